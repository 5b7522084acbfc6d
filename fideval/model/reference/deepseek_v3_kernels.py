"""Torch stand-ins for DeepSeek-V3's ``inference/kernel.py`` (Triton): ``act_quant``, ``weight_dequant``, ``fp8_gemm``.

The vendor's ``model.py`` imports these three names from ``kernel``; on a CPU the Triton kernels cannot run,
so :func:`fideval.model.reference.code.load_vendor_code` puts this module in their place (on a GPU the
vendor's own kernels are preferred, and which one computed what is recorded). Each function keeps the
vendor's signature and computes what its Triton kernel computes, in the same order of float32 operations
where the order is fixed by the kernel:

* ``act_quant``: per ``block_size`` run of the last dimension, ``s = max(amax, 1e-4) / 448`` (UE8M0: rounded
  up to a power of two), ``y = e4m3(x / s)``;
* ``weight_dequant``: ``fp8.to(float32) * s`` per 128x128 block (edge blocks partial), rounded once to the
  default dtype (the vendor's output tensor is ``torch.get_default_dtype()``);
* ``fp8_gemm``: per K block, ``acc += (a_blk @ b_blk^T) * a_s * b_s`` in float32, then rounded to the default
  dtype. The dot of one block is float32 here; Triton's fp8 ``tl.dot`` accumulates the exact fp8 products in
  float32 too, but in its own order, so the two agree to float32 rounding, not bitwise.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0


def act_quant(x: torch.Tensor, block_size: int = 128, scale_fmt: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise e4m3 quantization of ``x`` along its last dimension: (fp8 tensor, float32 scales [..., K/b])."""
    assert x.is_contiguous(), "Input tensor must be contiguous"
    assert x.size(-1) % block_size == 0, f"Last dimension size must be divisible by block_size (block_size={block_size})"
    xb = x.to(torch.float32).view(*x.shape[:-1], x.size(-1) // block_size, block_size)
    s = xb.abs().amax(dim=-1).clamp_min(1e-4) / FP8_MAX
    if scale_fmt == "ue8m0":
        s = torch.exp2(torch.ceil(torch.log2(s)))
    y = (xb / s.unsqueeze(-1)).to(torch.float8_e4m3fn).view(x.shape)
    return y, s


def _expand(s: torch.Tensor, rows: int, cols: int, block_size: int) -> torch.Tensor:
    """Block scales [ceil(R/b), ceil(C/b)] spread to one scale per element [R, C]."""
    return s.to(torch.float32).repeat_interleave(block_size, 0)[:rows].repeat_interleave(block_size, 1)[:, :cols]


def weight_dequant(x: torch.Tensor, s: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    """``x`` float8 [M, N] times its block scales ``s`` [ceil(M/b), ceil(N/b)], in the default dtype."""
    assert x.is_contiguous() and s.is_contiguous(), "Input tensors must be contiguous"
    assert x.dim() == 2 and s.dim() == 2, "Input tensors must have 2 dimensions"
    return dequant_f32(x, s, block_size).to(torch.get_default_dtype())


def dequant_f32(x: torch.Tensor, s: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    """``weight_dequant`` before its final rounding: the float32 products ``fp8 * scale`` per block."""
    M, N = x.shape
    return x.to(torch.float32) * _expand(s, M, N, block_size)


def fp8_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor) -> torch.Tensor:
    """``a`` fp8 [..., K] with per-128 scales ``a_s`` [..., K/128] times ``b`` fp8 [N, K] with 128x128 block scales
    ``b_s``; float32 accumulation block by block along K, the result in the default dtype [..., N]."""
    assert a.is_contiguous() and b.is_contiguous(), "Input tensors must be contiguous"
    assert a_s.is_contiguous() and b_s.is_contiguous(), "Scaling factor tensors must be contiguous"
    block = 128
    K, N = a.size(-1), b.size(0)
    M = a.numel() // K
    A, As = a.view(M, K).to(torch.float32), a_s.view(M, -1)
    B = b.to(torch.float32)
    bs_rows = b_s.to(torch.float32).repeat_interleave(block, 0)[:N]  # [N, K blocks]
    acc = torch.zeros(M, N, dtype=torch.float32, device=a.device)
    for k in range(-(-K // block)):
        lo, hi = k * block, min(K, (k + 1) * block)
        acc += (A[:, lo:hi] @ B[:, lo:hi].T) * As[:, k, None] * bs_rows[None, :, k]
    return acc.to(torch.get_default_dtype()).view(*a.shape[:-1], N)
