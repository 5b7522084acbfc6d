"""A Hugging Face safetensors checkpoint read one layer at a time, with every header checked before use.

Why not ``safetensors.safe_open`` for everything: we want each layer's bytes to land straight in a
(pinned) buffer we own, read on a background thread, so the copy to the GPU can overlap compute, and
we want byte ranges of fused expert tensors (a model-parallel rank reads only its experts). So we parse
the header with :mod:`fideval.formats.safetensors` (bounded, every entry checked against the file) and
``readinto`` the ranges.
A bad header, a tensor past the end of its file, or a key missing from the index is a one-line
:class:`~fideval.errors.FidevalError` naming the file.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from fideval.errors import FidevalError
from fideval.formats import nesting, safetensors
from fideval.model.weights.reading import reader_pool

MAX_HEADER = safetensors.MAX_HEADER
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
if hasattr(torch, "float8_e4m3fn"):
    DTYPES["F8_E4M3"] = torch.float8_e4m3fn
    DTYPES["F8_E5M2"] = torch.float8_e5m2
if hasattr(torch, "float8_e8m0fnu"):  # power-of-two block scales (DeepSeek-V4.1's FP8/FP4 weights, MX formats)
    DTYPES["F8_E8M0"] = torch.float8_e8m0fnu


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def _parse_header(path: Path) -> dict[str, TensorInfo]:
    try:
        header = safetensors.read(path, MAX_HEADER)
    except OSError as e:
        raise FidevalError(f"{path}: unreadable safetensors header ({e.strerror or type(e).__name__})",
                           hint="re-download the checkpoint") from None
    except safetensors.HeaderError as e:
        raise FidevalError(f"{path}: {e}", hint="the file is truncated or not safetensors; re-download it") from None
    out: dict[str, TensorInfo] = {}
    for key, e in header.tensors.items():
        if e.dtype not in DTYPES:
            raise FidevalError(f"{path}: tensor {key!r} has dtype {e.dtype}, which this torch cannot hold",
                               hint="upgrade torch, or convert the checkpoint")
        out[key] = TensorInfo(path, DTYPES[e.dtype], e.shape, e.start, e.nbytes)
    return out


class TensorMeta(Protocol):
    """What the runner needs to know about a tensor before reading it."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@runtime_checkable
class WeightSource(Protocol):
    """Where the runner's weights come from, tensor by tensor, under the reference model's Hugging Face names:
    this module's :class:`Checkpoint` (the teacher and emulated candidates) or a real quantized build
    (:class:`~fideval.model.weights.quantized.QuantizedCheckpoint`, :class:`~fideval.model.weights.quantized.GGUFCheckpoint`),
    which decodes its tensors to floats on read. ``config_dict`` is the reference's config.json, read from
    ``config_dir``; ``dir`` is what error messages name. An optional ``release`` attribute says how ``read``'s
    tensors are stored: a :class:`~fideval.model.weights.fp8_release.Release` when they are an FP8 release's fp8
    weights and ``_scale_inv`` scales (the runner dequantizes them on its device), None or absent when they
    are floats."""

    dir: Path
    config_dir: Path
    config_dict: dict

    def __contains__(self, key: str) -> bool: ...

    def info(self, key: str) -> TensorMeta: ...

    def read(self, key: str, rows: tuple[int, int] | None = None, pin: bool = False,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """The tensor (or rows ``[lo, hi)`` of its first dimension), optionally into pinned memory or ``out``."""
        ...


PIECE = 64 << 20
def _read_into(file: Path, start: int, view: memoryview, key: str) -> None:
    with open(file, "rb", buffering=0) as f:
        f.seek(start)
        got, n = 0, len(view)
        while got < n:
            k = f.readinto(view[got:])
            if not k:
                raise FidevalError(f"{file}: unexpected end of file reading {key!r}", hint="re-download the checkpoint")
            got += k


class Checkpoint:
    """The tensor directory of one checkpoint folder (``config.json`` + safetensors, single or sharded)."""

    def __init__(self, model_dir: str | os.PathLike):
        self.dir = self.config_dir = Path(model_dir)
        cfg = self.dir / "config.json"
        if not cfg.is_file():
            raise FidevalError(f"{cfg} not found", hint="--model must be a Hugging Face checkpoint folder with config.json")
        try:
            self.config_dict = nesting.loads(cfg.read_text())
        except (OSError, ValueError) as e:
            raise FidevalError(f"{cfg} is not valid JSON ({type(e).__name__})", hint="fix or re-download config.json") from None
        self.tensors: dict[str, TensorInfo] = {}
        index = self.dir / INDEX
        if index.is_file():
            try:
                weight_map = nesting.loads(index.read_text())["weight_map"]
                files = sorted(set(weight_map.values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                raise FidevalError(f"{index} has no valid weight_map", hint="re-download the checkpoint") from None
            for name in files:
                p = (self.dir / name).resolve()
                if p.parent != self.dir.resolve() or not p.is_file():
                    raise FidevalError(f"{index} names shard {name!r}, which is missing or outside the folder",
                                       hint="download every shard listed in the index")
                self.tensors.update(_parse_header(p))
            missing = [k for k in weight_map if k not in self.tensors]
            if missing:
                raise FidevalError(f"{index} lists {missing[0]!r} but no shard holds it ({len(missing)} such)",
                                   hint="re-download the checkpoint")
        elif (self.dir / SINGLE).is_file():
            self.tensors = _parse_header(self.dir / SINGLE)
        else:
            raise FidevalError(f"{self.dir} has neither {SINGLE} nor {INDEX}",
                               hint="only safetensors checkpoints are read (never .bin/.pt)")

    @functools.cached_property
    def release(self):
        """The FP8 release format ``config.json`` declares (:func:`fideval.model.weights.fp8_release.detect`), None for
        an unquantized checkpoint; a quantization this reader cannot take is a one-line error here."""
        from fideval.model.weights.fp8_release import detect

        return detect(self.config_dict, self.dir / "config.json")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return [k for k in self.tensors if k.startswith(prefix)]

    def info(self, key: str) -> TensorInfo:
        try:
            return self.tensors[key]
        except KeyError:
            raise FidevalError(f"{self.dir}: tensor {key!r} is missing from the checkpoint",
                               hint="the checkpoint is incomplete or not of the architecture config.json names") from None

    def read(self, key: str, rows: tuple[int, int] | None = None, pin: bool = False,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """Read one tensor (or rows ``[lo, hi)`` of its first dimension) into fresh, optionally pinned memory,
        or into ``out`` (a contiguous CPU tensor of the same dtype and element count) without a copy."""
        info = self.info(key)
        shape, start, nbytes = info.shape, info.start, info.nbytes
        if rows is not None:
            lo, hi = rows
            if not shape or not 0 <= lo <= hi <= shape[0]:
                raise FidevalError(f"{self.dir}: tensor {key!r} of shape {list(shape)} has no rows {lo}..{hi}",
                                   hint="the checkpoint does not match config.json")
            row = nbytes // shape[0] if shape[0] else 0
            shape, start, nbytes = (hi - lo, *shape[1:]), start + lo * row, (hi - lo) * row
        if out is None:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin and torch.cuda.is_available())
        else:
            if out.dtype != info.dtype or out.numel() * out.element_size() != nbytes or not out.is_contiguous():
                raise FidevalError(f"{self.dir}: tensor {key!r} ({info.dtype}, shape {list(shape)}) does not fit its slot "
                                   f"({out.dtype}, shape {list(out.shape)})", hint="the checkpoint does not match config.json")
            buf = out.view(-1).view(torch.uint8) if nbytes else out
        if nbytes:
            view = memoryview(buf.numpy())
            pieces = [(a, min(a + PIECE, nbytes)) for a in range(0, nbytes, PIECE)]
            if len(pieces) == 1 or threading.current_thread().name.startswith("fideval-read"):  # no nested waits
                _read_into(info.file, start, view, key)
            else:  # page cache -> memory copies run at a few GB/s per thread; several threads fill one tensor
                list(reader_pool().map(lambda ab: _read_into(info.file, start + ab[0], view[ab[0]:ab[1]], key), pieces))
        return out if out is not None else buf.view(info.dtype).view(shape)


def open_weights(weights: WeightSource | str | Path) -> WeightSource:
    """``weights`` itself, or the safetensors checkpoint in the folder it names."""
    return Checkpoint(weights) if isinstance(weights, (str, Path)) else weights
