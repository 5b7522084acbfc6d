"""``fideval verify STORE``: check a whole store and list every problem, one line each.

A store is trusted input to every score that follows, and it is large, copied between machines and
downloaded from the Hub, so ``verify`` checks all of it rather than stopping at the first fault: the
manifest parses; every shard named in it exists inside the store with the recorded size and SHA-256; its
header passes the bounded parser and agrees with the manifest (sequence id, rows, tokens, teacher identity);
token ids are inside the vocabulary; logits (a hidden store's states) are finite; a hidden store's
``head.safetensors`` has the SHA-256 and content digest its ``head`` block names and every shard names that head;
``index.parquet`` matches the manifest; and no stray shard or temp file lies in ``shards/``. Reading is one pass
per shard plus a finiteness scan that usually hits the page cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fideval.errors import FidevalError
from fideval.formats.store import settings_fingerprint
from fideval.fsio import sha256_file
from fideval.store import manifest as mf
from fideval.store.reader import StoreReader
from fideval.store.shard import data_rows, read_header

_ROWS_PER_SCAN = 256


def verify_store(root: str | Path) -> tuple[list[str], dict[str, int]]:
    """Return (problems, totals). An empty list means the store is sound."""
    root = Path(root)
    try:
        reader = StoreReader(root)
    except FidevalError as e:
        return [e.line()], {"shards": 0, "bytes": 0, "rows": 0}
    problems: list[str] = []
    totals = {"shards": 0, "bytes": 0, "rows": 0}
    expected_files: set[str] = set()
    for sid in reader.seq_ids:
        e = reader.entries[sid]
        name = e["file"]
        expected_files.add(name)
        try:
            path = reader.path(sid)
        except FidevalError as err:
            problems.append(f"shard {sid}: {err.message}")
            continue
        if name != f"shards/{sid}.safetensors":
            problems.append(f"shard {sid}: manifest names file {name!r}, expected shards/{sid}.safetensors")
        if not path.is_file():
            problems.append(f"shard {name}: missing")
            continue
        size = path.stat().st_size
        if size != e["bytes"]:
            problems.append(f"shard {name}: {size} bytes, manifest says {e['bytes']} (truncated?)")
        elif sha256_file(path) != e["sha256"]:
            problems.append(f"shard {name}: SHA-256 differs from the manifest (corrupt or altered)")
        try:
            head = read_header(path, name)
            reader._check_head(sid, head)
        except FidevalError as err:
            problems.append(err.message)
            continue
        tokens = np.fromfile(path, dtype="<i4", count=head.length, offset=head.token_ids_offset)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= reader.vocab_size):
            problems.append(f"shard {name}: token ids outside [0, {reader.vocab_size})")
        problems += _chain(name, head.meta, tokens, reader.meta)
        if head.meta.get("head") != reader.meta.get("head"):
            problems.append(f"shard {name}: names another lm head than the store's (the store mixes two teachers)")
        if head.rows:
            import torch

            data = data_rows(path, head)
            bad_rows = [a + int(r) for a in range(0, head.rows, _ROWS_PER_SCAN)
                        for r in torch.nonzero(~torch.isfinite(data[a:a + _ROWS_PER_SCAN]).all(dim=1)).flatten().tolist()]
            del data
            if bad_rows:
                problems.append(f"shard {name}: {len(bad_rows)} rows hold NaN or inf (first: row {bad_rows[0]})")
        totals["shards"] += 1
        totals["bytes"] += size
        totals["rows"] += head.rows
    if reader.kind == "hidden":
        problems += _head(root, reader.meta)
    shards_dir = root / "shards"
    if shards_dir.is_dir():
        for p in sorted(shards_dir.iterdir()):
            rel = f"shards/{p.name}"
            if rel in expected_files:
                continue
            if p.name.endswith(mf.ENTRY_SUFFIX) and f"shards/{p.name[:-len(mf.ENTRY_SUFFIX)]}.safetensors" in expected_files:
                continue  # a sidecar left by a writer killed between manifest and cleanup: harmless
            what = "leftover temp file of a killed write" if p.name.endswith(".tmp") else "stray file not in the manifest"
            problems.append(f"{rel}: {what}")
    index = root / mf.INDEX
    if not index.exists():
        problems.append(f"{mf.INDEX}: missing")
    else:
        try:
            rows = mf.read_index(root)
        except Exception as err:  # noqa: BLE001 -- pyarrow raises several types for a broken file
            problems.append(f"{mf.INDEX}: unreadable ({type(err).__name__})")
        else:
            if set(rows) != set(reader.entries):
                problems.append(f"{mf.INDEX}: lists {len(rows)} sequences, manifest {len(reader.entries)}")
            else:
                for sid, row in rows.items():
                    if any(row.get(k) != reader.entries[sid][k] for k in mf.ENTRY_KEYS):
                        problems.append(f"{mf.INDEX}: row for {sid} differs from the manifest")
                        break
    return problems, totals


def _head(root: Path, meta: dict[str, str]) -> list[str]:
    """A hidden store's head file against its ``head`` block: present, its file SHA-256, its content digest."""
    import json

    from fideval.store import head as head_file

    try:
        block = json.loads(meta.get("head") or "null")
        if not isinstance(block, dict):
            return ["manifest: a hidden store without a head block"]
        head_file.check_info(block, "manifest")
    except (ValueError, FidevalError) as err:
        return [f"manifest: head block unreadable ({err})"]
    path = root / str(block.get("file", head_file.FILE))
    if not path.is_file():
        return [f"{block.get('file')}: missing (score with --head-from MODEL, or re-download the store)"]
    if sha256_file(path) != block.get("sha256"):
        return [f"{block.get('file')}: SHA-256 differs from the manifest's head block (corrupt or altered)"]
    try:
        head_file.load(root, block)
    except FidevalError as err:
        return [err.message]
    return []


def _chain(name: str, meta: dict[str, str], tokens: np.ndarray, store_meta: dict[str, str]) -> list[str]:
    """A shard's links (docs/formats.md, 'The chain of custody'): its tokens against its ``token_sha256``, its
    ``settings_sha256`` against its own teacher block and the store's (one store, one teacher). Shards written
    before these keys existed carry neither: nothing to check."""
    import hashlib
    import json

    out = []
    want = meta.get("token_sha256")
    if want is not None and hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest() != want:
        out.append(f"shard {name}: its token ids do not hash to its token_sha256 (altered)")
    fp = meta.get("settings_sha256")
    if fp is not None:
        try:
            block = json.loads(meta.get("teacher") or "{}")
        except ValueError:
            block = None
        if not isinstance(block, dict) or settings_fingerprint(block) != fp:
            out.append(f"shard {name}: its teacher block does not hash to its settings_sha256 (altered)")
        if store_meta.get("settings_sha256") not in (None, fp):
            out.append(f"shard {name}: computed with other settings than the store's ({fp[:12]}... vs "
                       f"{store_meta['settings_sha256'][:12]}...): the store mixes two teachers")
    return out
