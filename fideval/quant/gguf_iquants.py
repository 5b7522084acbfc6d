"""llama.cpp's IQ4_NL and IQ4_XS (4-bit codes on the non-linear ``kvalues_iq4nl`` grid) as vectorised torch
encoders, byte-identical to ggml's ``quantize_iq4_nl`` / ``quantize_iq4_xs`` (``quantize_row_iq4_nl_impl``
with ``ntry = 7``, what ``llama-quantize`` runs), without and with an importance matrix.

Per block of 32: weights ``x*x`` (or ``imatrix * sqrt(sigma2 + x*x)``), a first scale ``max/127`` fitted by
weighted least squares, then 15 trial scales ``(t - 127)/max`` for t in -7..7, keeping the best fit. IQ4_XS
then stores a float16 super-block scale ``-max_scale/32`` and a 6-bit signed multiplier per block, and
re-picks every code with the block's quantized scale. Codes are the nearest grid value by ggml's
``best_index_int8`` (a tie goes to the upper neighbour). Float32 order as in :mod:`fideval.quant.gguf_kquants`.
"""

from __future__ import annotations

import torch

from fideval.quant.gguf_kquants import EPS, cdiv, f16_bytes, first_absmax, nearest_int, seqsum, sqrtf

KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def best_index(x: torch.Tensor) -> torch.Tensor:
    """ggml's ``best_index_int8(16, kvalues_iq4nl, x)`` (int64): clamp to the ends, else the nearer of the two
    grid neighbours, comparing ``x - val[mu-1] < val[mu] - x`` in float32."""
    vals = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=x.device)
    mu = torch.searchsorted(vals, x.contiguous(), right=True).clamp(1, 15)  # first grid value > x
    lower = (x - vals[mu - 1]) < (vals[mu] - x)
    idx = torch.where(lower, mu - 1, mu)
    idx = torch.where(x <= vals[0], torch.zeros_like(idx), idx)
    return torch.where(x >= vals[15], torch.full_like(idx, 15), idx)


def _block_scales(xb: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The per-block scale search of ``quantize_row_iq4_nl_impl`` (ntry = 7) over ``[B, 32]``."""
    vals = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=xb.device)
    mx = first_absmax(xb)
    zero = xb.abs().amax(-1) < EPS

    def fit(idv):
        q = vals[best_index(idv[:, None] * xb)]
        wq = w * q
        return seqsum(wq * xb), seqsum(wq * q)

    d = -mx / -127.0
    sumqx, sumq2 = fit(1 / d)
    d = torch.where(sumq2 > 0, sumqx / sumq2, torch.zeros_like(sumqx))
    best = d * sumqx
    for t in range(-7, 8):
        sqx, sq2 = fit(cdiv(float(t - 127), mx))
        take = (sq2 > 0) & (sqx * sqx > best * sq2)
        d = torch.where(take, sqx / sq2, d)
        best = torch.where(take, d * sqx, best)
    return torch.where(zero, torch.zeros_like(d), d)


def _weights(x: torch.Tensor, qw: torch.Tensor | None, nsub: int) -> torch.Tensor:
    """``[B, n]`` super-blocks -> ``[B * nsub, 32]`` weights."""
    xs = x.reshape(-1, 32)
    if qw is None:
        return xs * xs
    sigma2 = seqsum(x * x) * (2.0 / x.shape[-1])
    return qw.reshape(-1, 32) * sqrtf(sigma2.repeat_interleave(nsub)[:, None] + xs * xs)


def _pack(L: torch.Tensor) -> torch.Tensor:
    """Codes ``[B, n]`` -> ``[B, n/2]``: element j in the low nibble and j + 16 in the high nibble of each 32."""
    L = L.reshape(L.shape[0], -1, 2, 16)
    return (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(L.shape[0], -1).to(torch.uint8)


def encode_iq4_nl(x: torch.Tensor, qw: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 32]`` float32 -> ``[B, 18]`` block_iq4_nl bytes: d (float16), qs[16]."""
    d = _block_scales(x, _weights(x, qw, 1))
    idv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    L = best_index(idv[:, None] * x)
    return torch.cat([f16_bytes(d), _pack(L)], -1)


def encode_iq4_xs(x: torch.Tensor, qw: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 256]`` float32 -> ``[B, 136]`` block_iq4_xs bytes: d (float16), scales_h (uint16),
    scales_l[4], qs[128]."""
    B = x.shape[0]
    sc = _block_scales(x.reshape(B * 8, 32), _weights(x, qw, 8)).reshape(B, 8)
    max_scale = first_absmax(sc)  # ggml keeps the first largest |d| (0 when all are 0)
    d = -max_scale / 32
    idv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    ls = nearest_int(idv[:, None] * sc).clamp(-32, 31)
    dl = d[:, None] * ls.float()
    idl = torch.where(dl != 0, 1 / dl, torch.zeros_like(dl))
    L = best_index(idl[..., None] * x.reshape(B, 8, 32))
    ls = ls + 32
    lo, hi = ls & 0xF, ls >> 4
    scales_l = (lo[:, 0::2] | (lo[:, 1::2] << 4)).to(torch.uint8)
    scales_h = (hi << (2 * torch.arange(8, device=x.device))).sum(-1).to(torch.int32)
    sh = torch.stack([scales_h & 0xFF, scales_h >> 8], -1).to(torch.uint8)
    return torch.cat([f16_bytes(d), sh, scales_l, _pack(L.reshape(B, 256))], -1)
