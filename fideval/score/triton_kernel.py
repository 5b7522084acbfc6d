"""The GPU scorer: a streaming Triton kernel that reads each FP32 logit once and sums in float64.

:func:`_partials` (a program per row and segment: tiles, running maxima, table exps, :func:`guarded_segment` for flagged
segments), then :func:`_post` (a program per row: the seven figures and the rank). docs/score.md says how and what it measured.
"""

from __future__ import annotations

import torch

try:  # Triton is optional: the torch scorer covers machines without it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None

SEG = 8192  # tokens a partials program
TILE = 128  # tokens a tile (2 rows of 64): the rank pass's unit
LOG2N = 10  # the exp table: 2**(j / 1024)
# the exp's float64 constants: 1024 / ln 2, -ln 2 / 1024, and its degree-3 minimax polynomial's two top coefficients
KCONST = (1477.3197218702985, -0.0006769015435155716, 0.16666666680247416, 0.5000000039617454)
NPF = 8  # float64 partials a segment: ma, mb, Sa, Sb, X, Y, E, flags
_TABLES: dict = {}


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:
    # nats below its segment's maximum that a token may lie for the unguarded sums to stand (the exponent add stays normal
    # to 1022 * ln 2 = 708 nats; sums of ~1e5 terms of up to e**0 cannot overflow)
    RANGE = tl.constexpr(640.0)

    @triton.jit
    def _f64(like, v: tl.constexpr):
        # a float64 constant at full precision (a bare Python float literal is typed float32 by Triton)
        return tl.full(like.shape, v, tl.float64)

    @triton.jit
    def _lit_kc():
        # KCONST as literals (the interpreter passes float scalars as float32; the guarded pass keeps its literal code)
        return (tl.full((), 1477.3197218702985, tl.float64), tl.full((), -0.0006769015435155716, tl.float64),
                tl.full((), 0.16666666680247416, tl.float64), tl.full((), 0.5000000039617454, tl.float64))

    @triton.jit
    def _exp_tab(x, TAB, ASM: tl.constexpr, KC):
        """exp(x), |x| <= 700: x = k ln2/1024 + r (k: t's low word after the 1.5 * 2**52 rounding trick), exp(r) - 1 = r q(r)
        (q: the degree-2 part of a minimax cubic, 9.4e-17 relative), times ``TAB[k mod 1024] * 2**(k div 1024)``: one integer
        add of ``k << 42`` (:func:`exp_table`). ``KC``: :data:`KCONST` as float64 scalars. ``ASM``: that add in PTX."""
        magic = _f64(x, 6755399441055744.0)
        t = tl.fma(x, tl.broadcast_to(KC[0], x.shape), magic)
        ki = t.to(tl.int64, bitcast=True).to(tl.int32)
        kd = t - magic
        r = tl.fma(kd, tl.broadcast_to(KC[1], x.shape), x)
        mask = tl.full(ki.shape, 1023, tl.int32)  # constants as operands: ptxas folds them into the instructions
        if ASM:
            tab = tl.inline_asm_elementwise(
                "{ .reg .b32 i, lo, hi, s; .reg .b64 p; and.b32 i, $1, $3; mad.wide.u32 p, i, 8, $2;"
                " ld.global.nc.v2.u32 {lo, hi}, [p]; shl.b32 s, $1, $4; add.s32 hi, hi, s; mov.b64 $0, {lo, hi}; }",
                "=d,r,l,r,r", [ki, TAB + tl.zeros_like(ki), mask, tl.full(ki.shape, 10, tl.int32)], dtype=tl.float64,
                is_pure=True, pack=1)
        else:
            tab = tl.load(TAB + (ki & 1023))
            tab = (tab.to(tl.int64, bitcast=True) + (ki.to(tl.int64) << 42)).to(tl.float64, bitcast=True)
        q = tl.fma(tl.broadcast_to(KC[2], x.shape), r, tl.broadcast_to(KC[3], x.shape))
        q = tl.fma(q, r, _f64(x, 1.0))
        return tl.fma(tab, q * r, tab)

    @triton.jit
    def _add5(a0, a1, a2, a3, a4, b0, b1, b2, b3, b4):
        return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4

    @triton.jit
    def _nanmax(x, y):
        return tl.maximum(x, y, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _nanmin(x, y):
        return tl.minimum(x, y, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _or(x, y):
        return x | y

    @triton.jit
    def _fast_tile(a, b, sa, sb, m, acc, TAB, KC, ASM: tl.constexpr, MASKED: tl.constexpr):
        """Add one tile's terms, shifted by ``sa``/``sb`` (float64 scalars), to the five accumulators."""
        acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
        xa = a.to(tl.float64) - sa
        xb = b.to(tl.float64) - sb
        ea = _exp_tab(xa, TAB, ASM, KC)
        eb = _exp_tab(xb, TAB, ASM, KC)
        if MASKED:
            ea = tl.where(m, ea, 0.0)
            eb = tl.where(m, eb, 0.0)
            xa = tl.where(m, xa, 0.0)
            xb = tl.where(m, xb, 0.0)
        e = xa - xb
        return acc_sa + ea, acc_sb + eb, acc_x + ea * e, acc_y + eb * e, acc_e + ea * xa

    @triton.jit
    def _pack8(j, ma, mb, s_a, s_b, x_, y_, ea_, flags):
        # the eight float64 partials of one segment, laid along j = arange(8) for one store
        return tl.where(j == 0, ma, tl.where(j == 1, mb, tl.where(j == 2, s_a, tl.where(j == 3, s_b, tl.where(
            j == 4, x_, tl.where(j == 5, y_, tl.where(j == 6, ea_, flags.to(tl.float64))))))))

    @triton.jit
    def _key32(u):
        """A float32's bits -> an int32 of the same order (one ``redux.sync`` for a warp maximum); its own inverse."""
        return u ^ ((u >> 31) & 0x7FFFFFFF)

    @triton.jit
    def _tile_max(a0, b0, a1, b1):
        """The two rows' maxima over a tile: each lane's pair maximum in float32, then one integer key a lane (a NaN of
        negative sign is lost here, so NaN is also caught by the NaN-propagating minima)."""
        xa = tl.maximum(a0, a1, propagate_nan=tl.PropagateNan.ALL)
        xb = tl.maximum(b0, b1, propagate_nan=tl.PropagateNan.ALL)
        W: tl.constexpr = xa.shape[0]
        xa = tl.reduce(tl.reshape(xa, [W // 2, 2]), 1, _nanmax)
        xb = tl.reduce(tl.reshape(xb, [W // 2, 2]), 1, _nanmax)
        ka = _key32(tl.max(_key32(xa.to(tl.int32, bitcast=True)), 0))
        kb = _key32(tl.max(_key32(xb.to(tl.int32, bitcast=True)), 0))
        return ka.to(tl.float32, bitcast=True), kb.to(tl.float32, bitcast=True)

    @triton.jit
    def _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, ia, a0, a1, o0, TAB, KC, R: tl.constexpr, W: tl.constexpr, ASM: tl.constexpr):
        """The running maxima after a tile of maxima ``ta``/``tb``; when one grows the sums move to it (``E - d S``: two numbers
        of one sign), and the argmax ``ia`` to the tile's first index of ``ta`` (``a1`` at ``o0 + W`` when R == 2)."""
        na32 = tl.maximum(ma32, ta, propagate_nan=tl.PropagateNan.ALL)
        nb32 = tl.maximum(mb32, tb, propagate_nan=tl.PropagateNan.ALL)
        if (na32 > ma32) | (nb32 > mb32):
            if na32 > ma32:
                j = tl.min(tl.where(a0 == ta, o0, 2147483647), 0)
                if R == 2:
                    j = tl.minimum(j, tl.min(tl.where(a1 == ta, o0 + W, 2147483647), 0))
                ia = j
            acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
            da = na32.to(tl.float64) - sa
            db = nb32.to(tl.float64) - sb
            wa = _exp_tab(-da, TAB, ASM, KC)
            wb = _exp_tab(-db, TAB, ASM, KC)
            acc = (wa * acc_sa, wb * acc_sb, wa * (acc_x - (da - db) * acc_sa), wb * (acc_y - (da - db) * acc_sb),
                   wa * (acc_e - da * acc_sa))
            sa = na32.to(tl.float64)
            sb = nb32.to(tl.float64)
        return na32, nb32, sa, sb, acc, ia

    @triton.jit
    def _halves(x):
        """A tile of two tokens a lane as its lanes' first and second tokens (a register view)."""
        return tl.split(tl.reshape(x, [x.shape[0] // 2, 2]))

    @triton.jit
    def _lane_min(x):
        lo, hi = _halves(x)
        return _nanmin(lo, hi)

    @triton.jit
    def _add_tile(a, b, sa, sb, m, acc, TAB, KC, ASM: tl.constexpr, MASKED: tl.constexpr):
        """:func:`_fast_tile` into one set of accumulators a lane: its first tokens, then its second ones."""
        al, ah = _halves(a)
        bl, bh = _halves(b)
        ml, mh = _halves(m) if MASKED else (m, m)
        acc = _fast_tile(al, bl, sa, sb, ml, acc, TAB, KC, ASM, MASKED)
        return _fast_tile(ah, bh, sa, sb, mh, acc, TAB, KC, ASM, MASKED)

    @triton.jit
    def _tile_update(a0, b0, a1, b1, o0, st, ptm, TAB, KC, W: tl.constexpr, ASM: tl.constexpr):
        """One tile (``a0``/``b0`` at offsets ``o0``, ``a1``/``b1`` right after): raise the shifts to its maxima, then add
        its terms; its candidate maximum goes to ``ptm``. ``st``: maxima, shifts, minima, sums, argmax."""
        ma32, mb32, sa, sb, mn_a, mn_b, acc, ia = st
        ta, tb = _tile_max(a0, b0, a1, b1)
        tl.store(ptm, tb)
        mn_a = _nanmin(mn_a, _nanmin(_lane_min(a0), _lane_min(a1)))
        mn_b = _nanmin(mn_b, _nanmin(_lane_min(b0), _lane_min(b1)))
        ma32, mb32, sa, sb, acc, ia = _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, ia, a0, a1, o0, TAB, KC, 2, W, ASM)
        acc = _add_tile(a0, b0, sa, sb, o0, acc, TAB, KC, ASM, False)
        acc = _add_tile(a1, b1, sa, sb, o0, acc, TAB, KC, ASM, False)
        return ma32, mb32, sa, sb, mn_a, mn_b, acc, ia

    @triton.jit
    def _segment(pa, pb, ptm, n, TAB, KC, W: tl.constexpr, ASM: tl.constexpr):
        """The partials of the ``n`` tokens at ``pa``/``pb`` (``n`` a constexpr or a launch argument) and the first index of
        the reference maximum. Flag bit 3: the unguarded sums cannot stand (-inf, NaN/+inf, a spread over 640 nats)."""
        w = tl.arange(0, W)
        RW: tl.constexpr = 2 * W
        ma32 = tl.load(pa)
        mb32 = tl.load(pb)
        z = tl.zeros([W // 2], tl.float64)
        mn = tl.full([W // 2], float("inf"), tl.float32)
        st = (ma32, mb32, ma32.to(tl.float64), mb32.to(tl.float64), mn, mn, (z, z, z, z, z), tl.full((), 0, tl.int32))
        nfull = n // RW
        # the next tile's loads are issued before this one is reduced; two tiles a trip, each into the registers the other
        # is not using: no copies between trips
        a0n = tl.load(pa + w, mask=nfull > 0)
        b0n = tl.load(pb + w, mask=nfull > 0)
        a1n = tl.load(pa + W + w, mask=nfull > 0)
        b1n = tl.load(pb + W + w, mask=nfull > 0)
        for i in range(0, nfull // 2):
            o = (2 * i + 1) * RW + w
            a0m = tl.load(pa + o)
            b0m = tl.load(pb + o)
            a1m = tl.load(pa + o + W)
            b1m = tl.load(pb + o + W)
            st = _tile_update(a0n, b0n, a1n, b1n, o - RW, st, ptm + 2 * i, TAB, KC, W, ASM)
            more = 2 * i + 2 < nfull
            a0n = tl.load(pa + o + RW, mask=more)
            b0n = tl.load(pb + o + RW, mask=more)
            a1n = tl.load(pa + o + RW + W, mask=more)
            b1n = tl.load(pb + o + RW + W, mask=more)
            st = _tile_update(a0m, b0m, a1m, b1m, o, st, ptm + 2 * i + 1, TAB, KC, W, ASM)
        if nfull % 2 == 1:
            st = _tile_update(a0n, b0n, a1n, b1n, (nfull - 1) * RW + w, st, ptm + nfull - 1, TAB, KC, W, ASM)
        ma32, mb32, sa, sb, mn_a, mn_b, acc, ia = st
        for o0 in range(nfull * RW, n, W):  # the ragged end: masked lanes leave the extrema alone and add 0
            o = o0 + w
            m = o < n
            a = tl.load(pa + o, mask=m, other=float("-inf"))
            b = tl.load(pb + o, mask=m, other=float("-inf"))
            ta, tb = tl.reduce(a, 0, _nanmax), tl.reduce(b, 0, _nanmax)
            ma32, mb32, sa, sb, acc, ia = _raise_shifts(ma32, mb32, ta, tb, sa, sb, acc, ia, a, a, o, TAB, KC, 1, W, ASM)
            mn_a = _nanmin(mn_a, _lane_min(tl.where(m, a, float("inf"))))
            mn_b = _nanmin(mn_b, _lane_min(tl.where(m, b, float("inf"))))
            acc = _add_tile(tl.where(m, a, 0.0), tl.where(m, b, 0.0), sa, sb, m, acc, TAB, KC, ASM, True)
        ma = ma32.to(tl.float64)
        mb = mb32.to(tl.float64)
        s_a, s_b, x_, y_, e_ = tl.reduce(acc, 0, _add5)
        na32, nb32 = tl.reduce(mn_a, 0, _nanmin), tl.reduce(mn_b, 0, _nanmin)
        bad = (ma32 != ma32) | (ma32 == float("inf")) | (mb32 != mb32) | (mb32 == float("inf")) | (na32 != na32) | (nb32 != nb32)
        # every token within 640 nats of its segment's maximum (so of the shift it was taken at): the sums stand
        fast = (ma - na32.to(tl.float64) <= RANGE) & (mb - nb32.to(tl.float64) <= RANGE)
        flags = bad.to(tl.int32) | ((~fast & ~bad).to(tl.int32) << 3)
        return ma, mb, s_a, s_b, x_, y_, e_, flags, ia

    @triton.jit
    def guarded_segment(pa, pb, n, ma, mb, TAB, W: tl.constexpr):
        """A flagged segment's sums at its maxima ``ma``/``mb``, guarded (-inf clamped, 700-nats floor; masked lanes add 0),
        and the finite-vs--inf flags (bits 1 and 2: KL, reverse KL infinite)."""
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
            acc_sa, acc_sb, acc_x, acc_y, acc_e = acc
            xa = tl.maximum(a, -3.4028234663852886e38).to(tl.float64) - sha
            xb = tl.maximum(b, -3.4028234663852886e38).to(tl.float64) - shb
            # below the floor the exp's input is garbage (its table index stays in bounds: k mod N) and is not taken
            ea = tl.where(a - ma32 >= -700.0, _exp_tab(xa, TAB, 0, _lit_kc()), 0.0)
            eb = tl.where(b - mb32 >= -700.0, _exp_tab(xb, TAB, 0, _lit_kc()), 0.0)
            e = xa - xb
            u_a = tl.maximum(u_a, tl.where(b == float("-inf"), a, float("-inf")))  # > -inf somewhere: KL = +inf
            u_b = tl.maximum(u_b, tl.where(a == float("-inf"), b, float("-inf")))  # the mirror: reverse KL = +inf
            acc = (acc_sa + ea, acc_sb + eb, acc_x + ea * e, acc_y + eb * e, acc_e + ea * xa)
        s_a, s_b, x_, y_, e_ = tl.reduce(acc, 0, _add5)
        umax, vmax = tl.max(u_a, 0), tl.max(u_b, 0)
        flags = ((umax > float("-inf")).to(tl.int32) << 1) | ((vmax > float("-inf")).to(tl.int32) << 2)
        return s_a, s_b, x_, y_, e_, flags

    @triton.jit
    def _partials(A, B, stride_a, stride_b, V, NCH, PF, TM, TAB, KINV: tl.float64, KNHI: tl.float64, KC4: tl.float64,
                  KC3: tl.float64, SEG: tl.constexpr, W: tl.constexpr, ASM: tl.constexpr, CARG: tl.constexpr):
        """One (row, segment) a program: eight partials (argmax in the flags word, ``flags | index << 4``), the tile maxima.
        ``CARG``: the exp's constants from ``KINV``..``KC3`` (literals were moved into registers every trip), else literals."""
        pid = tl.program_id(0)
        row = (pid // NCH).to(tl.int64)
        seg = pid % NCH
        pa = A + row * stride_a + seg * SEG
        pb = B + row * stride_b + seg * SEG
        ptm = TM + row * (V // (2 * W)) + seg * (SEG // (2 * W))
        if CARG:
            KC = (tl.cast(KINV, tl.float64), tl.cast(KNHI, tl.float64), tl.cast(KC4, tl.float64), tl.cast(KC3, tl.float64))
        else:
            KC = _lit_kc()
        if seg == NCH - 1:
            ma, mb, s_a, s_b, x_, y_, e_, flags, ia = _segment(pa, pb, ptm, V - (NCH - 1) * SEG, TAB, KC, W, ASM)
        else:
            ma, mb, s_a, s_b, x_, y_, e_, flags, ia = _segment(pa, pb, ptm, SEG, TAB, KC, W, ASM)
        if (flags & 8) != 0:
            s_a, s_b, x_, y_, e_, fl = guarded_segment(pa, pb, tl.minimum(V - seg * SEG, SEG), ma, mb, TAB, 32)
            flags = (flags & 1) | fl
        j = tl.arange(0, 8)
        tl.store(PF + pid.to(tl.int64) * 8 + j, _pack8(j, ma, mb, s_a, s_b, x_, y_, e_, flags | (ia << 4)))

    @triton.jit
    def _ahead(pb, lo, cnt, bia, ia, G: tl.constexpr):
        """How many of the ``cnt`` <= G candidate tokens from ``lo`` rank ahead of token ``ia`` (logit ``bia``): higher, or
        equal at a lower index -- the tie rule (-0.0 and +0.0 compare equal)."""
        o = tl.arange(0, G)
        b = tl.load(pb + lo + o, mask=o < cnt, other=float("-inf"))
        return tl.sum(((o < cnt) & ((b > bia) | ((b == bia) & (lo + o < ia)))).to(tl.int32), axis=0)

    @triton.jit
    def store_figures(of, ma, mb, s_a, s_b, x_, y_, ea_, m_a, m_b, at, bt, fl):
        """A row's seven figures from its segment partials (relative to the segment maxima ``ma``/``mb``; empty segments have
        ``s`` = 0) rescaled to the row maxima ``m_a``/``m_b``; ``at``/``bt``: the realized token's logits; ``fl``: OR of flags."""
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
        """A row's figures, flags and the rank of the reference argmax ``i`` up to 10: ten tiles whose candidate maximum
        exceeds ``b[i]`` settle it unread; else only tiles that exceed or tie it, and the last < G tokens, are read."""
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


def exp_table(device) -> torch.Tensor:
    """``2**(j / 1024)`` for j < 1024, correctly rounded (:mod:`decimal` at 40 digits, not a float64 ``exp2`` that may be off
    by an ulp), then lowered by ``j << 42`` (a normal float64 in [0.5, 1]) for :func:`_tab_word`; on ``device``, cached."""
    key = torch.device(device)
    if key not in _TABLES:
        from decimal import Decimal, localcontext

        with localcontext() as ctx:
            ctx.prec = 40
            ln2 = Decimal(2).ln()
            vals = [float((ln2 * j / (1 << LOG2N)).exp()) for j in range(1 << LOG2N)]
        j = torch.arange(1 << LOG2N, dtype=torch.int64)
        tab = (torch.tensor(vals, dtype=torch.float64).view(torch.int64) - (j << (52 - LOG2N))).view(torch.float64)
        _TABLES[key] = tab.to(key)
    return _TABLES[key]


def score_rows(ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score float32 ``[n, V]`` rows on the GPU; same returns as :func:`fideval.score.torch_kernel.score_rows`.

    Under ``TRITON_INTERPRET=1`` (CPU tensors) the kernels run without their PTX and with the exp's constants as literals (the
    interpreter runs no inline assembly and passes float scalars as float32): the same float64 operations, so the same bits.
    """
    if triton is None:
        raise RuntimeError("triton is not installed")
    n, vocab = ref.shape
    if cand.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(ref.shape)} vs {tuple(cand.shape)}")
    if ref.stride(1) != 1 or cand.stride(1) != 1:
        ref, cand = ref.contiguous(), cand.contiguous()
    dev = ref.device
    compiled = int(not triton.knobs.runtime.interpret)
    nch = triton.cdiv(vocab, SEG)
    # only what the first kernel needs comes before its launch: the GPU idles until then
    pf = torch.empty((n * nch, NPF), dtype=torch.float64, device=dev)
    tm = torch.empty((n * (vocab // TILE),), dtype=torch.float32, device=dev)
    if n:
        _partials[(n * nch,)](ref, cand, ref.stride(0), cand.stride(0), vocab, nch, pf, tm, exp_table(dev), *KCONST, SEG=SEG,
                              W=TILE // 2, ASM=compiled, CARG=compiled, num_warps=1)
    t = targets.to(device=dev, dtype=torch.int64).contiguous()
    figs = torch.empty((n, 7), dtype=torch.float64, device=dev)
    flags = torch.empty((n, 4), dtype=torch.int8, device=dev)
    bad = torch.empty((n,), dtype=torch.int8, device=dev)
    if n:
        _post[(n,)](pf, tm, ref, cand, ref.stride(0), cand.stride(0), t, vocab, nch, figs, flags, bad, SEG=SEG,
                    NCH_P2=triton.next_power_of_2(nch), G=TILE, TB=1024, num_warps=4)
    return figs, flags.view(torch.bool), bad.view(torch.bool)
