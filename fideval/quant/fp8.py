"""FP8 E4M3 weights with 128x128 block scales, DeepSeek-V3 style.

DeepSeek's checkpoints store ``weight`` as float8_e4m3fn and ``weight_scale_inv`` as float32 of shape
``[ceil(out/128), ceil(in/128)]``: the dequantized weight is ``fp8 * weight_scale_inv`` tile by tile. The
encoder recipe follows their ``weight_quant``: s = amax(tile) / 448, q = cast(clamp(w / s)). Recipe
``ue8m0`` (DeepSeek-V3.1+ ``scale_fmt: ue8m0``) rounds s up to a power of two from its bits, so the
scale itself is exactly an E8M0 value and nothing saturates.

Tiles are 2-D over the last two dims (``[out, in]`` or ``[E, out, in]``; a 1-D tensor is one row). Edge
tiles may be partial, exactly like DeepSeek's own checkpoints (whose dims are not all multiples of 128):
the amax is taken over the elements that exist. An all-zero tile gets scale 1 (its codes are zero).
"""

from __future__ import annotations

import math

import torch

from fideval.quant.base import Encoded, Format
from fideval.quant.elements import E4M3, cast, ceil_pow2_exponent, pow2, to_codes

FP8_TILE = 128


def _tiles(x3: torch.Tensor, t: int) -> tuple[torch.Tensor, int, int]:
    """Zero-pad ``[B, R, C]`` to multiples of t and view it as ``[B, R/t, t, C/t, t]``."""
    b, r, c = x3.shape
    rp, cp = -(-r // t) * t, -(-c // t) * t
    if (rp, cp) != (r, c):
        x3 = torch.nn.functional.pad(x3, (0, cp - c, 0, rp - r))
    return x3.reshape(b, rp // t, t, cp // t, t), rp, cp


def fp8_scale(amax: torch.Tensor, recipe: str) -> torch.Tensor:
    """float32 dequant scale (``weight_scale_inv``) from tile/block amax: amax/448, or its UE8M0 ceiling."""
    s = amax.float() / amax.new_tensor(E4M3.max, dtype=torch.float32)  # a tensor: CUDA would multiply by 1/448
    if recipe == "ue8m0":
        s = pow2(ceil_pow2_exponent(s))
    return torch.where(amax > 0, s, torch.ones_like(s))


class FP8Block(Format):
    name = "fp8_block"
    recipes = ("fp32", "ue8m0")
    default_recipe = "fp32"
    groups = (FP8_TILE,)
    default_group = FP8_TILE
    element_bits = 8
    description = "FP8 E4M3, one float32 scale per 128x128 tile (DeepSeek-V3 weight_scale_inv)"

    def scale_bits(self, recipe=None) -> float:
        return 8.0 if recipe == "ue8m0" else 32.0

    def bits_per_weight(self, group=None, recipe=None) -> float:
        g = self.resolve_group(group)
        return 8 + self.scale_bits(recipe) / (g * g)

    def storage_bits(self, shape, group=None, recipe=None) -> int:
        g = self.resolve_group(group)
        shape = tuple(shape) if len(shape) >= 2 else (1, *shape)
        lead = math.prod(shape[:-2])
        tiles = lead * math.ceil(shape[-2] / g) * math.ceil(shape[-1] / g)
        return int(math.prod(shape) * 8 + tiles * self.scale_bits(recipe))

    def check_divides(self, shape, g) -> None:  # partial edge tiles are allowed (see module docstring)
        return None

    def _qdq_kernel(self, x, recipe, group, out) -> bool:
        """CUDA + Triton: one kernel for the whole tensor, the torch path's bits (:mod:`fideval.quant.weight_kernel`)."""
        from fideval.quant import weight_kernel

        return weight_kernel.usable(x, out) and weight_kernel.fp8_block_qdq(x, out, recipe, group, self.name)

    def _values(self, x2, recipe, group, shape):
        """E4M3 values ``[B, R, C]`` and per-tile scales ``[B, R/t, C/t]`` (edge tiles partial)."""
        rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, x2.shape[-1])
        t, rp, cp = _tiles(x2.reshape(-1, rows, cols), group)
        s = fp8_scale(t.abs().amax(dim=(2, 4)), recipe)
        q = cast((t / s[:, :, None, :, None]).clamp(-E4M3.max, E4M3.max), E4M3)
        return q, s, rows, cols, rp, cp

    def _encode(self, x2, recipe, group, shape, dtype) -> Encoded:
        q, s, rows, cols, rp, cp = self._values(x2, recipe, group, shape)
        q = q.reshape(-1, rp, cp)[:, :rows, :cols]
        lead = tuple(shape[:-2]) if len(shape) >= 2 else ()
        return Encoded(self.name, recipe, group, shape, dtype, to_codes(q, E4M3).reshape(shape),
                       s.reshape(*lead, s.shape[-2], s.shape[-1]))

    def _qdq(self, x2, recipe, group, shape, dtype):
        q, s, rows, cols, rp, cp = self._values(x2, recipe, group, shape)
        y = (q * s[:, :, None, :, None]).reshape(-1, rp, cp)[:, :rows, :cols]
        return y.reshape(shape).to(dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        return fp8_block_decode(enc.codes, enc.scales, enc.group).reshape(enc.shape).to(enc.dtype)


def fp8_block_decode(codes: torch.Tensor, scale_inv: torch.Tensor, tile: int = FP8_TILE) -> torch.Tensor:
    """float32 weights from E4M3 codes (uint8, or a float8_e4m3fn tensor as stored by DeepSeek) ``[..., R, C]``
    and ``weight_scale_inv`` ``[..., ceil(R/t), ceil(C/t)]``."""
    w8 = codes.view(torch.float8_e4m3fn) if codes.dtype == torch.uint8 else codes
    if w8.dim() == 1:
        w8, scale_inv = w8.unsqueeze(0), scale_inv.reshape(1, -1)
    return dequant_blocks(w8, scale_inv, (tile, tile), torch.float32)


DEQUANT_PIECE = 1 << 24  # elements of float32 temporaries per step of dequant_blocks


def dequant_blocks(w8: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (FP8_TILE, FP8_TILE),
                   dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """DeepSeek's ``weight_dequant``: ``w8.to(float32) * scale_inv`` per ``block`` tile (edge tiles partial),
    rounded once to ``dtype`` (float32 keeps the product), on ``w8``'s device.

    ``w8`` float8 ``[R, C]`` or ``[B, R, C]``, ``scale_inv`` ``[..., ceil(R/b0), ceil(C/b1)]``; ``out``, when given,
    is filled (a view, e.g. the gate rows of a fused experts tensor). Works in steps of whole row tiles of about
    ``DEQUANT_PIECE`` elements, so a fused experts tensor never has a float32 copy of itself; the scales are
    expanded over rows only and broadcast over the columns of a tile."""
    b0, b1 = block
    if w8.dim() not in (2, 3) or scale_inv.shape[:-2] != w8.shape[:-2]:
        raise ValueError(f"dequant_blocks: weight {list(w8.shape)} with scales {list(scale_inv.shape)}")
    rows, cols = w8.shape[-2:]
    if tuple(scale_inv.shape[-2:]) != (-(-rows // b0), -(-cols // b1)):
        raise ValueError(f"dequant_blocks: scales {list(scale_inv.shape)} do not tile {list(w8.shape)} in {b0}x{b1} blocks")
    y = torch.empty(w8.shape, dtype=dtype, device=w8.device) if out is None else out
    if tuple(y.shape) != tuple(w8.shape):
        raise ValueError(f"dequant_blocks: out {list(y.shape)} for weight {list(w8.shape)}")
    w3, s3, y3 = (w8, scale_inv, y) if w8.dim() == 3 else (w8[None], scale_inv[None], y[None])
    full, rem = divmod(cols, b1)
    step = max(b0, DEQUANT_PIECE // max(cols, 1) // b0 * b0)  # rows per step, whole tiles
    mats = max(1, DEQUANT_PIECE // max(rows * cols, 1))  # matrices per step when one is small
    for m in range(0, w3.shape[0], mats):
        for r in range(0, rows, step):
            x = w3[m:m + mats, r:r + step].to(torch.float32)
            s = s3[m:m + mats, r // b0:-(-(r + x.shape[1]) // b0)].to(torch.float32)
            s = s.repeat_interleave(b0, dim=-2)[:, :x.shape[1]]  # [.., rows, ceil(C/b1)]
            x[..., :full * b1].unflatten(-1, (full, b1)).mul_(s[..., :full, None])
            if rem:
                x[..., full * b1:].mul_(s[..., full:])
            y3[m:m + mats, r:r + step] = x
    return y


FP8_BLOCK = FP8Block()

DEFINES = (FP8_BLOCK,)  # fideval.quant.base.FORMATS names this module for them
