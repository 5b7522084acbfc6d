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

from fideval.quant.base import Encoded, Format, register
from fideval.quant.elements import E4M3, cast, ceil_pow2_exponent, from_codes, pow2, to_codes

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
    s = amax.float() / E4M3.max
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
    if codes.dtype == torch.float8_e4m3fn:
        codes = codes.view(torch.uint8)
    if codes.dim() == 1:
        codes, scale_inv = codes.unsqueeze(0), scale_inv.reshape(1, -1)
    vals = from_codes(codes, E4M3)
    r, c = vals.shape[-2:]
    s = scale_inv.float().repeat_interleave(tile, dim=-2).repeat_interleave(tile, dim=-1)[..., :r, :c]
    return vals * s


FP8_BLOCK = register(FP8Block())
