"""The fused GPU scorer: Triton kernels that read each FP32 logit once and work in float64.

Why this shape. At vocab 129,280 a row pair is 1 MB; one program per row leaves most of the GPU idle
behind a long float64 dependency chain (a first sketch measured ~28 % of copy bandwidth). So each row is split into
``CHUNK``-token chunks, one program per (row, chunk):

1. ``_partials`` loads its chunk of ``a`` (reference) and ``b`` (candidate) once, into registers. One
   combined reduction gives both chunk maxima and the special-value flags (NaN/+inf; the finite-vs--inf
   mismatches that make a KLD infinite, settled here in float32 so the float64 work needs no masks).
   With the chunk maxima exact there is no online rescaling: a second combined reduction sums, in
   float64, ``S = sum exp(x - m)``, ``X = sum e_a (xa - xb)``, ``Y = sum e_b (xa - xb)``,
   ``E = sum e_a xa`` (``xa = a - m_a``, ``xb = b - m_b``) and takes the lowest index holding the
   reference maximum. Two block reductions per chunk, not twenty: a version with 21 (separate sums plus
   a per-chunk candidate top-10) measured 10 % of copy bandwidth, this one 32 %.
2. ``_combine`` (one program per row) rescales the chunk partials to the row maxima (``exp(m_c - M)``
   weights; ``xa - xb`` shifts by the chunk constant ``(M_a - m_a) - (M_b - m_b)``) into the figures of
   :mod:`fideval.score.metrics`, and reads ``b`` at the reference argmax ``i`` and both rows at the
   realized token.
3. ``_rank`` counts, per row, the candidate tokens ahead of ``i`` (the top-k rank test). Only chunks
   whose candidate maximum reaches ``b[i]`` can hold such tokens; every other program returns after
   reading two scalars. For a candidate close to its reference that is one or two chunks per row, so
   top-k costs a few % of one extra read of ``b``; a candidate unrelated to its reference costs up to
   one full extra read, and stays exact.

Keys: a float32 maps to an order-preserving int32 (sign-magnitude flip, -0.0 canonicalised to +0.0);
``key = int32 << 32 | (2**31 - 1 - index)`` orders by (logit descending, index ascending) -- the documented
tie rule -- so the max key is the argmax with the lowest index and ``#{keys > key(b[i])}`` is the rank.

Exp (the first kernel, ``_partials``): libdevice's float64 exp; two FMA-polynomial exps (``_exp64``, ``_exp64t``, both within
2 ulp) are bench variants that measured slower on an H200. Measured (bench/RESULTS.md): ~1.3 M rows/s at
vocab 129,280, 32 % of the copy-bandwidth ceiling, 7.5x plain torch float64 -- short of the 75 % goal.
Memory is not the limit; whether float64 issue rate, conversions or latency is, has not been profiled.
No float64 ``[rows, V]`` tensor is ever materialised.

**The default since 2026-12-03 is the streaming kernel of** :mod:`fideval.score.triton_stream` (``stream=1``:
one-warp programs walking their segment in small tiles, shifts at running maxima, no per-element -inf guards,
then one program a row for the outputs; 59.8-61.3 % of copy bandwidth against 42.0-42.4 % for the compact
kernel in the same runs). The kernels below are the ``stream=0`` variants it replaced, kept as bench baselines and for their
tests.

**Compact kernel (``stream=0, compact=1``, chunk 8,192, 8 warps, table exp N = 256).** ``_partials_compact``
keeps the three-kernel shape and cuts what every element pays for, found with Nsight Compute on an H200 (the lean
kernel below issued 91 instructions per element pair, 39 of them float64, at 3 warps per scheduler):

* one reduction gives both maxima (NaN-propagating, so NaN/+inf flag the row) *and* both minima; the
  finite-vs--inf tests that make a KLD infinite run only in a chunk whose minimum is -inf (a block-uniform
  branch over the registers already held), instead of on every element;
* no per-element argmax: :func:`_combine` (``SCAN``) rescans the one chunk that holds the row maximum (one
  extra chunk read per row, ~6 % of one row's bytes at chunk 8,192) for its first index;
* the exp is :func:`_exp64_tab` (8 float64 operations against 14): ``2**(j/256)`` gathered from a correctly
  rounded 2 KB table, a degree-4 polynomial on ``|r| <= ln2/512``.

Measured (bench/RESULTS.md, 2026-12-03, five runs on H200s): 1.71-1.96 M rows/s, 42.0-47.9 % of the copy
ceiling and 9.7-11.0x torch float64, against 34.0-36.9 % for the lean kernel in the same runs; 74 instructions
and 25.6 float64 operations per element pair; the ALU pipe (49 %) now leads the FP64 pipe. Still short of the
75 % goal: see the RESULTS row for what is left.

Lean variant (``lean=G``): ``_partials_lean`` does the same per-chunk work with fewer per-element operations --
the flags come out of the (NaN-propagating) max reduction instead of ten compares per element, the exp is
``_exp64m`` (14 float64 operations, no range branch; values below 700 nats under the chunk maximum are decided
zero in float32: they are below 1e-304 of the sum) -- and ``G`` chunks per program with the next chunk's logits
loaded before the current one is reduced. Cost model behind it (H100/H200 SM, per 32 elements): a float64
op holds the FP64 pipe 2 cycles, a float32<->float64 conversion ~8; two exps + conversions + sums are ~36
float64 ops, i.e. ~72 pipe cycles, while the measured 32 % of copy bandwidth is ~200 cycles -- so the old
kernel is not FP64-throughput-bound, and issue count and latency hiding are what the variant attacks.
"""

from __future__ import annotations

import torch

try:  # Triton is optional: the torch fallback covers machines without it.
    import triton
    import triton.language as tl

    from fideval.score import triton_launch, triton_stream
    from fideval.score.triton_stream import (  # the helpers both modules use
        _add5, _f64, _key, _max2, _or, _pack8, store_figures)
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None

NPF = 8  # float64 partials per (row, chunk): ma, mb, Sa, Sb, X, Y, Ea, flags


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _exp64(x):
        """exp(x) for float64 x <= 0 from FMAs: x = k ln2/2 + r, |r| <= ln2/4, degree-10 Taylor
        (truncation <= 1.1e-16 relative), times 2**(k//2) built from bits and sqrt(2) when k is odd.
        Below -708.4 the result is 0 (libdevice gives subnormals there; no sum can see the difference)."""
        x = tl.maximum(x, -1000.0)
        k = tl.floor(x * _f64(x, 2.8853900817779268) + 0.5)
        r = tl.fma(k, _f64(x, -3.46573590184561908245e-01), x)
        r = tl.fma(k, _f64(x, -9.54107464635293850010e-11), r)
        p = _f64(x, 2.755731922398589065e-07)
        p = tl.fma(p, r, _f64(x, 2.755731922398589065e-06))
        p = tl.fma(p, r, _f64(x, 2.4801587301587301587e-05))
        p = tl.fma(p, r, _f64(x, 1.9841269841269841270e-04))
        p = tl.fma(p, r, _f64(x, 1.3888888888888888889e-03))
        p = tl.fma(p, r, _f64(x, 8.3333333333333333333e-03))
        p = tl.fma(p, r, _f64(x, 4.1666666666666666667e-02))
        p = tl.fma(p, r, _f64(x, 1.6666666666666666667e-01))
        p = tl.fma(p, r, _f64(x, 0.5))
        p = tl.fma(p, r, _f64(x, 1.0))
        p = tl.fma(p, r, _f64(x, 1.0))
        ki = k.to(tl.int32)
        half = ki >> 1
        p = tl.where((ki & 1) != 0, p * _f64(x, 1.4142135623730951), p)
        scale = ((half + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
        return tl.where(half < -1022, 0.0, p * scale)

    @triton.jit
    def _exp64t(x):
        """exp(x) for float64 -700 <= x <= 0 (callers zero what lies below): x = k ln2/8 + r with k from the
        1.5 * 2**52 rounding trick (no float-to-int conversion), |r| <= ln2/16, a degree-8 Taylor
        polynomial (truncation 1.5e-18), times 2**((k mod 8)/8) picked by a select tree of constants, and
        2**(k div 8) added to the exponent bits. Fewer float64 operations than libdevice's, yet measured
        slower on an H200 (22 % vs 32 % of copy bandwidth: the selects and 64-bit integer work cost more);
        kept as a bench variant."""
        x = tl.maximum(x, -700.0)
        magic = _f64(x, 6755399441055744.0)
        t = tl.fma(x, _f64(x, 11.541560327111707), magic)
        k = t - magic
        ti = t.to(tl.int64, bitcast=True) - 4843621399236968448  # = k: t = 1.5 * 2**52 + k exactly
        r = tl.fma(k, _f64(x, -8.664339754614047706125e-02), x)
        r = tl.fma(k, _f64(x, -2.385268661588234625e-11), r)
        p = _f64(x, 2.4801587301587301587e-05)
        p = tl.fma(p, r, _f64(x, 1.9841269841269841270e-04))
        p = tl.fma(p, r, _f64(x, 1.3888888888888888889e-03))
        p = tl.fma(p, r, _f64(x, 8.3333333333333333333e-03))
        p = tl.fma(p, r, _f64(x, 4.1666666666666666667e-02))
        p = tl.fma(p, r, _f64(x, 1.6666666666666666667e-01))
        p = tl.fma(p, r, _f64(x, 0.5))
        p = tl.fma(p, r, _f64(x, 1.0))
        p = tl.fma(p, r, _f64(x, 1.0))
        b0 = (ti & 1) != 0
        b1 = (ti & 2) != 0
        b2 = (ti & 4) != 0
        t01 = tl.where(b0, _f64(x, 1.0905077326652577), _f64(x, 1.0))
        t23 = tl.where(b0, _f64(x, 1.2968395546510096), _f64(x, 1.189207115002721))
        t45 = tl.where(b0, _f64(x, 1.5422108254079407), _f64(x, 1.4142135623730951))
        t67 = tl.where(b0, _f64(x, 1.8340080864093424), _f64(x, 1.681792830507429))
        t03 = tl.where(b1, t23, t01)
        t47 = tl.where(b1, t67, t45)
        y = p * tl.where(b2, t47, t03)
        return (y.to(tl.int64, bitcast=True) + ((ti >> 3) << 52)).to(tl.float64, bitcast=True)

    @triton.jit
    def _exp64m(x):
        """exp(x) for float64 -700 <= x <= 0 (callers zero what lies below, deciding in float32): x = k ln2 + r
        with k from the 1.5 * 2**52 rounding trick (k sits in t's low bits: no conversion), r by two FMAs
        (Cody-Waite), a degree-10 polynomial with p(0) = 1 exactly (near-minimax on |r| <= ln2/2, fitted with
        mpmath: approximation error 2.2e-16 relative), and 2**k added to the exponent bits (one 64-bit add; no
        range branch). 14 float64 operations against libdevice's ~16 plus its range test and branch."""
        magic = _f64(x, 6755399441055744.0)
        t = tl.fma(x, _f64(x, 1.4426950408889634), magic)
        kd = t - magic
        r = tl.fma(kd, _f64(x, -6.93147180559945286227e-01), x)
        r = tl.fma(kd, _f64(x, -2.31904681384629955842e-17), r)
        p = _f64(x, 2.7491964657031836e-07)
        p = tl.fma(p, r, _f64(x, 2.763920473385284e-06))
        p = tl.fma(p, r, _f64(x, 2.4801900436396688e-05))
        p = tl.fma(p, r, _f64(x, 0.00019841173045597238))
        p = tl.fma(p, r, _f64(x, 0.0013888888528801456))
        p = tl.fma(p, r, _f64(x, 0.008333333382975))
        p = tl.fma(p, r, _f64(x, 0.04166666666820436))
        p = tl.fma(p, r, _f64(x, 0.16666666666564545))
        p = tl.fma(p, r, _f64(x, 0.4999999999999798))
        p = tl.fma(p, r, _f64(x, 1.0000000000000056))
        p = tl.fma(p, r, _f64(x, 1.0))
        # t = 1.5 * 2**52 + k: its low word is k, so t << 52 is k << 52 (mod 2**64) -- k added to p's exponent
        return (p.to(tl.int64, bitcast=True) + (t.to(tl.int64, bitcast=True) << 52)).to(tl.float64, bitcast=True)

    @triton.jit
    def _exp64_tab(x, TAB, INV_STEP: tl.constexpr, STEP: tl.constexpr, LOG2N: tl.constexpr, DEG: tl.constexpr):
        """exp(x) for float64 -700 <= x <= 0 (callers zero what lies below), table-driven: x = k ln2 / N + r with
        N = 2**LOG2N and k from the 1.5 * 2**52 rounding trick (k is t's low word: no conversion), r by one FMA
        (the rounding of ln2 / N costs |x| * 1.1e-16 relative, i.e. nothing where exp(x) can reach a sum),
        exp(r) - 1 = r * q(r) with q the Taylor polynomial of degree DEG - 1 (DEG is chosen with N so that the
        truncation r**(DEG+1) / (DEG+1)! stays below 4e-17 on |r| <= ln2 / 2N), times ``TAB[k mod N]`` =
        2**((k mod N) / N) (correctly rounded float64, gathered from a small table that stays in L1), with
        2**(k div N) added to the exponent bits. DEG + 4 float64 operations against ``_exp64m``'s 14."""
        magic = _f64(x, 6755399441055744.0)
        t = tl.fma(x, _f64(x, INV_STEP), magic)
        kd = t - magic
        r = tl.fma(kd, _f64(x, -STEP), x)
        ki = t.to(tl.int64, bitcast=True).to(tl.int32)  # = k: t = 1.5 * 2**52 + k exactly, whose low word is k
        tab = tl.load(TAB + (ki & ((1 << LOG2N) - 1)))
        q = _f64(x, 1.0)
        if DEG >= 6:
            q = tl.fma(_f64(x, 1.0 / 720.0), r, _f64(x, 1.0 / 120.0))
        elif DEG == 5:
            q = _f64(x, 1.0 / 120.0)
        if DEG >= 5:
            q = tl.fma(q, r, _f64(x, 1.0 / 24.0))
        elif DEG == 4:
            q = _f64(x, 1.0 / 24.0)
        if DEG >= 4:
            q = tl.fma(q, r, _f64(x, 1.0 / 6.0))
        else:
            q = _f64(x, 1.0 / 6.0)
        q = tl.fma(q, r, _f64(x, 0.5))
        q = tl.fma(q, r, _f64(x, 1.0))
        e = tl.fma(tab, q * r, tab)
        return (e.to(tl.int64, bitcast=True) + ((ki >> LOG2N).to(tl.int64) << 52)).to(tl.float64, bitcast=True)

    @triton.jit
    def _exp64_n(x, TAB, EXP: tl.constexpr):
        """The table exps by variant: 4 = N 256, degree 4; 5 = N 64, degree 5; 6 = N 2048, degree 3
        (each pair within 4e-17 truncation; constants N / ln2 and ln2 / N correctly rounded)."""
        if EXP == 4:
            y = _exp64_tab(x, TAB, 369.3299304675746, 0.0027076061740622863, 8, 4)
        elif EXP == 5:
            y = _exp64_tab(x, TAB, 92.33248261689366, 0.010830424696249145, 6, 5)
        else:
            y = _exp64_tab(x, TAB, 2954.639443740597, 0.0003384507717577858, 11, 3)
        return y

    @triton.jit
    def _f64_of_f32_bits(a):
        """float32 -> float64 on the integer pipe (a bench variant of the F2F conversion): exact for normal
        numbers; zero and subnormals become +-[2**-127, 2**-126) (an absolute error below 1.2e-38, which no
        logit difference can see). Callers map -inf to the lowest finite float32 first; NaN is flagged apart."""
        w = a.to(tl.int32, bitcast=True).to(tl.int64)
        mag = ((w & 0x7FFFFFFF) << 29) + 4035225266123964416  # exponent rebias 896 << 52
        return (mag | ((w >> 31) << 63)).to(tl.float64, bitcast=True)

    @triton.jit
    def _nanmax_nanmax_max_max(a1, b1, u1, v1, a2, b2, u2, v2):
        return (tl.maximum(a1, a2, propagate_nan=tl.PropagateNan.ALL),
                tl.maximum(b1, b2, propagate_nan=tl.PropagateNan.ALL),
                tl.maximum(u1, u2), tl.maximum(v1, v2))

    @triton.jit
    def _shifted_exps(a, b, ma32, mb32, sha, shb, TAB, EXP: tl.constexpr, CVT: tl.constexpr):
        """``xa = a - m_a``, ``xb = b - m_b`` in float64 (-inf mapped to the lowest float32 first, so that
        ``exp`` gives exactly 0 and ``0 * (xa - xb)`` stays 0) and their exps: EXP >= 4 the table exps, 3
        ``_exp64m``, else libdevice's. For 3 and up the zero below 700 nats is decided in float32: a - m rounds
        monotonically, so x >= -700 - 3e-5 wherever the exp's value is kept (its exponent add stays normal);
        NaN (-inf - -inf) and -inf give 0. CVT 1: the float32->float64 conversion on the integer pipe."""
        if CVT == 1:
            xa = _f64_of_f32_bits(tl.maximum(a, -3.4028234663852886e38)) - sha
            xb = _f64_of_f32_bits(tl.maximum(b, -3.4028234663852886e38)) - shb
        else:
            xa = tl.maximum(a, -3.4028234663852886e38).to(tl.float64) - sha
            xb = tl.maximum(b, -3.4028234663852886e38).to(tl.float64) - shb
        if EXP >= 4:
            ea = tl.where(a - ma32 >= -700.0, _exp64_n(xa, TAB, EXP), 0.0)
            eb = tl.where(b - mb32 >= -700.0, _exp64_n(xb, TAB, EXP), 0.0)
        elif EXP == 3:
            ea = tl.where(a - ma32 >= -700.0, _exp64m(xa), 0.0)
            eb = tl.where(b - mb32 >= -700.0, _exp64m(xb), 0.0)
        else:
            ea = tl.exp(xa)
            eb = tl.exp(xb)
        return xa, xb, ea, eb

    @triton.jit
    def _lean_chunk(a, b, offs, q, PF, PK, NQ, TAB, EXP: tl.constexpr, CVT: tl.constexpr):
        """The partials of one chunk with fewer per-element operations than ``_partials``: the flags come
        out of the max reduction itself. NaN-propagating maxima flag NaN/+inf (a NaN anywhere makes the chunk
        maximum NaN); the maximum of ``a`` where ``b = -inf`` is above -inf exactly when KL is +inf (and the
        mirror). No maximum here ever meets a NaN it must ignore (Triton leaves that case unspecified)."""
        ua = tl.where(b == float("-inf"), a, float("-inf"))  # > -inf somewhere: KL = +inf
        ub = tl.where(a == float("-inf"), b, float("-inf"))  # the mirror: reverse KL = +inf
        ma32, mb32, umax, vmax = tl.reduce((a, b, ua, ub), 0, _nanmax_nanmax_max_max)
        bad = (ma32 != ma32) | (ma32 == float("inf")) | (mb32 != mb32) | (mb32 == float("inf"))
        flags = (bad.to(tl.int32) | ((umax > float("-inf")).to(tl.int32) << 1)
                 | ((vmax > float("-inf")).to(tl.int32) << 2))
        ma = ma32.to(tl.float64)
        mb = mb32.to(tl.float64)
        ia = tl.where(a == ma32, offs, 2147483647)
        sha = tl.where(ma > float("-inf"), ma, 0.0)
        shb = tl.where(mb > float("-inf"), mb, 0.0)
        xa, xb, ea, eb = _shifted_exps(a, b, ma32, mb32, sha, shb, TAB, EXP, CVT)
        e = xa - xb
        s_a, s_b, x_, y_, ea_, ia = tl.reduce((ea, eb, ea * e, eb * e, ea * xa, ia), 0, _add5_min)
        j = tl.arange(0, 8)
        vals = _pack8(j, ma, mb, s_a, s_b, x_, y_, ea_, flags)
        tl.store(PF + q.to(tl.int64) * 8 + j, vals, mask=(j < 8) & (q + j * 0 < NQ))
        tl.store(PK + q + j * 0, ia + j * 0, mask=(j < 1) & (q + j * 0 < NQ))

    @triton.jit
    def _ld(ptr, m, LDC: tl.constexpr):
        # LDC 1: stream the logits past L1 (.cg), leaving it to the exp table
        if LDC == 1:
            x = tl.load(ptr, mask=m, other=float("-inf"), cache_modifier=".cg")
        else:
            x = tl.load(ptr, mask=m, other=float("-inf"))
        return x

    @triton.jit
    def _partials_lean(A, B, stride_a, stride_b, V, NCH, NQ, PF, PK, TAB, CHUNK: tl.constexpr, G: tl.constexpr,
                       EXP: tl.constexpr, CVT: tl.constexpr, LDC: tl.constexpr):
        """``G`` consecutive (row, chunk) items per program; the next item's logits are loaded before the
        current one is reduced (a register prefetch that overlaps HBM latency with the float64 work)."""
        q = tl.program_id(0) * G
        r = tl.arange(0, CHUNK)
        row = (q // NCH).to(tl.int64)
        offs = (q % NCH) * CHUNK + r
        m = (offs < V) & (q + r * 0 < NQ)
        a_n = _ld(A + row * stride_a + offs, m, LDC)
        b_n = _ld(B + row * stride_b + offs, m, LDC)
        for i in range(G):
            a = a_n
            b = b_n
            oc = offs
            qc = q
            q = qc + 1
            row = (q // NCH).to(tl.int64)
            offs = (q % NCH) * CHUNK + r
            m = (offs < V) & (q + r * 0 < NQ) & (i + 1 < G)
            a_n = _ld(A + row * stride_a + offs, m, LDC)
            b_n = _ld(B + row * stride_b + offs, m, LDC)
            _lean_chunk(a, b, oc, qc, PF, PK, NQ, TAB, EXP, CVT)

    @triton.jit
    def _max_max_min_min(a1, b1, u1, v1, a2, b2, u2, v2):
        return (tl.maximum(a1, a2, propagate_nan=tl.PropagateNan.ALL),
                tl.maximum(b1, b2, propagate_nan=tl.PropagateNan.ALL),
                tl.minimum(u1, u2), tl.minimum(v1, v2))

    @triton.jit
    def _partials_compact(A, B, stride_a, stride_b, V, NCH, PF, TAB, CHUNK: tl.constexpr, EXP: tl.constexpr,
                          CVT: tl.constexpr, LDC: tl.constexpr):
        """One (row, chunk) per program with the per-element work cut to what every row needs: one reduction
        gives both maxima (NaN-propagating: NaN/+inf flags) and both minima; only a chunk whose minimum is -inf
        pays for the finite-vs--inf tests (a second reduction on the registers it already holds); the argmax is
        left to :func:`_combine` (``SCAN``), which rescans the one chunk that holds the row maximum."""
        pid = tl.program_id(0)
        row = (pid // NCH).to(tl.int64)
        offs = (pid % NCH) * CHUNK + tl.arange(0, CHUNK)
        m = offs < V
        a = _ld(A + row * stride_a + offs, m, LDC)
        b = _ld(B + row * stride_b + offs, m, LDC)
        ma32, mb32, na32, nb32 = tl.reduce((a, b, a, b), 0, _max_max_min_min)
        bad = (ma32 != ma32) | (ma32 == float("inf")) | (mb32 != mb32) | (mb32 == float("inf"))
        flags = bad.to(tl.int32)
        if (na32 == float("-inf")) | (nb32 == float("-inf")):  # masked tokens here: settle the infinite KLDs
            ua = tl.where(b == float("-inf"), a, float("-inf"))  # > -inf somewhere: KL = +inf
            ub = tl.where(a == float("-inf"), b, float("-inf"))  # the mirror: reverse KL = +inf
            umax, vmax = tl.reduce((ua, ub), 0, _max2)
            flags = flags | ((umax > float("-inf")).to(tl.int32) << 1) | ((vmax > float("-inf")).to(tl.int32) << 2)
        ma = ma32.to(tl.float64)
        mb = mb32.to(tl.float64)
        sha = tl.where(ma > float("-inf"), ma, 0.0)
        shb = tl.where(mb > float("-inf"), mb, 0.0)
        xa, xb, ea, eb = _shifted_exps(a, b, ma32, mb32, sha, shb, TAB, EXP, CVT)
        e = xa - xb
        s_a, s_b, x_, y_, ea_ = tl.reduce((ea, eb, ea * e, eb * e, ea * xa), 0, _add5)
        j = tl.arange(0, 8)
        vals = _pack8(j, ma, mb, s_a, s_b, x_, y_, ea_, flags)
        tl.store(PF + pid.to(tl.int64) * 8 + j, vals)

    @triton.jit
    def _max_max_or(m1, n1, f1, m2, n2, f2):
        return tl.maximum(m1, m2), tl.maximum(n1, n2), f1 | f2

    @triton.jit
    def _add5_min(a0, a1, a2, a3, a4, i0, b0, b1, b2, b3, b4, j0):
        return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, tl.minimum(i0, j0)

    @triton.jit
    def _partials(A, B, stride_a, stride_b, V, NCH, PF, PK, CHUNK: tl.constexpr, FAST_EXP: tl.constexpr):
        pid = tl.program_id(0)
        row = (pid // NCH).to(tl.int64)
        ch = pid % NCH
        offs = ch * CHUNK + tl.arange(0, CHUNK)
        mask = offs < V
        a = tl.load(A + row * stride_a + offs, mask=mask, other=float("-inf"))
        b = tl.load(B + row * stride_b + offs, mask=mask, other=float("-inf"))
        # bit 0: NaN/+inf (bad row); bit 1: a finite, b = -inf (KL = +inf); bit 2: the mirror (reverse KL)
        fl = ((a != a) | (a == float("inf")) | (b != b) | (b == float("inf"))).to(tl.int32)
        fl = fl | (((a > float("-inf")) & (b == float("-inf"))).to(tl.int32) << 1)
        fl = fl | (((b > float("-inf")) & (a == float("-inf"))).to(tl.int32) << 2)
        ma32, mb32, flags = tl.reduce((a, b, fl), 0, _max_max_or)
        ma = ma32.to(tl.float64)
        mb = mb32.to(tl.float64)
        # argmax, lowest index among equal maxima: folded into the float64 reduction below
        ia = tl.where(a == ma32, offs, 2147483647)
        sha = tl.where(ma > float("-inf"), ma, 0.0)
        shb = tl.where(mb > float("-inf"), mb, 0.0)
        # -inf -> the lowest float32: exp gives exactly 0 and 0 * (finite difference) = 0
        xa = tl.maximum(a, -3.4028234663852886e38).to(tl.float64) - sha
        xb = tl.maximum(b, -3.4028234663852886e38).to(tl.float64) - shb
        if FAST_EXP == 2:
            ea = tl.where(a < ma32 - 700.0, 0.0, _exp64t(xa))
            eb = tl.where(b < mb32 - 700.0, 0.0, _exp64t(xb))
        elif FAST_EXP == 1:
            ea = _exp64(xa)
            eb = _exp64(xb)
        else:
            ea = tl.exp(xa)
            eb = tl.exp(xb)
        e = xa - xb
        s_a, s_b, x_, y_, ea_, ia = tl.reduce((ea, eb, ea * e, eb * e, ea * xa, ia), 0, _add5_min)
        j = tl.arange(0, 8)
        vals = _pack8(j, ma, mb, s_a, s_b, x_, y_, ea_, flags)
        tl.store(PF + pid.to(tl.int64) * 8 + j, vals)
        tl.store(PK + pid, ia)

    @triton.jit
    def _combine(PF, PK, A, B, stride_a, stride_b, T, OUTF, OUTI, BIA, NCH, V, NCH_P2: tl.constexpr,
                 SCAN: tl.constexpr = 0, RANK: tl.constexpr = 0):
        row = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, NCH_P2)
        cm = c < NCH
        base = (row * NCH + c) * 8
        ma = tl.load(PF + base + 0, mask=cm, other=float("-inf"))
        mb = tl.load(PF + base + 1, mask=cm, other=float("-inf"))
        s_a = tl.load(PF + base + 2, mask=cm, other=0.0)
        s_b = tl.load(PF + base + 3, mask=cm, other=0.0)
        x_ = tl.load(PF + base + 4, mask=cm, other=0.0)
        y_ = tl.load(PF + base + 5, mask=cm, other=0.0)
        ea_ = tl.load(PF + base + 6, mask=cm, other=0.0)
        fl = tl.reduce(tl.load(PF + base + 7, mask=cm, other=0.0).to(tl.int32), 0, _or)
        m_a = tl.max(ma, axis=0)
        m_b = tl.max(mb, axis=0)
        t = tl.load(T + row)
        at = tl.load(A + row * stride_a + t).to(tl.float64)
        bt = tl.load(B + row * stride_b + t).to(tl.float64)
        store_figures(OUTF + row * 7, ma, mb, s_a, s_b, x_, y_, ea_, m_a, m_b, at, bt, fl)
        # the reference argmax: first chunk holding the row maximum, then that chunk's first index of it
        cbest = tl.minimum(tl.min(tl.where(cm & (ma == m_a), c, NCH_P2), axis=0), NCH - 1)
        if SCAN > 0:  # the partials kept no argmax: the first index of the maximum in chunk cbest
            so = cbest * SCAN + tl.arange(0, SCAN)
            av = tl.load(A + row * stride_a + so, mask=so < V, other=float("-inf"))
            ia = tl.min(tl.where(av == m_a.to(tl.float32), so, 2147483647), axis=0).to(tl.int64)
        else:
            ia = tl.load(PK + row * NCH + cbest).to(tl.int64)
        # a NaN row's maximum matches nowhere (ia = 2**31 - 1): keep every read below in bounds (the row is flagged)
        ia = tl.minimum(ia, V - 1)
        bia = tl.load(B + row * stride_b + ia)
        tl.store(BIA + row * 2, _key(bia, ia))
        tl.store(BIA + row * 2 + 1, bia.to(tl.int32, bitcast=True).to(tl.int64))
        bad = ((fl & 1) != 0) | (m_a == float("-inf")) | (m_b == float("-inf"))
        oi = OUTI + row * 3
        tl.store(oi + 0, (ia == t).to(tl.int32))
        tl.store(oi + 1, bad.to(tl.int32))
        if RANK:  # the rank here, not in _rank: only chunks whose candidate maximum reaches b[i] are read
            kia = _key(bia, ia)
            n = tl.full((), 0, tl.int32)
            for c2 in range(0, NCH):
                if tl.load(PF + (row * NCH + c2) * 8 + 1) >= bia.to(tl.float64):
                    o2 = c2 * SCAN + tl.arange(0, SCAN)
                    bv = tl.load(B + row * stride_b + o2, mask=o2 < V, other=float("-inf"))
                    n = n + tl.sum((_key(bv, o2) > kia).to(tl.int32), axis=0)
            tl.store(oi + 2, n)
        else:
            tl.store(oi + 2, 0)  # the rank, counted by _rank

    @triton.jit
    def _rank(B, stride_b, V, NCH, PF, BIA, OUTI, CHUNK: tl.constexpr):
        pid = tl.program_id(0)
        row = (pid // NCH).to(tl.int64)
        ch = pid % NCH
        bia = tl.load(BIA + row * 2 + 1).to(tl.int32).to(tl.float32, bitcast=True)
        mb = tl.load(PF + pid.to(tl.int64) * 8 + 1)
        if mb >= bia.to(tl.float64):  # only here can a token beat (or tie below) the reference argmax
            kia = tl.load(BIA + row * 2)
            offs = ch * CHUNK + tl.arange(0, CHUNK)
            b = tl.load(B + row * stride_b + offs, mask=offs < V, other=float("-inf"))
            n = tl.sum((_key(b, offs) > kia).to(tl.int32), axis=0)
            if n > 0:
                tl.atomic_add(OUTI + row * 3 + 2, n)


def exp64(x: torch.Tensor, variant: int = 1) -> torch.Tensor:
    """The kernel's float64 exps on their own (x <= 0), for tests: 1 = ``_exp64``, 2 = ``_exp64t``,
    3 = ``_exp64m``, 4-6 = the table exps of :func:`_exp64_n` (2 and up take -700 <= x)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _exp64_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), exp_table(variant, x.device), BLOCK=1024,
                                                   VARIANT=variant)
    return y


if triton is not None:

    @triton.jit
    def _exp64_kernel(X, Y, N, TAB, BLOCK: tl.constexpr, VARIANT: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < N
        x = tl.load(X + o, mask=m, other=0.0)
        if VARIANT >= 4:
            y = _exp64_n(x, TAB, VARIANT)
        elif VARIANT == 2:
            y = _exp64t(x)
        elif VARIANT == 3:
            y = _exp64m(x)
        else:
            y = _exp64(x)
        tl.store(Y + o, y, mask=m)


_LAST: list = [None]  # the last partials launch's compiled kernel (registers, spills: bench diagnostics)


def last_partials_kernel():
    """The compiled partial-sums kernel of the last :func:`score_rows` call (``.n_regs``, ``.n_spills``), or None."""
    return _LAST[0]


_TAB_LOG2N = {4: 8, 5: 6, 6: 11, 7: 5, 8: 4, 9: 10, 10: 9}  # 7-10: N 32 / 16 / 1024 / 512, the streaming kernel's
# the table exps' constants as float64 kernel arguments (the streaming kernel's ``carg``): 1 / step, -step
# (step = ln2 / N), and the polynomial's top two coefficients (N = 256: Taylor's 1/24, 1/6; N = 1024 and 512:
# the degree-3 minimax ones of triton_stream._exp_tab)
_EXPK = {4: (369.3299304675746, -0.0027076061740622863, 1.0 / 24.0, 1.0 / 6.0),
         9: (1477.3197218702985, -0.0006769015435155716, 0.16666666680247416, 0.5000000039617454),
         10: (738.6598609351493, -0.0013538030870311431, 0.16666666720932405, 0.5000000158464087)}
_EXP256 = _EXPK[4]
_TABLES: dict = {}


def exp_table(variant: int, device, xadd: bool = False) -> torch.Tensor:
    """``2**(j / N)`` for j < N, each correctly rounded to float64 (computed with :mod:`decimal` at 40 digits,
    not with a float64 ``exp2`` that may be off by an ulp), on ``device``; cached. A 1-entry table for the
    variants that use none. ``xadd``: each entry's bits lowered by ``j << (52 - log2 N)`` (its high word by
    ``j << (20 - log2 N)``: a normal float64 in [0.5, 1)), for the streaming kernel's exponent add on the
    table entry (``triton_stream._tab_word``)."""
    key = (variant, device if isinstance(device, torch.device) else torch.device(device), bool(xadd))
    if key not in _TABLES:
        log2n = _TAB_LOG2N.get(variant, 0)
        from decimal import Decimal, localcontext

        with localcontext() as ctx:
            ctx.prec = 40
            ln2 = Decimal(2).ln()
            vals = [float((ln2 * j / (1 << log2n)).exp()) for j in range(1 << log2n)]
        tab = torch.tensor(vals, dtype=torch.float64)
        if xadd:
            j = torch.arange(1 << log2n, dtype=torch.int64)
            tab = (tab.view(torch.int64) - (j << (52 - log2n))).view(torch.float64)
        _TABLES[key] = tab.to(device)
    return _TABLES[key]


def score_rows(ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor, *, chunk: int = 8192,
               num_warps: int | None = None, fast_exp: int | None = None, lean: int = 0, cvt: int = 0, ldc: int = 0,
               compact: int = 1, combine_warps: int = 4, rank_in_combine: int = 0, stream: int = 1,
               tile_rows: int = 2, asm: int = 1, vec: int = 2, stages: int = 0, maxnreg: int = 0,
               red: int = 2, unroll: int = 1, carg: int = 1, post_warps: int = 4, xadd: int | None = None,
               pair: int = 1
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score float32 ``[n, V]`` rows on the GPU; same returns as :func:`fideval.score.torch_kernel.score_rows`.

    The default is the streaming kernel (:mod:`fideval.score.triton_stream`): a segment of ``chunk`` = 8,192
    tokens per one-warp program, walked in tiles of ``tile_rows`` x (32 * ``vec`` * ``num_warps``) tokens with the
    next tile's loads issued before the current one is reduced (``stages`` 0, two tiles a loop trip with
    ``unroll``; ``stages`` >= 2 uses Triton's asynchronous-copy pipeline instead), tile maxima by integer warp
    reductions (``red`` 2; 1 without the in-lane pair maximum, 0 shuffles), the N = 1,024 table exp with a
    degree-3 minimax polynomial (``fast_exp`` 9; 4 = N 256 with degree-4 Taylor, the default until session 7;
    10 = N 512 degree 3; 5, 7, 8 = N 64, 32, 16) with its address and exponent code in PTX (``asm``), its
    constants as kernel arguments (``carg``) and its exponent added to the table entry (``xadd`` 1; 0 after the
    polynomial) and, with ``pair`` 1 (the default since session 8), each lane's two tokens of a tile row
    summed into one set of accumulators (0: one set per token); then one launch of
    :func:`~fideval.score.triton_stream._post` (``post_warps`` warps a row) for the combine, the rank and the
    flags. ``chunk`` must be a whole number of tiles. Both launches go through
    :func:`fideval.score.triton_launch.launch`: Triton's JIT on the first call for a shape, alignment and
    configuration, the compiled kernel's launcher after that. Measured on H200s: see bench/RESULTS.md.

    ``stream=0`` gives the earlier kernels (bench variants): the compact kernel (chunk 8,192 on 8 warps was its
    best), ``rank_in_combine`` (the top-k rank inside the combine: no gain measured), ``compact=0`` the first
    kernels, whose ``fast_exp`` picks 0 libdevice's exp, 1 :func:`_exp64`, 2 :func:`_exp64t`, 3 :func:`_exp64m`,
    and ``lean`` >= 1 :func:`_partials_lean` with ``lean`` chunks per program. ``num_warps`` defaults to 1 for
    the streaming kernel and 8 for the others.
    """
    if triton is None:
        raise RuntimeError("triton is not installed")
    if fast_exp is None:
        fast_exp = 9 if stream else 4
    if xadd is None:
        xadd = 1 if stream else 0
    if stream and fast_exp not in (4, 5, 7, 8, 9, 10):
        raise ValueError(f"the streaming kernel takes fast_exp 4, 5, 7, 8, 9 or 10, not {fast_exp}")
    if stream and tile_rows not in (1, 2):
        raise ValueError(f"the streaming kernel takes tiles of 1 or 2 rows, not {tile_rows}")
    if compact and not stream and fast_exp not in (3, 4, 5, 6):
        raise ValueError(f"the compact kernel takes fast_exp 3-6, not {fast_exp}")
    n, vocab = ref.shape
    if cand.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(ref.shape)} vs {tuple(cand.shape)}")
    if ref.stride(1) != 1 or cand.stride(1) != 1:
        ref, cand = ref.contiguous(), cand.contiguous()
    dev = ref.device
    if num_warps is None:
        num_warps = 1 if stream else 8
    nch = triton.cdiv(vocab, chunk)
    if stream:  # the streaming partials kernel (a segment of ``chunk`` tokens per program), then the row outputs
        g = tile_rows * 32 * vec * num_warps  # tokens a tile: the rank pass's unit
        if n and chunk % g:
            raise ValueError(f"the streaming kernel's segments are whole tiles: chunk {chunk} is not a "
                             f"multiple of {g}")
        # only what the first kernel needs comes before its launch: the GPU idles until then
        pf = torch.empty((n * nch, NPF), dtype=torch.float64, device=dev)
        if n:
            tab, log2n = exp_table(fast_exp, dev, bool(xadd)), _TAB_LOG2N[fast_exp]
            tm = torch.empty((n * (vocab // g),), dtype=torch.float32, device=dev)
            _LAST[0] = triton_launch.launch(
                triton_stream._partials_stream, (n * nch,),
                ref, cand, ref.stride(0), cand.stride(0), vocab, nch, pf, tm, tab, *_EXPK.get(fast_exp, _EXP256),
                SEG=chunk, R=tile_rows,
                W=32 * vec * num_warps, LOG2N=log2n, ASM=int(asm), NS=stages, RED=int(red), UNR=int(unroll),
                CARG=int(bool(carg) and fast_exp in _EXPK), TABX=int(bool(xadd)),
                PAIR=int(bool(pair)), num_warps=num_warps,
                **({"maxnreg": maxnreg} if maxnreg else {}))
        t = targets.to(device=dev, dtype=torch.int64).contiguous()
        figs = torch.empty((n, 7), dtype=torch.float64, device=dev)
        flags = torch.empty((n, 4), dtype=torch.int8, device=dev)
        bad = torch.empty((n,), dtype=torch.int8, device=dev)
        if n:
            triton_launch.launch(triton_stream._post, (n,), pf, tm, ref, cand, ref.stride(0), cand.stride(0), t,
                                 vocab, nch, figs, flags, bad, SEG=chunk, NCH_P2=triton.next_power_of_2(nch), G=g,
                                 TB=1024, num_warps=post_warps)
        return figs, flags.view(torch.bool), bad.view(torch.bool)
    t = targets.to(device=dev, dtype=torch.int64).contiguous()
    pf = torch.empty((n * nch, NPF), dtype=torch.float64, device=dev)
    figs = torch.empty((n, 7), dtype=torch.float64, device=dev)
    pk = torch.empty((n * nch,), dtype=torch.int32, device=dev)
    outi = torch.empty((n, 3), dtype=torch.int32, device=dev)
    bia = torch.empty((n, 2), dtype=torch.int64, device=dev)
    if n:
        if compact:
            _LAST[0] = _partials_compact[(n * nch,)](ref, cand, ref.stride(0), cand.stride(0), vocab, nch, pf,
                                                     exp_table(fast_exp, dev), CHUNK=chunk, EXP=int(fast_exp),
                                                     CVT=int(cvt), LDC=int(ldc), num_warps=num_warps)
        elif lean:
            nq = n * nch
            _LAST[0] = _partials_lean[(triton.cdiv(nq, lean),)](ref, cand, ref.stride(0), cand.stride(0), vocab, nch, nq,
                                                     pf, pk, exp_table(fast_exp, dev), CHUNK=chunk, G=int(lean),
                                                     EXP=int(fast_exp), CVT=int(cvt), LDC=int(ldc), num_warps=num_warps)
        else:
            _partials[(n * nch,)](ref, cand, ref.stride(0), cand.stride(0), vocab, nch, pf, pk,
                                  CHUNK=chunk, FAST_EXP=int(fast_exp), num_warps=num_warps)
        _combine[(n,)](pf, pk, ref, cand, ref.stride(0), cand.stride(0), t, figs, outi, bia, nch, vocab,
                       NCH_P2=triton.next_power_of_2(nch), SCAN=chunk if compact else 0,
                       RANK=int(bool(compact and rank_in_combine)), num_warps=combine_warps if compact else 1)
        if not (compact and rank_in_combine):
            _rank[(n * nch,)](cand, cand.stride(0), vocab, nch, pf, bia, outi, CHUNK=chunk, num_warps=num_warps)
    rank = outi[:, 2]
    flags = torch.stack([rank < 1, rank < 5, rank < 10, outi[:, 0] != 0], dim=1)
    return figs, flags, outi[:, 1] != 0
