"""Q4_0, Q4_1, Q5_0 and Q5_1 with an importance matrix, as llama-quantize writes them (``quantize_row_q4_0_impl``,
``quantize_row_q4_1_impl``, ``quantize_row_q5_0_impl``, ``quantize_row_q5_1_impl`` in ``ggml-quants.c``).

Without weights these types are the plain round-to-nearest of :mod:`fideval.quant.gguf_formats`; with them
llama.cpp runs a search per block of 32: weights ``imatrix[j] * sqrtf(sigma2 + x[j]^2)`` with ``sigma2`` the mean
square of the whole ROW (not the block, unlike the K-quants' ``2 * sum / 256``), then ``make_qx_quants`` (Q4_0:
nmax 8, Q5_0: 16; symmetric) or ``make_qkx3_quants`` (Q4_1: 15, Q5_1: 31; rmin -0.9, rdelta 0.05, 36 steps), the
searches :mod:`fideval.quant.gguf_kquants` already runs in ggml's float32 order. The codes are the search's
(no re-rounding against the float16 scale, unlike Q4_K). Where a mix needs them: Q4_0/Q5_0 mixes with
``--imatrix`` (and their Q4_1/Q5_1 ``ffn_down``), and the K-quants' fallbacks on rows that 256 does not divide
(Q4_K -> Q5_0, Q5_K -> Q5_1: DeepSeek's ``attn_k_b`` rows of 128). Oracle: llama-quantize's GGUFs
(``tests/test_quant_gguf_mix_spec.py``).
"""

from __future__ import annotations

import torch

from fideval.errors import FidevalError
from fideval.quant.base import Encoded
from fideval.quant.gguf_formats import _pack_high_bits, _pack_nibbles, get_gguf
from fideval.quant.gguf_kquants import f16_bytes, make_qkx, make_qx, seqsum, sqrtf

NMAX = {"q4_0": 8, "q5_0": 16, "q4_1": 15, "q5_1": 31}


def encode_legacy_imatrix(x: torch.Tensor, kind: str, qw: torch.Tensor) -> torch.Tensor:
    """Rows ``[R, n]`` (float32, n a multiple of 32) and weights ``[n]`` -> raw GGUF bytes ``[R, n/32 * type_size]``."""
    kind = kind.lower()
    R, n = x.shape
    nb = n // 32
    sigma2 = seqsum(x * x) / n  # C: sum_x2/n_per_row
    xb = x.reshape(R * nb, 32)
    w = qw.reshape(1, nb, 32).expand(R, nb, 32).reshape(R * nb, 32) * sqrtf(sigma2.repeat_interleave(nb)[:, None] + xb * xb)
    if kind in ("q4_0", "q5_0"):
        d, L = make_qx(xb, NMAX[kind], w)
        parts = [f16_bytes(d)] + ([_pack_high_bits(L)] if kind == "q5_0" else []) + [_pack_nibbles(L)]
    else:
        d, mn, L = make_qkx(xb, w, NMAX[kind], -0.9, 0.05, 36)  # mn: C's `min` (the_min = -min)
        parts = [f16_bytes(d), f16_bytes(-mn)] + ([_pack_high_bits(L)] if kind == "q5_1" else []) + [_pack_nibbles(L)]
    return torch.cat([p.reshape(R * nb, -1) for p in parts], -1).reshape(R, -1)


def legacy_imatrix_quant_dequant(x: torch.Tensor, kind: str, imatrix: torch.Tensor) -> torch.Tensor:
    """Quantize ``x`` ([out, in], or stacked [E, out, in] with ``imatrix`` [E, in]) as llama-quantize does with an
    importance matrix, then dequantize with ggml's decoder; same shape and dtype."""
    if kind.lower() not in NMAX:
        raise FidevalError(f"{kind}: no importance-weighted legacy encoder", hint=f"use one of {', '.join(NMAX)}")
    fmt = get_gguf(kind)
    mats = x.float().reshape(-1, x.shape[-2] if x.dim() >= 2 else 1, x.shape[-1])
    im = imatrix.float().reshape(-1, x.shape[-1])
    if im.shape[0] not in (1, mats.shape[0]) or x.shape[-1] % 32:
        raise FidevalError(f"{kind} imatrix of shape {list(imatrix.shape)} does not fit a tensor {list(x.shape)}",
                           hint="one weight per input column (per expert for stacked experts), rows a multiple of 32")
    out = torch.empty_like(mats)
    for e in range(mats.shape[0]):
        raw = encode_legacy_imatrix(mats[e], kind, im[e if im.shape[0] > 1 else 0])
        out[e] = fmt.decode(Encoded(fmt.name, "ggml", 32, tuple(mats[e].shape), torch.float32, raw))
    return out.reshape(x.shape).to(x.dtype)
