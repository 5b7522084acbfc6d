"""One store shard: a safetensors file written and parsed by hand, format ``fideval.logits`` v1 (a logit store's:
float32 ``logits [rows, V]``) or ``fideval.hidden`` v1 (a hidden store's: the final norm's output ``hidden [rows, H]``
in the dtype the run computed it, BF16, F16 or F32), each with the sequence's ``token_ids [L]`` (I32).

Why by hand: a teacher shard of 8,192 rows x 129,280 vocab is 4.2 GB. ``safetensors.numpy.save`` builds the
whole file in memory (a second copy) before we could write it; here the header is a few hundred bytes and the
tensor bytes stream from the caller's array into the temp file while being hashed, so writing costs no copy
and no second read. The result is an ordinary safetensors file (8-byte little-endian header length, JSON
header padded with spaces to a multiple of 8, then the tensor bytes) that ``safetensors.safe_open`` reads.

Parsing is bounded (:mod:`fideval.formats.safetensors`): the header length, every dtype, shape and byte range
is checked against the file size *before* anything is allocated or mapped, so a corrupt or hostile header that claims 10^12 rows is refused
with one line instead of a MemoryError.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import ids, safetensors
from fideval.fsio import atomic_open

FORMAT = "fideval.logits"
HIDDEN_FORMAT = "fideval.hidden"
VERSION = "1"
KINDS = ("logits", "logprobs", "hidden")
# per shard format: its data tensor's name and the dtypes it may hold (safetensors names); bytes per value
TENSORS = {FORMAT: ("logits", ("F32",)), HIDDEN_FORMAT: ("hidden", ("BF16", "F16", "F32"))}
ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2}
# a data tensor's safetensors dtype -> (the numpy dtype its bytes are read and written as, the torch dtype they are);
# bfloat16 has no numpy dtype: its 16 bits travel as int16 and are viewed back
DATA_DTYPES = {"F32": ("<f4", "float32"), "BF16": ("<i2", "bfloat16"), "F16": ("<f2", "float16")}
SAFETENSORS_NAME = {torch_name: st for st, (_, torch_name) in DATA_DTYPES.items()}
# Metadata every shard carries (strings, as safetensors requires); the store's meta is copied into each shard
# so a shard separated from its manifest still says what produced it.
REQUIRED_META = ("format", "version", "seq_id", "window_id", "domain", "model_id", "model_revision",
                 "tokenizer_sha256", "vocab_size", "kind", "row_start")
MAX_HEADER = 1 << 20  # 1 MiB: two tensors and a few dozen metadata strings need a few KB
_CHUNK = 1 << 24


def check_seq_id(seq_id: str) -> str:
    """Sequence ids become file names: letters, digits, ``._-``, not starting with a dot, at most 200 chars."""
    if not ids.is_file_safe(seq_id):
        raise FidevalError(f"sequence id {seq_id!r} cannot be a shard name",
                           hint="use letters, digits, '.', '_' and '-' (window ids like 'code-003.c1' are fine)")
    return seq_id


def shard_rel(seq_id: str) -> str:
    return f"shards/{check_seq_id(seq_id)}.safetensors"


@dataclass(frozen=True)
class ShardHeader:
    """What a shard's header says, after every check passed. Offsets are absolute file offsets."""

    meta: dict[str, str]
    rows: int
    vocab: int  # the data tensor's columns: V for logits, H for hidden states
    length: int  # number of tokens (L)
    row_start: int
    logits_offset: int  # the data tensor's absolute offset (logits or hidden)
    token_ids_offset: int
    file_bytes: int
    tensor: str = "logits"  # the data tensor's name: logits or hidden
    dtype: str = "F32"  # its safetensors dtype

    @property
    def data_bytes(self) -> int:
        return self.rows * self.vocab * ITEMSIZE[self.dtype]


def _header_bytes(meta: dict[str, str], rows: int, width: int, length: int, tensor: str = "logits",
                  dtype: str = "F32") -> bytes:
    lbytes, tbytes = rows * width * ITEMSIZE[dtype], length * 4
    header = {
        "__metadata__": meta,
        tensor: {"dtype": dtype, "shape": [rows, width], "data_offsets": [0, lbytes]},
        "token_ids": {"dtype": "I32", "shape": [length], "data_offsets": [lbytes, lbytes + tbytes]},
    }
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)  # data starts 8-aligned, as safetensors itself pads
    return len(raw).to_bytes(8, "little") + raw


def write_shard(path: Path, logits: np.ndarray, token_ids: np.ndarray, meta: dict[str, str], *, tensor: str = "logits",
                dtype: str = "F32") -> tuple[str, int]:
    """Write one shard atomically (temp name, fsync, rename); return (sha256, bytes) of what was written.
    ``logits``: the data tensor (``tensor``: logits or hidden) as a little-endian array of ``dtype``'s bytes (a
    bfloat16 tensor as its uint16 view)."""
    rows, vocab = logits.shape
    head = _header_bytes(meta, rows, vocab, token_ids.shape[0], tensor, dtype)
    h = hashlib.sha256(head)
    total = len(head)
    with atomic_open(path, "wb") as f:
        f.write(head)
        for arr in (logits, token_ids):
            mv = memoryview(arr.reshape(-1).view(np.uint8))
            for a in range(0, len(mv), _CHUNK):
                part = mv[a:a + _CHUNK]
                h.update(part)
                f.write(part)
            total += len(mv)
    return h.hexdigest(), total


def parse_header(prefix: bytes | memoryview, file_bytes: int, name: str) -> ShardHeader:
    """Check a shard header held in ``prefix`` (the file's first bytes) against the file's size.

    ``prefix`` must hold at least the 8 length bytes and the header; :func:`read_header` reads exactly that.
    Raises a one-line :class:`FidevalError` naming ``name`` on the first problem.
    """
    def bad(what: str) -> FidevalError:
        return FidevalError(f"shard {name}: {what}", hint="delete it and re-run the teacher, or run 'fideval verify'")

    try:
        parsed = safetensors.parse(prefix, file_bytes, MAX_HEADER)
    except safetensors.HeaderError as e:
        raise bad(str(e)) from None
    header, meta = dict(parsed.tensors), parsed.metadata
    if meta is None:
        raise bad("metadata missing or not a map of strings")
    fmt = meta.get("format")
    if fmt not in TENSORS:
        raise bad(f"format {fmt!r} is not {FORMAT!r} or {HIDDEN_FORMAT!r}")
    if meta.get("version") != VERSION:
        raise bad(f"format version {meta.get('version')!r}, this fideval reads {VERSION}")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise bad(f"metadata lacks {', '.join(missing)}")
    if meta["kind"] not in KINDS or (meta["kind"] == "hidden") != (fmt == HIDDEN_FORMAT):
        raise bad(f"kind {meta['kind']!r} does not fit format {fmt!r}")
    tensor, dtypes = TENSORS[fmt]
    if set(header) != {tensor, "token_ids"}:
        raise bad(f"tensors {sorted(header)} are not exactly {tensor} and token_ids")
    data_start, data_bytes = parsed.data_start, parsed.data_bytes
    for key, want_dtypes, want_ndim in ((tensor, dtypes, 2), ("token_ids", ("I32",), 1)):
        t = header[key]
        if t.dtype not in want_dtypes:
            raise bad(f"{key} dtype {t.dtype!r} is not {' or '.join(want_dtypes)}")
        if len(t.shape) != want_ndim:
            raise bad(f"{key} shape {list(t.shape)} is not {want_ndim} non-negative integers")
        if t.start % 4:
            raise bad(f"{key} data is not 4-byte aligned")
    spans = sorted((t.start - data_start, t.start - data_start + t.nbytes) for t in header.values())
    if spans[0][0] != 0 or spans[0][1] != spans[1][0] or spans[1][1] != data_bytes:
        raise bad(f"tensor bytes do not exactly fill the {data_bytes} data bytes (truncated or padded)")
    rows, vocab = header[tensor].shape
    (length,) = header["token_ids"].shape
    width_key = "hidden_size" if tensor == "hidden" else "vocab_size"
    try:
        vocab_meta, row_start = int(meta.get(width_key, "")), int(meta["row_start"])
    except ValueError:
        raise bad(f"{width_key} or row_start is not an integer") from None
    if vocab != vocab_meta:
        raise bad(f"{tensor} have {vocab} columns, metadata says {width_key} {vocab_meta}")
    if not 0 <= row_start < max(length, 1) or rows not in (length - row_start, length - row_start - 1):
        raise bad(f"{rows} {tensor} rows do not fit {length} tokens from row_start {row_start}")
    return ShardHeader(meta=meta, rows=rows, vocab=vocab, length=length, row_start=row_start,
                       logits_offset=header[tensor].start, token_ids_offset=header["token_ids"].start,
                       file_bytes=file_bytes, tensor=tensor, dtype=header[tensor].dtype)


def data_rows(path: Path, head: ShardHeader):
    """A shard's data tensor (logits or hidden states) as a torch tensor in its own dtype over a read-only memory map of
    the file (no host memory until rows are touched), at the offsets ``head`` (its checked header) gives."""
    import torch

    from fideval.store.feed import mapped_tensor

    npd, name = DATA_DTYPES[head.dtype]
    dtype = getattr(torch, name)
    if not head.rows:
        return torch.empty((0, head.vocab), dtype=dtype)
    arr = np.memmap(path, dtype=npd, mode="r", offset=head.logits_offset, shape=(head.rows, head.vocab))
    return mapped_tensor(arr).view(dtype)


def read_header(path: Path, name: str | None = None) -> ShardHeader:
    """Parse a shard's header from disk, reading only the header bytes."""
    name = name or Path(path).name
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            first = f.read(8)
            n = int.from_bytes(first, "little") if len(first) == 8 else 0
            prefix = first + (f.read(n) if 2 <= n <= MAX_HEADER and 8 + n <= size else b"")
    except OSError as e:
        raise FidevalError(f"shard {name}: cannot read ({e.strerror})", hint="check the store folder") from None
    return parse_header(prefix, size, name)
