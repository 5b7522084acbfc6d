"""llama.cpp's K-quants (Q4_K, Q5_K, Q6_K) as vectorised torch encoders, byte-identical to ggml's
``quantize_q4_K`` & co. -- the functions ``llama-quantize`` calls -- without and with an importance matrix.

Why byte-identical and not "the same idea": a K-quant build is defined by ggml's search for each
sub-block's scale and min (``make_qkx2_quants``, ``make_qkx3_quants``, ``make_qx_quants``,
``make_qp_quants``), and any reordering of its float32 arithmetic changes bytes. So every float32
expression here is evaluated in ggml's order, one rounding per C operation:

* sums run element by element from 0 (:func:`seqsum`), never as a tree reduction;
* ``nearest_int`` is ggml's bit trick (:func:`nearest_int`: add 1.5 * 2**23, keep the mantissa), which is
  round-half-to-even for ordinary values and defined garbage for huge ones -- reproduced, not fixed;
* ``uint8_t`` stores of an ``int`` wrap modulo 256 (they matter only for degenerate rows);
* scales go through float16 (round to nearest even) and back where ggml does.

The oracle is llama.cpp built as ggml-base is (x86-64, no FMA contraction): ``tests/data/llamacpp/
quant_vectors.npz``, written by ``tools/llamacpp/quant_vectors.py``. The searches loop over their steps
and elements in Python, vectorised over every block of the tensor at once, so a tensor costs a few
thousand torch operations whatever its size (GPU-friendly).
"""

from __future__ import annotations

import torch

QK_K = 256
EPS = 1e-15  # ggml's GROUP_MAX_EPS


def nearest_int(v: torch.Tensor) -> torch.Tensor:
    """ggml's ``nearest_int``: (fval + 12582912.f) as bits, mantissa minus 2**22 (int32)."""
    return ((v.float() + 12582912.0).view(torch.int32) & 0x7FFFFF) - 0x400000


def seqsum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in C order from 0.0: ``float s = 0; for (...) s += t[i];``."""
    s = torch.zeros(t.shape[:-1], dtype=torch.float32, device=t.device)
    for i in range(t.shape[-1]):
        s = s + t[..., i]
    return s


def cdiv(c: float, t: torch.Tensor) -> torch.Tensor:
    """C's ``c / t`` for a float constant ``c``, rounded once. torch computes ``scalar / tensor`` as
    ``reciprocal(t) * scalar``, rounded twice: exact for powers of two, but a quarter of the quotients ``63.f/x`` (or
    IQ4's ``-126.f/max``) come out one ulp off, which now and then moves a code or a chosen trial scale."""
    return torch.full_like(t, c) / t


def sqrtf(v: torch.Tensor) -> torch.Tensor:
    """C ``sqrtf``, correctly rounded: in float64, then rounded once (exact for sqrt, 53 >= 2 * 24 + 2).
    torch's float32 sqrt on the CPU is not always correctly rounded (sqrt(8868931584) gives 94175.0,
    not 94175.0078)."""
    return torch.sqrt(v.double()).float()


def f16_round(v: torch.Tensor) -> torch.Tensor:
    """GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))."""
    return v.to(torch.float16).float()


def f16_bytes(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float16).reshape(-1, 1).view(torch.uint8)


def first_absmax(x: torch.Tensor) -> torch.Tensor:
    """The signed value of the first element of largest magnitude (ggml's ``if (ax > amax)`` loop)."""
    return torch.gather(x, -1, x.abs().argmax(-1, keepdim=True)).squeeze(-1)


def _running_max(v: torch.Tensor) -> torch.Tensor:
    """``float m = 0; if (v > m) m = v;`` over the last dim: +0.0 unless some value is positive."""
    m = v.amax(-1)
    return torch.where(m > 0, m, torch.zeros_like(m))


def _f(i: torch.Tensor) -> torch.Tensor:
    return i.float()


def make_qkx(x: torch.Tensor, w: torch.Tensor, nmax: int, rmin: float, rdelta: float, nstep: int,
             use_mad: bool = False):
    """``make_qkx2_quants`` / ``make_qkx3_quants`` (identical for given weights) over blocks ``[B, n]``.
    Returns (scale [B], the_min [B], L [B, n] int32)."""

    def err(diff):
        return diff.abs() if use_mad else diff * diff

    n = x.shape[-1]
    mn = torch.minimum(x.amin(-1), torch.zeros((), device=x.device))
    mx = x.amax(-1)
    sum_w = w[:, 0].clone()
    sum_x = sum_w * x[:, 0]
    for i in range(1, n):
        sum_w = sum_w + w[:, i]
        sum_x = sum_x + w[:, i] * x[:, i]
    flat = mx <= mn
    iscale = cdiv(float(nmax), mx - mn)
    scale = 1 / iscale
    L = nearest_int(iscale[:, None] * (x - mn[:, None])).clamp(0, nmax)
    diff = (scale[:, None] * _f(L) + mn[:, None]) - x
    best = seqsum(w * err(diff))
    the_min = mn  # ggml's `min`: each accepted step moves it, and later steps start from the moved one
    for s in range(nstep + 1):
        iscale = (torch.tensor(rmin, dtype=torch.float32) + torch.tensor(rdelta, dtype=torch.float32) * s + nmax) / (mx - the_min)
        la = nearest_int(iscale[:, None] * (x - the_min[:, None])).clamp(0, nmax)
        fl = _f(la)
        wl = w * fl
        sum_l, sum_l2, sum_xl = seqsum(wl), seqsum(wl * fl), seqsum(wl * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_min = torch.where(pos, torch.zeros_like(this_min), this_min)
        this_scale = torch.where(pos, sum_xl / sum_l2, this_scale)
        diff = (this_scale[:, None] * fl + this_min[:, None]) - x
        cur = seqsum(w * err(diff))
        take = (D > 0) & (cur < best)
        L = torch.where(take[:, None], la, L)
        best = torch.where(take, cur, best)
        scale = torch.where(take, this_scale, scale)
        the_min = torch.where(take, this_min, the_min)
    L = torch.where(flat[:, None], torch.zeros_like(L), L)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    the_min = torch.where(flat, mn, the_min)  # ggml returns before the search: *the_min = -min
    return scale, -the_min, L


def make_qp(x: torch.Tensor, qw: torch.Tensor, nmax: int):
    """``make_qp_quants`` over ``[B, n]`` (n = 8 sub-block scales or mins): returns (scale [B], L uint8-wrapped [B, n])."""
    mx = torch.clamp(x.amax(-1), min=0.0)
    zero = mx < EPS
    iscale = cdiv(float(nmax), mx)
    L = nearest_int(iscale[:, None] * x) & 0xFF
    scale = 1 / iscale
    diff = x - scale[:, None] * _f(L)
    best = seqsum(qw * diff * diff)
    for s in (-4, -3, -2, -1, 1, 2, 3, 4):
        isc = (torch.tensor(0.1, dtype=torch.float32) * s + nmax) / mx
        sc = 1 / isc
        lv = nearest_int(isc[:, None] * x).clamp(max=nmax)
        diff = x - sc[:, None] * _f(lv)
        mse = seqsum(qw * diff * diff)
        take = mse < best
        best = torch.where(take, mse, best)
        iscale = torch.where(take, isc, iscale)
    lv = nearest_int(iscale[:, None] * x).clamp(max=nmax)
    sumlx = seqsum(qw * x * _f(lv))
    suml2 = seqsum(qw * _f(lv) * _f(lv))
    L = lv & 0xFF
    L, sumlx, suml2 = _refine_qp(x, qw, L, sumlx, suml2, nmax)
    out = torch.where(suml2 > 0, sumlx / suml2, torch.zeros_like(sumlx))
    return torch.where(zero, torch.zeros_like(out), out), torch.where(zero[:, None], torch.zeros_like(L), L)


def _refine_qp(x, w, L, sumlx, suml2, nmax):
    """``make_qp_quants``' five passes of coordinate descent: element by element, try the level the current
    scale implies and keep it if the weighted fit improves. ggml reads L back as uint8 (a negative level
    wrapped) but compares the new int level with it. A pass that changes nothing leaves the state as it
    was, so running all five equals ggml's early break."""
    for _ in range(5):
        for i in range(x.shape[-1]):
            xi, wi, li = x[:, i], w[:, i], _f(L[:, i])
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new = nearest_int(xi * sl2 / slx).clamp(max=nmax)
            fn = _f(new)
            slx2 = slx + wi * xi * fn
            sl22 = sl2 + wi * fn * fn
            ok = (slx > 0) & (sl2 > 0) & (new != L[:, i]) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = torch.where(ok, new & 0xFF, L[:, i])
            sumlx = torch.where(ok, slx2, sumlx)
            suml2 = torch.where(ok, sl22, suml2)
    return L, sumlx, suml2


def make_q3(x: torch.Tensor, nmax: int):
    """``make_q3_quants(n, nmax, x, L, do_rmse=true)`` over ``[B, n]``: returns (scale [B], L [B, n] in [0, 2*nmax))."""
    mx = first_absmax(x)
    zero = x.abs().amax(-1) < EPS
    w = x * x
    L = nearest_int(cdiv(-float(nmax), mx)[:, None] * x).clamp(-nmax, nmax - 1)
    sumlx, suml2 = seqsum(w * x * _f(L)), seqsum(w * _f(L) * _f(L))
    for _ in range(5):  # a pass without a change leaves the state as it was: running all five = ggml's break
        for i in range(x.shape[-1]):
            xi, wi, li = x[:, i], w[:, i], _f(L[:, i])
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new = nearest_int(xi * sl2 / slx).clamp(-nmax, nmax - 1)
            fn = _f(new)
            slx2 = slx + wi * xi * fn
            sl22 = sl2 + wi * fn * fn
            ok = (slx > 0) & (new != L[:, i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = torch.where(ok, new, L[:, i])
            sumlx = torch.where(ok, slx2, sumlx)
            suml2 = torch.where(ok, sl22, suml2)
    scale = torch.where(suml2 > 0, sumlx / suml2, torch.zeros_like(sumlx))
    return torch.where(zero, torch.zeros_like(scale), scale), torch.where(zero[:, None], torch.zeros_like(L), L + nmax)


def make_qx(x: torch.Tensor, nmax: int, qw: torch.Tensor | None):
    """``make_qx_quants(n, nmax, x, L, rmse_type=1, qw)`` over ``[B, n]``: returns (scale [B], L [B, n] in [0, 2*nmax))."""
    mx = first_absmax(x)
    zero = x.abs().amax(-1) < EPS
    w = qw if qw is not None else x * x
    iscale = cdiv(-float(nmax), mx)

    def fit(isc):
        lv = nearest_int(isc[:, None] * x).clamp(-nmax, nmax - 1)
        fl = _f(lv)
        return lv, seqsum(w * x * fl), seqsum(w * fl * fl)

    lv, sumlx, suml2 = fit(iscale)
    L = lv + nmax
    scale = torch.where(suml2 != 0, sumlx / suml2, torch.zeros_like(sumlx))
    best = scale * sumlx
    for s in range(-9, 10):
        if s == 0:
            continue
        isc = -(nmax + torch.tensor(0.1, dtype=torch.float32) * s) / mx
        lv, slx, sl2 = fit(isc)
        take = (sl2 > 0) & (slx * slx > best * sl2)
        L = torch.where(take[:, None], lv + nmax, L)
        scale = torch.where(take, slx / sl2, scale)
        best = torch.where(take, scale * slx, best)
    return torch.where(zero, torch.zeros_like(scale), scale), torch.where(zero[:, None], torch.zeros_like(L), L)


# ---------------------------------------------------------------- Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scale and min


def _pack_scales_k4(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """8 scales and 8 mins (uint8, <= 63 unless wrapped) into the 12 bytes of ``block_q4_K.scales``."""
    ls, lm = ls.to(torch.int32), lm.to(torch.int32)
    q = torch.zeros(ls.shape[0], 12, dtype=torch.int32, device=ls.device)
    q[:, 0:4] = ls[:, :4]
    q[:, 4:8] = lm[:, :4]
    q[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    q[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    q[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    return (q & 0xFF).to(torch.uint8)


def _unpack_scales_k4(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_scale_min_k4`` for j = 0..7: (sc [B, 8], m [B, 8]) as int32."""
    q = q.to(torch.int32)
    sc = torch.cat([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], -1)
    m = torch.cat([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], -1)
    return sc, m


def encode_qk_asym(x: torch.Tensor, nmax: int, qw: torch.Tensor | None):
    """Q4_K (nmax 15) or Q5_K (nmax 31) of super-blocks ``[B, 256]``: (d, dmin, 12 scale bytes, L [B, 256])."""
    B = x.shape[0]
    xs = x.reshape(B * 8, 32)
    if qw is None:  # quantize_row_q{4,5}_K_ref
        av = sqrtf(seqsum(xs * xs) / 32)
        w = av[:, None] + xs.abs()
        rmin, nstep = (-1.0, 20) if nmax == 15 else (-0.5, 15)
        sc, mins, L = make_qkx(xs, w, nmax, rmin, 0.1, nstep)
        sc, mins = sc.reshape(B, 8), mins.reshape(B, 8)
        max_scale = _running_max(sc)
        max_min = _running_max(mins)
        inv_s = torch.where(max_scale > 0, cdiv(63.0, max_scale), torch.zeros_like(max_scale))
        inv_m = torch.where(max_min > 0, cdiv(63.0, max_min), torch.zeros_like(max_min))
        ls = (nearest_int(inv_s[:, None] * sc) & 0xFF).clamp(max=63)
        lm = (nearest_int(inv_m[:, None] * mins) & 0xFF).clamp(max=63)
        d, dmin = max_scale / 63.0, max_min / 63.0
    else:  # quantize_row_q{4,5}_K_impl
        sigma2 = 2 * seqsum(x * x) / QK_K
        s2 = sigma2.repeat_interleave(8)[:, None]
        w = qw.reshape(B * 8, 32) * sqrtf(s2 + xs * xs)
        sw = seqsum(w).reshape(B, 8)
        sc, mins, L = make_qkx(xs, w, nmax, -0.9, 0.05, 36)
        d, ls = make_qp(sc.reshape(B, 8), sw, 63)
        dmin, lm = make_qp(mins.reshape(B, 8), sw, 63)
        if nmax == 31:
            ls, lm = ls.clamp(max=63), lm.clamp(max=63)
    scales = _pack_scales_k4(ls, lm)
    scu, mu = _unpack_scales_k4(scales)
    dd = f16_round(d)[:, None] * _f(scu)
    dm = f16_round(dmin)[:, None] * _f(mu)
    xb = x.reshape(B, 8, 32)
    new = nearest_int((xb + dm[..., None]) / dd[..., None]).clamp(0, nmax)
    L = torch.where((dd != 0)[..., None], new, L.reshape(B, 8, 32)).reshape(B, QK_K)
    return d, dmin, scales, L


def encode_q4_k(x: torch.Tensor, qw: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 256]`` float32 -> ``[B, 144]`` block_q4_K bytes: d, dmin, scales[12], qs[128]."""
    d, dmin, scales, L = encode_qk_asym(x, 15, qw)
    L = L.reshape(-1, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(-1, 128).to(torch.uint8)
    return torch.cat([f16_bytes(d), f16_bytes(dmin), scales, qs], -1)


def encode_q5_k(x: torch.Tensor, qw: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 256]`` float32 -> ``[B, 176]`` block_q5_K bytes: d, dmin, scales[12], qh[32], qs[128]."""
    d, dmin, scales, L = encode_qk_asym(x, 31, qw)
    L = L.reshape(-1, 4, 2, 32)
    hi = (L >> 4) & 1  # bit 2n (low half of pair n) and 2n+1 (high half)
    sh = torch.arange(4, device=x.device).reshape(1, 4, 1) * 2
    qh = ((hi[:, :, 0] << sh) | (hi[:, :, 1] << (sh + 1))).sum(1)
    lo = L & 0xF
    qs = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    return torch.cat([f16_bytes(d), f16_bytes(dmin), scales, qh.to(torch.uint8), qs.to(torch.uint8)], -1)


# ---------------------------------------------------------------- Q6_K: 16 sub-blocks of 16, int8 scales


def encode_q6_k(x: torch.Tensor, qw: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 256]`` float32 -> ``[B, 210]`` block_q6_K bytes: ql[128], qh[64], scales[16] (int8), d."""
    B = x.shape[0]
    xs = x.reshape(B * 16, 16)
    sc, L = make_qx(xs, 32, None if qw is None else qw.reshape(B * 16, 16))
    sc = sc.reshape(B, 16)
    max_scale = first_absmax(sc)
    zero = sc.abs().amax(-1) < EPS
    iscale = cdiv(-128.0, max_scale)
    d = 1 / iscale
    isc = (nearest_int(iscale[:, None] * sc).clamp(max=127) & 0xFF).to(torch.uint8)
    dd = f16_round(d)[:, None] * _f(isc.view(torch.int8).to(torch.int32))
    xb = x.reshape(B, 16, 16)
    new = nearest_int(xb / dd[..., None]).clamp(-32, 31) + 32
    L = torch.where((dd != 0)[..., None], new, L.reshape(B, 16, 16)).reshape(B, 2, 4, 32)
    lo, hi = L & 0xF, L >> 4
    ql = torch.cat([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], -1).reshape(B, 128)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(B, 64)
    out = torch.cat([ql.to(torch.uint8), qh.to(torch.uint8), isc, f16_bytes(d)], -1)
    return torch.where(zero[:, None], torch.zeros_like(out), out)


# ---------------------------------------------------------------- Q2_K / Q3_K: 16 sub-blocks of 16


def _pack_2bit(L: torch.Tensor) -> torch.Tensor:
    """Codes 0..3 ``[B, 256]`` -> ``[B, 64]``: byte 32*h + l holds elements 128*h + l + 32*k at bits 2k."""
    L = L.reshape(-1, 2, 4, 32)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(-1, 64).to(torch.uint8)


def encode_q2_k(x: torch.Tensor, qw: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 256]`` float32 -> ``[B, 84]`` block_q2_K bytes: scales[16] (scale | min << 4), qs[64], d, dmin."""
    B = x.shape[0]
    xs = x.reshape(B * 16, 16)
    if qw is None:  # quantize_row_q2_K_ref
        sc, mins, L = make_qkx(xs, xs.abs(), 3, -0.5, 0.1, 15, use_mad=True)
        sc, mins = sc.reshape(B, 16), mins.reshape(B, 16)
        max_scale, max_min = _running_max(sc), _running_max(mins)
        ls = torch.where((max_scale > 0)[:, None], nearest_int(cdiv(15.0, max_scale)[:, None] * sc), 0)
        lm = torch.where((max_min > 0)[:, None], nearest_int(cdiv(15.0, max_min)[:, None] * mins), 0)
        scales = (ls | (lm << 4)) & 0xFF
        d, dmin = max_scale / 15.0, max_min / 15.0
    else:  # quantize_row_q2_K_impl
        sigma2 = seqsum(x * x) / QK_K
        w = qw.reshape(B * 16, 16) * sqrtf(sigma2.repeat_interleave(16)[:, None] + xs * xs)
        sw = seqsum(w).reshape(B, 16)
        sc, mins, L = make_qkx(xs, w, 3, -0.9, 0.05, 36)
        d, ls = make_qp(sc.reshape(B, 16), sw, 15)
        dmin, lm = make_qp(mins.reshape(B, 16), sw, 15)
        scales = (ls | (lm << 4)) & 0xFF
    dd = f16_round(d)[:, None] * _f(scales & 0xF)
    dm = f16_round(dmin)[:, None] * _f(scales >> 4)
    xb = x.reshape(B, 16, 16)
    new = nearest_int((xb + dm[..., None]) / dd[..., None]).clamp(0, 3)
    L = torch.where((dd != 0)[..., None], new, L.reshape(B, 16, 16)).reshape(B, QK_K)
    return torch.cat([scales.to(torch.uint8), _pack_2bit(L), f16_bytes(d), f16_bytes(dmin)], -1)


def encode_q3_k(x: torch.Tensor, qw: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 256]`` float32 -> ``[B, 110]`` block_q3_K bytes: hmask[32], qs[64], scales[12] (16 x 6 bits), d."""
    B = x.shape[0]
    xs = x.reshape(B * 16, 16)
    if qw is None:  # quantize_row_q3_K_ref
        sc, L = make_q3(xs, 4)
        sc = sc.reshape(B, 16)
        max_scale = first_absmax(sc)
        iscale = cdiv(-32.0, max_scale)
        l6 = (nearest_int(iscale[:, None] * sc) & 0xFF).to(torch.uint8).view(torch.int8).to(torch.int32)
        l6 = torch.where((max_scale != 0)[:, None], l6.clamp(-32, 31) + 32, 0)
        d = torch.where(max_scale != 0, 1 / iscale, torch.zeros_like(iscale))
    else:  # quantize_row_q3_K_impl
        sigma2 = 2 * seqsum(x * x) / QK_K
        w = qw.reshape(B * 16, 16) * sqrtf(sigma2.repeat_interleave(16)[:, None] + xs * xs)
        sw = seqsum(w).reshape(B, 16)
        sc, L = make_qx(xs, 4, w)
        d, l6 = make_qx(sc.reshape(B, 16), 32, sw)
    lo, hi = l6 & 0xF, l6 >> 4
    scales = torch.zeros(B, 12, dtype=torch.int32, device=x.device)
    scales[:, :8] = lo[:, :8] | (lo[:, 8:] << 4)
    scales[:, 8:] = (hi.reshape(B, 4, 4) << (2 * torch.arange(4, device=x.device))[None, :, None]).sum(1)
    dd = f16_round(d)[:, None] * _f(l6 - 32)
    new = nearest_int(x.reshape(B, 16, 16) / dd[..., None]).clamp(-4, 3) + 4
    L = torch.where((dd != 0)[..., None], new, L.reshape(B, 16, 16)).reshape(B, 8, 32)
    hmask = ((L > 3).to(torch.int32) << torch.arange(8, device=x.device)[None, :, None]).sum(1)
    return torch.cat([hmask.to(torch.uint8), _pack_2bit((L & 3).reshape(B, QK_K)), scales.to(torch.uint8), f16_bytes(d)], -1)
