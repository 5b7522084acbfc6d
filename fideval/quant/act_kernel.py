"""The serving path's activation quantize-dequantize (:func:`fideval.quant.activations.act_quant_e4m3`) as one
Triton kernel on CUDA: the same bits, one read and one write of the activations.

Why. A candidate's serving path quantizes every activation entering a quantized linear; for routed experts that
is each token's block input ``[H]`` and, inside the experts, the down projection's input ``[k, I]``. The torch
version is a dozen elementwise passes over float32 copies (the E4M3 rounding is built from the bits); measured
on an H100 (bench/evaluation.py, 2026-12-07) it took the MoE part of a DeepSeek-V3-sized candidate from 1.9 s
(the teacher's) to 7.6 s. Here each program loads a row's blocks once, and computes per block of ``block``
channels: ``amax`` clamped to at least 1e-4, ``s = amax / 448`` (or its power-of-two ceiling, ``ue8m0``),
``q = clamp(x / s, +-448)`` rounded to E4M3 half to even with the torch version's own arithmetic (not the
hardware conversion: Triton's interpreter does not round that one to even, and one rule on every device is
easier to defend), ``q * s`` in float32, then the input's dtype (round to nearest even). Divisions round
correctly (``div_rn``), as the torch version's do, so every step is the same float32 operation, and
tests/test_quant_act_kernel.py checks the bits against it (on the GPU, and on the CPU under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch

from fideval.quant.elements import AMAX_FLOOR, E4M3  # the torch version's own constants

try:  # optional: the CPU machine and CI may lack it; act_quant_e4m3 then runs its torch version
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None

E4M3_MAX = E4M3.max
BLOCKS_PER_PROGRAM = 8
ROUNDER = 12582912.0  # 1.5 x 2^23: adding and subtracting it rounds a float32 below 2^22 to an integer, half to even


def usable(x: torch.Tensor, block: int) -> bool:
    """Whether :func:`act_quant_e4m3` takes ``x``: Triton present, a CUDA tensor of a float dtype, and a
    power-of-two block (Triton's ranges) of at most 1,024 channels."""
    return (triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and 0 < block <= 1024 and block & (block - 1) == 0 and x.numel() > 0)


def act_quant_e4m3(x: torch.Tensor, block: int, scale: str) -> torch.Tensor:
    """``x [..., C]`` quantized-dequantized per ``block`` channels (``scale``: ``fp32`` or ``ue8m0``); the
    input's shape and dtype. The caller checks the arguments (:func:`fideval.quant.activations.act_quant_e4m3`)."""
    c = x.shape[-1] if x.dim() else 1
    rows = x.reshape(-1, c).contiguous()
    out = torch.empty_like(rows)
    n_blocks = triton.cdiv(c, block)
    grid = (rows.shape[0], triton.cdiv(n_blocks, BLOCKS_PER_PROGRAM))
    _act_qdq[grid](rows, out, c, rows.stride(0), BLOCK=block, GROUP=BLOCKS_PER_PROGRAM,
                   UE8M0=scale == "ue8m0", num_warps=4)
    return out.reshape(x.shape)


if triton is not None:
    _FLOOR, _MAX, _ROUNDER = tl.constexpr(AMAX_FLOOR), tl.constexpr(E4M3_MAX), tl.constexpr(ROUNDER)  # jit sees constexprs

    @triton.jit
    def _act_qdq(x_ptr, out_ptr, C, stride, BLOCK: tl.constexpr, GROUP: tl.constexpr, UE8M0: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        first = tl.program_id(1) * GROUP * BLOCK
        cols = first + tl.arange(0, GROUP)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]  # [GROUP, BLOCK]
        mask = cols < C
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), _FLOOR)  # padding is 0: the block's own channels
        s = tl.math.div_rn(amax, tl.full(amax.shape, _MAX, tl.float32))
        if UE8M0:  # the smallest power of two >= s: add the mantissa mask, keep the exponent (s is normal here)
            bits = s.to(tl.int32, bitcast=True)
            s = ((bits + 0x007FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
        q = tl.math.div_rn(x, s[:, None])
        q = tl.minimum(tl.maximum(q, -_MAX), _MAX)
        # E4M3 rounding as fideval.quant.elements.cast builds it: e = max(floor(log2 |q|), -6) from the exponent
        # field, |q| scaled by 2^(3 - e) (exact), rounded half to even by the 1.5 x 2^23 addition (exact below
        # 2^22: the scaled value is below 16), scaled back by 2^(e - 3), the sign bit put back (-0 stays -0)
        bits = q.to(tl.int32, bitcast=True)
        a = tl.abs(q)
        e = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 127, -6)
        up = ((130 - e) << 23).to(tl.float32, bitcast=True)
        down = ((124 + e) << 23).to(tl.float32, bitcast=True)
        r = (a * up + _ROUNDER) - _ROUNDER
        r = r * down  # >= +0: its sign bit is clear
        sign = (bits >> 31) << 31  # the sign bit alone (an arithmetic shift); not -r, which Triton forms as 0 - r (+0)
        y = (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True) * s[:, None]
        if out_ptr.dtype.element_ty != tl.float32:  # to bf16/fp16: round to nearest even, as torch's .to()
            y = y.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(out_ptr + row * stride + cols, y, mask=mask)
