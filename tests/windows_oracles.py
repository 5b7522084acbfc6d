"""Independent reference implementations the overlap screen's tests (and ``bench/overlap.py``) compare
``fideval.windows.screen`` against. None of it is used by fideval itself.

* the word rule per character (:func:`oracle_words`), the byte table of the ASCII fast path per byte
  (:data:`BYTE_TABLE`, :func:`oracle_bytes_words`), and the documented hashes with Python ints
  (:func:`oracle_word_hash`, :func:`oracle_ngram_hash`);
* the full index (:class:`CalibrationIndex`): every calibration n-gram hash in one sorted unique array,
  asked by binary search. A second implementation of the screen's answer that shares only the hashing with
  the evaluation-side index and the streamed pass; the bench runs it at scale, so it is numpy, not sets.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fideval.windows.screen import Hasher, Overlap, Probe, rank
from fideval.windows.screen import ngrams as ng
from fideval.windows.screen.scan import batched, scan

M64 = (1 << 64) - 1
P, Q = 0x100000001B3, 0x9E3779B97F4A7C15


def oracle_words(text: str) -> list[str]:
    """Independent normaliser: NFKC, lower, per-character Unicode category test, split."""
    t = unicodedata.normalize("NFKC", text).lower()
    return "".join(c if unicodedata.category(c)[0] in "LNM" else " " for c in t).split()


def oracle_grams(text: str, n: int) -> list[tuple[str, ...]]:
    w = oracle_words(text)
    return [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]


# The ASCII fast path's byte table: letters lowercased, digits kept, every other ASCII byte -> space,
# bytes >= 0x80 unchanged (the compiled loop's vector range tests must equal it byte for byte).
BYTE_TABLE = [b if (48 <= b <= 57 or 97 <= b <= 122 or b >= 128) else b + 32 if 65 <= b <= 90 else 32
              for b in range(256)]


def oracle_bytes_words(buf: bytes, bounds: list[int]) -> list[tuple[bytes, int]]:
    """(word, document) of raw bytes through :data:`BYTE_TABLE`, one byte at a time."""
    out = []
    for d in range(len(bounds) - 1):
        mapped = bytes(BYTE_TABLE[b] for b in buf[bounds[d]:bounds[d + 1]])
        out += [(w, d) for w in mapped.split(b" ") if w]
    return out


def smx(x: int) -> int:
    """splitmix64's finaliser with Python ints."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def oracle_bytes_hash(b: bytes) -> int:
    """The word hash as documented in ``ngrams.py``, transcribed with Python ints."""
    chunks = [int.from_bytes(b[i:i + 8], "little") for i in range(0, len(b), 8)]
    h = (chunks[0] + len(b) * Q) & M64
    for c in chunks[1:]:
        h = (h * P + smx(c)) & M64
    return smx(h)


def oracle_word_hash(word: str) -> int:
    return oracle_bytes_hash(word.encode("utf-8"))


def oracle_ngram_hash(units: list[int]) -> int:
    return smx(sum(u * pow(Q, j, 1 << 64) for j, u in enumerate(units)) & M64)


@dataclass
class CalibrationIndex:
    """Sorted unique 64-bit hashes of every calibration n-gram, plus counts."""

    hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    documents: int = 0
    ngrams: int = 0  # with repeats

    @classmethod
    def build(cls, texts: Iterable[str], hasher: Hasher, *, merge_every: int = 64_000_000,
              batch_chars: int = 256 << 10, on_batch: Callable[[int], None] | None = None) -> CalibrationIndex:
        """Hash ``texts`` batch by batch into one buffer of ``merge_every`` hashes; each time it fills, sort
        it in place, deduplicate, and merge into the index."""
        buf = np.empty(merge_every, np.uint64)  # virtual until written: small sets touch little of it
        fill = 0
        merged = np.zeros(0, np.uint64)
        docs = grams = 0

        def flush(extra: np.ndarray | None = None) -> np.ndarray:
            u = ng.sorted_unique(buf[:fill] if extra is None else extra, in_place=True)  # a new array
            return u if merged.size == 0 else ng.sorted_unique(np.concatenate([merged, u]), in_place=True)

        for batch in batched(texts, len, batch_chars):
            h, _ = hasher.of_texts(batch)
            docs += len(batch)
            grams += h.size
            if fill + h.size > buf.size:
                merged = flush()
                fill = 0
            if h.size > buf.size:
                merged = flush(h)
            else:
                buf[fill:fill + h.size] = h
                fill += h.size
            if on_batch:
                on_batch(sum(len(t) for t in batch))
        if fill:
            merged = flush()
        return cls(hashes=merged, documents=docs, ngrams=grams)

    def contains(self, h: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``h`` occur in the calibration set."""
        if self.hashes.size == 0 or h.size == 0:
            return np.zeros(h.shape, dtype=bool)
        order = np.argsort(h)  # sorted queries walk the index in order: far fewer cache misses
        q = h[order]
        i = np.searchsorted(self.hashes, q)
        hit = np.empty(h.shape, dtype=bool)
        hit[order] = self.hashes[np.minimum(i, self.hashes.size - 1)] == q
        return hit


def overlap_of(h: np.ndarray, index: CalibrationIndex) -> Overlap:
    """Fraction of n-gram *occurrences* (repeats counted, as in lm-evaluation-harness) seen in calibration."""
    hit = index.contains(h)
    return Overlap(total=int(h.size), matched=int(hit.sum()), matched_hashes=ng.sorted_unique(h[hit]))


def overlaps_of(h: np.ndarray, group: np.ndarray, n_groups: int, index: Any) -> tuple[np.ndarray, np.ndarray]:
    """(total, matched) n-gram counts per group for many documents at once (``index``: a
    :class:`CalibrationIndex` or a resolved ``Queries``): one lookup for all of them."""
    hit = index.contains(h)
    return np.bincount(group, minlength=n_groups), np.bincount(group[hit], minlength=n_groups)


def attribute(cal_docs: Iterable[tuple[Any, str]], targets: dict[str, np.ndarray], hasher: Hasher,
              top_k: int = 3) -> dict[str, list[dict]]:
    """A calibration pass of its own for attribution alone: for each target (key -> its matched hashes), the
    ``top_k`` calibration documents sharing the most distinct n-grams with it (the windows stage gets the
    same from its screening passes)."""
    targets = {k: v for k, v in targets.items() if v.size}
    if not targets:
        return {}
    res = scan(cal_docs, hasher, Probe.of(np.concatenate(list(targets.values()))))
    return rank(res.pair_doc, res.pair_hash, res.origins, targets, top_k)
