"""Compiled inner loops of the overlap screen (numba): word hashes, n-gram hashes, query probes.

Why compiled: the calibration side of the screen is tens of millions of words. As whole-array numpy
expressions the word hash alone needs a dozen passes over the batch (byte table, edge scan, gathers,
masks, one pass per 8-byte chunk), each over fresh arrays, and the n-gram hash and the lookup several
more. Here the calibration pass (:func:`scan_words`) takes a batch one document at a time: 64-byte blocks
are classified and lowercased with vector instructions (:func:`_block64`), word edges come out of the
block masks with ``tzcnt``/``popcnt``, each word is hashed from unaligned 8-byte loads, then the document's
n-grams are rolled and probed, every work array sized to one document and reused (:class:`Scratch`), so
they stay in the L1/L2 cache and nothing of the batch but its bytes and its hits crosses memory. All of it
runs without the GIL (``nogil=True``), so worker threads hash batches while the main thread parses the
next. On the bench (2,000-word documents, AMD EPYC, one thread) a 426 MB calibration set takes ~0.6 s
(~0.07 s edges, ~0.2 s word hashes, ~0.1 s n-grams, ~0.2 s probes), against ~1.3 s for the previous
three-pass version (byte-at-a-time table copy and edge scan, batch-sized int64 arrays between passes).

The vector code is LLVM IR written through numba intrinsics (``_block64``, ``_load64``, ``_ctz``,
``_popcnt``): LLVM lowers it to AVX-512, AVX2 or SSE2 as the machine has them, so it is portable. numba
(a dependency for this reason) compiles these on first use and caches the machine code beside this file
(``cache=True``; a read-only install falls back to numba's user-wide cache folder).

The hash definitions are those of :mod:`fideval.windows.ngrams`, whose docstring is the reference; the
test suite checks these loops against a pure-Python transcription of that definition and of the byte
table. All arithmetic is uint64, wrapping mod 2^64 (every operand is cast explicitly: numba turns mixed
int64/uint64 arithmetic into float64).
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
    raise ImportError("fideval.windows.kernels needs a little-endian machine")


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
    digit or letter, or any byte >= 0x80: the bytes ``ngrams._LUT`` does not map to a space) and stores
    them lowercased (A-Z to a-z, every other byte as it is) into ``t[j:j+64]``. One vector load, four
    range tests (``b - '0' < 10``; ``(b | 0x20) - 'a' < 26``, which folds A-Z onto a-z and nothing else
    onto them; ``b - 'A' < 26``; ``b >= 0x80``), one vector store, the 64 results read as one integer: a
    few AVX-512 (or twice as many AVX2/SSE) instructions for 64 bytes, where the byte-at-a-time table
    copy and edge scan they replace took ~2 ns a byte."""
    if not (_bytes_type(buf) and _bytes_type(t)):
        return None

    def codegen(context, builder, signature, args):
        v = _vec64(context, builder, signature.args[0], args[0], args[1])
        c = (lambda k: ir.Constant(_V64, [k] * 64))
        below = (lambda x, lo, n: builder.icmp_unsigned("<", builder.sub(x, c(lo)), c(n)))
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
    on word length up to 16 bytes). ~4 ns a word. Arrays are passed once per document: numba counts
    references on each call, which per chunk (a first version, with helpers taking arrays) made this loop
    4x slower."""
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
    of word bytes (ASCII letters and digits, bytes >= 0x80: the table ``ngrams._LUT`` maps every other
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
    the hits crosses memory. The probe has its own loop: fused into the rolling hash it measured slower
    (1.2-1.4 s against 0.9-1.1 s for the bench's 426 MB on a loaded machine: each probe's load then waits
    on the multiply chain). Its prefilter words are prefetched ``AHEAD`` n-grams early: the 4 MB prefilter
    lives in the L3 cache shared with the thread reading JSON (and the machine's other jobs), and the hint
    measured 0.96-1.05 s against 1.11-1.63 s a pass (0.7-1.0 against 1.1-1.3 s on one thread alone)."""
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


# == JSON lines: one string field per line, unescaped, for the calibration pass ===========================


@intrinsic
def _special64(typingctx, buf, i):
    """The 64 bytes ``buf[i:i+64]``: mask of those that end a plain run inside a JSON string: ``"``, ``\\``,
    control bytes (< 0x20, which JSON forbids unescaped, the line's newline among them) and bytes >= 0x80
    (non-ASCII: left to the Python path). One vector load, three compares."""
    if not _bytes_type(buf):
        return None

    def codegen(context, builder, signature, args):
        v = _vec64(context, builder, signature.args[0], args[0], args[1])
        c = (lambda k: ir.Constant(_V64, [k] * 64))
        m = builder.or_(builder.or_(builder.icmp_unsigned("==", v, c(0x22)), builder.icmp_unsigned("==", v, c(0x5C))),
                        builder.icmp_signed("<", v, c(0x20)))
        return builder.bitcast(m, ir.IntType(64))
    return types.uint64(buf, types.intp), codegen


@intrinsic
def _newline64(typingctx, buf, i):
    """Mask of the ``\\n`` bytes of ``buf[i:i+64]``."""
    if not _bytes_type(buf):
        return None

    def codegen(context, builder, signature, args):
        v = _vec64(context, builder, signature.args[0], args[0], args[1])
        return builder.bitcast(builder.icmp_unsigned("==", v, ir.Constant(_V64, [10] * 64)), ir.IntType(64))
    return types.uint64(buf, types.intp), codegen


@intrinsic
def _copy64(typingctx, src, i, dst, j):
    """``dst[j:j+64] = src[i:i+64]``: one unaligned vector load and store, no bounds check."""
    if not (_bytes_type(src) and _bytes_type(dst)):
        return None

    def codegen(context, builder, signature, args):
        v = _vec64(context, builder, signature.args[0], args[0], args[1])
        builder.store(v, _vec64_ptr(context, builder, signature.args[2], args[2], args[3]), align=1)
        return context.get_dummy_value()
    return types.none(src, types.intp, dst, types.intp), codegen


MAX_INT_DIGITS = 4000  # longer integer literals are left to json.loads (Python limits int() to 4300 digits)
_DEPTH = 64  # deeper nesting is left to json.loads


@njit(inline="always")
def _hex(b):
    """The value of an ASCII hex digit, or -1."""
    x = np.int64(b)
    if 48 <= x <= 57:
        return x - 48
    x |= 0x20
    if 97 <= x <= 102:
        return x - 87
    return np.int64(-1)


@njit(nogil=True, cache=True)
def _json_line(raw, p, n, key, out, o, stack):
    """Parse the JSON line starting at ``raw[p]``, requiring a strict subset of what ``json.loads`` accepts:
    an object (``{...}`` with only spaces and tabs around it up to the ``\\n``), plain-ASCII bytes, strings
    whose escapes are the JSON ones, numbers of JSON's grammar (integer part <= MAX_INT_DIGITS digits),
    ``true``/``false``/``null``, nesting <= _DEPTH, and exactly one top-level member named ``key`` (no escape
    in top-level member names), whose value is a string unescaping to ASCII. Its unescaped bytes are
    written to ``out[o:]``. Returns (end, o_end): ``end`` the index of the line's ``\\n`` (or ``n``, the
    block's end) and ``o_end`` the end of the text in ``out``; ``end = -1`` when the line is
    not of that subset (json.loads decides it then: the subset has exactly json.loads's meaning, anything
    else is not answered here). ``raw[n:n + PAD]`` is zero: every loop stops at the first of those bytes."""
    q = p
    while raw[q] == 32 or raw[q] == 9:
        q += 1
    if raw[q] != 123:  # '{'
        return -1, o
    q += 1
    depth = 1
    stack[0] = 0  # 0: in an object, 1: in an array
    state = 2  # 0 expect a value, 1 after a value, 2 expect a key or '}', 3 expect a key, 4 a value or ']'
    found = 0
    field = False
    o0 = o
    o1 = o
    while True:
        while raw[q] == 32 or raw[q] == 9:
            q += 1
        c = raw[q]
        if state == 1:
            if depth == 0:
                if c == 10 or q == n:
                    return (q, o1) if found == 1 else (-1, o)
                return -1, o
            if c == 44:  # ','
                q += 1
                state = 3 if stack[depth - 1] == 0 else 0
            elif c == 125 and stack[depth - 1] == 0:  # '}'
                q += 1
                depth -= 1
            elif c == 93 and stack[depth - 1] == 1:  # ']'
                q += 1
                depth -= 1
            else:
                return -1, o
            continue
        if state == 2 and c == 125:
            q += 1
            depth -= 1
            state = 1
            continue
        if state == 4 and c == 93:
            q += 1
            depth -= 1
            state = 1
            continue
        if state >= 2 and state <= 3 and c != 34:
            return -1, o
        if c == 34:  # a string: a key (states 2, 3) or a value
            is_key = state == 2 or state == 3
            copy = field and not is_key
            q += 1
            s0 = q
            esc = False
            while True:
                m = _special64(raw, q)
                if copy:
                    _copy64(raw, q, out, o)
                if m == _U(0):
                    q += 64
                    if copy:
                        o += 64
                    continue
                k = np.int64(_ctz(m))
                q += k
                if copy:
                    o += k
                b = raw[q]
                if b == 34:
                    break
                if b != 92:  # a control byte, a non-ASCII byte, or the end of the line
                    return -1, o0
                esc = True
                b = raw[q + 1]
                if b == 34 or b == 92 or b == 47:
                    v = np.int64(b)
                elif b == 98:
                    v = 8
                elif b == 102:
                    v = 12
                elif b == 110:
                    v = 10
                elif b == 114:
                    v = 13
                elif b == 116:
                    v = 9
                elif b == 117:  # \uXXXX
                    v = 0
                    for j in range(2, 6):
                        x = _hex(raw[q + j])
                        if x < 0:
                            return -1, o0
                        v = v * 16 + x
                    q += 4
                    if copy and v >= 128:
                        return -1, o0  # non-ASCII text: the Python path normalises it
                else:
                    return -1, o0
                if copy:
                    out[o] = np.uint8(v)
                    o += 1
                q += 2
            s1 = q
            q += 1
            if is_key:
                field = False
                if depth == 1:
                    if esc:
                        return -1, o0
                    if s1 - s0 == key.size:
                        field = True
                        for j in range(key.size):
                            if raw[s0 + j] != key[j]:
                                field = False
                                break
                    if field:
                        found += 1
                        if found > 1:
                            return -1, o0
                while raw[q] == 32 or raw[q] == 9:
                    q += 1
                if raw[q] != 58:  # ':'
                    return -1, o0
                q += 1
                state = 0
            else:
                if copy:
                    o1 = o
                field = False
                state = 1
            continue
        if field:  # the field's value is not a string: json.loads's path says so
            return -1, o0
        if c == 123 or c == 91:  # '{', '['
            if depth == _DEPTH:
                return -1, o0
            stack[depth] = 0 if c == 123 else 1
            depth += 1
            q += 1
            state = 2 if c == 123 else 4
            continue
        if c == 45 or 48 <= c <= 57:  # a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
            if c == 45:
                q += 1
            if raw[q] == 48:
                q += 1
            elif 49 <= raw[q] <= 57:
                d0 = q
                while 48 <= raw[q] <= 57:
                    q += 1
                if q - d0 > MAX_INT_DIGITS:
                    return -1, o0
            else:
                return -1, o0
            if raw[q] == 46:
                q += 1
                if not 48 <= raw[q] <= 57:
                    return -1, o0
                while 48 <= raw[q] <= 57:
                    q += 1
            if raw[q] == 101 or raw[q] == 69:
                q += 1
                if raw[q] == 43 or raw[q] == 45:
                    q += 1
                if not 48 <= raw[q] <= 57:
                    return -1, o0
                while 48 <= raw[q] <= 57:
                    q += 1
            state = 1
            continue
        if c == 116 and raw[q + 1] == 114 and raw[q + 2] == 117 and raw[q + 3] == 101:  # true
            q += 4
        elif c == 102 and raw[q + 1] == 97 and raw[q + 2] == 108 and raw[q + 3] == 115 and raw[q + 4] == 101:
            q += 5
        elif c == 110 and raw[q + 1] == 117 and raw[q + 2] == 108 and raw[q + 3] == 108:  # null
            q += 4
        else:
            return -1, o0
        state = 1


@njit(nogil=True, cache=True)
def jsonl_field(raw, p, n, key, out, o, ls, le, ob, oe):
    """Lines of the block ``raw[:n]`` (whole lines; ``raw[n:n + PAD]`` zero) from ``p``: line k is
    ``raw[ls[k]:le[k]]`` (without its ``\\n``); if it is of :func:`_json_line`'s subset, its field's
    unescaped text is ``out[ob[k]:oe[k]]`` (written from ``out[o]`` on, back to back), else ``oe[k] = -1``
    (json.loads's path decides the line). Stops when ``ls`` is full; returns (lines, next p, next o).
    ``out`` has room for ``n - p + PAD`` bytes from ``o``: the text of a line is never longer than it."""
    stack = np.empty(_DEPTH, np.uint8)
    k = 0
    while p < n and k < ls.size:
        e, o2 = _json_line(raw, p, n, key, out, o, stack)
        ls[k] = p
        if e >= 0:
            ob[k] = o
            oe[k] = o2
            o = o2
        else:
            oe[k] = -1
            ob[k] = o
            e = p
            while True:  # the line's end: the next '\n', or the block's end
                m = _newline64(raw, e)
                if m != _U(0):
                    e += np.int64(_ctz(m))
                    break
                e += 64
                if e >= n:
                    break
            e = min(e, n)
        le[k] = e
        p = e + 1
        k += 1
    return k, p, o


@njit(nogil=True, cache=True)
def last_newline(raw, n):
    """Index of the last ``\\n`` in ``raw[:n]``, or -1."""
    for i in range(n - 1, -1, -1):
        if raw[i] == 10:
            return i
    return -1
