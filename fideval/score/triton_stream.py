"""The scorer's default kernels: a streaming partial-sums kernel (each program walks its (row, segment) in small
tiles) and one program a row for the outputs.

Why. The compact kernel (:mod:`fideval.score.triton_kernel`) holds a whole 8,192-token chunk of both rows in
registers between its max reduction and its exps: at 124 registers ptxas rematerialises (recomputes the exp's
first FMA, reloads 64-bit constants, re-selects the shifts), and the clamp, the 700-nats floor and the select
that guard -inf cost ten more instructions per element pair -- 74 issued per pair where ~45 do the work. Nsight
Compute on an H200 showed what the streaming shape is then up against: no pipe is saturated (FP64 56 %, issue
60 %); the warps wait on memory and on the float64 dependency chains (long-scoreboard and wait stalls).

:func:`_partials_stream`, one warp per (row, segment of 8,192 tokens):

* **A tile at a time, the next one in flight.** ``R`` rows of ``W = 32 * vec`` tokens a tile; tile i + 1's
  loads are issued before tile i is reduced (``NS`` 0: a register prefetch, two tiles a loop trip (``UNR``) so
  that no registers are copied between trips; ``NS`` >= 2: Triton's asynchronous-copy pipeline, which feeds a
  no-exp probe at 78 % of copy bandwidth but costs registers with the exps in: slower).
* **Shifts are running maxima.** Before a tile's exps the program raises its shifts to the tile's maxima and,
  only when one grows (a uniform branch, a few times a segment), moves the sums to the new shift
  (:func:`_shift_to`). Every term is taken at or below its shift, so the rescaling adds numbers of one sign;
  a fixed shift instead (the segment's first token) measured 1.3e-12 against the numpy float64 reference,
  the peak token's ``x ln x`` term cancelling in the rescale; running maxima give 2.1e-13. The tile maxima
  are integer warp reductions (``RED``: each lane's pair maximum, then :func:`_key32` and one ``redux.sync``
  in place of five shuffle-and-max steps); the same rare branch moves the reference argmax.
* **Unguarded exps, checked once.** No -inf clamp, floor or select per element: the program tracks each
  column's (NaN-propagating) minimum and, where its segment holds -inf, NaN/+inf or spans over 640 nats,
  redoes it at the end with :func:`guarded_segment`, the compact kernel's element logic (never, for real
  logits).
* **Exp.** :func:`_exp_tab`: ``2**(j/N)`` from the correctly rounded table and a short polynomial, by default
  N = 1,024 with a degree-3 minimax polynomial (9.4e-17 relative; N = 256 with degree-4 Taylor until
  2026-12-03: one FMA more per exp). ``ASM``: the table address (``and`` + ``mad.wide``) and the exponent add
  in PTX, where Triton's 64-bit integer code takes four instructions; ``TABX``: the exponent added to the
  table entry before the polynomial (:func:`_tab_word`: one integer instruction where it took two); ``CARG``:
  the constants as float64 kernel arguments (constant-bank operands, where literals were moved into
  registers on every loop trip: 96 registers without).
* **One accumulator set a lane** (``PAIR``, the default since 2026-12-04): a lane's two tokens of a tile row
  are split (:func:`_halves`, a register view) and added one after the other into one set of [W / 2] sums
  and minima, where each token had its own set (reduced across at the segment's end). ptxas gives it 96
  registers against 80, yet its partials kernel took 656 us against 700 in the same timeline; the summation
  order differs, so its bits differ from ``PAIR`` 0 (both within 3.4e-13 of numpy float64).
* **What it writes.** The compact kernel's partials (``ma, mb, Sa, Sb, X, Y, E, flags`` per segment, relative
  to the segment maxima; the argmax within the segment in the flags word) and the candidate's maximum over
  every tile.

:func:`_post`, one program per row: the rescale of the partials into the seven figures, the realized token,
and the rank of the reference argmax ``i`` among the candidate's tokens. Only ``rank < 1, 5, 10`` is an
output, so ten tiles whose candidate maximum exceeds ``b[i]`` settle it unread, and otherwise only the tiles
that reach ``b[i]`` are read (one or two for a candidate close to its reference): 19 us a call where the
combine and the chunk-scanning rank took ~90, and an unrelated candidate no longer costs a re-read.

Measured (bench/RESULTS.md, H200, 2,047 rows at vocab 129,280, medians of round-robin rounds; single rounds
of one configuration spread over up to 6 points, and the same kernel ran 12 % slower in one run than minutes
before). 2026-12-04, session 8: ``PAIR`` 1 at 61.1 / 63.3 % of copy bandwidth against 55.9 / 60.0 % for
``PAIR`` 0 in the same runs, and 67.0 against 62.4 % in the final run (15.4x torch float64); its partials
kernel 656 us + _post 19.6 us back to back, i.e. 73 % of copy for the kernels alone: the rest of a single
call is the host's launch work (less since triton_launch) and, for a first call after an idle GPU, more
(895-1,040 us where the next ones take 681).
Largest difference from the numpy float64 reference 3.3e-13. The 75 % goal is not met: Nsight Compute (657 us
at 1.88 GHz) puts DRAM at 67 %, warp stalls on float64 dependencies (wait 28 %), loads (long scoreboard 16 %)
and the FP64 pipe (15 %); 22 float64 instructions a token make a floor of ~350 us, issue ~400 us. Tried and
dropped: an L2 prefetch of the tile 2-16 tiles ahead (64.2-52.5 % against 64.6 %), more warps a scheduler by a
register cap (64: 58.4 %, 72: 60.5-61.9 %). 2026-12-04, session 10: what the figure runs up against is the
board's power cap. Scoring back to back for seconds, the H200 draws its 700 W limit (nvidia-smi: throttle
reason SW power cap) and its SM clock falls to 1,455-1,695 MHz, where a copy of the same bytes runs at
1,980 MHz and ~640 W: sustained, the scorer makes 61-62 % of the sustained copy, against 67 % for the bench's
single calls (short gaps between them). On rows that alias one L2-resident row (no HBM reads) the same kernel
takes 664 us at ~1.9 GHz and still 697 W: the float64 work alone draws the cap. At 700 W a call of 667 us
(75 %) may spend 467 mJ where it spends ~568 (812 us), and the reads' share (~100 mJ) is fixed: the compute
must cost ~20 % less energy a token; fewer stalls alone buy nothing. Nor did a change that moves work off the
FP64 pipe at the same speed per clock: k taken from float32 arithmetic (two float64 instructions an exp
fewer, 86 registers) ran at a 3-5 % higher clock and the same time a call.
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
def _tab_word(ki, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr, TABX: tl.constexpr):
    """``TAB[k mod N]``; with ``TABX`` (the table of :func:`~fideval.score.triton_kernel.exp_table` ``xadd``,
    each entry's high word lowered by ``j << (20 - LOG2N)``) already scaled by ``2**(k div N)``: adding
    ``k << (20 - LOG2N)`` to the high word restores the entry's own bits and adds ``k div N`` to its exponent in
    one integer instruction (where the exponent add after the polynomial takes a shift and a multiply-add). A
    power-of-two scaling moved before the FMA: the same bits wherever the result is normal, and x < -708, where
    the exponent leaves its range either way, is caught by the callers' 640-nats test as before."""
    MASK: tl.constexpr = (1 << LOG2N) - 1
    SH: tl.constexpr = 20 - LOG2N
    mask = tl.full(ki.shape, MASK, tl.int32)  # constants as operands: ptxas folds them into the instructions
    if ASM:
        if TABX:
            tab = tl.inline_asm_elementwise(
                "{ .reg .b32 i, lo, hi, s; .reg .b64 p; and.b32 i, $1, $3; mad.wide.u32 p, i, 8, $2;"
                " ld.global.nc.v2.u32 {lo, hi}, [p]; shl.b32 s, $1, $4; add.s32 hi, hi, s; mov.b64 $0, {lo, hi}; }",
                "=d,r,l,r,r", [ki, TAB + tl.zeros_like(ki), mask, tl.full(ki.shape, SH, tl.int32)],
                dtype=tl.float64, is_pure=True, pack=1)
        else:
            tab = tl.inline_asm_elementwise(
                "{ .reg .b32 i; .reg .b64 p; and.b32 i, $1, $3; mad.wide.u32 p, i, 8, $2; ld.global.nc.f64 $0, [p]; }",
                "=d,r,l,r", [ki, TAB + tl.zeros_like(ki), mask], dtype=tl.float64, is_pure=True, pack=1)
    else:
        tab = tl.load(TAB + (ki & MASK))
        if TABX:
            tab = (tab.to(tl.int64, bitcast=True) + (ki.to(tl.int64) << (52 - LOG2N))).to(tl.float64, bitcast=True)
    return tab


@triton.jit
def _exp_tab(x, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr, KC=None, TABX: tl.constexpr = 0):
    """exp(x), |x| <= 700: x = k ln2/N + r with N = 2**LOG2N (k from the 1.5 * 2**52 rounding trick: t's low
    word), r by one FMA (ln2/N rounded: r is off by |x| * 1.1e-16, which no sum can see, since every x here is
    taken at or below a running maximum, so large |x| means a negligible term), exp(r) - 1 = r q(r) with q a
    polynomial of degree DEG - 1, times ``TAB[k mod N]`` = 2**((k mod N)/N), with k div N added to the exponent
    bits. N / DEG: 256 / 4, 64 / 5, 32 / 6, 16 / 7 (Taylor: truncation below 4e-17 on |r| <= ln2/2N; a smaller
    table is fewer L1 lines for the gather, at one more FMA each step); 1024 / 3 and 512 / 3 (minimax on
    |r| <= 1.001 ln2/2N: 9.4e-17 and 1.5e-15 relative; one FMA fewer than N = 256). ``KC``: the constants (1/step,
    -step, and the two top coefficients) as kernel arguments, which
    ptxas reads from the constant bank where literals are moved into registers on every loop trip. ``TABX``:
    the exponent add on the table entry, before the polynomial (:func:`_tab_word`)."""
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
    elif LOG2N == 10:
        INV: tl.constexpr = 1477.3197218702985
        HI: tl.constexpr = 0.0006769015435155716
        DEG: tl.constexpr = 3
        C2: tl.constexpr = 0.5000000039617454
        C3: tl.constexpr = 0.16666666680247416
    elif LOG2N == 9:
        INV: tl.constexpr = 738.6598609351493
        HI: tl.constexpr = 0.0013538030870311431
        DEG: tl.constexpr = 3
        C2: tl.constexpr = 0.5000000158464087
        C3: tl.constexpr = 0.16666666720932405
    else:
        INV: tl.constexpr = 23.083120654223414
        HI: tl.constexpr = 0.04332169878499658
        DEG: tl.constexpr = 7
    magic = _f64(x, 6755399441055744.0)
    if KC is None:
        t = tl.fma(x, _f64(x, INV), magic)
    else:
        t = tl.fma(x, tl.broadcast_to(KC[0], x.shape), magic)
    ki = t.to(tl.int64, bitcast=True).to(tl.int32)
    kd = t - magic
    if KC is None:
        r = tl.fma(kd, _f64(x, -HI), x)
    else:
        r = tl.fma(kd, tl.broadcast_to(KC[1], x.shape), x)
    tab = _tab_word(ki, TAB, LOG2N, ASM, TABX)
    if DEG == 3:
        if KC is None:
            q = tl.fma(_f64(x, C3), r, _f64(x, C2))
        else:
            q = tl.fma(tl.broadcast_to(KC[2], x.shape), r, tl.broadcast_to(KC[3], x.shape))
        q = tl.fma(q, r, _f64(x, 1.0))
    elif KC is None:
        q = _inv_fact(x, DEG)
        for j in tl.static_range(DEG - 1, 0, -1):
            q = tl.fma(q, r, _inv_fact(x, j))
    else:  # N = 256, degree 4
        q = tl.fma(tl.broadcast_to(KC[2], x.shape), r, tl.broadcast_to(KC[3], x.shape))
        q = tl.fma(q, r, _f64(x, 0.5))
        q = tl.fma(q, r, _f64(x, 1.0))
    e = tl.fma(tab, q * r, tab)
    if TABX:
        pass  # the exponent is in the table word already
    elif ASM:
        # hi word += (k >> LOG2N) << 20: k div N into the exponent field (one shift, one multiply-add)
        e = tl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi, k; mov.b64 {lo, hi}, $1; shr.s32 k, $2, $3; shl.b32 k, k, 20; add.s32 hi, hi, k;"
            " mov.b64 $0, {lo, hi}; }", "=d,d,r,r", [e, ki, tl.full(ki.shape, LOG2N, tl.int32)], dtype=tl.float64,
            is_pure=True, pack=1)
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
def _nanmax(x, y):
    return tl.maximum(x, y, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nanmax2(a1, b1, a2, b2):
    return _nanmax(a1, a2), _nanmax(b1, b2)


@triton.jit
def _fast_tile(a, b, sa, sb, m, acc, TAB, KC, LOG2N: tl.constexpr, ASM: tl.constexpr, MASKED: tl.constexpr,
               TABX: tl.constexpr):
    """Add one [W] tile's terms, shifted by ``sa``/``sb`` (float64 scalars), to the five [W] accumulators."""
    acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
    xa = a.to(tl.float64) - sa
    xb = b.to(tl.float64) - sb
    ea = _exp_tab(xa, TAB, LOG2N, ASM, KC, TABX)
    eb = _exp_tab(xb, TAB, LOG2N, ASM, KC, TABX)
    if MASKED:
        ea = tl.where(m, ea, 0.0)
        eb = tl.where(m, eb, 0.0)
        xa = tl.where(m, xa, 0.0)
        xb = tl.where(m, xb, 0.0)
    e = xa - xb
    return acc_sa + ea, acc_sb + eb, acc_x + ea * e, acc_y + eb * e, acc_e + ea * xa


@triton.jit
def _safe_tile(a, b, ma32, mb32, sa, sb, acc, u_a, u_b, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr,
               TABX: tl.constexpr):
    """The compact kernel's guarded element logic (shift at the maxima, -inf clamped, 700-nats floor) for one
    [W] tile; masked lanes arrive as -inf and add 0. ``u_a``/``u_b`` track the finite-vs--inf tests."""
    acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
    xa = tl.maximum(a, -3.4028234663852886e38).to(tl.float64) - sa
    xb = tl.maximum(b, -3.4028234663852886e38).to(tl.float64) - sb
    # below the floor the exp's input is garbage (its table index stays in bounds: k mod N) and is not taken
    ea = tl.where(a - ma32 >= -700.0, _exp_tab(xa, TAB, LOG2N, ASM, None, TABX), 0.0)
    eb = tl.where(b - mb32 >= -700.0, _exp_tab(xb, TAB, LOG2N, ASM, None, TABX), 0.0)
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
def _shift_to(acc, sa, sb, na, nb, TAB, KC, LOG2N: tl.constexpr, ASM: tl.constexpr, TABX: tl.constexpr):
    """Move the five sums from the shifts ``sa``/``sb`` to the higher ``na``/``nb`` (float64 scalars). Every
    term was taken at or below its shift (x <= 0), so ``E - d S`` adds two negative numbers: no cancellation.
    The weights use the table exp (its range holds wherever the sums can stand: a segment spread over 640
    nats is flagged and redone), which keeps libdevice's registers out of the loop."""
    acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
    da = na - sa
    db = nb - sb
    wa = _exp_tab(-da, TAB, LOG2N, ASM, KC, TABX)
    wb = _exp_tab(-db, TAB, LOG2N, ASM, KC, TABX)
    return (wa * acc_sa, wb * acc_sb, wa * (acc_x - (da - db) * acc_sa), wb * (acc_y - (da - db) * acc_sb),
            wa * (acc_e - da * acc_sa))


@triton.jit
def _key32(x):
    """float32 -> an int32 of the same order (negatives' magnitude bits flipped; NaN of either sign lands at an
    end), so that a warp maximum is one ``redux.sync`` (Triton's integer reduction) instead of five shuffle
    and max steps."""
    u = x.to(tl.int32, bitcast=True)
    return u ^ ((u >> 31) & 0x7FFFFFFF)


@triton.jit
def _unkey32(k):
    """The float32 of :func:`_key32`'s ``k`` (the map is its own inverse)."""
    return (k ^ ((k >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _tile_max(a0, b0, a1, b1, R: tl.constexpr, RED: tl.constexpr):
    """The two rows' maxima over a tile (``a1``/``b1`` only when R == 2). With ``RED`` through the integer keys
    of :func:`_key32` (``RED`` 2: each lane's pair maximum in float32 first, one key a lane): a NaN of negative
    sign is then lost here, so NaN is also caught by the NaN-propagating minima."""
    if R == 2:
        xa = tl.maximum(a0, a1, propagate_nan=tl.PropagateNan.ALL)
        xb = tl.maximum(b0, b1, propagate_nan=tl.PropagateNan.ALL)
    else:
        xa = a0
        xb = b0
    if RED == 2:  # each lane's pair maximum first, in float32: one key per lane
        W: tl.constexpr = xa.shape[0]
        xa = tl.reduce(tl.reshape(xa, [W // 2, 2]), 1, _nanmax)
        xb = tl.reduce(tl.reshape(xb, [W // 2, 2]), 1, _nanmax)
    if RED:
        ta = _unkey32(tl.max(_key32(xa), 0))
        tb = _unkey32(tl.max(_key32(xb), 0))
    else:
        ta, tb = tl.reduce((xa, xb), 0, _nanmax2)
    return ta, tb


@triton.jit
def _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, ia, a0, a1, o0, TAB, KC, R: tl.constexpr, W: tl.constexpr,
                  LOG2N: tl.constexpr, ASM: tl.constexpr, TABX: tl.constexpr):
    """The running maxima after a tile whose maxima are ``ta``/``tb`` (NaN-propagating), and the shifts and sums
    moved to them when one grows (a uniform branch). There too the reference's argmax ``ia`` moves to the
    tile's first index of ``ta`` (``o0`` the offsets of ``a0``; ``a1`` follows at ``o0 + W``): strictly
    greater only, so the lowest index of the maximum is kept."""
    na32 = tl.maximum(ma32, ta, propagate_nan=tl.PropagateNan.ALL)
    nb32 = tl.maximum(mb32, tb, propagate_nan=tl.PropagateNan.ALL)
    if (na32 > ma32) | (nb32 > mb32):
        if na32 > ma32:
            j = tl.min(tl.where(a0 == ta, o0, 2147483647), 0)
            if R == 2:
                j = tl.minimum(j, tl.min(tl.where(a1 == ta, o0 + W, 2147483647), 0))
            ia = j
        acc = _shift_to(acc, sa, sb, na32.to(tl.float64), nb32.to(tl.float64), TAB, KC, LOG2N, ASM, TABX)
        sa = na32.to(tl.float64)
        sb = nb32.to(tl.float64)
    return na32, nb32, sa, sb, acc, ia


@triton.jit
def _nanmin(x, y):
    return tl.minimum(x, y, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nanmin2(a1, b1, a2, b2):
    return _nanmin(a1, a2), _nanmin(b1, b2)


@triton.jit
def _tile_update(a0, b0, a1, b1, o0, st, ptm, TAB, KC, R: tl.constexpr, W: tl.constexpr, LOG2N: tl.constexpr,
                 ASM: tl.constexpr, RED: tl.constexpr, TABX: tl.constexpr, PAIR: tl.constexpr):
    """One tile (rows ``a0``/``b0`` at offsets ``o0`` and, when R == 2, ``a1``/``b1`` right after them): raise
    the shifts to the tile's maxima first (a uniform branch: the sums move only when a maximum grows), then
    add the tile's terms. ``st`` is the segment's state: maxima, shifts, minima, sums, argmax. The candidate's
    tile maximum goes to ``ptm`` (the rank pass reads only tiles that reach ``b[i]``)."""
    ma32, mb32, sa, sb, mn_a, mn_b, acc, ia = st
    ta, tb = _tile_max(a0, b0, a1, b1, R, RED)
    tl.store(ptm, tb)
    if R == 2:
        mn_a = _nanmin(mn_a, _nanmin(_lane_min(a0, PAIR), _lane_min(a1, PAIR)))
        mn_b = _nanmin(mn_b, _nanmin(_lane_min(b0, PAIR), _lane_min(b1, PAIR)))
    else:
        mn_a = _nanmin(mn_a, _lane_min(a0, PAIR))
        mn_b = _nanmin(mn_b, _lane_min(b0, PAIR))
    ma32, mb32, sa, sb, acc, ia = _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, ia, a0, a1, o0, TAB, KC, R, W,
                                                LOG2N, ASM, TABX)
    acc = _add_tile(a0, b0, sa, sb, o0, acc, TAB, KC, LOG2N, ASM, False, TABX, PAIR)
    if R == 2:
        acc = _add_tile(a1, b1, sa, sb, o0, acc, TAB, KC, LOG2N, ASM, False, TABX, PAIR)
    return ma32, mb32, sa, sb, mn_a, mn_b, acc, ia


@triton.jit
def _halves(x):
    """A [W] tile of two tokens a lane as its lanes' first and second tokens: two [W / 2] tensors, no data
    moved."""
    return tl.split(tl.reshape(x, [x.shape[0] // 2, 2]))


@triton.jit
def _lane_min(x, PAIR: tl.constexpr):
    """``x`` in the minima's width: with ``PAIR``, the (NaN-propagating) minimum of each lane's two tokens."""
    if PAIR:
        lo, hi = _halves(x)
        x = _nanmin(lo, hi)
    return x


@triton.jit
def _add_tile(a, b, sa, sb, m, acc, TAB, KC, LOG2N: tl.constexpr, ASM: tl.constexpr, MASKED: tl.constexpr,
              TABX: tl.constexpr, PAIR: tl.constexpr):
    """:func:`_fast_tile` into the accumulators' width: with ``PAIR``, each lane's first tokens, then its
    second ones (mask ``m`` split alike)."""
    if PAIR:
        al, ah = _halves(a)
        bl, bh = _halves(b)
        if MASKED:
            ml, mh = _halves(m)
        else:
            ml = m
            mh = m
        acc = _fast_tile(al, bl, sa, sb, ml, acc, TAB, KC, LOG2N, ASM, MASKED, TABX)
        acc = _fast_tile(ah, bh, sa, sb, mh, acc, TAB, KC, LOG2N, ASM, MASKED, TABX)
    else:
        acc = _fast_tile(a, b, sa, sb, m, acc, TAB, KC, LOG2N, ASM, MASKED, TABX)
    return acc


@triton.jit
def _segment(pa, pb, ptm, n, TAB, KC, R: tl.constexpr, W: tl.constexpr, LOG2N: tl.constexpr, ASM: tl.constexpr,
             NS: tl.constexpr, RED: tl.constexpr, UNR: tl.constexpr, TABX: tl.constexpr, PAIR: tl.constexpr):
    """The compact partials of the ``n`` tokens at ``pa``/``pb`` (``n`` a constexpr or a launch argument, never
    a program-dependent value: loop bounds stay scalar for the compiler and for Triton's interpreter), and the
    first index of the reference maximum. Where the unguarded sums cannot stand (-inf, NaN/+inf, a spread
    over 640 nats) flag bit 3 asks for them to be redone with :func:`guarded_segment`; the maxima are exact
    either way."""
    w = tl.arange(0, W)
    RW: tl.constexpr = R * W
    # the shifts: running maxima, raised (and the sums moved) before a tile that exceeds them
    ma32 = tl.load(pa)
    mb32 = tl.load(pb)
    WA: tl.constexpr = W // 2 if PAIR else W  # the accumulators' width
    z = tl.zeros([WA], tl.float64)
    mn = tl.full([WA], float("inf"), tl.float32)
    st = (ma32, mb32, ma32.to(tl.float64), mb32.to(tl.float64), mn, mn, (z, z, z, z, z),
          tl.full((), 0, tl.int32))
    nfull = n // RW
    if NS == 0:
        # register prefetch: the next tile's loads are issued before this one is reduced, so every warp keeps a
        # tile of HBM reads in flight while it does float64 work
        a0n = tl.load(pa + w, mask=nfull > 0)
        b0n = tl.load(pb + w, mask=nfull > 0)
        if R == 2:
            a1n = tl.load(pa + W + w, mask=nfull > 0)
            b1n = tl.load(pb + W + w, mask=nfull > 0)
        else:
            a1n = a0n
            b1n = b0n
        if UNR:
            # two tiles a trip, each loaded into the registers the other is not using: no copies between trips
            for i in range(0, nfull // 2):
                o = (2 * i + 1) * RW + w
                a0m = tl.load(pa + o)
                b0m = tl.load(pb + o)
                if R == 2:
                    a1m = tl.load(pa + o + W)
                    b1m = tl.load(pb + o + W)
                else:
                    a1m = a0m
                    b1m = b0m
                st = _tile_update(a0n, b0n, a1n, b1n, o - RW, st, ptm + 2 * i,
                                  TAB, KC, R, W, LOG2N, ASM, RED, TABX, PAIR)
                more = 2 * i + 2 < nfull
                a0n = tl.load(pa + o + RW, mask=more)
                b0n = tl.load(pb + o + RW, mask=more)
                if R == 2:
                    a1n = tl.load(pa + o + RW + W, mask=more)
                    b1n = tl.load(pb + o + RW + W, mask=more)
                else:
                    a1n = a0n
                    b1n = b0n
                st = _tile_update(a0m, b0m, a1m, b1m, o, st, ptm + 2 * i + 1,
                                  TAB, KC, R, W, LOG2N, ASM, RED, TABX, PAIR)
            if nfull % 2 == 1:
                st = _tile_update(a0n, b0n, a1n, b1n, (nfull - 1) * RW + w, st, ptm + nfull - 1,
                                  TAB, KC, R, W, LOG2N, ASM, RED, TABX, PAIR)
        else:
            for i in range(0, nfull):
                a0, b0, a1, b1 = a0n, b0n, a1n, b1n
                o = (i + 1) * RW + w
                more = i + 1 < nfull
                a0n = tl.load(pa + o, mask=more)
                b0n = tl.load(pb + o, mask=more)
                if R == 2:
                    a1n = tl.load(pa + o + W, mask=more)
                    b1n = tl.load(pb + o + W, mask=more)
                else:
                    a1n = a0n
                    b1n = b0n
                st = _tile_update(a0, b0, a1, b1, o - RW, st, ptm + i,
                                  TAB, KC, R, W, LOG2N, ASM, RED, TABX, PAIR)
    else:
        # Triton's pipeliner: NS - 1 tiles in flight as asynchronous copies into shared memory
        for i in tl.range(0, nfull, num_stages=NS):
            o = i * RW + w
            a0 = tl.load(pa + o)
            b0 = tl.load(pb + o)
            if R == 2:
                a1 = tl.load(pa + o + W)
                b1 = tl.load(pb + o + W)
            else:
                a1 = a0
                b1 = b0
            st = _tile_update(a0, b0, a1, b1, o, st, ptm + i, TAB, KC, R, W, LOG2N, ASM, RED, TABX, PAIR)
    ma32, mb32, sa, sb, mn_a, mn_b, acc, ia = st
    for o0 in range(nfull * RW, n, W):  # the ragged end: masked lanes leave the extrema alone and add 0
        o = o0 + w
        m = o < n
        a = tl.load(pa + o, mask=m, other=float("-inf"))
        b = tl.load(pb + o, mask=m, other=float("-inf"))
        ta, tb = tl.reduce((a, b), 0, _nanmax2)
        ma32, mb32, sa, sb, acc, ia = _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, ia, a, a, o, TAB, KC, 1, W,
                                                    LOG2N, ASM, TABX)
        mn_a = _nanmin(mn_a, _lane_min(tl.where(m, a, float("inf")), PAIR))
        mn_b = _nanmin(mn_b, _lane_min(tl.where(m, b, float("inf")), PAIR))
        acc = _add_tile(tl.where(m, a, 0.0), tl.where(m, b, 0.0), sa, sb, m, acc, TAB, KC, LOG2N, ASM, True, TABX,
                        PAIR)
    ma = ma32.to(tl.float64)
    mb = mb32.to(tl.float64)
    s_a, s_b, x_, y_, e_ = tl.reduce(acc, 0, _add5)
    na32, nb32 = tl.reduce((mn_a, mn_b), 0, _nanmin2)
    bad = ((ma32 != ma32) | (ma32 == float("inf")) | (mb32 != mb32) | (mb32 == float("inf")) | (na32 != na32)
           | (nb32 != nb32))
    # every token within 640 nats of its segment's maximum (so of the shift it was taken at): the sums stand
    fast = (ma - na32.to(tl.float64) <= RANGE) & (mb - nb32.to(tl.float64) <= RANGE)
    flags = bad.to(tl.int32) | ((~fast & ~bad).to(tl.int32) << 3)
    return ma, mb, s_a, s_b, x_, y_, e_, flags, ia


@triton.jit
def guarded_segment(pa, pb, n, ma, mb, TAB, W: tl.constexpr, LOG2N: tl.constexpr, TABX: tl.constexpr):
    """The partial sums of a flagged segment (``n`` tokens at ``pa``/``pb``, float64 maxima ``ma``/``mb``),
    shifted to its maxima with the guarded element logic: -inf clamped, the 700-nats floor, the
    finite-vs--inf flags (bits 1 and 2). Rare (masked or extreme rows); run at the end of
    :func:`_partials_stream`, behind a branch."""
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
        acc, u_a, u_b = _safe_tile(a, b, ma32, mb32, sha, shb, acc, u_a, u_b, TAB, LOG2N, 0, TABX)
    s_a, s_b, x_, y_, e_ = tl.reduce(acc, 0, _add5)
    umax, vmax = tl.reduce((u_a, u_b), 0, _max2)
    flags = ((umax > float("-inf")).to(tl.int32) << 1) | ((vmax > float("-inf")).to(tl.int32) << 2)
    return s_a, s_b, x_, y_, e_, flags


@triton.jit
def _partials_stream(A, B, stride_a, stride_b, V, NCH, PF, TM, TAB, KINV: tl.float64, KNHI: tl.float64,
                     KC4: tl.float64, KC3: tl.float64, SEG: tl.constexpr, R: tl.constexpr, W: tl.constexpr,
                     LOG2N: tl.constexpr, ASM: tl.constexpr, NS: tl.constexpr, RED: tl.constexpr, UNR: tl.constexpr,
                     CARG: tl.constexpr, TABX: tl.constexpr, PAIR: tl.constexpr):
    """One (row, segment of SEG tokens) per program, in tiles of R x [W] tokens: the compact partials (the
    segment's argmax in the flags word: ``flags | index << 4``, the index within the segment), redone with
    :func:`guarded_segment` where flag bit 3 says the unguarded sums cannot stand (-inf, NaN/+inf, a spread
    over 640 nats; real logits: never), and the candidate's tile maxima, which :func:`_post` then turns into
    the row outputs. (Doing that in each row's last program to finish, behind a release/acquire counter,
    measured slower: 59.6 % of copy against 62.1 %.) A row's last segment (short, maybe ragged) has its own
    copy of the code, so that every other segment runs a loop of constexpr length with no tail. ``CARG``: the
    exp's constants come from ``KINV``.. ``KC3``; ``TABX``: the
    exponent add on the table entry (:func:`_tab_word`; the table must be the ``xadd`` one)."""
    pid = tl.program_id(0)
    row = (pid // NCH).to(tl.int64)
    seg = pid % NCH
    pa = A + row * stride_a + seg * SEG
    pb = B + row * stride_b + seg * SEG
    ptm = TM + row * (V // (R * W)) + seg * (SEG // (R * W))
    if CARG:
        KC = (tl.cast(KINV, tl.float64), tl.cast(KNHI, tl.float64), tl.cast(KC4, tl.float64),
              tl.cast(KC3, tl.float64))
    else:
        KC = None
    if seg == NCH - 1:
        ma, mb, s_a, s_b, x_, y_, e_, flags, ia = _segment(pa, pb, ptm, V - (NCH - 1) * SEG, TAB, KC, R, W,
                                                           LOG2N, ASM, NS, RED, UNR, TABX, PAIR)
    else:
        ma, mb, s_a, s_b, x_, y_, e_, flags, ia = _segment(pa, pb, ptm, SEG, TAB, KC, R, W, LOG2N, ASM, NS, RED,
                                                           UNR, TABX, PAIR)
    if (flags & 8) != 0:
        s_a, s_b, x_, y_, e_, fl = guarded_segment(pa, pb, tl.minimum(V - seg * SEG, SEG), ma, mb, TAB, 32,
                                                   LOG2N, TABX)
        flags = (flags & 1) | fl
    j = tl.arange(0, 8)
    tl.store(PF + pid.to(tl.int64) * 8 + j, _pack8(j, ma, mb, s_a, s_b, x_, y_, e_, flags | (ia << 4)))


@triton.jit
def _or(x, y):
    return x | y


@triton.jit
def _key(x, idx):
    """The rank key of logit ``x`` at index ``idx``: int32 of the logit's order (-0.0 and +0.0 the same) above,
    ``2**31 - 1 - idx`` below, so that keys order by (logit descending, index ascending), the tie rule."""
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 and +0.0 are the same logit
    bits = x.to(tl.int32, bitcast=True)
    k32 = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (k32.to(tl.int64) << 32) | (2147483647 - idx).to(tl.int64)


@triton.jit
def _ahead(pb, lo, cnt, bia, ia, G: tl.constexpr):
    """How many of the ``cnt`` <= G candidate tokens from ``lo`` rank ahead of token ``ia`` (logit ``bia``):
    higher, or equal at a lower index -- the tie rule (-0.0 and +0.0 compare equal)."""
    o = tl.arange(0, G)
    b = tl.load(pb + lo + o, mask=o < cnt, other=float("-inf"))
    return tl.sum(((o < cnt) & ((b > bia) | ((b == bia) & (lo + o < ia)))).to(tl.int32), axis=0)


@triton.jit
def store_figures(of, ma, mb, s_a, s_b, x_, y_, ea_, m_a, m_b, at, bt, fl):
    """A row's seven figures at ``of`` from its segment partials (vectors over the segments, relative to the
    segment maxima ``ma``/``mb``; empty segments have ``s`` = 0), rescaled to the row maxima ``m_a``/``m_b``
    (``exp(m_c - M)`` weights; ``xa - xb`` shifts by the segment constant ``(M_a - m_a) - (M_b - m_b)``);
    ``at``/``bt`` are the two logits of the realized token, ``fl`` the row's OR of the segment flags (bits 1, 2:
    KL, reverse KL infinite). Shared by :func:`_post` and the earlier kernels' combine."""
    ha = s_a > 0
    hb = s_b > 0
    da = tl.where(ha, m_a - ma, 0.0)
    db = tl.where(hb, m_b - mb, 0.0)
    wa = tl.where(ha, tl.exp(-da), 0.0)
    wb = tl.where(hb, tl.exp(-db), 0.0)
    sa = tl.sum(wa * s_a, axis=0)
    sb = tl.sum(wb * s_b, axis=0)
    ep_e = tl.sum(tl.where(ha & hb, wa * (x_ - (da - db) * s_a), 0.0), axis=0) / sa
    eq_e = tl.sum(tl.where(ha & hb, wb * (y_ - (da - db) * s_b), 0.0), axis=0) / sb
    ep_x = tl.sum(tl.where(ha, wa * (ea_ - da * s_a), 0.0), axis=0) / sa
    log_ratio = tl.log(sa / sb)
    log_sa = tl.log(sa)
    tl.store(of + 0, tl.where((fl & 2) != 0, float("inf"), ep_e - log_ratio))
    tl.store(of + 1, tl.where((fl & 4) != 0, float("inf"), -eq_e + log_ratio))
    tl.store(of + 2, (m_a - at) + log_sa)
    tl.store(of + 3, (m_b - bt) + tl.log(sb))
    tl.store(of + 4, tl.exp(bt - m_b) / sb - tl.exp(at - m_a) / sa)
    tl.store(of + 5, log_sa - ep_x)
    tl.store(of + 6, 1.0 / sa)


@triton.jit
def _post(PF, TM, A, B, stride_a, stride_b, T, V, NCH, FIGS, FLAGS, BAD, SEG: tl.constexpr, NCH_P2: tl.constexpr,
          G: tl.constexpr, TB: tl.constexpr):
    """A row's outputs (a program per row) from its segment partials: rescale them to the row maxima into the
    seven figures, read both rows at the realized token and the candidate at the reference argmax ``i``, and
    rank ``i`` among the candidate's tokens. Only the rank's comparison with 1, 5 and 10 is an output, so it
    stops at 10: ten tiles whose candidate maximum exceeds ``b[i]`` settle it unread; otherwise only the tiles
    that exceed or tie ``b[i]`` (one or two for a candidate close to its reference), and the row's last < G
    tokens, are read."""
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
    f7 = tl.load(PF + base + 7, mask=cm, other=0.0).to(tl.int32)
    t = tl.load(T + row)
    at = tl.load(A + row * stride_a + t).to(tl.float64)
    bt = tl.load(B + row * stride_b + t).to(tl.float64)
    fl = tl.reduce(f7 & 15, 0, _or)
    m_a = tl.max(ma, axis=0)
    m_b = tl.max(mb, axis=0)
    # the reference argmax: the first segment holding the row maximum, then that segment's first index of it
    cbest = tl.minimum(tl.min(tl.where(cm & (ma == m_a), c, NCH_P2), axis=0), NCH - 1)
    ia = (tl.sum(tl.where(c == cbest, f7 >> 4, 0), axis=0) + cbest * SEG).to(tl.int64)
    ia = tl.minimum(ia, V - 1)  # a NaN row matches nowhere: keep the reads in bounds (the row is flagged)
    pb = B + row * stride_b
    bia = tl.load(pb + ia)
    store_figures(FIGS + row * 7, ma, mb, s_a, s_b, x_, y_, ea_, m_a, m_b, at, bt, fl)
    # the rank of i, up to 10
    J = V // G
    ptm = TM + row * J
    n = tl.full((), 0, tl.int32)
    jt = tl.arange(0, TB)
    for j0 in range(0, J, TB):
        if n < 10:
            jj = j0 + jt
            tm = tl.load(ptm + jj, mask=jj < J, other=float("-inf"))
            above = (jj < J) & (tm > bia)
            if n + tl.sum(above.to(tl.int32), axis=0) >= 10:
                n = tl.full((), 10, tl.int32)
            else:
                todo = above | ((jj < J) & (tm == bia) & (jj * G < ia))
                while tl.max(todo.to(tl.int32), axis=0) > 0:
                    jn = tl.min(tl.where(todo, jj, 2147483647), axis=0)
                    n += _ahead(pb, jn.to(tl.int64) * G, G, bia, ia, G)
                    todo = todo & (jj != jn)
    n += _ahead(pb, tl.cast(J * G, tl.int64), V - J * G, bia, ia, G)
    bad = ((fl & 1) != 0) | (m_a == float("-inf")) | (m_b == float("-inf"))
    tl.store(FLAGS + row * 4, (n < 1).to(tl.int8))
    tl.store(FLAGS + row * 4 + 1, (n < 5).to(tl.int8))
    tl.store(FLAGS + row * 4 + 2, (n < 10).to(tl.int8))
    tl.store(FLAGS + row * 4 + 3, (ia == t).to(tl.int8))
    tl.store(BAD + row, bad.to(tl.int8))


@triton.jit
def _exp_kernel(X, Y, N, TAB, LOG2N: tl.constexpr, ASM: tl.constexpr, TABX: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < N, other=0.0)
    tl.store(Y + o, _exp_tab(x, TAB, LOG2N, ASM, None, TABX), mask=o < N)


def exp_tab(x: torch.Tensor, tab: torch.Tensor, log2n: int, asm: int = 1, xadd: int = 0) -> torch.Tensor:
    """:func:`_exp_tab` on its own (float64 ``x`` in [-700, 0], ``tab`` = ``triton_kernel.exp_table`` of the
    matching variant and ``xadd``), for tests."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _exp_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), tab, LOG2N=log2n, ASM=asm, TABX=int(xadd),
                                                 BLOCK=1024)
    return y
