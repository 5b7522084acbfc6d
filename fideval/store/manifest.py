"""The store's table of contents: ``manifest.json`` (format ``fideval.store`` v1), per-shard entry sidecars, and
``index.parquet``.

The manifest is the one thing a reader trusts: it names every shard with its SHA-256, size and row count, so
a reader can check a shard before using it and ``fideval verify`` can find missing, stray or altered files.
While a teacher run is in progress the manifest does not exist yet; instead each finished shard gets a small
sidecar ``shards/<seq_id>.entry.json`` written (atomically) right after the shard itself. A killed run
therefore resumes from the sidecars without re-hashing terabytes, and ``finish()`` folds them into the
manifest. ``index.parquet`` is the same table for people and dataframes; pyarrow is imported only when it is
written or read, so the GPU side needs nothing beyond numpy/torch/safetensors to read shards.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from fideval.errors import FidevalError
from fideval.fsio import write_json

FORMAT = "fideval.store"
VERSION = "1"
MANIFEST = "manifest.json"
INDEX = "index.parquet"
ENTRY_SUFFIX = ".entry.json"
MAX_MANIFEST = 256 << 20
META_REQUIRED = ("model_id", "model_revision", "tokenizer_sha256", "vocab_size", "kind")
ENTRY_KEYS = {"file": str, "sha256": str, "bytes": int, "rows": int, "tokens": int, "row_start": int,
              "window_id": str, "domain": str}
_HEX64 = re.compile(r"[0-9a-f]{64}")


def normalize_meta(meta: dict[str, Any]) -> dict[str, str]:
    """Store meta as strings (safetensors metadata must be strings); lists/dicts become JSON."""
    out: dict[str, str] = {}
    for k, v in meta.items():
        if not isinstance(k, str):
            raise FidevalError(f"store meta key {k!r} is not a string")
        out[k] = v if isinstance(v, str) else json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)
    missing = [k for k in META_REQUIRED if not out.get(k)]
    if missing:
        raise FidevalError(f"store meta lacks {', '.join(missing)}", hint="pass model_id, model_revision, "
                           "tokenizer_sha256, vocab_size and kind ('logits' or 'logprobs')")
    if out["kind"] not in ("logits", "logprobs"):
        raise FidevalError(f"store meta kind {out['kind']!r} is not 'logits' or 'logprobs'")
    if not out["vocab_size"].isdigit() or int(out["vocab_size"]) < 1:
        raise FidevalError(f"store meta vocab_size {out['vocab_size']!r} is not a positive integer")
    return out


def check_entry(seq_id: str, entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise FidevalError(f"{where}: entry for {seq_id!r} is not an object", hint="rebuild or re-download the store")
    for key, typ in ENTRY_KEYS.items():
        v = entry.get(key)
        if not isinstance(v, typ) or (typ is int and (isinstance(v, bool) or v < 0)):
            raise FidevalError(f"{where}: entry for {seq_id!r} has bad {key!r} ({v!r})", hint="rebuild or re-download the store")
    if not _HEX64.fullmatch(entry["sha256"]):
        raise FidevalError(f"{where}: entry for {seq_id!r} has a malformed sha256", hint="rebuild or re-download the store")
    return entry


def _read_json(path: Path, limit: int) -> Any:
    try:
        size = path.stat().st_size
        if size > limit:
            raise FidevalError(f"{path} is {size} bytes, more than a manifest can be ({limit})", hint="is this a store?")
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise FidevalError(f"{path} is not valid JSON", hint="rebuild or re-download the store") from None
    except FileNotFoundError:
        raise FidevalError(f"{path} does not exist", hint="is this a finished store? a teacher run writes it at the end") from None
    except OSError as e:
        raise FidevalError(f"cannot read {path} ({e.strerror})") from None


def load_manifest(root: Path) -> dict[str, Any]:
    """Read and check ``manifest.json``: format, version, meta and every shard entry's types."""
    path = Path(root) / MANIFEST
    m = _read_json(path, MAX_MANIFEST)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise FidevalError(f"{path} is not a fideval store manifest (format {m.get('format') if isinstance(m, dict) else None!r})")
    if m.get("version") != VERSION:
        raise FidevalError(f"{path} has store version {m.get('version')!r}, this fideval reads {VERSION}",
                           hint="use the fideval version that wrote it")
    if not isinstance(m.get("meta"), dict) or not isinstance(m.get("shards"), dict):
        raise FidevalError(f"{path} lacks 'meta' or 'shards'", hint="rebuild or re-download the store")
    try:
        m["meta"] = normalize_meta(m["meta"])
    except FidevalError as e:
        raise FidevalError(f"{path}: {e.message}", hint="rebuild or re-download the store") from None
    for sid, e in m["shards"].items():
        check_entry(sid, e, str(path))
    return m


def manifest_dict(meta: dict[str, str], shards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "meta": meta, "shards": dict(sorted(shards.items()))}


def entry_path(root: Path, seq_id: str) -> Path:
    return Path(root) / "shards" / f"{seq_id}{ENTRY_SUFFIX}"


def write_entry(root: Path, seq_id: str, entry: dict[str, Any], mtime_ns: int) -> None:
    write_json(entry_path(root, seq_id), {**entry, "mtime_ns": mtime_ns})


def read_entry(root: Path, seq_id: str) -> tuple[dict[str, Any], int] | None:
    """A sidecar's (entry, mtime_ns), or None when absent or unreadable (the shard is then re-hashed)."""
    path = entry_path(root, seq_id)
    try:
        raw = _read_json(path, 1 << 16)
        mtime = raw.pop("mtime_ns")
        if type(mtime) is not int:
            return None
        return check_entry(seq_id, raw, str(path)), mtime
    except (FidevalError, AttributeError, KeyError):
        return None


def write_index(root: Path, shards: dict[str, dict[str, Any]]) -> None:
    """``index.parquet``: one row per shard, the manifest's entries as columns (sorted by seq_id)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fideval.fsio import atomic_path

    ids = sorted(shards)
    cols: dict[str, Any] = {"seq_id": pa.array(ids, pa.string())}
    for key, typ in ENTRY_KEYS.items():
        cols[key] = pa.array([shards[s][key] for s in ids], pa.string() if typ is str else pa.int64())
    with atomic_path(Path(root) / INDEX) as tmp:
        pq.write_table(pa.table(cols), tmp)


def read_index(root: Path) -> dict[str, dict[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(Path(root) / INDEX).to_pylist()
    return {row.pop("seq_id"): row for row in table}


def stat_mtime(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
