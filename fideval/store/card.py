"""The dataset card beside every store: ``README.md`` in the Hugging Face dataset-card format (YAML metadata between
``---`` lines, then prose), so a store pushed to the Hub as a dataset says what it is on its page and to any tool that
reads the metadata: the model and revision it was computed from, its kind, the head's digest (a hidden store), the
settings fingerprint, its size, and every sequence with its token SHA-256 (the link to ``eval-windows.json``) and, when
the windows are at hand, the sources its windows were cut from.

The card is derived from the manifest (and the windows file): it adds no fact of its own, so regenerating it from the
same files gives the same bytes, and ``fideval verify`` never trusts it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from fideval.fsio import sha256_file, write_text
from fideval.store import manifest as mf

FILE = "README.md"
GENERATOR = "fideval store card"


def _size_category(rows: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                        (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")):
        if rows < bound:
            return name
    return "100M<n<1B"


def _sources(windows_file: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    """(domain -> its source as eval-windows.json records it, sequence id -> its window's documents in a few words)."""
    if windows_file is None or not Path(windows_file).is_file():
        return {}, {}
    try:
        ev = json.loads(Path(windows_file).read_text())
    except (OSError, ValueError):
        return {}, {}
    domains = {}
    for d in ev.get("domains") or []:
        if isinstance(d, dict) and d.get("name"):
            domains[str(d["name"])] = d.get("source")
    docs = {}
    for w in ev.get("windows") or []:
        if not isinstance(w, dict):
            continue
        names = [str((doc.get("source") or {}).get("doc_id") or (doc.get("source") or {}).get("file") or "?")
                 for doc in w.get("documents") or [] if isinstance(doc, dict)]
        text = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        docs[str(w.get("id"))] = text
        for c in w.get("cuts") or []:
            if isinstance(c, dict):
                docs[str(c.get("id"))] = text
    return domains, docs


def render(root: Path, windows_file: Path | None = None) -> str:
    """The card of the finished store at ``root`` (``windows_file``: the ``eval-windows.json`` it was computed on)."""
    root = Path(root)
    man = mf.load_manifest(root)
    meta, shards = man["meta"], man["shards"]
    kind = meta["kind"]
    head = json.loads(meta["head"]) if meta.get("head") else None
    rows = sum(int(e["rows"]) for e in shards.values())
    nbytes = sum(int(e["bytes"]) for e in shards.values()) + (int(head.get("bytes", 0)) if head else 0)
    domains, docs = _sources(windows_file)
    per_domain = Counter(e["domain"] for e in shards.values())
    block = {"format": man["format"], "version": man["version"], "kind": kind, "model_id": meta["model_id"],
             "model_revision": meta["model_revision"], "tokenizer_sha256": meta["tokenizer_sha256"],
             "vocab_size": int(meta["vocab_size"]), "manifest_sha256": sha256_file(root / mf.MANIFEST),
             "settings_sha256": meta.get("settings_sha256"), "sequences": len(shards), "rows": rows, "bytes": nbytes}
    if head:
        block |= {"hidden_size": int(meta["hidden_size"]), "head_sha256": head.get("weight_sha256"),
                  "head_file_sha256": head.get("sha256"), "lm_head": head.get("lm_head"), "head_finish": head.get("finish")}
    front = {"pretty_name": f"fideval teacher store: {meta['model_id']} ({kind})", "tags": ["fideval", "teacher-store",
             "kl-divergence", "quantization"], "size_categories": [_size_category(rows)], "x_fideval": block,
             "x_generator": GENERATOR}
    what = {"hidden": "the final norm's output of every position (the lm head's input) and, in `head.safetensors`, the "
                      "head as the run applied it; `fideval score` replays the FP32 logits from them on its device",
            "logits": "the FP32 logits of every position",
            "logprobs": "log-probabilities imported from llama.cpp (lossy: see the manifest's `lossy`)"}.get(kind, kind)
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "",
             f"# Teacher store: {meta['model_id']} @ {meta['model_revision']}", "",
             f"A [fideval](https://github.com/) reference for fidelity evaluation of quantized builds of `{meta['model_id']}`. "
             f"It holds {what}: {len(shards)} sequences, {rows:,} rows, {nbytes / 1e9:.3f} GB.", "",
             "Score a build against it: `fideval score --teacher hf://datasets/ORG/NAME@REV --candidate STORE --out records` "
             "(or `--config CONFIG --candidate NAME`). Check it first: `fideval verify hf://datasets/ORG/NAME@REV`.", "",
             "## Identity", "",
             f"- model: `{meta['model_id']}` revision `{meta['model_revision']}`",
             f"- tokenizer.json SHA-256: `{meta['tokenizer_sha256']}`",
             f"- store kind: `{kind}` (format `{man['format']}` v{man['version']}, docs/formats-store.md)",
             f"- settings fingerprint: `{meta.get('settings_sha256')}`",
             f"- manifest.json SHA-256: `{block['manifest_sha256']}`"]
    if head:
        lines += [f"- lm head: `{head.get('source')}` {head.get('dtype')} {head.get('shape')}, content SHA-256 "
                  f"`{head.get('weight_sha256')}`, applied as `{head.get('lm_head')}`"
                  + (f", then `{head['finish']['op']}` {head['finish']['value']}" if head.get("finish") else "")]
    lines += ["", "## Sequences", "", "| domain | sequences | source |", "|---|---:|---|"]
    for d in sorted(per_domain):
        src = domains.get(d)
        lines.append(f"| {d} | {per_domain[d]} | {_source_text(src)} |")
    lines += ["", "Every sequence's token ids hash to the SHA-256 below (the same as `eval-windows.json`'s):", "",
              "| sequence | window | tokens | token SHA-256 | documents |", "|---|---|---:|---|---|"]
    for sid in sorted(shards):
        e = shards[sid]
        lines.append(f"| {sid} | {e['window_id']} | {e['tokens']} | `{_token_sha(root, sid)}` | {docs.get(sid, '')} |")
    return "\n".join(lines) + "\n"


def _source_text(src: Any) -> str:
    if not isinstance(src, dict):
        return "" if src is None else str(src)
    keep = [f"{k}={src[k]}" for k in ("type", "id", "config", "split", "revision", "path", "file") if src.get(k) is not None]
    return ", ".join(keep).replace("|", "/")


def _token_sha(root: Path, seq_id: str) -> str:
    from fideval.store.shard import read_header, shard_rel

    try:
        return read_header(root / shard_rel(seq_id)).meta.get("token_sha256", "")
    except Exception:  # noqa: BLE001 -- a card never fails a finished store; verify names a broken shard
        return ""


def write(root: Path, windows_file: Path | None = None) -> Path:
    """Write (atomically) the card of the finished store at ``root``; return its path."""
    path = Path(root) / FILE
    write_text(path, render(root, windows_file))
    return path
