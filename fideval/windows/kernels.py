"""Compiled inner loops of the overlap screen (numba): word hashes, n-gram hashes, query probes.

Why compiled: the calibration side of the screen is tens of millions of words. As whole-array numpy
expressions the word hash alone needs a dozen passes over the batch (byte table, edge scan, gathers,
masks, one pass per 8-byte chunk), each over fresh arrays, and the n-gram hash and the lookup several
more; here a batch is mapped, split into words, hashed, rolled into n-grams and probed in a few loops over
work arrays that are reused (:class:`Scratch`), and they run without the GIL (``nogil=True``), so a
second thread can hash one batch while the main thread parses the next. numba
(a dependency for this reason) compiles these on first use and caches the machine code beside this file
(``cache=True``; a read-only install falls back to numba's user-wide cache folder).

The hash definitions are those of :mod:`fideval.windows.ngrams`, whose docstring is the reference; the
test suite checks these loops against a pure-Python transcription of that definition. All arithmetic is
uint64, wrapping mod 2^64 (every operand is cast explicitly: numba turns mixed int64/uint64 arithmetic
into float64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_U = np.uint64
P = _U(0x100000001B3)  # base folding a long word's 8-byte chunks (FNV prime, odd)
Q = _U(0x9E3779B97F4A7C15)  # n-gram polynomial base (golden ratio, odd)
SPACE = 32


@njit(inline="always")
def _smx(x):
    x ^= x >> _U(30)
    x *= _U(0xBF58476D1CE4E5B9)
    x ^= x >> _U(27)
    x *= _U(0x94D049BB133111EB)
    x ^= x >> _U(31)
    return x


@njit(nogil=True, cache=True)
def mix_units(ids):
    """The units of token n-grams: ``smx(id + 1)`` of each int64 token id, as uint64."""
    out = np.empty(ids.size, np.uint64)
    for i in range(ids.size):
        out[i] = _smx(_U(ids[i]) + _U(1))
    return out


@njit(inline="always")
def _chunk(buf, lut, s, m):
    """Little-endian uint64 of the ``m`` (<= 8) table-mapped bytes ``buf[s:s+m]``."""
    c = _U(0)
    for k in range(m):
        c |= _U(lut[buf[s + k]]) << _U(8 * k)
    return c


_MASK = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


class Scratch:
    """Work arrays of the word loop, kept between batches: fresh arrays would be fresh pages, and on a
    virtual machine the page faults of touching ~5 bytes of new memory per input byte cost as much as
    the hashing. One per thread (the calibration pass keeps one in each worker)."""

    def __init__(self) -> None:
        self.size = -1

    def ensure(self, nb: int, nd: int) -> None:
        if nb + nd <= self.size:
            return
        size = max(nb + nd, 2 * max(self.size, 0))
        self.t = np.empty(size + 16, np.uint8)
        self.v8 = np.ndarray((size + 8,), dtype="<u8", buffer=self.t, strides=(1,))  # v8[i] = t[i:i+8] (LE)
        cap = size // 2 + 2  # a word takes >= 1 byte and is followed by a space
        self.st, self.en = np.empty(cap, np.int64), np.empty(cap, np.int64)
        self.wh, self.wd = np.empty(cap, np.uint64), np.empty(cap, np.int64)
        self.g, self.gd = np.empty(cap, np.uint64), np.empty(cap, np.int64)
        self.size = size


def word_hashes(buf: np.ndarray, bounds: np.ndarray, lut: np.ndarray,
                scratch: Scratch | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(hash, document) of every word of documents ``buf[bounds[d]:bounds[d+1]]``. A word is a maximal run
    of bytes whose table value is not a space; its hash is splitmix64 of (chunk0 + len*Q), each further
    8-byte chunk folded in as h*P + splitmix64(chunk).

    Three passes, none with a loop-carried dependency longer than a counter (a serial word-by-word parse
    is latency-bound at ~30 cycles a word): the bytes are mapped through the table into a copy with one
    space after each document (so no word crosses one) and 16 bytes of padding; word starts and ends are
    recorded branch-free; then each word is hashed on its own from unaligned 8-byte loads (a stride-1
    uint64 view of the copy), so the multiplies of many words overlap. Returns copies unless a
    ``scratch`` is given (then views into it, valid until its next use)."""
    sc = scratch or Scratch()
    sc.ensure(buf.size, bounds.size - 1)
    nw = _word_hashes(buf, bounds, lut, sc.t, sc.v8, sc.st, sc.en, sc.wh, sc.wd)
    if scratch is None:
        return sc.wh[:nw].copy(), sc.wd[:nw].copy()
    return sc.wh[:nw], sc.wd[:nw]


@njit(nogil=True, cache=True)
def _word_hashes(buf, bounds, lut, t, v8, st, en, out, doc):
    nd = bounds.size - 1
    o = 0
    for d in range(nd):
        for i in range(bounds[d], bounds[d + 1]):
            t[o] = lut[buf[i]]
            o += 1
        t[o] = SPACE
        o += 1
    for k in range(16):
        t[o + k] = SPACE
    ks = 0
    ke = 0
    prev = 0
    for i in range(o):  # branch-free: write always, advance on an edge
        cur = np.int64(t[i] != SPACE)
        st[ks] = i
        ks += cur & (1 - prev)
        en[ke] = i
        ke += prev & (1 - cur)
        prev = cur
    d = 0
    for j in range(ks):
        s = st[j]
        n = en[j] - s
        while s >= bounds[d + 1] + d:  # the document holding this word (t-offset of its end: bounds[d+1] + d)
            d += 1
        doc[j] = d
        h = (v8[s] & _MASK[min(n, 8)]) + _U(n) * Q
        h2 = h * P + _smx(v8[s + 8] & _MASK[max(0, min(n - 8, 8))])  # computed always, kept if n > 8: no branch
        h = h2 if n > 8 else h
        c = 16
        while c < n:  # words over 16 bytes
            h = h * P + _smx(v8[s + c] & _MASK[min(n - c, 8)])
            c += 8
        out[j] = _smx(h)
    return ks


def ngram_hashes(units: np.ndarray, group: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash, group) of every run of ``n`` consecutive ``units`` within one ``group`` (groups are
    contiguous): splitmix64(sum_j units[s+j] * Q^j), rolled forward with Q^-1 and Q^(n-1)."""
    m = max(units.size - n + 1, 0)
    out, grp = np.empty(m, np.uint64), np.empty(m, np.int64)
    k = _ngram_hashes(units, group, n, out, grp)
    return out[:k], grp[:k]


@njit(nogil=True, cache=True)
def _ngram_hashes(units, group, n, out, grp):
    m = units.size - n + 1
    if m <= 0:
        return 0
    qinv = Q  # Q^-1 mod 2^64 by Newton's iteration from x = Q (right to 3 bits: Q*Q = 1 mod 8), 5 steps -> 96
    for _ in range(5):
        qinv = qinv * (_U(2) - Q * qinv)
    qn1 = _U(1)
    for _ in range(n - 1):
        qn1 *= Q
    k = 0
    a = 0
    total = units.size
    while a < total:
        b = a
        while b < total and group[b] == group[a]:
            b += 1
        if b - a >= n:
            g = _U(0)
            for j in range(n - 1, -1, -1):
                g = g * Q + units[a + j]
            out[k] = _smx(g)
            grp[k] = group[a]
            k += 1
            for s in range(a + 1, b - n + 1):
                g = (g - units[s - 1]) * qinv + units[s + n - 1] * qn1
                out[k] = _smx(g)
                grp[k] = group[a]
                k += 1
        a = b
    return k


@njit(inline="always")
def _bits3(x):
    """Three bit positions (of 64) from the low 18 bits of a hash: the prefilter's key within its word."""
    return ((_U(1) << (x & _U(63))) | (_U(1) << ((x >> _U(6)) & _U(63)))
            | (_U(1) << ((x >> _U(12)) & _U(63))))


@njit(nogil=True, cache=True)
def build_probe(q, bits, bucket_bits):
    """Probe tables for the sorted unique ``q``. The prefilter is a blocked Bloom filter of ``2**bits``
    bits: the top ``bits - 6`` bits of a hash pick one 64-bit word, three bits of its low 18 bits must all
    be set there (one memory access per probe; at 32 bits per query ~0.2 % of absent hashes pass, against
    3 % for a one-bit bitmap; each pass costs a cache and TLB miss or two). Then bucket starts (uint32)
    over the top ``bucket_bits`` bits for the exact 64-bit comparison."""
    bitmap = np.zeros(max(1, (1 << bits) >> 6), np.uint64)
    wshift = _U(64 - (bits - 6))
    for x in q:
        bitmap[x >> wshift] |= _bits3(x)
    nb = 1 << bucket_bits
    starts = np.zeros(nb + 1, np.uint32)
    sshift = _U(64 - bucket_bits)
    for x in q:
        starts[np.int64(x >> sshift) + 1] += np.uint32(1)
    for t in range(nb):
        starts[t + 1] += starts[t]
    return bitmap, starts


@njit(nogil=True, cache=True)
def lookup(h, bitmap, bits, q, starts, bucket_bits):
    """Index of each ``h`` in ``q``, or -1."""
    wshift, sshift = _U(64 - (bits - 6)), _U(64 - bucket_bits)
    out = np.empty(h.size, np.int64)
    for i in range(h.size):
        x = h[i]
        r = -1
        m = _bits3(x)
        if bitmap[x >> wshift] & m == m:  # the prefilter
            t = np.int64(x >> sshift)
            for j in range(starts[t], starts[t + 1]):
                if q[j] == x:
                    r = j
        out[i] = r
    return out


def scan_words(buf, bounds, lut, n, bitmap, bits, q, starts, bucket_bits, scratch: Scratch):
    """The calibration pass over one batch (unit ``words``): (n-grams hashed, and for every n-gram found
    in ``q``: its document and its index in ``q``). Runs without the GIL."""
    sc = scratch
    sc.ensure(buf.size, bounds.size - 1)
    return _scan_words(buf, bounds, lut, n, bitmap, bits, q, starts, bucket_bits, sc.t, sc.v8, sc.st, sc.en,
                       sc.wh, sc.wd, sc.g, sc.gd)


@njit(nogil=True, cache=True)
def _scan_words(buf, bounds, lut, n, bitmap, bits, q, starts, bucket_bits, t, v8, st, en, wh, wd, g, gd):
    nw = _word_hashes(buf, bounds, lut, t, v8, st, en, wh, wd)
    k = _ngram_hashes(wh[:nw], wd[:nw], n, g, gd)
    return _hits(g[:k], gd[:k], bitmap, bits, q, starts, bucket_bits, st, en)  # word bounds are spent: reuse them


@njit(nogil=True, cache=True)
def scan_units(units, group, n, bitmap, bits, q, starts, bucket_bits):
    """As :func:`scan_words` for unit ids already mixed to uint64 (unit ``tokens``)."""
    m = max(units.size - n + 1, 0)
    g, gd = np.empty(m, np.uint64), np.empty(m, np.int64)
    k = _ngram_hashes(units, group, n, g, gd)
    return _hits(g[:k], gd[:k], bitmap, bits, q, starts, bucket_bits, np.empty(k, np.int64), np.empty(k, np.int64))


@njit(nogil=True, cache=True)
def _hits(g, gd, bitmap, bits, q, starts, bucket_bits, hd, hq):
    """(n-grams probed, document and query index of each hit). Branch-free writes into ``hd``/``hq``
    (length >= ``g.size``), the cursor advancing on a hit: growing result arrays inside this loop (a first
    version) made numba count references on every n-gram and measured 13x slower than the bare probe."""
    wshift, sshift = _U(64 - (bits - 6)), _U(64 - bucket_bits)
    k = 0
    for i in range(g.size):
        x = g[i]
        j = -1
        m = _bits3(x)
        if bitmap[x >> wshift] & m == m:
            t = np.int64(x >> sshift)
            for r in range(starts[t], starts[t + 1]):
                if q[r] == x:
                    j = r
        hd[k] = gd[i]
        hq[k] = j
        k += np.int64(j >= 0)
    return g.size, hd[:k].copy(), hq[:k].copy()
