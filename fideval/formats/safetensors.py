"""The one safetensors header reader: bounded before anything is allocated, every entry checked.

Three places read safetensors headers (the layer-by-layer checkpoint reader, the logit-store shards, the
shape-only inspection of a checkpoint) and they used to parse them three ways. The layout is simple (an
8-byte little-endian length ``n``, ``n`` bytes of JSON, then the data), so we parse it here, without
``safetensors.safe_open``: a hostile length is refused before a byte is read past it, a header nested deeper than
:data:`fideval.formats.nesting.MAX_DEPTH` levels is refused (not a ``RecursionError``), and an entry whose
dtype, shape and byte range disagree, or that leaves the file, is refused with its name. Callers add what
the file is (a checkpoint, a shard) to the message and their own fix: :class:`HeaderError` carries only
*what* is wrong.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from fideval.formats import nesting

# bits per element of every safetensors dtype fideval reads (the F8 variants included)
DTYPE_BITS = {"F64": 64, "F32": 32, "BF16": 16, "F16": 16, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "I64": 64,
              "I32": 32, "I16": 16, "I8": 8, "U8": 8, "BOOL": 8}
FLOAT_DTYPES = {"F64", "F32", "BF16", "F16"}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's own limit


class HeaderError(ValueError):
    """What is wrong with a header, in words a caller puts after the file's name."""


@dataclass(frozen=True)
class Entry:
    """One tensor of a header. ``start`` is the absolute offset of its first byte in the file."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


@dataclass(frozen=True)
class Header:
    tensors: dict[str, Entry]
    metadata: dict[str, str] | None
    data_start: int  # 8 + the header's length: where the data bytes begin
    file_bytes: int

    @property
    def data_bytes(self) -> int:
        return self.file_bytes - self.data_start


def _entry(name: str, v: object, data_start: int, data_bytes: int) -> Entry:
    key = name if len(name) <= 120 else name[:117] + "..."  # how messages show it: a hostile header can be 100 MB
    if not isinstance(v, dict):
        raise HeaderError(f"tensor {key!r} has a malformed header entry ({v!r:.40})")
    dtype, shape, offs = v.get("dtype"), v.get("shape"), v.get("data_offsets")
    if (not isinstance(shape, list) or not all(type(s) is int and 0 <= s < 1 << 62 for s in shape)
            or not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)):
        raise HeaderError(f"tensor {key!r} has a malformed header entry (shape {shape!r:.40}, data_offsets {offs!r:.40})")
    if dtype not in DTYPE_BITS:
        raise HeaderError(f"tensor {key!r} has dtype {dtype!r:.20}, which fideval does not read")
    a, b = offs
    if not 0 <= a <= b <= data_bytes:
        raise HeaderError(f"tensor {key!r}: byte range {offs!r} lies outside the {data_bytes} data bytes "
                          f"(header and file are inconsistent: truncated?)")
    need = math.prod(shape) * DTYPE_BITS[dtype] // 8
    if need != b - a:
        raise HeaderError(f"tensor {key!r} has an impossible header entry: {key} shape {shape} needs {need} bytes "
                          f"of {dtype}, its byte range holds {b - a} (inconsistent)")
    return Entry(dtype, tuple(shape), data_start + a, b - a)


def header_length(first8: bytes, file_bytes: int, max_header: int = MAX_HEADER) -> int:
    """The header length the first 8 bytes claim, refused unless it fits ``max_header`` and the file."""
    if file_bytes < 8 or len(first8) < 8:
        raise HeaderError(f"only {file_bytes} bytes, too short for a safetensors header")
    n = int.from_bytes(bytes(first8[:8]), "little")
    if n < 2 or n > max_header or 8 + n > file_bytes:
        raise HeaderError(f"header length {n} is impossible for a {file_bytes}-byte file")
    return n


def parse(prefix: bytes | memoryview, file_bytes: int, max_header: int = MAX_HEADER) -> Header:
    """Parse a header held in ``prefix`` (the file's first bytes, at least the length and the header)."""
    n = header_length(prefix[:8], file_bytes, max_header)
    if len(prefix) < 8 + n:
        raise HeaderError("header truncated")
    try:
        raw = nesting.loads(bytes(prefix[8:8 + n]).decode("utf-8"))
    except nesting.TooDeep:  # json's own RecursionError included: a hostile header is one line too
        raise HeaderError(f"header is nested deeper than {nesting.MAX_DEPTH} levels") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HeaderError("header is not valid JSON") from None
    if not isinstance(raw, dict):
        raise HeaderError("header is not a JSON object")
    meta = raw.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict)
                             or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        raise HeaderError("metadata is not a map of strings")
    data_start = 8 + n
    tensors = {str(k): _entry(str(k), v, data_start, file_bytes - data_start) for k, v in raw.items()}
    return Header(tensors=tensors, metadata=meta, data_start=data_start, file_bytes=file_bytes)


def read(path: str | os.PathLike, max_header: int = MAX_HEADER) -> Header:
    """Read and parse the header of the file at ``path``, reading only the header's bytes. An unreadable file
    raises :class:`OSError`; a bad header :class:`HeaderError`."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(8)
        n = header_length(first, size, max_header)
        return parse(first + f.read(n), size, max_header)


def folder_shapes(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{tensor name: (shape, dtype)}`` from the headers of every ``*.safetensors`` file in ``folder``
    (no tensor data is read), each header checked as :func:`read` does."""
    from fideval.errors import FidevalError

    folder = Path(folder)
    if not folder.is_dir():
        raise FidevalError(f"{folder}: not a folder", hint="give a checkpoint folder with *.safetensors files")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FidevalError(f"{folder}: no *.safetensors files", hint="give a Hugging Face checkpoint folder")
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in files:
        try:
            header = read(f)
        except (OSError, HeaderError) as e:
            raise FidevalError(f"{f}: not a readable safetensors file ({e})",
                               hint="the file is truncated or not safetensors; re-download the checkpoint") from None
        out.update({k: (e.shape, e.dtype) for k, e in header.tensors.items()})
    return out


TORCH_CODES = {"float64": "F64", "float32": "F32", "bfloat16": "BF16", "float16": "F16", "int64": "I64", "int32": "I32",
               "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def sorted_header(entries: dict[str, tuple[str, list[int], int]], meta: dict[str, str] | None) -> bytes:
    """A safetensors file's first bytes (the 8-byte length and the JSON header) for tensors laid out one after
    another in ``entries``' order (name -> (dtype code, shape, byte count)), with every key sorted: the same content
    gives the same bytes in every process (the safetensors library writes its metadata in hash-map order)."""
    header: dict[str, object] = {"__metadata__": dict(meta)} if meta else {}
    at = 0
    for name, (code, shape, n) in entries.items():
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)
    return len(raw).to_bytes(8, "little") + raw


def encode(tensors: dict, meta: dict[str, str] | None = None) -> bytes:
    """A small safetensors file's bytes (CPU torch tensors, little-endian) with :func:`sorted_header`."""
    import numpy as np
    import torch

    entries, blobs = {}, []
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        code = TORCH_CODES[str(t.dtype).removeprefix("torch.")]
        arr = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
        blob = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False)).tobytes()
        entries[name] = (code, list(t.shape), len(blob))
        blobs.append(blob)
    return sorted_header(entries, meta) + b"".join(blobs)
