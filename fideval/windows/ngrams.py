"""Content n-grams as 64-bit hashes: the unit the overlap screen counts.

**Normalisation (unit ``words``)**, applied to each document (or window segment) separately, following
GPT-3's decontamination and lm-evaluation-harness's ``decontamination/janitor.py`` in spirit:

1. Unicode NFKC (full-width letters, ligatures and compatibility forms fold to their plain form);
2. ``str.lower()``;
3. every run of characters that is not a Unicode letter, number or combining mark (categories L*, N*, M*)
   becomes one space: punctuation, symbols, underscores and markup vanish;
4. split on whitespace. A content n-gram is ``n`` consecutive words of *one* document: n-grams never
   straddle a document boundary (a separator token is not content).

ASCII text takes a numpy fast path (a 256-entry byte table) that is, by construction, the same mapping as
the regex path restricted to ASCII; the test suite checks both against a per-character Python oracle.

**Hashing.** A word hashes to 64 bits from its UTF-8 bytes read 8 at a time (zero-padded chunks folded
by a polynomial mod 2^64, plus its length) and finalised with splitmix64; an n-gram hashes to the
splitmix64 of a polynomial over its word hashes, computed for all n-grams at once from one prefix sum.
Everything is vectorised over a whole batch of documents, so no Python object is made per word. Token-id
n-grams (unit ``tokens``) use the same n-gram polynomial over mixed token ids. Two distinct n-grams share
a hash with probability ~2^-64, so against a calibration set of N distinct n-grams a window n-gram is
falsely reported as seen with probability N / 2^64 (5e-11 for a billion calibration n-grams):
negligible beside the 2-5 % thresholds.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np
import regex

_U64 = np.uint64
_P = _U64(0x100000001B3)  # base folding a long word's 8-byte chunks (FNV prime, odd)
_Q = _U64(0x9E3779B97F4A7C15)  # n-gram polynomial base (golden ratio, odd)
_NONWORD = regex.compile(r"[^\p{L}\p{N}\p{M}]+")

# ASCII fast path: letters lowercased, digits kept, every other ASCII byte -> space; bytes >= 0x80 unchanged.
_LUT = np.full(256, 32, dtype=np.uint8)
_LUT[ord("0"):ord("9") + 1] = np.arange(ord("0"), ord("9") + 1)
_LUT[ord("a"):ord("z") + 1] = np.arange(ord("a"), ord("z") + 1)
_LUT[ord("A"):ord("Z") + 1] = np.arange(ord("a"), ord("z") + 1)
_LUT[128:] = np.arange(128, 256)


def normalize_text(text: str) -> str:
    """The normalised text: words separated by single spaces (see the module docstring)."""
    return _NONWORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def words(text: str) -> list[str]:
    return normalize_text(text).split()


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser (a bijection on uint64 with full avalanche), in place on a copy."""
    x = x.astype(_U64, copy=True)
    x ^= x >> _U64(30)
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def _doc_bytes(text: str) -> bytes:
    if text.isascii():
        return text.encode("ascii")  # NFKC and lower() of ASCII are the byte table's job
    return normalize_text(text).encode("utf-8")


class _Powers:
    """Cached tables ``base**k`` and ``base**-k`` (mod 2^64) for k < n, grown on demand."""

    def __init__(self, base: np.uint64):
        self.base = base
        self.inv = _U64(pow(int(base), -1, 1 << 64))  # odd bases are invertible mod 2^64
        self.fwd = self.bwd = np.ones(1, _U64)

    def tables(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.fwd.size < n:
            m = max(n, 2 * self.fwd.size)
            self.fwd = np.cumprod(np.concatenate(([_U64(1)], np.full(m - 1, self.base, _U64))), dtype=_U64)
            self.bwd = np.cumprod(np.concatenate(([_U64(1)], np.full(m - 1, self.inv, _U64))), dtype=_U64)
        return self.fwd[:n], self.bwd[:n]


_QQ = _Powers(_Q)


def _span_hashes(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, powers: _Powers) -> np.ndarray:
    """sum_{j in [s, e)} values[j] * base^(j - s) (mod 2^64) for every span, via one prefix sum:
    (C[e] - C[s]) * base^-s with C[k] = sum_{j<k} values[j] * base^j."""
    fwd, bwd = powers.tables(values.size + 1)
    c = np.zeros(values.size + 1, _U64)
    np.cumsum(values * fwd[:values.size], out=c[1:])
    return (c[ends] - c[starts]) * bwd[starts]


_TABLE = _LUT.tobytes()


def word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of the normalised words of ``texts``, concatenated, and the index of each word's text.

    A word's bytes are read 8 at a time straight from the buffer through an unaligned uint64 view
    (stride 1 byte), so the per-byte work is only the byte table and the word-edge scan; the rest is per word.
    """
    parts = [_doc_bytes(t) for t in texts]
    if not parts:
        return np.zeros(0, _U64), np.zeros(0, np.int64)
    lens = np.fromiter((len(p) + 1 for p in parts), dtype=np.int64, count=len(parts))
    text_start = np.concatenate(([0], np.cumsum(lens)[:-1]))
    buf = (b" " + b" ".join(parts) + b" ").translate(_TABLE)  # leading space: every word has a start edge
    text_start += 1
    n = len(buf)
    is_word = np.frombuffer(buf, dtype=np.uint8) != 32
    edges = np.flatnonzero(is_word[1:] != is_word[:-1]) + 1  # word starts and ends alternate (bool: fast path)
    if edges.size == 0:
        return np.zeros(0, _U64), np.zeros(0, np.int64)
    starts, ends = edges[0::2], edges[1::2]
    wlen = ends - starts
    padded = buf + bytes(8)
    view = np.ndarray((n,), dtype="<u8", buffer=padded, strides=(1,))  # view[i] = bytes i..i+7
    h = _chunk(view[starts], wlen) + wlen.astype(_U64) * _Q
    for k in range(8, int(wlen.max()), 8):  # words longer than 8 bytes: fold in further 8-byte chunks
        long = np.flatnonzero(wlen > k)
        h[long] = h[long] * _P + splitmix64(_chunk(view[starts[long] + k], wlen[long] - k))
    doc = np.searchsorted(text_start, starts, side="right") - 1
    return splitmix64(h), doc


def _chunk(x: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """Keep the low ``min(remaining, 8)`` bytes of each uint64 (the rest belongs to the next word)."""
    return x & _MASKS[np.minimum(remaining, 8)]


_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=_U64)


def ngram_hashes(units: np.ndarray, group: np.ndarray, n: int) -> np.ndarray:
    """Hashes of every run of ``n`` consecutive ``units`` (uint64) that lies within one ``group``."""
    m = units.size - n + 1
    if m <= 0:
        return np.zeros(0, _U64)
    i = np.flatnonzero(group[:m] == group[n - 1:])
    return splitmix64(_span_hashes(units, i, i + n, _QQ))


def sorted_unique(x: np.ndarray, *, in_place: bool = False) -> np.ndarray:
    """``np.unique`` for uint64 by sort + neighbour compare (numpy 2.4's ``unique`` is ~100x slower here);
    ``in_place`` sorts ``x`` itself, saving one copy of a large array."""
    if x.size == 0:
        return x.astype(_U64)
    if in_place:
        x.sort()
        s = x
    else:
        s = np.sort(x)
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def text_ngrams(texts: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n-gram hashes, index of the text each came from) for word n-grams of each text separately."""
    h, doc = word_hashes(texts)
    m = h.size - n + 1
    if m <= 0:
        return np.zeros(0, _U64), np.zeros(0, np.int64)
    valid = doc[:m] == doc[n - 1:]
    return ngram_hashes(h, doc, n), doc[:m][valid]


def token_ngrams(seqs: Sequence[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n-gram hashes, sequence index) for token-id n-grams within each sequence separately."""
    if not seqs:
        return np.zeros(0, _U64), np.zeros(0, np.int64)
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    doc = np.repeat(np.arange(len(seqs), dtype=np.int64), lens)
    units = splitmix64(np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]).astype(_U64) + _U64(1))
    m = units.size - n + 1
    if m <= 0:
        return np.zeros(0, _U64), np.zeros(0, np.int64)
    valid = doc[:m] == doc[n - 1:]
    return ngram_hashes(units, doc, n), doc[:m][valid]
