"""Dynamic FP8 E4M3 activation quantization, per token per 128 channels (DeepSeek-V3 ``act_quant``).

The *serving* path of a candidate runs what an FP8 inference engine runs: every activation entering a
quantized linear is quantized block-wise along its last (channel) dim, then dequantized, so the emulated
matmul sees exactly the values the FP8 GEMM would. Per block: amax is clamped to at least 1e-4 (so an
all-zero block gets a finite scale), s = amax / 448 (recipe ``fp32``) or the power-of-two ceiling of that
(``ue8m0``, from the bits), and ``x / s`` is clamped to +-448 before the cast -- torch's float8 cast turns
overflow into NaN on some devices, and a clamp costs nothing.

If the channel count is not a multiple of the block (tiny test models), the last block is partial and
its amax covers only the channels that exist (zero padding does not change an absolute maximum).
"""

from __future__ import annotations

import torch

from fideval.errors import FidevalError
from fideval.quant.elements import E4M3, cast, ceil_pow2_exponent, pow2

AMAX_FLOOR = 1e-4


def act_quant_e4m3(x: torch.Tensor, block: int = 128, scale: str = "fp32") -> torch.Tensor:
    """Quantize-dequantize activations ``[..., C]`` to E4M3 with one scale per ``block`` channels.

    Returns a tensor of the input's shape and dtype."""
    if scale not in ("fp32", "ue8m0"):
        raise FidevalError(f"activation scale {scale!r} is not known", hint="use fp32 or ue8m0")
    if block <= 0:
        raise FidevalError(f"activation block {block} must be positive")
    shape, dtype = x.shape, x.dtype
    c = shape[-1]
    xf = x.float().reshape(-1, c)
    pad = -c % block
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    b = xf.reshape(xf.shape[0], -1, block)
    amax = b.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR)
    s = amax / E4M3.max
    if scale == "ue8m0":
        s = pow2(ceil_pow2_exponent(s))
    y = cast((b / s).clamp(-E4M3.max, E4M3.max), E4M3) * s
    y = y.reshape(xf.shape)[:, :c]
    return y.reshape(shape).to(dtype)
