"""The store's table of contents: ``manifest.json`` (format ``fideval.store`` v2; v1 read), per-shard entry sidecars,
and ``index.parquet``.

The manifest is the one thing a reader trusts: it names every shard with its SHA-256, size and row count, so
a reader can check a shard before using it and ``fideval verify`` can find missing, stray or altered files.
While a teacher run is in progress the manifest does not exist yet; instead each finished shard gets a small
sidecar ``shards/<seq_id>.entry.json`` written (atomically) right after the shard itself. A killed run
therefore resumes from the sidecars without re-hashing terabytes, and ``finish()`` folds them into the
manifest. ``index.parquet`` is the same table for people and dataframes; pyarrow is imported only when it is
written or read, so the GPU side needs nothing beyond numpy/torch/safetensors to read shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any

from fideval.errors import FidevalError
from fideval.formats import nesting
from fideval.formats.model import dump, parse
from fideval.formats.store import MANIFEST, ShardEntry, StoreManifest
from fideval.fsio import write_json

FORMAT, VERSION = StoreManifest.FORMAT, StoreManifest.VERSION
INDEX = "index.parquet"
ENTRY_SUFFIX = ".entry.json"
MAX_MANIFEST = 256 << 20
META_REQUIRED = ("model_id", "model_revision", "tokenizer_sha256", "vocab_size", "kind")
ENTRY_KEYS = {f.name: typing.get_type_hints(ShardEntry)[f.name] for f in dataclasses.fields(ShardEntry)}


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
                           "tokenizer_sha256, vocab_size and kind ('logits', 'logprobs' or 'hidden')")
    if out["kind"] not in ("logits", "logprobs", "hidden"):
        raise FidevalError(f"store meta kind {out['kind']!r} is not 'logits', 'logprobs' or 'hidden'")
    for key in ("vocab_size", "hidden_size") if out["kind"] == "hidden" else ("vocab_size",):
        if not out.get(key, "").isdigit() or int(out[key]) < 1:
            raise FidevalError(f"store meta {key} {out.get(key)!r} is not a positive integer")
    return out


def check_entry(seq_id: str, entry: Any, where: str) -> dict[str, Any]:
    """A shard entry checked against :class:`ShardEntry` (types, sizes >= 0, a 64-hex SHA-256), as a dict."""
    return dump(parse(ShardEntry, entry, where, f"shards.{seq_id}"))


def _read_json(path: Path, limit: int) -> Any:
    try:
        size = path.stat().st_size
        if size > limit:
            raise FidevalError(f"{path} is {size} bytes, more than a manifest can be ({limit})", hint="is this a store?")
        return nesting.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise FidevalError(f"{path} is not valid JSON", hint="rebuild or re-download the store") from None
    except FileNotFoundError:
        raise FidevalError(f"{path} does not exist", hint="is this a finished store? a teacher run writes it at the end") from None
    except OSError as e:
        raise FidevalError(f"cannot read {path} ({e.strerror})") from None


def read_manifest(root: Path) -> StoreManifest:
    """``manifest.json`` as a :class:`StoreManifest`: format, version, meta and every shard entry checked."""
    path = Path(root) / MANIFEST
    m = parse(StoreManifest, _read_json(path, MAX_MANIFEST), str(path))
    try:
        meta = normalize_meta(m.meta)
    except FidevalError as e:
        raise FidevalError(f"{path}: {e.message}", hint="rebuild or re-download the store") from None
    return dataclasses.replace(m, meta=meta)


def load_manifest(root: Path) -> dict[str, Any]:
    """:func:`read_manifest` as plain dicts, the form the store's reader and writer index into."""
    return dump(read_manifest(root))


def recorded_head(root: Path) -> dict[str, Any] | None:
    """The ``head`` block an existing hidden store was written with (its manifest, else the first readable shard of a
    killed run), or None (a new store, or a logit store)."""
    from fideval.store.shard import read_header

    root = Path(root)
    meta = None
    if (root / MANIFEST).is_file():
        meta = load_manifest(root)["meta"]
    elif (root / "shards").is_dir():
        for shard in sorted((root / "shards").glob("*.safetensors")):
            try:
                meta = read_header(shard).meta
                break
            except FidevalError:
                continue
    if not meta or not meta.get("head"):
        return None
    try:
        block = json.loads(meta["head"])
    except ValueError:
        raise FidevalError(f"{root}: the store's head block is not JSON", hint="rebuild or re-download the store") from None
    return block if isinstance(block, dict) else None


def manifest_dict(meta: dict[str, str], shards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    entries = {sid: ShardEntry(**{k: e[k] for k in ENTRY_KEYS}) for sid, e in sorted(shards.items())}
    return dump(StoreManifest(meta=meta, shards=entries))


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
