"""The streaming partial-sums kernel (the scorer's default): each program walks its (row, segment) in small tiles.

Why. The compact kernel (:mod:`fideval.score.triton_kernel`) holds a whole 8,192-token chunk of both rows in
registers between its max reduction and its exps: at 124 registers ptxas rematerialises (recomputes the exp's
first FMA, reloads 64-bit constants, re-selects the shifts), and the clamp, the 700-nats floor and the select
that guard -inf cost ten more instructions per element pair -- 74 issued per pair where ~45 do the work. Nsight
Compute on an H200 showed what the streaming shape is then up against: no pipe is saturated (FP64 56 %, issue
60 %); the warps wait on memory and on the float64 dependency chains (long-scoreboard and wait stalls).

* **A tile at a time, the next one in flight.** One warp per program (a [W] tile reduces with shuffles
  alone); ``R`` rows of ``W = 32 * vec`` tokens a tile; tile i + 1's loads are issued before tile i is reduced
  (``NS`` 0: a register prefetch; ``NS`` >= 2: Triton's asynchronous-copy pipeline, which feeds a no-exp probe
  at 78 % of copy bandwidth but costs registers with the exps in: slower). 72 registers, no spills.
* **Shifts are running maxima.** Before a tile's exps the program raises its shifts to the tile's maxima and,
  only when one grows (a uniform branch, a few times a segment), moves the sums to the new shift
  (:func:`_shift_to`). Every term is taken at or below its shift, so the rescaling adds numbers of one sign;
  a fixed shift instead (the segment's first token) measured 1.3e-12 against the numpy float64 reference,
  the peak token's ``x ln x`` term cancelling in the rescale; running maxima give 2.1e-13.
* **Unguarded exps, checked once.** No -inf clamp, floor or select per element: the program tracks each
  column's minimum and, where its segment holds -inf, NaN/+inf or spans over 640 nats, sets flag bit 3;
  :func:`_fix` (a second small launch, one program per row that returns at once for real logits) redoes
  those segments with :func:`guarded_segment`, the compact kernel's element logic. Its registers stay out of
  this kernel.
* **Exp.** :func:`_exp_tab`: ``2**(j/256)`` from the correctly rounded table and a degree-4 polynomial; with
  ``ASM`` the table address (``and`` + ``mad.wide``) and the exponent add (a shift and a multiply-add on the
  high word) are PTX, where Triton's 64-bit integer code takes four instructions.

The partials written are those of the compact kernel (``ma, mb, Sa, Sb, X, Y, E, flags`` per segment,
relative to the segment maxima), so :func:`~fideval.score.triton_kernel._combine` follows it unchanged; the
rank pass is :func:`~fideval.score.triton_kernel._rank_rows` (a program per row, scanning only the chunks whose
candidate maximum reaches ``b[i]``), and :func:`_finish` turns their integers into the boolean outputs.

Measured (bench/RESULTS.md, 2026-12-03, H200s, 2,047 rows at vocab 129,280): the whole scorer at 52.8-56.9 % of
copy bandwidth and 12.1-13.1x torch float64 over three runs (this kernel 724-738 us of the ~0.9 ms), against
46.5-47.4 % for the compact kernel in the same runs; largest difference from the numpy float64 reference 2.1e-13.
The 75 % goal is not met.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# nats below its segment's maximum that a token may lie for the unguarded sums to stand (the table exp's exponent
# add stays normal to 1022 * ln 2 = 708 nats; sums of ~1e5 terms of up to e**0 cannot overflow)
RANGE = tl.constexpr(640.0)


@triton.jit
def _f64(like, v: tl.constexpr):
    # a float64 constant at full precision (a bare Python float literal is typed float32 by Triton)
    return tl.full(like.shape, v, tl.float64)


@triton.jit
def _inv_fact(like, K: tl.constexpr):
    """1 / K! as a float64 tensor shaped like ``like`` (K <= 8)."""
    if K == 1:
        v = _f64(like, 1.0)
    elif K == 2:
        v = _f64(like, 0.5)
    elif K == 3:
        v = _f64(like, 1.0 / 6.0)
    elif K == 4:
        v = _f64(like, 1.0 / 24.0)
    elif K == 5:
        v = _f64(like, 1.0 / 120.0)
    elif K == 6:
        v = _f64(like, 1.0 / 720.0)
    elif K == 7:
        v = _f64(like, 1.0 / 5040.0)
    else:
        v = _f64(like, 1.0 / 40320.0)
    return v


@triton.jit
def _exp_tab(x, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr):
    """exp(x), |x| <= 700: x = k ln2/N + r with N = 2**LOG2N (k from the 1.5 * 2**52 rounding trick: t's low
    word), r by one FMA (ln2/N rounded: r is off by |x| * 1.1e-16, which no sum can see, since every x here is
    taken at or below a running maximum, so large |x| means a negligible term), exp(r) - 1 = r q(r) with q the Taylor polynomial
    of degree DEG - 1 (truncation below 4e-17 on |r| <= ln2/2N), times ``TAB[k mod N]`` = 2**((k mod N)/N), with
    k div N added to the exponent bits. N / DEG: 256 / 4, 64 / 5, 32 / 6, 16 / 7 -- a smaller table is fewer L1
    lines for the gather (32 lanes, random indices) to touch, at one more FMA per step."""
    if LOG2N == 8:
        INV: tl.constexpr = 369.3299304675746
        HI: tl.constexpr = 0.0027076061740622863
        DEG: tl.constexpr = 4
    elif LOG2N == 6:
        INV: tl.constexpr = 92.33248261689366
        HI: tl.constexpr = 0.010830424696249145
        DEG: tl.constexpr = 5
    elif LOG2N == 5:
        INV: tl.constexpr = 46.16624130844683
        HI: tl.constexpr = 0.02166084939249829
        DEG: tl.constexpr = 6
    else:
        INV: tl.constexpr = 23.083120654223414
        HI: tl.constexpr = 0.04332169878499658
        DEG: tl.constexpr = 7
    magic = _f64(x, 6755399441055744.0)
    t = tl.fma(x, _f64(x, INV), magic)
    kd = t - magic
    r = tl.fma(kd, _f64(x, -HI), x)
    ki = t.to(tl.int64, bitcast=True).to(tl.int32)
    if ASM:
        if LOG2N == 8:
            tab = tl.inline_asm_elementwise(
                "{ .reg .b32 i; .reg .b64 p; and.b32 i, $1, 255; mad.wide.u32 p, i, 8, $2; ld.global.nc.f64 $0, [p]; }",
                "=d,r,l", [ki, TAB + tl.zeros_like(ki)], dtype=tl.float64, is_pure=True, pack=1)
        elif LOG2N == 6:
            tab = tl.inline_asm_elementwise(
                "{ .reg .b32 i; .reg .b64 p; and.b32 i, $1, 63; mad.wide.u32 p, i, 8, $2; ld.global.nc.f64 $0, [p]; }",
                "=d,r,l", [ki, TAB + tl.zeros_like(ki)], dtype=tl.float64, is_pure=True, pack=1)
        elif LOG2N == 5:
            tab = tl.inline_asm_elementwise(
                "{ .reg .b32 i; .reg .b64 p; and.b32 i, $1, 31; mad.wide.u32 p, i, 8, $2; ld.global.nc.f64 $0, [p]; }",
                "=d,r,l", [ki, TAB + tl.zeros_like(ki)], dtype=tl.float64, is_pure=True, pack=1)
        else:
            tab = tl.inline_asm_elementwise(
                "{ .reg .b32 i; .reg .b64 p; and.b32 i, $1, 15; mad.wide.u32 p, i, 8, $2; ld.global.nc.f64 $0, [p]; }",
                "=d,r,l", [ki, TAB + tl.zeros_like(ki)], dtype=tl.float64, is_pure=True, pack=1)
    else:
        tab = tl.load(TAB + (ki & ((1 << LOG2N) - 1)))
    q = _inv_fact(x, DEG)
    for j in tl.static_range(DEG - 1, 0, -1):
        q = tl.fma(q, r, _inv_fact(x, j))
    e = tl.fma(tab, q * r, tab)
    if ASM:
        # hi word += (k >> LOG2N) << 20: k div N into the exponent field (one shift, one multiply-add)
        if LOG2N == 8:
            e = tl.inline_asm_elementwise(
                "{ .reg .b32 lo, hi, k; mov.b64 {lo, hi}, $1; shr.s32 k, $2, 8; shl.b32 k, k, 20; add.s32 hi, hi, k;"
                " mov.b64 $0, {lo, hi}; }", "=d,d,r", [e, ki], dtype=tl.float64, is_pure=True, pack=1)
        elif LOG2N == 6:
            e = tl.inline_asm_elementwise(
                "{ .reg .b32 lo, hi, k; mov.b64 {lo, hi}, $1; shr.s32 k, $2, 6; shl.b32 k, k, 20; add.s32 hi, hi, k;"
                " mov.b64 $0, {lo, hi}; }", "=d,d,r", [e, ki], dtype=tl.float64, is_pure=True, pack=1)
        elif LOG2N == 5:
            e = tl.inline_asm_elementwise(
                "{ .reg .b32 lo, hi, k; mov.b64 {lo, hi}, $1; shr.s32 k, $2, 5; shl.b32 k, k, 20; add.s32 hi, hi, k;"
                " mov.b64 $0, {lo, hi}; }", "=d,d,r", [e, ki], dtype=tl.float64, is_pure=True, pack=1)
        else:
            e = tl.inline_asm_elementwise(
                "{ .reg .b32 lo, hi, k; mov.b64 {lo, hi}, $1; shr.s32 k, $2, 4; shl.b32 k, k, 20; add.s32 hi, hi, k;"
                " mov.b64 $0, {lo, hi}; }", "=d,d,r", [e, ki], dtype=tl.float64, is_pure=True, pack=1)
    else:
        e = (e.to(tl.int64, bitcast=True) + ((ki >> LOG2N).to(tl.int64) << 52)).to(tl.float64, bitcast=True)
    return e


@triton.jit
def _add5(a0, a1, a2, a3, a4, b0, b1, b2, b3, b4):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4


@triton.jit
def _max2(a1, b1, a2, b2):
    return tl.maximum(a1, a2), tl.maximum(b1, b2)


@triton.jit
def _nanmax2(a1, b1, a2, b2):
    return tl.maximum(a1, a2, propagate_nan=tl.PropagateNan.ALL), tl.maximum(b1, b2, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min2(a1, b1, a2, b2):
    return tl.minimum(a1, a2), tl.minimum(b1, b2)


@triton.jit
def _fast_tile(a, b, sa, sb, m, acc, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr, MASKED: tl.constexpr):
    """Add one [W] tile's terms, shifted by ``sa``/``sb`` (float64 scalars), to the five [W] accumulators."""
    acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
    xa = a.to(tl.float64) - sa
    xb = b.to(tl.float64) - sb
    ea = _exp_tab(xa, TAB, LOG2N, ASM)
    eb = _exp_tab(xb, TAB, LOG2N, ASM)
    if MASKED:
        ea = tl.where(m, ea, 0.0)
        eb = tl.where(m, eb, 0.0)
        xa = tl.where(m, xa, 0.0)
        xb = tl.where(m, xb, 0.0)
    e = xa - xb
    return acc_sa + ea, acc_sb + eb, acc_x + ea * e, acc_y + eb * e, acc_e + ea * xa


@triton.jit
def _safe_tile(a, b, ma32, mb32, sa, sb, acc, u_a, u_b, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr):
    """The compact kernel's guarded element logic (shift at the maxima, -inf clamped, 700-nats floor) for one
    [W] tile; masked lanes arrive as -inf and add 0. ``u_a``/``u_b`` track the finite-vs--inf tests."""
    acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
    xa = tl.maximum(a, -3.4028234663852886e38).to(tl.float64) - sa
    xb = tl.maximum(b, -3.4028234663852886e38).to(tl.float64) - sb
    # below the floor the exp's input is garbage (its table index stays in bounds: k & 255) and is not taken
    ea = tl.where(a - ma32 >= -700.0, _exp_tab(xa, TAB, LOG2N, ASM), 0.0)
    eb = tl.where(b - mb32 >= -700.0, _exp_tab(xb, TAB, LOG2N, ASM), 0.0)
    e = xa - xb
    u_a = tl.maximum(u_a, tl.where(b == float("-inf"), a, float("-inf")))  # > -inf somewhere: KL = +inf
    u_b = tl.maximum(u_b, tl.where(a == float("-inf"), b, float("-inf")))  # the mirror: reverse KL = +inf
    return (acc_sa + ea, acc_sb + eb, acc_x + ea * e, acc_y + eb * e, acc_e + ea * xa), u_a, u_b


@triton.jit
def _pack8(j, ma, mb, s_a, s_b, x_, y_, ea_, flags):
    """The eight float64 partials of one (row, chunk), laid along ``j = arange(8)`` for one store."""
    return tl.where(j == 0, ma, tl.where(j == 1, mb, tl.where(j == 2, s_a, tl.where(j == 3, s_b, tl.where(
        j == 4, x_, tl.where(j == 5, y_, tl.where(j == 6, ea_, flags.to(tl.float64))))))))


@triton.jit
def _shift_to(acc, sa, sb, na, nb, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr):
    """Move the five sums from the shifts ``sa``/``sb`` to the higher ``na``/``nb`` (float64 scalars). Every
    term was taken at or below its shift (x <= 0), so ``E - d S`` adds two negative numbers: no cancellation.
    The weights use the table exp (its range holds wherever the sums can stand: a segment spread over 640
    nats is flagged and redone), which keeps libdevice's registers out of the loop."""
    acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
    da = na - sa
    db = nb - sb
    wa = _exp_tab(-da, TAB, LOG2N, ASM)
    wb = _exp_tab(-db, TAB, LOG2N, ASM)
    return (wa * acc_sa, wb * acc_sb, wa * (acc_x - (da - db) * acc_sa), wb * (acc_y - (da - db) * acc_sb),
            wa * (acc_e - da * acc_sa))


@triton.jit
def _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr):
    """The running maxima after a tile whose maxima are ``ta``/``tb`` (NaN-propagating), and the shifts and sums
    moved to them when one grows (a uniform branch)."""
    na32 = tl.maximum(ma32, ta, propagate_nan=tl.PropagateNan.ALL)
    nb32 = tl.maximum(mb32, tb, propagate_nan=tl.PropagateNan.ALL)
    if (na32 > ma32) | (nb32 > mb32):
        acc = _shift_to(acc, sa, sb, na32.to(tl.float64), nb32.to(tl.float64), TAB, LOG2N, ASM)
        sa = na32.to(tl.float64)
        sb = nb32.to(tl.float64)
    return na32, nb32, sa, sb, acc


@triton.jit
def _tile_update(a0, b0, a1, b1, ma32, mb32, sa, sb, mn_a, mn_b, acc, w, TAB, R: tl.constexpr, LOG2N: tl.constexpr,
                 ASM: tl.constexpr):
    """One tile (rows ``a0``/``b0`` and, when R == 2, ``a1``/``b1``): raise the shifts to the tile's maxima
    first (a uniform branch: the sums move only when a maximum grows), then add the tile's terms."""
    if R == 2:
        ta, tb = tl.reduce((tl.maximum(a0, a1, propagate_nan=tl.PropagateNan.ALL),
                            tl.maximum(b0, b1, propagate_nan=tl.PropagateNan.ALL)), 0, _nanmax2)
        mn_a = tl.minimum(mn_a, tl.minimum(a0, a1))
        mn_b = tl.minimum(mn_b, tl.minimum(b0, b1))
    else:
        ta, tb = tl.reduce((a0, b0), 0, _nanmax2)
        mn_a = tl.minimum(mn_a, a0)
        mn_b = tl.minimum(mn_b, b0)
    ma32, mb32, sa, sb, acc = _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, TAB, LOG2N, ASM)
    acc = _fast_tile(a0, b0, sa, sb, w, acc, TAB, LOG2N, ASM, False)
    if R == 2:
        acc = _fast_tile(a1, b1, sa, sb, w, acc, TAB, LOG2N, ASM, False)
    return ma32, mb32, sa, sb, mn_a, mn_b, acc


@triton.jit
def _segment(pa, pb, n, TAB, R: tl.constexpr, W: tl.constexpr, LOG2N: tl.constexpr, ASM: tl.constexpr,
             NS: tl.constexpr):
    """The compact partials of the ``n`` tokens at ``pa``/``pb`` (``n`` a constexpr or a launch argument, never
    a program-dependent value: loop bounds stay scalar for the compiler and for Triton's interpreter). Where
    the unguarded sums cannot stand (-inf, NaN/+inf, a spread over 640 nats) flag bit 3 asks :func:`_fix` to
    redo them with :func:`guarded_segment`; the maxima are exact either way."""
    w = tl.arange(0, W)
    # the shifts: running maxima, raised (and the sums moved) before a tile that exceeds them
    ma32 = tl.load(pa)
    mb32 = tl.load(pb)
    sa = ma32.to(tl.float64)
    sb = mb32.to(tl.float64)
    z = tl.zeros([W], tl.float64)
    acc = (z, z, z, z, z)
    mn_a = tl.full([W], float("inf"), tl.float32)
    mn_b = mn_a
    nfull = n // (R * W)
    if NS == 0:
        # register prefetch: tile i + 1's loads are issued before tile i is reduced, so every warp keeps a tile
        # of HBM reads in flight while it does float64 work
        a0n = tl.load(pa + w, mask=nfull > 0)
        b0n = tl.load(pb + w, mask=nfull > 0)
        if R == 2:
            a1n = tl.load(pa + W + w, mask=nfull > 0)
            b1n = tl.load(pb + W + w, mask=nfull > 0)
        else:
            a1n = a0n
            b1n = b0n
        for i in range(0, nfull):
            a0, b0, a1, b1 = a0n, b0n, a1n, b1n
            o = (i + 1) * (R * W) + w
            more = i + 1 < nfull
            a0n = tl.load(pa + o, mask=more)
            b0n = tl.load(pb + o, mask=more)
            if R == 2:
                a1n = tl.load(pa + o + W, mask=more)
                b1n = tl.load(pb + o + W, mask=more)
            ma32, mb32, sa, sb, mn_a, mn_b, acc = _tile_update(a0, b0, a1, b1, ma32, mb32, sa, sb, mn_a, mn_b, acc,
                                                               w, TAB, R, LOG2N, ASM)
    else:
        # Triton's pipeliner: NS - 1 tiles in flight as asynchronous copies into shared memory
        for i in tl.range(0, nfull, num_stages=NS):
            o = i * (R * W) + w
            a0 = tl.load(pa + o)
            b0 = tl.load(pb + o)
            if R == 2:
                a1 = tl.load(pa + o + W)
                b1 = tl.load(pb + o + W)
            else:
                a1 = a0
                b1 = b0
            ma32, mb32, sa, sb, mn_a, mn_b, acc = _tile_update(a0, b0, a1, b1, ma32, mb32, sa, sb, mn_a, mn_b, acc,
                                                               w, TAB, R, LOG2N, ASM)
    for o0 in range(nfull * (R * W), n, W):  # the ragged end: masked lanes leave the extrema alone and add 0
        o = o0 + w
        m = o < n
        a = tl.load(pa + o, mask=m, other=float("-inf"))
        b = tl.load(pb + o, mask=m, other=float("-inf"))
        ta, tb = tl.reduce((a, b), 0, _nanmax2)
        mn_a = tl.minimum(mn_a, tl.where(m, a, float("inf")))
        mn_b = tl.minimum(mn_b, tl.where(m, b, float("inf")))
        ma32, mb32, sa, sb, acc = _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, TAB, LOG2N, ASM)
        acc = _fast_tile(tl.where(m, a, 0.0), tl.where(m, b, 0.0), sa, sb, m, acc, TAB, LOG2N, ASM, True)
    bad = (ma32 != ma32) | (ma32 == float("inf")) | (mb32 != mb32) | (mb32 == float("inf"))
    ma = ma32.to(tl.float64)
    mb = mb32.to(tl.float64)
    na32, nb32 = tl.reduce((mn_a, mn_b), 0, _min2)
    # every token within 640 nats of its segment's maximum (so of the shift it was taken at): the sums stand
    fast = (ma - na32.to(tl.float64) <= RANGE) & (mb - nb32.to(tl.float64) <= RANGE)
    flags = bad.to(tl.int32) | ((~fast & ~bad).to(tl.int32) << 3)
    s_a, s_b, x_, y_, e_ = tl.reduce(acc, 0, _add5)
    return ma, mb, s_a, s_b, x_, y_, e_, flags


@triton.jit
def guarded_segment(pa, pb, n, ma, mb, TAB, W: tl.constexpr, LOG2N: tl.constexpr):
    """The partial sums of a flagged segment (``n`` tokens at ``pa``/``pb``, float64 maxima ``ma``/``mb``),
    shifted to its maxima with the guarded element logic: -inf clamped, the 700-nats floor, the
    finite-vs--inf flags (bits 1 and 2). Rare (masked or extreme rows); run by :func:`_fix`, so that its
    registers stay out of the streaming kernel."""
    w = tl.arange(0, W)
    ma32 = ma.to(tl.float32)
    mb32 = mb.to(tl.float32)
    sha = tl.where(ma > float("-inf"), ma, 0.0)
    shb = tl.where(mb > float("-inf"), mb, 0.0)
    z = tl.zeros([W], tl.float64)
    acc = (z, z, z, z, z)
    u_a = tl.full([W], float("-inf"), tl.float32)
    u_b = u_a
    for o0 in range(0, n, W):
        o = o0 + w
        m = o < n
        a = tl.load(pa + o, mask=m, other=float("-inf"))
        b = tl.load(pb + o, mask=m, other=float("-inf"))
        acc, u_a, u_b = _safe_tile(a, b, ma32, mb32, sha, shb, acc, u_a, u_b, TAB, LOG2N, 0)
    s_a, s_b, x_, y_, e_ = tl.reduce(acc, 0, _add5)
    umax, vmax = tl.reduce((u_a, u_b), 0, _max2)
    flags = ((umax > float("-inf")).to(tl.int32) << 1) | ((vmax > float("-inf")).to(tl.int32) << 2)
    return s_a, s_b, x_, y_, e_, flags


@triton.jit
def _partials_stream(A, B, stride_a, stride_b, V, NCH, PF, TAB, SEG: tl.constexpr, R: tl.constexpr,
                     W: tl.constexpr, LOG2N: tl.constexpr, ASM: tl.constexpr, NS: tl.constexpr):
    """One (row, segment of SEG tokens) per program, in tiles of R x [W] tokens; writes the compact partials.
    A row's last segment (short, maybe ragged) has its own copy of the code, so that every other segment runs
    a loop of constexpr length with no tail."""
    pid = tl.program_id(0)
    row = (pid // NCH).to(tl.int64)
    seg = pid % NCH
    pa = A + row * stride_a + seg * SEG
    pb = B + row * stride_b + seg * SEG
    if seg == NCH - 1:
        ma, mb, s_a, s_b, x_, y_, e_, flags = _segment(pa, pb, V - (NCH - 1) * SEG, TAB, R, W, LOG2N, ASM, NS)
    else:
        ma, mb, s_a, s_b, x_, y_, e_, flags = _segment(pa, pb, SEG, TAB, R, W, LOG2N, ASM, NS)
    j = tl.arange(0, 8)
    tl.store(PF + pid.to(tl.int64) * 8 + j, _pack8(j, ma, mb, s_a, s_b, x_, y_, e_, flags))


@triton.jit
def _fix(PF, A, B, stride_a, stride_b, V, NCH, TAB, SEG: tl.constexpr, NCH_P2: tl.constexpr, W: tl.constexpr,
         LOG2N: tl.constexpr):
    """One program per row: redo, with :func:`guarded_segment`, the sums of every segment whose flag bit 3 is
    set (a row of real logits has none, and its program returns after one vector load)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, NCH_P2)
    flv = tl.load(PF + (row * NCH + c) * 8 + 7, mask=c < NCH, other=0.0).to(tl.int32)
    if (tl.reduce(flv, 0, _or) & 8) != 0:
        for c2 in range(0, NCH):
            pfc = PF + (row * NCH + c2) * 8
            f2 = tl.load(pfc + 7).to(tl.int32)
            if (f2 & 8) != 0:
                ma = tl.load(pfc)
                mb = tl.load(pfc + 1)
                s_a, s_b, x_, y_, e_, fl = guarded_segment(A + row * stride_a + c2 * SEG, B + row * stride_b + c2 * SEG,
                                                          tl.minimum(V - c2 * SEG, SEG), ma, mb, TAB, W, LOG2N)
                j = tl.arange(0, 8)
                tl.store(pfc + j, _pack8(j, ma, mb, s_a, s_b, x_, y_, e_, (f2 & 1) | fl))


@triton.jit
def _or(x, y):
    return x | y


@triton.jit
def _finish(OUTI, FLAGS, BAD, N, BLOCK: tl.constexpr):
    """The boolean outputs from the combine's and the rank pass's integers, in one launch: top-1/5/10 from the
    rank, ref_correct, and the non-finite row mask."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = r < N
    rank = tl.load(OUTI + r * 3 + 2, mask=m, other=0)
    hit = tl.load(OUTI + r * 3, mask=m, other=0)
    bad = tl.load(OUTI + r * 3 + 1, mask=m, other=0)
    tl.store(FLAGS + r * 4, (rank < 1).to(tl.int8), mask=m)
    tl.store(FLAGS + r * 4 + 1, (rank < 5).to(tl.int8), mask=m)
    tl.store(FLAGS + r * 4 + 2, (rank < 10).to(tl.int8), mask=m)
    tl.store(FLAGS + r * 4 + 3, (hit != 0).to(tl.int8), mask=m)
    tl.store(BAD + r, (bad != 0).to(tl.int8), mask=m)


@triton.jit
def _exp_kernel(X, Y, N, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < N, other=0.0)
    tl.store(Y + o, _exp_tab(x, TAB, LOG2N, ASM), mask=o < N)


def exp_tab(x: torch.Tensor, tab: torch.Tensor, log2n: int, asm: int = 1) -> torch.Tensor:
    """:func:`_exp_tab` on its own (float64 ``x`` in [-700, 0], ``tab`` = ``triton_kernel.exp_table`` of the
    matching variant), for tests."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _exp_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), tab, LOG2N=log2n, ASM=asm, BLOCK=1024)
    return y
