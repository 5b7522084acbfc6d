"""``fideval store materialize``: a logit store written from a hidden one, for those who publish references in the seed's
format (FP32 logits, format ``fideval.logits``) or feed tools that read logits.

Each shard is the hidden shard's states through the store's head (fideval.store.replay), on the CPU or a GPU, written
by the same writer a teacher run uses: atomically, resumably (a rerun skips the shards already written), each shard
naming its tokens' SHA-256 as the teacher's did. The manifest keeps the teacher's identity and settings and adds
``materialized``: the hidden store's manifest SHA-256, its head's content digest and the device that replayed it (the
bits are the teacher's own where the replay's GEMM is the teacher's: docs/formats-store.md, "Replay").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fideval.errors import FidevalError
from fideval.fsio import sha256_file


def materialize(rows: Any, out: Path, device: str = "cpu", windows_file: Path | None = None) -> dict[str, Any]:
    """Write the logit store of the hidden store ``rows`` (a :class:`~fideval.store.replay.HiddenStore`) at ``out``;
    returns ``{written, skipped, rows, bytes}``."""
    import torch

    from fideval.progress import progress
    from fideval.store import card
    from fideval.store import manifest as mf
    from fideval.store.writer import StoreWriter

    if getattr(rows, "kind", None) != "hidden":
        raise FidevalError(f"{rows.root} is a {getattr(rows, 'kind', '?')} store: it already holds its logits",
                           hint="materialize a hidden store")
    if Path(out).resolve() == Path(rows.root).resolve():
        raise FidevalError(f"--out {out} is the hidden store itself", hint="write the logit store to another folder")
    meta = {k: v for k, v in rows.meta.items() if k not in ("head", "hidden_size", "kind", "profile", "canary")}
    dev = torch.device(device)
    meta |= {"kind": "logits", "materialized": json.dumps({
        "from_manifest_sha256": sha256_file(Path(rows.root) / mf.MANIFEST), "head_sha256": rows.block["weight_sha256"],
        "lm_head": rows.head(dev).mode, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"},
        sort_keys=True)}
    for k in ("canary", "profile"):  # the teacher run's own records, kept as the teacher wrote them
        if k in rows.meta:
            meta[f"teacher_{k}"] = rows.meta[k]
    w = StoreWriter(out, meta)
    written = skipped = 0
    with progress("materialize", total=len(rows.seq_ids), unit="sequences") as bar:
        for sid in rows.seq_ids:
            if w.done(sid):
                skipped += 1
            else:
                logits, tokens = rows.logits(sid, dev)
                e = rows.entry(sid)
                w.write(sid, logits, tokens, e["window_id"], e["domain"], row_start=int(e["row_start"]))
                written += 1
            bar.advance(1)
    man = w.finish()
    card.write(Path(out), windows_file)
    return {"written": written, "skipped": skipped, "rows": sum(e["rows"] for e in man["shards"].values()),
            "bytes": sum(e["bytes"] for e in man["shards"].values())}
