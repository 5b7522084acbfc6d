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
from fideval.quant.elements import AMAX_FLOOR, E4M3, cast, ceil_pow2_exponent, pow2

# rows per chunk hold about this many elements: the float32 temporaries of a chunk (a dozen, in cast()) stay
# near 0.4 GB, where the whole [T k, I] input of a MoE block's down projection would take tens of GB at once
CHUNK_ELEMENTS = 1 << 23


def act_quant_e4m3(x: torch.Tensor, block: int = 128, scale: str = "fp32") -> torch.Tensor:
    """Quantize-dequantize activations ``[..., C]`` to E4M3 with one scale per ``block`` channels.

    Returns a tensor of the input's shape and dtype. On CUDA with Triton, one kernel computes it
    (:mod:`fideval.quant.act_kernel`, the same bits). Otherwise it works on chunks of whole rows
    (``CHUNK_ELEMENTS``), so the float32 temporaries stay bounded whatever the size of ``x``; the blocks never
    span rows, so the result is the same bits as one pass over the whole tensor."""
    if scale not in ("fp32", "ue8m0"):
        raise FidevalError(f"activation scale {scale!r} is not known", hint="use fp32 or ue8m0")
    if block <= 0:
        raise FidevalError(f"activation block {block} must be positive")
    from fideval.quant import act_kernel

    if act_kernel.usable(x, block):  # CUDA: one Triton kernel, the same bits (fideval.quant.act_kernel)
        return act_kernel.act_quant_e4m3(x, block, scale)
    return act_quant_e4m3_torch(x, block, scale)


def act_quant_e4m3_torch(x: torch.Tensor, block: int, scale: str) -> torch.Tensor:
    """:func:`act_quant_e4m3` in torch operations, on any device (the kernel's oracle); arguments unchecked."""
    shape, dtype = x.shape, x.dtype
    c = shape[-1] if x.dim() else 1
    rows = x.reshape(-1, c)
    out = torch.empty(rows.shape, dtype=dtype, device=x.device)
    step = max(1, CHUNK_ELEMENTS // max(c + (-c % block), 1))
    for i in range(0, rows.shape[0], step):  # rows are independent: a chunk's result is the whole tensor's
        out[i:i + step] = _qdq_rows(rows[i:i + step].float(), block, scale)
    return out.reshape(shape)


def _qdq_rows(xf: torch.Tensor, block: int, scale: str) -> torch.Tensor:
    """float32 ``[rows, C]`` quantized-dequantized per ``block`` channels (float32 result)."""
    c = xf.shape[-1]
    pad = -c % block
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    b = xf.reshape(xf.shape[0], -1, block)
    amax = b.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR)
    s = amax / amax.new_tensor(E4M3.max)  # a tensor divisor: torch's CUDA kernel multiplies by the reciprocal of a scalar
    if scale == "ue8m0":
        s = pow2(ceil_pow2_exponent(s))
    y = cast((b / s).clamp(-E4M3.max, E4M3.max), E4M3) * s
    return y.reshape(xf.shape)[:, :c]
