"""Compiled inner loops of the overlap screen (numba): word hashes, n-gram hashes, query probes.

Why compiled: the calibration side of the screen is tens of millions of words, and as whole-array numpy
expressions the word hash alone needs a dozen passes over fresh arrays. Here the calibration pass
(:func:`scan_words`) takes a batch one document at a time: 64-byte blocks are classified and lowercased with
vector instructions (:func:`_block64`), word edges come out of the block masks with ``tzcnt``/``popcnt``,
each word is hashed from unaligned 8-byte loads, then the document's n-grams are rolled and probed, every
work array sized to one document and reused (:class:`Scratch`), so they stay in cache. All of it runs
without the GIL (``nogil=True``), so worker threads hash batches while the main thread reads the next. On
the bench (``bench/overlap.py``, one thread) a 426 MB calibration set takes ~0.6 s.

The vector code is LLVM IR written through numba intrinsics (``_block64``, ``_load64``, ``_ctz``,
``_popcnt``): LLVM lowers it to AVX-512, AVX2 or SSE2 as the machine has them. numba compiles these on
first use and caches the machine code beside this file (``cache=True``).

The hash definitions are those of :mod:`fideval.windows.screen.ngrams`, whose docstring is the reference;
the test suite checks these loops against a pure-Python transcription of that definition and of the byte
table (``tests/windows_oracles.py``). All arithmetic is uint64, wrapping mod 2^64 (every operand is cast
explicitly: numba turns mixed int64/uint64 arithmetic into float64).
"""

from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_U = np.uint64
P = _U(0x100000001B3)  # base folding a long word's 8-byte chunks (FNV prime, odd)
Q = _U(0x9E3779B97F4A7C15)  # n-gram polynomial base (golden ratio, odd)
if sys.byteorder != "little":  # the loads below read bytes as little-endian integers and vector masks
    raise ImportError("fideval.windows.screen.hashing needs a little-endian machine")


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


# == words: 64-byte masks, edges, word hashes ================================================================


@intrinsic
def _ctz(typingctx, x):
    """Trailing zero bits of a uint64 (64 for 0: ``tzcnt``)."""
    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))
    return types.uint64(types.uint64), codegen


@intrinsic
def _popcnt(typingctx, x):
    """Set bits of a uint64 (``popcnt``)."""
    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])
    return types.uint64(types.uint64), codegen


def _bytes_type(a) -> bool:
    """A contiguous uint8 array: what the raw loads below may address as ``data + i``."""
    return isinstance(a, types.Array) and a.dtype == types.uint8 and a.ndim == 1 and a.layout == "C"


def _byte_ptr(context, builder, aryty, ary, idx):
    return builder.gep(context.make_array(aryty)(context, builder, ary).data, [idx])


_V64 = ir.VectorType(ir.IntType(8), 64)


def _vec64_ptr(context, builder, aryty, ary, idx):
    """``ary[idx:idx+64]`` as a pointer to one <64 x i8> vector (unaligned, no bounds check)."""
    return builder.bitcast(_byte_ptr(context, builder, aryty, ary, idx), _V64.as_pointer())


def _vec64(context, builder, aryty, ary, idx):
    """The 64 bytes ``ary[idx:idx+64]`` as one <64 x i8> vector: one unaligned load."""
    return builder.load(_vec64_ptr(context, builder, aryty, ary, idx), align=1)


@intrinsic
def _load64(typingctx, buf, i):
    """``buf[i:i+8]`` (a uint8 array) as a little-endian uint64: one unaligned load, no bounds check."""
    if not _bytes_type(buf):
        return None

    def codegen(context, builder, signature, args):
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, ir.IntType(64).as_pointer()), align=1)
    return types.uint64(buf, types.intp), codegen


@intrinsic
def _block64(typingctx, buf, i, t, j):
    """The 64 bytes ``buf[i:i+64]``: returns the word-byte mask (bit k set iff ``buf[i+k]`` is an ASCII
    digit or letter, or any byte >= 0x80: the bytes the byte table of ``ngrams`` does not map to a space) and stores
    them lowercased (A-Z to a-z, every other byte as it is) into ``t[j:j+64]``. One vector load, four
    range tests (``b - '0' < 10``; ``(b | 0x20) - 'a' < 26``, which folds A-Z onto a-z and nothing else
    onto them; ``b - 'A' < 26``; ``b >= 0x80``), one vector store, the 64 results read as one integer: a
    few AVX-512 (or twice as many AVX2/SSE) instructions for 64 bytes, where the byte-at-a-time table
    copy and edge scan they replace took ~2 ns a byte."""
    if not (_bytes_type(buf) and _bytes_type(t)):
        return None

    def codegen(context, builder, signature, args):
        v = _vec64(context, builder, signature.args[0], args[0], args[1])
        def c(k):
            return ir.Constant(_V64, [k] * 64)

        def below(x, lo, n):
            return builder.icmp_unsigned("<", builder.sub(x, c(lo)), c(n))

        digit = below(v, 0x30, 10)
        alpha = below(builder.or_(v, c(0x20)), 0x61, 26)
        high = builder.icmp_signed("<", v, c(0))
        lower = builder.or_(v, builder.select(below(v, 0x41, 26), c(0x20), c(0)))
        builder.store(lower, _vec64_ptr(context, builder, signature.args[2], args[2], args[3]), align=1)
        return builder.bitcast(builder.or_(builder.or_(digit, alpha), high), ir.IntType(64))
    return types.uint64(buf, types.intp, t, types.intp), codegen


_ONE = _U(1)
_ALL = _U(0xFFFFFFFFFFFFFFFF)
PAD = 64  # bytes readable past the last document: the 64-byte loads of the last block run past it


@njit(inline="always")
def _low_bytes(k):
    """A mask of the low ``k`` bytes, 1 <= k <= 8 (``bzhi``)."""
    return _ALL >> _U(64 - 8 * k)


@njit(nogil=True, cache=True)
def _doc_words(buf, b0, b1, e, t, wh):
    """Hashes of the words of one document, bytes ``buf[b0:b1]`` (readable to ``b1 + PAD``), into ``wh``;
    returns their number. Scratch: ``e`` for ``b1 - b0 + 32`` edge positions, ``t`` for ``b1 - b0 + 128``
    bytes (the document lowercased, positions relative to ``b0``).

    Edges, 64 bytes a step: the word-byte mask of a block (:func:`_block64`, which also writes the block
    lowercased to ``t``; bits from ``b1`` on cleared, so no word runs past its document) xor itself shifted
    by one, the previous block's last bit carried in, marks every byte where a word starts or ends; starts
    and ends alternate (a document starts and ends outside a word). Their positions are written eight at a
    time unconditionally (``tzcnt``, clear the lowest bit) and the cursor advances by the ``popcnt``; a
    block with more than 8 (then 16) edges takes a branch. ~0.15 ns a byte.

    Then each word is hashed on its own from unaligned 8-byte loads of ``t`` (still in the L1 cache), so the
    multiplies of many words overlap; the second chunk is always computed and kept by a select (no branch
    on word length up to 16 bytes). ~4 ns a word. Arrays are passed once per document (numba counts
    references on each call)."""
    ke = 0
    carry = _U(0)
    p = b0
    while p <= b1:  # the block holding b1 ends the last word
        m = _block64(buf, p, t, p - b0)
        if b1 - p < 64:
            m &= (_ONE << _U(b1 - p)) - _ONE
        x = m ^ ((m << _ONE) | carry)
        carry = m >> _U(63)
        c = np.int64(_popcnt(x))
        o = p - b0
        for k in range(8):
            e[ke + k] = o + np.int64(_ctz(x))
            x &= x - _ONE
        if c > 8:
            for k in range(8, 16):
                e[ke + k] = o + np.int64(_ctz(x))
                x &= x - _ONE
            if c > 16:
                for k in range(16, c):
                    e[ke + k] = o + np.int64(_ctz(x))
                    x &= x - _ONE
        ke += c
        p += 64
    nw = ke // 2
    for j in range(nw):
        s = e[2 * j]
        n = e[2 * j + 1] - s
        h = (_load64(t, s) & _low_bytes(min(n, 8))) + _U(n) * Q
        h2 = h * P + _smx(_load64(t, s + 8) & _low_bytes(max(1, min(n - 8, 8))))
        h = h2 if n > 8 else h
        c = 16
        while c < n:  # words over 16 bytes
            h = h * P + _smx(_load64(t, s + c) & _low_bytes(min(n - c, 8)))
            c += 8
        wh[j] = _smx(h)
    return nw


def _padded(buf: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``buf`` if ``PAD`` bytes are readable past its last document (``ngrams.doc_buffer`` leaves them), else
    a padded copy."""
    end = int(bounds[-1]) if bounds.size else 0
    if buf.size >= end + PAD and buf.dtype == np.uint8 and buf.flags.c_contiguous:
        return buf
    out = np.zeros(end + PAD, np.uint8)
    out[:end] = buf[:end]
    return out


class Scratch:
    """Work arrays of the word loops, kept between batches: fresh arrays would be fresh pages, and on a
    virtual machine page faults cost as much as the hashing. Edges, the lowercased bytes, word and n-gram
    hashes are per document (reused for each, so they stay in the L1/L2 cache); hits per batch (written
    branch-free, so sized for every n-gram, but only the first ``hits + 1`` entries are ever touched). One
    per thread (the calibration pass keeps one in each worker)."""

    def __init__(self) -> None:
        self.doc = self.batch = -1

    def ensure(self, doc: int, batch: int) -> None:
        """Room for documents of ``doc`` bytes and batches of ``batch`` bytes."""
        if doc > self.doc:
            self.doc = max(doc, 2 * self.doc)
            self.e = np.empty(self.doc + 32, np.int64)  # a document of b bytes has at most b + 1 edges
            self.t = np.empty(self.doc + 128, np.uint8)
            self.wh, self.g = np.empty(self.doc // 2 + 1, np.uint64), np.empty(self.doc // 2 + 1, np.uint64)
        if batch > self.batch:
            self.batch = max(batch, 2 * self.batch)
            self.hd, self.hq = np.empty(self.batch + 1, np.int64), np.empty(self.batch + 1, np.int64)  # >= n-grams


def word_hashes(buf: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hash, document) of every word of documents ``buf[bounds[d]:bounds[d+1]]``. A word is a maximal run
    of word bytes (ASCII letters and digits, bytes >= 0x80: the byte table of ``ngrams`` maps every other
    byte to a space, and A-Z to a-z); its hash is splitmix64 of (chunk0 + len*Q), each further 8-byte
    chunk folded in as h*P + splitmix64(chunk). See :func:`_doc_words`."""
    buf = _padded(buf, bounds)
    longest = int(np.diff(bounds).max()) if bounds.size > 1 else 0
    cap = (int(bounds[-1]) + bounds.size) // 2 + 1 if bounds.size else 1  # a word per 2 bytes, +1 per document
    out, doc = np.empty(cap, np.uint64), np.empty(cap, np.int64)
    nw = _word_hashes(buf, bounds, np.empty(longest + 32, np.int64), np.empty(longest + 128, np.uint8), out, doc)
    return out[:nw].copy(), doc[:nw].copy()


@njit(nogil=True, cache=True)
def _word_hashes(buf, bounds, e, t, out, doc):
    o = 0
    for d in range(bounds.size - 1):
        nw = _doc_words(buf, bounds[d], bounds[d + 1], e, t, out[o:])
        doc[o:o + nw] = d
        o += nw
    return o


# == n-grams and probes ======================================================================================


@intrinsic
def _prefetch(typingctx, a, i):
    """Hint the cache line of ``a[i]`` (a contiguous 1-d array) into cache (``llvm.prefetch``, for read)."""
    if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), i8p)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.none(a, types.intp), codegen


AHEAD = 16  # probes whose prefilter word is prefetched ahead of the one being tested


@njit(inline="always")
def _qinv():
    """Q^-1 mod 2^64 by Newton's iteration from x = Q (right to 3 bits: Q*Q = 1 mod 8), 5 steps -> 96."""
    x = Q
    for _ in range(5):
        x = x * (_U(2) - Q * x)
    return x


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
    qinv = _qinv()
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
            for j in range(np.int64(starts[t]), np.int64(starts[t + 1])):
                if q[j] == x:
                    r = j
        out[i] = r
    return out


def scan_words(buf, bounds, n, bitmap, bits, q, starts, bucket_bits, scratch: Scratch):
    """The calibration pass over one batch (unit ``words``): (n-grams hashed, and for every n-gram found
    in ``q``: its document and its index in ``q``). Runs without the GIL."""
    buf = _padded(buf, bounds)
    scratch.ensure(int(np.diff(bounds).max()) if bounds.size > 1 else 0, int(bounds[-1]) if bounds.size else 0)
    sc = scratch
    return _scan_words(buf, bounds, n, bitmap, bits, q, starts, bucket_bits, sc.e, sc.t, sc.wh, sc.g, sc.hd,
                       sc.hq)


@njit(nogil=True, cache=True)
def _scan_words(buf, bounds, n, bitmap, bits, q, starts, bucket_bits, e, low, wh, g, hd, hq):
    """Document by document: word hashes (:func:`_doc_words`), n-gram hashes, probes, each into arrays of
    one document that stay in cache and are reused for the next, so nothing of the batch but the bytes and
    the hits crosses memory. The probe has its own loop (fused into the rolling hash it measured ~25 %
    slower: each probe's load waits on the multiply chain), and its prefilter words are prefetched
    ``AHEAD`` n-grams early (the 4 MB prefilter lives in a shared L3 cache; the hint saved ~15 % a pass)."""
    wshift, sshift = _U(64 - (bits - 6)), _U(64 - bucket_bits)
    qinv = _qinv()
    qn1 = _U(1)
    for _ in range(n - 1):
        qn1 *= Q
    grams = 0
    k = 0
    for d in range(bounds.size - 1):
        nw = _doc_words(buf, bounds[d], bounds[d + 1], e, low, wh)
        m = nw - n + 1
        if m <= 0:
            continue
        h = _U(0)
        for j in range(n - 1, -1, -1):
            h = h * Q + wh[j]
        g[0] = _smx(h)
        for s in range(1, m):
            h = (h - wh[s - 1]) * qinv + wh[s + n - 1] * qn1
            g[s] = _smx(h)
        for s in range(min(AHEAD, m)):
            _prefetch(bitmap, np.int64(g[s] >> wshift))
        for s in range(m):
            if s + AHEAD < m:
                _prefetch(bitmap, np.int64(g[s + AHEAD] >> wshift))
            x = g[s]
            r = -1
            b = _bits3(x)
            if bitmap[x >> wshift] & b == b:
                t = np.int64(x >> sshift)
                for i in range(np.int64(starts[t]), np.int64(starts[t + 1])):  # int64: uint32 | -1 is float64
                    if q[i] == x:
                        r = i
            hd[k] = d
            hq[k] = r
            k += np.int64(r >= 0)
        grams += m
    return grams, hd[:k].copy(), hq[:k].copy()


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
    for i in range(min(AHEAD, g.size)):
        _prefetch(bitmap, np.int64(g[i] >> wshift))
    for i in range(g.size):
        if i + AHEAD < g.size:
            _prefetch(bitmap, np.int64(g[i + AHEAD] >> wshift))
        x = g[i]
        j = -1
        m = _bits3(x)
        if bitmap[x >> wshift] & m == m:
            t = np.int64(x >> sshift)
            for r in range(np.int64(starts[t]), np.int64(starts[t + 1])):
                if q[r] == x:
                    j = r
        hd[k] = gd[i]
        hq[k] = j
        k += np.int64(j >= 0)
    return g.size, hd[:k].copy(), hq[:k].copy()
