"""The 13-gram overlap screen: what fraction of a window's content n-grams occur in the calibration data.

Why: a quantized checkpoint whose scales were calibrated on some text is flattered when evaluated on
that same text. GPT-3 and lm-evaluation-harness flag contamination by 13-gram overlap; we screen each
window (default: at most 5 % of its content 13-grams seen in calibration) and each chat conversation
before packing (at most 2 %), and rebuild or drop what fails.

**Index: sorted unique uint64 arrays, not a Bloom filter.** The calibration set is streamed in batches
of documents; their n-gram hashes (:mod:`fideval.windows.ngrams`) are written into one buffer of
``merge_every`` entries, which, when full, is sorted in place, deduplicated and merged into the index
(concatenating two sorted runs and sorting again is cheap), so memory stays ~ 8 bytes per distinct
calibration n-gram plus the buffer (and one copy of the index during a merge). One sort of everything
costs less than sorting runs and merging them, hence the large buffer. Lookup is ``np.searchsorted`` on the final array. We chose this over a
Bloom filter because it is exact up to 64-bit hash collisions (false-positive rate N / 2^64 per query,
versus a Bloom filter's designed ~1e-3 at 10 bits per entry), so the recorded fraction equals a
brute-force set computation; at 8 bytes per n-gram a 2 GB budget still holds ~200 M distinct calibration
13-grams, beyond which a Bloom filter (1.25 bytes/entry at 1 % FPR) would be the next step.

Attribution ("which calibration documents did this window match") needs document identities the index
does not keep; :func:`attribute` does a second, targeted pass over the calibration stream that only
tests n-grams already known to match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from fideval.windows import ngrams as ng

BATCH_CHARS = 256 << 10  # documents are hashed in batches of ~this many characters (cache-sized arrays)


def batched(docs: Iterable, size_of: Callable[[object], int], limit: int = BATCH_CHARS) -> Iterator[list]:
    batch, n = [], 0
    for d in docs:
        batch.append(d)
        n += size_of(d)
        if n >= limit:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


@dataclass
class Hasher:
    """Turns document payloads into n-gram hashes for one unit: ``words`` (payload = text) or ``tokens``
    (payload = token ids; ``encode`` maps text to ids)."""

    unit: str
    n: int
    encode: Callable[[str], np.ndarray] | None = None

    def of_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.unit == "words":
            return ng.text_ngrams(texts, self.n)
        assert self.encode is not None, "the tokens unit needs a tokenizer"
        return ng.token_ngrams([self.encode(t) for t in texts], self.n)

    def of_tokens(self, seqs: Sequence[np.ndarray], decode: Callable[[np.ndarray], str]) -> tuple[np.ndarray, np.ndarray]:
        if self.unit == "words":
            return ng.text_ngrams([decode(s) for s in seqs], self.n)
        return ng.token_ngrams(seqs, self.n)


@dataclass
class CalibrationIndex:
    """Sorted unique 64-bit hashes of every calibration n-gram, plus counts for the record."""

    hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    documents: int = 0
    ngrams: int = 0  # with repeats

    @classmethod
    def build(cls, texts: Iterable[str], hasher: Hasher, *, merge_every: int = 64_000_000,
              batch_chars: int = BATCH_CHARS, on_batch: Callable[[int], None] | None = None) -> "CalibrationIndex":
        """Hash ``texts`` batch by batch into one buffer of ``merge_every`` hashes; each time it fills, sort
        it in place, deduplicate, and merge into the index (two sorted runs: a cheap sort)."""
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


@dataclass(frozen=True)
class Overlap:
    """A window's (or conversation's) screen result: ``matched`` of ``total`` content n-grams seen."""

    total: int
    matched: int
    matched_hashes: np.ndarray  # sorted unique hashes that matched, for attribution

    @property
    def fraction(self) -> float:
        return self.matched / self.total if self.total else 0.0


def overlap_of(h: np.ndarray, index: CalibrationIndex) -> Overlap:
    """Fraction of n-gram *occurrences* (repeats counted, as in lm-evaluation-harness) seen in calibration."""
    hit = index.contains(h)
    return Overlap(total=int(h.size), matched=int(hit.sum()), matched_hashes=ng.sorted_unique(h[hit]))


def overlaps_of(h: np.ndarray, group: np.ndarray, n_groups: int, index: CalibrationIndex) -> tuple[np.ndarray, np.ndarray]:
    """(total, matched) n-gram counts per group for many documents at once: one sorted lookup for all of
    them, which is what makes screening a million evaluation tokens cheap (consecutive sorted queries
    land in the same cache lines of the index)."""
    hit = index.contains(h)
    return (np.bincount(group, minlength=n_groups), np.bincount(group[hit], minlength=n_groups))


def attribute(cal_docs: Iterable[tuple[dict, str]], targets: dict[str, np.ndarray], hasher: Hasher,
              top_k: int = 3) -> dict[str, list[dict]]:
    """Second pass: for each target (window id -> its matched hashes), the ``top_k`` calibration documents
    sharing the most distinct n-grams with it. ``cal_docs`` yields (origin, text) in stream order."""
    targets = {k: v for k, v in targets.items() if v.size}
    best: dict[str, list[tuple[int, int, dict]]] = {k: [] for k in targets}
    if not targets:
        return {}
    union = np.unique(np.concatenate(list(targets.values())))
    seq = 0
    for batch in batched(cal_docs, lambda d: len(d[1])):
        h, doc = hasher.of_texts([t for _, t in batch])
        keep = np.isin(h, union)
        if keep.any():
            pairs = np.unique(np.stack([doc[keep].astype(np.uint64), h[keep]]), axis=1)
            for key, th in targets.items():
                m = np.isin(pairs[1], th)
                if not m.any():
                    continue
                counts = np.bincount(pairs[0][m].astype(np.int64), minlength=len(batch))
                for d in np.flatnonzero(counts):
                    best[key].append((-int(counts[d]), seq + int(d), batch[d][0]))
                best[key] = sorted(best[key], key=lambda t: (t[0], t[1]))[:top_k]
        seq += len(batch)
    return {k: [{"document": origin, "shared_ngrams": -c} for c, _, origin in v] for k, v in best.items()}
