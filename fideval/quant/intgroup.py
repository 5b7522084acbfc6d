"""Integer group-wise round-to-nearest (RTN) quantization: INT4/INT8, symmetric or asymmetric, groups
along the last dimension (32/64/128 typical; any divisor is accepted).

This is the baseline every calibrated method (GPTQ, AWQ) is measured against, with the storage they
use: the scale is a float16 (rounded *before* the codes are computed, so decode uses exactly the stored
scale), and an asymmetric zero point is an integer of the element width.

* ``sym``: scale = amax / qmax (qmax = 7 or 127), q = clamp(round(x / scale), -qmax-1, qmax).
* ``asym``: scale = (max - min) / (2**b - 1), zero = clamp(round(-min / scale), 0, 2**b - 1),
  q = clamp(round(x / scale) + zero, 0, 2**b - 1); decode (q - zero) * scale.

Rounding is half-to-even (``torch.round``). A constant-zero group gets scale 1 so it decodes to zeros.
"""

from __future__ import annotations

import torch

from fideval.quant.base import Encoded, Format


class IntGroup(Format):
    recipes = ("sym", "asym")
    default_recipe = "sym"
    groups = None
    default_group = 128

    def __init__(self, bits: int):
        self.name = f"int{bits}"
        self.element_bits = bits
        self.description = f"INT{bits} group-wise RTN, float16 scale per group (+ INT{bits} zero point if asym)"

    def scale_bits(self, recipe=None) -> float:
        return 16.0 + (self.element_bits if recipe == "asym" else 0)

    def _encode(self, x2, recipe, group, shape, dtype) -> Encoded:
        b = x2.reshape(-1, group)
        n = self.element_bits
        if recipe == "sym":
            qmax = 2 ** (n - 1) - 1
            # divisors as tensors: torch's CUDA kernel multiplies by the reciprocal of a Python scalar divisor
            scale = (b.abs().amax(-1, keepdim=True) / b.new_tensor(qmax, dtype=torch.float32)).to(torch.float16).float()
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            q = torch.round(b / scale).clamp(-qmax - 1, qmax)
            zero = None
        else:
            top = 2**n - 1
            mn, mx = b.amin(-1, keepdim=True), b.amax(-1, keepdim=True)
            scale = ((mx - mn) / b.new_tensor(top, dtype=torch.float32)).to(torch.float16).float()
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            zero = torch.round(-mn / scale).clamp(0, top)
            q = (torch.round(b / scale) + zero).clamp(0, top)
        lead = (*shape[:-1], shape[-1] // group)
        extra = {} if zero is None else {"zeros": zero.to(torch.uint8).reshape(lead)}
        codes = q.to(torch.int16).reshape(shape)  # signed for sym; kept wide so both recipes share a dtype
        return Encoded(self.name, recipe, group, shape, dtype, codes, scale.to(torch.float16).reshape(lead), extra)

    def decode(self, enc: Encoded) -> torch.Tensor:
        g = enc.group
        q = enc.codes.float().reshape(-1, g)
        s = enc.scales.float().reshape(-1, 1)
        if "zeros" in enc.extra:
            q = q - enc.extra["zeros"].float().reshape(-1, 1)
        return (q * s).reshape(enc.shape).to(enc.dtype)


INT4 = IntGroup(4)
INT8 = IntGroup(8)

DEFINES = (INT4, INT8)  # fideval.quant.base.FORMATS names this module for them
