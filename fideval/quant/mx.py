"""OCP Microscaling (MX v1.0): blocks of 32 elements sharing one E8M0 (power-of-two) scale.

Two encoder recipes, because real producers disagree and the difference is measurable:

* ``floor`` -- the spec's (OCP MX v1.0 section 6.3): shared_exp = floor(log2(amax)) - emax_elem. The
  largest element can land above the element max (up to 2**(emax+1) - ulp) and is then saturated: for FP4
  a block whose amax has mantissa >= 1.5 loses its top value to 6*scale.
* ``rceil`` -- NVIDIA's and the gpt-oss producer's: scale = amax / elem_max rounded *up* to a power of
  two (bit trick: add the mantissa mask, keep the exponent field). Nothing saturates, but small values
  get a coarser grid than ``floor`` gives them.

Both take exponents from the float's bits (the exponent field), never from
``log2`` of a float, which rounds the largest float below 2**k up to k. Elements are cast
round-half-to-even with saturation (:func:`fideval.quant.elements.cast`). An all-zero block gets E8M0
code 0 (2**-127) and zero elements.
"""

from __future__ import annotations

import torch

from fideval.quant.base import Encoded, Format
from fideval.quant.elements import (
    E2M1,
    E2M3,
    E3M2,
    E4M3,
    E5M2,
    ElementFormat,
    cast,
    ceil_pow2_exponent,
    e8m0_decode,
    e8m0_encode,
    floor_log2,
    from_codes,
    pow2,
    to_codes,
)

MX_BLOCK = 32


def mx_scale_exponent(amax: torch.Tensor, elem: ElementFormat, recipe: str) -> torch.Tensor:
    """Shared exponent (int32, clamped to E8M0's [-127, 127]) of blocks with absolute maxima ``amax``."""
    if recipe == "floor":
        e = floor_log2(torch.where(amax > 0, amax, torch.ones_like(amax))) - elem.emax
        e = torch.where(amax > 0, e, torch.full_like(e, -127))
    elif recipe == "rceil":
        # amax / elem.max in float32 (one correctly rounded division, as the producers do), then round up. A tensor
        # divisor: torch's CUDA kernel multiplies by the reciprocal of a Python scalar (an ulp off, often)
        e = ceil_pow2_exponent(amax.float() / amax.new_tensor(elem.max, dtype=torch.float32))
    else:  # pragma: no cover - resolve_recipe guards this
        raise ValueError(recipe)
    return e.clamp(-127, 127)


class MXFormat(Format):
    recipes = ("floor", "rceil")
    default_recipe = "floor"
    groups = (MX_BLOCK,)
    default_group = MX_BLOCK

    def __init__(self, name: str, elem: ElementFormat):
        self.name = name
        self.elem = elem
        self.element_bits = elem.bits
        self.description = f"OCP MX: {elem.name.upper()} elements, one E8M0 scale per 32"

    def scale_bits(self, recipe=None) -> float:
        return 8.0

    def _qdq_kernel(self, x, recipe, group, out) -> bool:
        """CUDA + Triton: one kernel for the whole tensor, the torch path's bits (:mod:`fideval.quant.weight_kernel`)."""
        from fideval.quant import weight_kernel

        return weight_kernel.usable(x, out) and weight_kernel.mx_qdq(x, out, self.elem, recipe, self.name)

    def _values(self, x2, recipe, group):
        """Element values (float32, on the element grid) and shared exponents of ``[n, group]`` blocks."""
        blocks = x2.reshape(-1, group)
        e = mx_scale_exponent(blocks.abs().amax(dim=-1), self.elem, recipe)
        return cast(blocks * pow2(-e).unsqueeze(-1), self.elem), e  # exact: multiply by a power of two

    def _encode(self, x2, recipe, group, shape, dtype) -> Encoded:
        q, e = self._values(x2, recipe, group)
        return Encoded(self.name, recipe, group, shape, dtype, to_codes(q, self.elem).reshape(shape),
                       e8m0_encode(e).reshape(*shape[:-1], shape[-1] // group))

    def _qdq(self, x2, recipe, group, shape, dtype):
        q, e = self._values(x2, recipe, group)
        return (q * pow2(e).unsqueeze(-1)).reshape(shape).to(dtype)  # exact, even into the subnormals

    def decode(self, enc: Encoded) -> torch.Tensor:
        return mx_decode(enc.codes, enc.scales, self.elem, enc.group).reshape(enc.shape).to(enc.dtype)


def mx_decode(codes: torch.Tensor, scale_codes: torch.Tensor, elem: ElementFormat, group: int = MX_BLOCK) -> torch.Tensor:
    """float32 values of MX element codes ``[..., n]`` with E8M0 scale codes ``[..., n // group]``."""
    vals = from_codes(codes, elem).reshape(*scale_codes.shape, group)
    return (vals * e8m0_decode(scale_codes).unsqueeze(-1)).reshape(codes.shape)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Two E2M1 codes per byte, low nibble first (the gpt-oss, OCP and GGUF-MXFP4-within-half order):
    ``[..., n/2]`` uint8 -> ``[..., n]`` uint8 codes."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_fp4`."""
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)


def decode_gpt_oss_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Decode gpt-oss-style MXFP4 safetensors: ``*_blocks`` uint8 ``[..., G, 16]`` (32 E2M1 codes per
    block, low nibble first) and ``*_scales`` uint8 ``[..., G]`` (E8M0). Returns float32 ``[..., G*32]``.

    (gpt-oss stores expert weights as ``[E, out, G, 16]``: the last dim of the result is the input dim.)"""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        from fideval.errors import FidevalError

        raise FidevalError(f"MXFP4 blocks/scales must be uint8, got {blocks.dtype}/{scales.dtype}")
    if tuple(blocks.shape[:-1]) != tuple(scales.shape) or blocks.shape[-1] != MX_BLOCK // 2:
        from fideval.errors import FidevalError

        raise FidevalError(
            f"MXFP4 blocks {list(blocks.shape)} do not match scales {list(scales.shape)}",
            hint="expected blocks [..., G, 16] and scales [..., G]",
        )
    codes = unpack_fp4(blocks)  # [..., G, 32]
    vals = from_codes(codes, E2M1) * e8m0_decode(scales).unsqueeze(-1)
    return vals.reshape(*scales.shape[:-1], scales.shape[-1] * MX_BLOCK)


MXFP4 = MXFormat("mxfp4", E2M1)
MXFP6_E2M3 = MXFormat("mxfp6_e2m3", E2M3)
MXFP6_E3M2 = MXFormat("mxfp6_e3m2", E3M2)
MXFP8_E4M3 = MXFormat("mxfp8_e4m3", E4M3)
MXFP8_E5M2 = MXFormat("mxfp8_e5m2", E5M2)

DEFINES = (MXFP4, MXFP6_E2M3, MXFP6_E3M2, MXFP8_E4M3, MXFP8_E5M2)  # fideval.quant.base.FORMATS names this module for them
