"""Torch stand-ins for the GPU kernels DeepSeek-V3.2-Exp's ``inference/model.py`` calls, so it runs on a CPU.

The vendor's ``kernel.py`` (tilelang 0.1.6) defines ``act_quant``, ``fp8_gemm`` and ``fp8_index``; its
``rotate_activation`` imports ``fast_hadamard_transform.hadamard_transform`` (a CUDA extension). This module
is passed to :func:`~fideval.model.reference.code.load_vendor_code` as the stand-in for both top-level names
(``kernel`` and ``fast_hadamard_transform``), so it exposes the same four functions with the same signatures.
Each follows the tilelang/CUDA code step for step (read from the vendor's ``kernel.py``):

* ``act_quant(x, block_size=128, scale_fmt=None)``: per 1x128 group of the last dim, ``amax = max(|x|,
  1e-4)`` in float32; the scale is ``amax * (1/448)`` (float32 product), or with any ``scale_fmt`` (the
  release's ``"ue8m0"``) the power of two ``2^ceil(log2(amax * (1/448)))`` taken from the float32 bits as
  the kernel's ``fast_round_scale`` does; ``y = clamp(x / s, -448, 448)`` cast to E4M3 (round to nearest
  even). Returns ``(y float8_e4m3fn, s float32 [..., N/128])``. The vendor's kernel is compiled for bf16
  input only; here float32 input is accepted too (a float32 run), computed the same way.
* ``fp8_gemm(a, a_s, b, b_s)``: ``C = sum_k (A_k @ B_k^T) * (a_s[:, k] * b_s[n // 128, k])`` per 128-wide K
  block, each block's products accumulated in float32 and promoted into a float32 accumulator (the
  kernel's "2xAcc"), output in ``torch.get_default_dtype()`` as the vendor allocates it.
* ``fp8_index(q, q_s, k, k_s)``: ``o[b, m, n] = k_s[b, n] * sum_h relu(q[b, m, h, :] . k[b, n, :]) *
  q_s[b, m, h]``, float32 throughout.
* ``hadamard_transform(x, scale)``: ``scale * H x`` along the last dim with the Sylvester Hadamard matrix
  of the next power of two (x zero-padded, output cut back), computed in float32 by the fast
  Walsh-Hadamard butterfly and returned in ``x``'s dtype, as the CUDA extension does.

Tests: ``tests/test_kernels_v32.py`` checks each against a float64 numpy/scipy reference, and (on CUDA, where
tilelang / fast_hadamard_transform import) against the vendor's own GPU kernels.
"""

from __future__ import annotations

import math

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128  # the kernels' group_size / block_K: fixed at 128 whatever block_size says
_INV = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)  # the kernel's fp8_max_inv, a float32 constant
_INDEX_PIECE = 1 << 24  # fp8_index: float32 elements of the [m, n, h] product held at once


def round_scale(amax: torch.Tensor) -> torch.Tensor:
    """``fast_round_scale``: 2^(exponent of amax/448, +1 when its mantissa is non-zero), from the float32 bits."""
    v = (amax.to(torch.float32) * _INV.to(amax.device)).contiguous()
    bits = v.view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - 127 + ((bits & ((1 << 23) - 1)) != 0).to(torch.int32)
    return ((exp + 127) << 23).to(torch.int32).view(torch.float32)


def act_quant(x: torch.Tensor, block_size: int = 128, scale_fmt: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise E4M3 quantization of ``x``'s last dim in groups of 128 (see the module docstring)."""
    assert x.is_contiguous(), "Input tensor must be contiguous"
    assert x.size(-1) % block_size == 0, f"Last dimension size must be divisible by block_size (block_size={block_size})"
    n = x.size(-1)
    g = x.reshape(-1, n // GROUP, GROUP).to(torch.float32)
    amax = g.abs().amax(dim=-1).clamp_min(1e-4)
    s = round_scale(amax) if scale_fmt is not None else amax * _INV.to(x.device)
    y = (g / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return y.view(x.shape), s.view(*x.shape[:-1], n // block_size)


def fp8_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor) -> torch.Tensor:
    """``a`` E4M3 [..., K] with per-1x128 scales ``a_s`` [..., K/128]; ``b`` E4M3 [N, K] with 128x128 block
    scales ``b_s`` [ceil(N/128), K/128]; returns ``a @ b.T`` dequantized, in the default dtype."""
    assert a.is_contiguous() and b.is_contiguous(), "Input tensors must be contiguous"
    assert a_s.is_contiguous() and b_s.is_contiguous(), "Scaling factor tensors must be contiguous"
    k = a.size(-1)
    m = a.numel() // k
    n = b.size(0)
    a2, sa = a.view(m, k), a_s.view(m, -1).to(torch.float32)
    sb = b_s.to(torch.float32).repeat_interleave(GROUP, dim=0)[:n]  # [N, K/128]: each row's block scale
    acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for j in range(math.ceil(k / GROUP)):
        lo, hi = j * GROUP, min(k, (j + 1) * GROUP)
        part = a2[:, lo:hi].to(torch.float32) @ b[:, lo:hi].to(torch.float32).T
        acc += part * (sa[:, j:j + 1] * sb[:, j][None, :])
    return acc.to(torch.get_default_dtype()).view(*a.shape[:-1], n)


def fp8_index(q: torch.Tensor, q_s: torch.Tensor, k: torch.Tensor, k_s: torch.Tensor) -> torch.Tensor:
    """The indexer's scores: ``q`` E4M3 [b, m, h, d], ``q_s`` float32 [b, m, h] (or [b, m, h, 1]: the
    per-head weights times q's scale), ``k`` E4M3 [b, n, d], ``k_s`` float32 holding b*n scales (the
    vendor passes its [b, n, 1] cache). Returns float32 [b, m, n]."""
    bsz, m, h, d = q.shape
    n = k.size(1)
    qs = q_s.reshape(bsz, m, h).to(torch.float32)
    ks = k_s.reshape(bsz, n).to(torch.float32)
    kf = k.to(torch.float32)
    out = torch.empty(bsz, m, n, dtype=torch.float32, device=q.device)
    step = max(1, _INDEX_PIECE // max(1, n * h))
    for b in range(bsz):
        for lo in range(0, m, step):
            qf = q[b, lo:lo + step].to(torch.float32)  # [s, h, d]
            logits = torch.einsum("shd,nd->snh", qf, kf[b]).clamp_min_(0)
            out[b, lo:lo + step] = (logits * qs[b, lo:lo + step, None, :]).sum(-1) * ks[b][None, :]
    return out


def hadamard_transform(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``fast_hadamard_transform.hadamard_transform``: ``scale * H_{2^p} x`` on the last dim (p = ceil(log2
    dim)), float32 butterflies, output in ``x``'s dtype and shape."""
    dim = x.size(-1)
    p = max(0, math.ceil(math.log2(dim))) if dim > 1 else 0
    width = 1 << p
    y = x.reshape(-1, dim).to(torch.float32)
    if width != dim:
        y = torch.nn.functional.pad(y, (0, width - dim))
    rows = y.size(0)
    h = 1
    while h < width:
        y = y.view(rows, width // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2)
        h *= 2
    y = y.reshape(rows, width)[:, :dim] * scale
    return y.to(x.dtype).view(x.shape)
