"""``StoreWriter``: stream teacher logits into a store one shard at a time, atomically and resumably.

A teacher run over a large model takes hours; it will be killed (preemption, OOM, a full disk) and must
resume without redoing finished sequences and without trusting a half-written file. So:

* every shard is written to a temp name and renamed (``fideval.fsio``): a shard file either is complete or
  does not exist;
* right after the rename a sidecar ``shards/<seq_id>.entry.json`` records its SHA-256, size and mtime.
  On resume, ``done(seq_id)`` trusts a shard whose size and mtime still match its sidecar (no re-hash: a
  kill must not cost a full re-read of the store) and whose header still parses; a shard without a sidecar,
  or whose size/mtime changed, is re-hashed against the sidecar or the previous manifest, and if that fails
  ``done`` says False so the caller rewrites it. ``rehash=True`` re-hashes every shard regardless;
* ``finish()`` folds the entries into ``manifest.json`` and ``index.parquet`` (both atomic) and removes the
  sidecars. Silent corruption of a file whose mtime did not change is caught later, by ``fideval verify``
  and by the reader's hash check on first read.

One writer per store at a time. Mixing teachers is refused: a shard whose header names another model,
revision, tokenizer, vocabulary or kind is an error, not a skip.

A hidden store (meta ``kind: hidden``) takes the final norm's output instead of logits (bfloat16, float16 or
float32, kept in that dtype) and, before its first shard, the lm head as the run used it (:meth:`StoreWriter.set_head`,
``head.safetensors``, named in the meta's ``head`` block that every shard copies).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.fsio import sha256_file, write_json
from fideval.store import manifest as mf
from fideval.store.shard import (
    DATA_DTYPES,
    FORMAT,
    HIDDEN_FORMAT,
    SAFETENSORS_NAME,
    VERSION,
    check_seq_id,
    read_header,
    shard_rel,
    write_shard,
)

_IDENTITY = ("model_id", "model_revision", "tokenizer_sha256", "vocab_size", "kind")


def _hidden_numpy(x: Any, width: int, what: str) -> tuple[np.ndarray, str]:
    """A hidden-state tensor ``[rows, H]`` (torch, any device; or numpy float16/float32) as little-endian bytes of its
    own dtype, and the safetensors name of that dtype. NaN/inf rows are refused (the teacher run is broken)."""
    import torch

    t = x.detach() if hasattr(x, "detach") else torch.from_numpy(np.ascontiguousarray(x))
    name = str(t.dtype).removeprefix("torch.")
    if name not in SAFETENSORS_NAME:
        raise FidevalError(f"{what}: hidden states are {name}, a hidden store keeps bfloat16, float16 or float32",
                           hint="compute the teacher in float32 or bfloat16")
    if t.ndim != 2 or t.shape[1] != width:
        raise FidevalError(f"{what}: hidden states shape {tuple(t.shape)} is not [rows, {width}]",
                           hint="the store's hidden_size must match the model's")
    finite = torch.isfinite(t).all(dim=1)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten().tolist()
        raise FidevalError(f"{what}: {len(bad)} hidden-state rows hold NaN or inf (first: row {bad[0]})",
                           hint="the teacher run is broken; check its dtype and inputs")
    st = SAFETENSORS_NAME[name]
    npd = DATA_DTYPES[st][0]
    t = t.to("cpu").contiguous()
    arr = (t.view(torch.int16) if name == "bfloat16" else t).numpy()
    return np.ascontiguousarray(arr.astype(np.dtype(npd), copy=False)), st


def _as_numpy(x: Any, dtype: np.dtype, what: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on the GPU
        import torch

        if what == "logits" and x.dtype != torch.float32:
            raise FidevalError(f"logits are {x.dtype}, the store keeps float32", hint="compute the teacher in float32")
        x = x.detach().to("cpu", {np.float32: torch.float32, np.int32: torch.int32}[np.dtype(dtype).type]).contiguous().numpy()
    arr = np.asarray(x)
    if arr.dtype != dtype:
        if what == "logits":
            raise FidevalError(f"logits are {arr.dtype}, the store keeps float32", hint="compute the teacher in float32")
        arr = arr.astype(dtype)
    return np.ascontiguousarray(arr.astype(np.dtype(dtype).newbyteorder("<"), copy=False))


class StoreWriter:
    """``w = StoreWriter(root, meta)``; for each sequence ``if not w.done(sid): w.write(...)``; then ``w.finish()``."""

    def __init__(self, root: str | Path, meta: dict[str, Any], *, rehash: bool = False):
        self.root = Path(root)
        self.meta = mf.normalize_meta(meta)
        self.vocab_size = int(self.meta["vocab_size"])
        self.hidden = self.meta["kind"] == "hidden"
        self.rehash = rehash
        self._verified: dict[str, dict[str, Any]] = {}
        self._previous: dict[str, dict[str, Any]] = {}
        if (self.root / mf.MANIFEST).exists():
            old = mf.load_manifest(self.root)
            self._check_identity(old["meta"], str(self.root / mf.MANIFEST))
            self._previous = old["shards"]
        shards = self.root / "shards"
        # temp files of a killed write (shards, sidecars, manifest, index): never complete, safe to drop
        for tmp in [*shards.glob(".*.tmp"), *self.root.glob(".*.tmp")] if self.root.is_dir() else []:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _check_identity(self, other: dict[str, str], where: str) -> None:
        for k in _IDENTITY:
            if other.get(k) != self.meta[k]:
                raise FidevalError(f"{where} has {k} {other.get(k)!r}, this run writes {self.meta[k]!r}",
                                   hint="write to a new store folder; one store holds one teacher")

    def done(self, seq_id: str) -> bool:
        """True when the shard exists and is verified (then skip it); False means (re)write it."""
        if seq_id in self._verified:
            return True
        path = self.root / shard_rel(seq_id)
        st = mf.stat_mtime(path)
        if st is None:
            return False
        side = mf.read_entry(self.root, seq_id)
        entry = side[0] if side else self._previous.get(seq_id)
        if entry is None:
            return False
        cheap = side is not None and not self.rehash and st == (entry["bytes"], side[1])
        if not cheap and (st[0] != entry["bytes"] or sha256_file(path) != entry["sha256"]):
            return False
        try:
            head = read_header(path, f"{seq_id}.safetensors")
        except FidevalError:
            return False
        self._check_identity(head.meta, str(path))
        if head.rows != entry["rows"] or head.length != entry["tokens"] or head.meta["seq_id"] != seq_id:
            return False
        if not cheap:  # remember the new mtime so the next resume is cheap again
            mf.write_entry(self.root, seq_id, entry, st[1])
        self._verified[seq_id] = entry
        return True

    def entry(self, seq_id: str) -> dict[str, Any] | None:
        """The manifest entry (``sha256``, ``bytes``, ...) of a shard verified or written by this writer, else None."""
        return self._verified.get(seq_id)

    def set_head(self, weight: Any, info: dict[str, Any]) -> dict[str, Any]:
        """A hidden store's lm head as the run used it (``weight [V, H]``, bfloat16 or float32) written once into
        ``head.safetensors`` (fideval.store.head) and named in the meta's ``head`` block, before the first shard. A
        resumed store keeps its head file when the content is the same; a store whose shards were computed with
        another head is refused (one store holds one teacher)."""
        from fideval.store import head as head_file

        if not self.hidden:
            raise FidevalError(f"{self.root}: a {self.meta['kind']} store keeps no head", hint="this is a bug in the caller")
        w = head_file.stored_form(weight)
        old, digest = mf.recorded_head(self.root), head_file.content_sha256(w)
        if old is not None and old.get("weight_sha256") != digest:
            raise FidevalError(f"{self.root} holds shards computed with lm head {str(old.get('weight_sha256'))[:12]}…, this "
                               f"run's head is {digest[:12]}…", hint="write a new store (one store holds one teacher)")
        block = head_file.write(self.root, w, info, digest)  # w is already the stored form: its digest stands
        self.meta["head"] = json.dumps(block, sort_keys=True)
        return block

    def write(self, seq_id: str, logits: Any, token_ids: Any, window_id: str, domain: str, *,
              row_start: int = 0, extra_meta: dict[str, str] | None = None) -> dict[str, Any]:
        """Write one sequence's shard atomically. ``logits`` float32 [rows, V] (numpy or torch, any device); in a
        hidden store the final norm's output [L, H] instead (torch bfloat16/float16/float32 or numpy float16/float32).

        Row i of ``logits`` predicts token ``row_start + i + 1``; a teacher keeps every row (``row_start`` 0,
        rows == L). Imported stores that lack the first rows set ``row_start``; the last row (predicting past
        the end) may be absent, so rows is ``L - row_start`` or ``L - row_start - 1``.
        """
        check_seq_id(seq_id)
        tk = _as_numpy(token_ids, np.dtype(np.int32), "token_ids")
        if self.hidden:
            if "head" not in self.meta:
                raise FidevalError(f"{self.root}: a hidden store's head is written before its first shard",
                                   hint="this is a bug in the caller (StoreWriter.set_head)")
            lg, dtype = _hidden_numpy(logits, int(self.meta["hidden_size"]), seq_id)
            said = json.loads(self.meta["head"]).get("hidden_dtype")
            if SAFETENSORS_NAME.get(said) != dtype:
                raise FidevalError(f"{seq_id}: hidden states are {dtype}, the store's head block says {said}",
                                   hint="this is a bug in the runner's export_head; write a logit store meanwhile")
        else:
            lg, dtype = _as_numpy(logits, np.dtype(np.float32), "logits"), "F32"
            if lg.ndim != 2 or lg.shape[1] != self.vocab_size:
                raise FidevalError(f"{seq_id}: logits shape {lg.shape} is not [rows, {self.vocab_size}]",
                                   hint="the store's vocab_size must match the model's output width")
        length = tk.shape[0] if tk.ndim == 1 else -1
        if length < 1 or not 0 <= row_start < length or lg.shape[0] not in (length - row_start, length - row_start - 1):
            raise FidevalError(f"{seq_id}: {lg.shape[0]} rows do not fit {tk.shape} token ids from row {row_start}")
        if not self.hidden:
            step = max(1, (1 << 24) // max(self.vocab_size, 1))  # bounded temporaries, even for 4 GB shards
            bad = [a + int(r) for a in range(0, lg.shape[0], step)
                   for r in np.flatnonzero(~np.isfinite(lg[a:a + step]).all(axis=1))]
            if bad:
                raise FidevalError(f"{seq_id}: {len(bad)} logit rows hold NaN or inf (first: row {bad[0]})",
                                   hint="the teacher run is broken; check its dtype and inputs")
        fmt = HIDDEN_FORMAT if self.hidden else FORMAT
        meta = {**self.meta, **(extra_meta or {}), "format": fmt, "version": VERSION, "seq_id": seq_id,
                "window_id": str(window_id), "domain": str(domain), "row_start": str(row_start),
                # the windows' own hash of these tokens (eval-windows.json): the link from a shard back to its windows
                "token_sha256": hashlib.sha256(tk.tobytes()).hexdigest()}
        path = self.root / shard_rel(seq_id)
        sha, nbytes = write_shard(path, lg, tk, meta, tensor="hidden" if self.hidden else "logits", dtype=dtype)
        entry = {"file": shard_rel(seq_id), "sha256": sha, "bytes": nbytes, "rows": int(lg.shape[0]),
                 "tokens": int(length), "row_start": int(row_start), "window_id": str(window_id), "domain": str(domain)}
        st = mf.stat_mtime(path)
        mf.write_entry(self.root, seq_id, entry, st[1] if st else 0)
        self._verified[seq_id] = entry
        return entry

    def finish(self) -> dict[str, Any]:
        """Write ``manifest.json`` and ``index.parquet`` for every verified shard; drop the sidecars."""
        shards_dir = self.root / "shards"
        known = set(self._previous)
        if shards_dir.is_dir():
            known |= {p.name[: -len(mf.ENTRY_SUFFIX)] for p in shards_dir.glob("*" + mf.ENTRY_SUFFIX)}
        for sid in sorted(known - set(self._verified)):
            with contextlib.suppress(FidevalError):
                self.done(sid)
        if not self._verified:
            raise FidevalError(f"{self.root}: no shards were written", hint="nothing to finish")
        manifest = mf.manifest_dict(self.meta, self._verified)
        mf.write_index(self.root, manifest["shards"])
        write_json(self.root / mf.MANIFEST, manifest)
        for sid in self._verified:
            with contextlib.suppress(FileNotFoundError):
                mf.entry_path(self.root, sid).unlink()
        return manifest
