"""The one small interface every quantization format implements, and the registry that names them.

A format is an ``encode(x, recipe, group) -> Encoded`` / ``decode(Encoded) -> Tensor`` pair (the
gpt-fast shape: make the quantized state, turn it back into numbers). The *recipe* is the producer's
rule for choosing scales and rounding (e.g. MX ``floor`` vs ``rceil``): two builds of "the same" format
differ exactly there, so it is a first-class, named argument rather than a flag buried in a kernel.

Blocks run along the last (input/reduction) dimension, so ``[out, in]`` weights and ``[E, out, in]``
fused expert tensors are handled alike. Formats whose block does not divide the last dimension raise a
one-line :class:`FidevalError` rather than padding silently (``fp8_block`` is the documented exception:
like DeepSeek's checkpoints it allows partial edge tiles).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from fideval.errors import FidevalError


@dataclass
class Encoded:
    """The packed state of one tensor: element codes, block scales and whatever else the format needs."""

    format: str
    recipe: str
    group: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    codes: torch.Tensor  # uint8 code per element (int16 for INT formats), or raw block bytes for GGUF types
    scales: torch.Tensor | None = None  # per-block scales (float32, or uint8 codes for E8M0/E4M3 scales)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # zero points, tensor scales...


class Format:
    """Base class: subclasses set the class attributes and implement ``_encode``/``decode``."""

    name: str = ""
    recipes: tuple[str, ...] = ()
    default_recipe: str = ""
    groups: tuple[int, ...] | None = None  # allowed group sizes; None = any positive divisor
    default_group: int = 32
    element_bits: int = 8
    description: str = ""

    # -- bookkeeping -----------------------------------------------------------------------------
    def scale_bits(self, recipe: str | None = None) -> float:
        """Bits of per-group side data (scale, zero point...)."""
        raise NotImplementedError

    def bits_per_weight(self, group: int | None = None, recipe: str | None = None) -> float:
        """Storage bits per weight: element bits plus per-group side data spread over the group."""
        g = self.resolve_group(group)
        return self.element_bits + self.scale_bits(recipe) / g

    def storage_bits(self, shape: tuple[int, ...], group: int | None = None, recipe: str | None = None) -> int:
        """Exact bits to store a tensor of ``shape`` (formats with 2-D tiles override this)."""
        n = 1
        for d in shape:
            n *= d
        g = self.resolve_group(group)
        return int(round(n * self.element_bits + (n // g) * self.scale_bits(recipe)))

    # -- argument checks -------------------------------------------------------------------------
    def resolve_recipe(self, recipe: str | None) -> str:
        r = recipe or self.default_recipe
        if r not in self.recipes:
            raise FidevalError(
                f"format {self.name}: unknown recipe {r!r}", hint=f"use one of {', '.join(self.recipes)}"
            )
        return r

    def resolve_group(self, group: int | None) -> int:
        g = self.default_group if group is None else int(group)
        if g <= 0 or (self.groups is not None and g not in self.groups):
            allowed = ", ".join(map(str, self.groups)) if self.groups else "a positive integer"
            raise FidevalError(f"format {self.name}: group {group} is not allowed", hint=f"use {allowed}")
        return g

    def check_divides(self, shape: tuple[int, ...], g: int) -> None:
        last = shape[-1] if shape else 1
        if last % g:
            raise FidevalError(
                f"format {self.name}: block of {g} does not divide the last dimension {last} of a {list(shape)} tensor",
                hint="leave this module class unquantized or pick a format with a block that divides it",
            )

    # -- the interface ---------------------------------------------------------------------------
    def _prepare(self, x: torch.Tensor, recipe: str | None, group: int | None) -> tuple[str, int, tuple[int, ...]]:
        """Resolve recipe and group, and reject what no format can take (one-line errors)."""
        r = self.resolve_recipe(recipe)
        g = self.resolve_group(group)
        if not x.is_floating_point():
            raise FidevalError(f"format {self.name}: cannot quantize a {x.dtype} tensor", hint="pass float weights")
        shape = tuple(x.shape)
        self.check_divides(shape, g)
        return r, g, shape

    @torch.no_grad()
    def encode(self, x: torch.Tensor, recipe: str | None = None, group: int | None = None) -> Encoded:
        from fideval.quant.elements import check_finite

        r, g, shape = self._prepare(x, recipe, group)
        check_finite(x, f"format {self.name}")
        return self._encode(x.float().reshape(-1, shape[-1] if shape else 1), r, g, shape, x.dtype)

    def _encode(self, x2: torch.Tensor, recipe: str, group: int, shape: tuple, dtype: torch.dtype) -> Encoded:
        raise NotImplementedError

    def decode(self, enc: Encoded) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def quant_dequant(self, x: torch.Tensor, recipe: str | None = None, group: int | None = None,
                      out: torch.Tensor | None = None, *, kernel: bool = True) -> torch.Tensor:
        """Quantize then dequantize; same shape and dtype.

        Works matrix by matrix (``[E, out, in]`` -> E matrices, each with its own tensor-level scale where
        the format has one) and in chunks of whole 128-row tiles of about 2**24 elements, so a fused
        expert tensor of tens of GB never has more than a few hundred MB of float32 temporaries.

        ``out``: a tensor of ``x``'s shape and dtype to write the result into, ``x`` itself included (each chunk
        is read before it is written, and a matrix's context before any of its chunks): a runner that owns the
        tensor quantizes a fused expert tensor in place, with no second copy of it (any strides: a transposed
        view is written through).

        On CUDA with Triton, formats with a weight kernel (MX, ``fp8_block``: :mod:`fideval.quant.weight_kernel`) do
        the whole tensor in one launch with the same bits and one NaN/Inf check; ``kernel=False`` forces the torch
        path below (the kernels' oracle, for tests and bench/quant_throughput.py)."""
        from fideval.quant.elements import check_finite

        r, g, shape = self._prepare(x, recipe, group)
        if out is None:
            out = torch.empty(shape, dtype=x.dtype, device=x.device)
        elif tuple(out.shape) != shape or out.dtype != x.dtype or out.device != x.device:
            raise ValueError(f"out {tuple(out.shape)} {out.dtype} does not match x {shape} {x.dtype}")
        if kernel and self._qdq_kernel(x, r, g, out):
            return out
        rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1] if shape else 1)
        lead = shape[:-2] if len(shape) >= 2 else (1,)
        src, dst = (t[(None,) * (3 - t.dim())] if t.dim() < 2 else t for t in (x, out))  # views: [1, 1, cols]
        step = max(CHUNK_ROWS_MULTIPLE, (CHUNK_ELEMENTS // max(cols, 1)) // CHUNK_ROWS_MULTIPLE * CHUNK_ROWS_MULTIPLE)
        for idx in itertools.product(*map(range, lead)):  # views, never a reshape copy of a strided x
            s_m, d_m = src[idx], dst[idx]
            ctx = self.matrix_context(s_m)
            for i in range(0, rows, step):
                piece = s_m[i : i + step]
                check_finite(piece, f"format {self.name}")
                d_m[i : i + step] = self._qdq(piece.float(), r, g, tuple(piece.shape), x.dtype, **ctx)
        return out

    def _qdq(self, x2: torch.Tensor, recipe: str, group: int, shape: tuple, dtype: torch.dtype, **ctx) -> torch.Tensor:
        """Quantize-dequantize one chunk. Formats may override it with a shortcut that skips packing the
        codes; it must equal ``decode(_encode(...))`` bit for bit (tests/test_quant_base.py checks)."""
        return self.decode(self._encode(x2, recipe, group, shape, dtype, **ctx))

    def _qdq_kernel(self, x: torch.Tensor, recipe: str, group: int, out: torch.Tensor) -> bool:
        """Quantize-dequantize all of ``x`` into ``out`` with a device kernel, raising check_finite's error on NaN/Inf;
        False (nothing written) where there is none for this format, device or layout: the torch path runs."""
        return False

    def matrix_context(self, mat: torch.Tensor) -> dict:
        """Per-matrix quantities a chunk's encoder needs (NVFP4: the matrix amax); none by default."""
        return {}


# Chunking of quant_dequant: whole 128-row tiles (fp8_block), about 2**24 elements per chunk.
CHUNK_ROWS_MULTIPLE = 128
CHUNK_ELEMENTS = 1 << 24


# THE table of formats: name -> the module that defines it, imported on first use. Each of those modules imports
# this one (Format, Encoded), so the table names them instead of importing them (the shape of
# fideval.model.reference.driver.DRIVERS); a module lists its formats in ``DEFINES``. tests/test_quant_base.py checks
# that the table and the modules' ``DEFINES`` agree.
FORMATS: dict[str, str] = {
    "fp8_block": "fideval.quant.fp8",
    **{f"mx{k}": "fideval.quant.mx" for k in ("fp4", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3", "fp8_e5m2")},
    "nvfp4": "fideval.quant.nvfp4",
    "int4": "fideval.quant.intgroup",
    "int8": "fideval.quant.intgroup",
    **{f"gguf_{k}": "fideval.quant.gguf_formats" for k in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4")},
    **{f"gguf_{k}": "fideval.quant.gguf_ktypes" for k in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs")},
}
_LOADED: dict[str, Format] = {}


def get_format(name: str) -> Format:
    """The format named ``name``; one-line error listing the known names otherwise."""
    key = str(name).lower()
    module = FORMATS.get(key)
    if module is None:
        raise FidevalError(f"unknown quant format {name!r}", hint=f"known formats: {', '.join(sorted(FORMATS))}")
    if key not in _LOADED:
        import importlib

        _LOADED.update((f.name, f) for f in importlib.import_module(module).DEFINES)
    return _LOADED[key]


def quant_dequant(x: torch.Tensor, format: str, recipe: str | None = None, group: int | None = None) -> torch.Tensor:
    """Quantize then dequantize ``x`` (same shape and dtype), blocks along the last dimension."""
    return get_format(format).quant_dequant(x, recipe, group)
