"""Content n-grams as 64-bit hashes: the unit the overlap screen counts.

**Normalisation (unit ``words``)**, applied to each document (or window segment) separately, following
GPT-3's decontamination and lm-evaluation-harness's ``decontamination/janitor.py`` in spirit:

1. Unicode NFKC (full-width letters, ligatures and compatibility forms fold to their plain form);
2. ``str.lower()``;
3. every run of characters that is not a Unicode letter, number or combining mark (categories L*, N*, M*)
   becomes one space: punctuation, symbols, underscores and markup vanish;
4. split on whitespace. A content n-gram is ``n`` consecutive words of *one* document: n-grams never
   straddle a document boundary (a separator token is not content).

ASCII text takes a fast path: the compiled loop maps its bytes itself (letters lowercased, digits kept,
every other ASCII byte a space, bytes >= 0x80 as they are), by construction the same mapping as the regex
path restricted to ASCII; other text goes through the regex path first. The test suite checks both
against a per-character Python oracle, and the compiled loop against that byte table for all 256 values.

**Hashing** (all arithmetic mod 2^64; ``smx`` is the splitmix64 finaliser; P = 0x100000001B3,
Q = 0x9E3779B97F4A7C15):

* a word of normalised UTF-8 bytes ``b`` (length L) is cut into m = ceil(L / 8) chunks, chunk k being
  ``b[8k:8k+8]`` read little-endian and zero-padded; ``h = chunk0 + L*Q``, then ``h = h*P + smx(chunk_k)``
  for k = 1..m-1; the word's hash is ``smx(h)``;
* an n-gram of word hashes ``w_0..w_{n-1}`` hashes to ``smx(sum_j w_j * Q^j)``;
* a token id (unit ``tokens``) is the unit ``smx(id + 1)``, and its n-grams use the same polynomial.

The loops live in :mod:`fideval.windows.screen.hashing` (numba): per document, 64-byte vector blocks for the
word edges, one hash per word from 8-byte loads, a rolling polynomial for the n-grams, no Python object
per word. Two distinct n-grams share a hash with
probability ~2^-64, so against a calibration set of N distinct n-grams a window n-gram is falsely
reported as seen with probability N / 2^64 (5e-11 for a billion calibration n-grams): negligible beside
the 2-5 % thresholds.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import regex

from fideval.windows.screen import hashing

_U64 = np.uint64
_NONWORD = regex.compile(r"[^\p{L}\p{N}\p{M}]+")

_PAD = bytes(hashing.PAD)  # zero bytes after the last text: the compiled 64-byte loads may read past it


def normalize_text(text: str) -> str:
    """The normalised text: words separated by single spaces (see the module docstring)."""
    return _NONWORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def words(text: str) -> list[str]:
    return normalize_text(text).split()


def _doc_bytes(text: str) -> bytes:
    if text.isascii():
        return text.encode("ascii")  # NFKC and lower() of ASCII are the byte table's job
    return normalize_text(text).encode("utf-8")


def doc_buffer(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of every text, back to back, as uint8; bounds: text ``d`` is ``buf[bounds[d]:bounds[d+1]]``):
    what the compiled loops read, followed by ``hashing.PAD`` zero bytes that they may load past the last
    text. ASCII texts go in as they are (the byte table normalises them); others go through
    :func:`normalize_text` first."""
    parts = [_doc_bytes(t) for t in texts]
    bounds = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)), out=bounds[1:])
    parts.append(_PAD)
    return np.frombuffer(b"".join(parts), np.uint8), bounds


def word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of the normalised words of ``texts``, concatenated, and the index of each word's text."""
    buf, bounds = doc_buffer(texts)
    return hashing.word_hashes(buf, bounds)


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
    buf, bounds = doc_buffer(texts)
    h, doc = hashing.word_hashes(buf, bounds)
    return hashing.ngram_hashes(h, doc, n)


def token_units(seqs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(mixed token ids, sequence index): the units of token n-grams (splitmix64 of id + 1)."""
    if not seqs:
        return np.zeros(0, _U64), np.zeros(0, np.int64)
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    doc = np.repeat(np.arange(len(seqs), dtype=np.int64), lens)
    return hashing.mix_units(np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])), doc


def token_ngrams(seqs: Sequence[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n-gram hashes, sequence index) for token-id n-grams within each sequence separately."""
    units, doc = token_units(seqs)
    return hashing.ngram_hashes(units, doc, n)


@dataclass
class Hasher:
    """Turns document payloads into n-gram hashes for one unit: ``words`` (payload = text) or ``tokens``
    (payload = token ids; ``encode`` maps text to ids)."""

    unit: str
    n: int
    encode: Callable[[str], np.ndarray] | None = None

    def of_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.unit == "words":
            return text_ngrams(texts, self.n)
        assert self.encode is not None, "the tokens unit needs a tokenizer"
        return token_ngrams([self.encode(t) for t in texts], self.n)

    def of_tokens(self, seqs: Sequence[np.ndarray], decode: Callable[[np.ndarray], str]) -> tuple[np.ndarray, np.ndarray]:
        if self.unit == "words":
            return text_ngrams([decode(s) for s in seqs], self.n)
        return token_ngrams(seqs, self.n)

    def prepare(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The part of hashing that needs Python objects (normalising non-ASCII text, encoding tokens): done
        on the calling thread; the rest (``scan``'s compiled probe loop) needs no GIL."""
        if self.unit == "words":
            return doc_buffer(texts)
        assert self.encode is not None, "the tokens unit needs a tokenizer"
        return token_units([self.encode(t) for t in texts])
