"""The evaluation-side index of the 13-gram overlap screen: which evaluation n-grams occur in calibration.

Why: a quantized checkpoint whose scales were calibrated on some text is flattered when evaluated on
that same text. GPT-3 and lm-evaluation-harness flag contamination by 13-gram overlap; we screen each
window (default: at most 5 % of its content 13-grams seen in calibration) and each chat conversation
before packing (at most 2 %), and rebuild or drop what fails.

**Index the small side.** The screen only has to know which *evaluation* n-grams occur in calibration,
and the evaluation side is small (a million tokens) while calibration sets are large (tens of millions to
billions of tokens). So the evaluation n-grams are hashed first and held as one sorted unique uint64
array with two probe tables (:class:`Probe`, ``hashing.build_probe``): a blocked Bloom prefilter of ~32
bits per query (4 MB for a million: one word read per probe, ~0.2 % of absent n-grams pass), and bucket
starts over the top log2(queries) bits for the exact 64-bit comparison of those that pass. Not a Bloom
filter *instead* of the hashes: the prefilter only saves work, every reported match is an exact 64-bit
equality. The calibration stream is then probed against it (:mod:`fideval.windows.screen.scan`).

The windows stage does not know every window it will screen before the pass (a rejected window is
replaced by one packed from later documents, a dropped conversation shifts the packing), so
:class:`Queries` accumulates: hashes it has not resolved are collected, and one pass resolves all of them;
``fideval windows`` packs ahead (spare windows) so that one pass is usually enough
(:mod:`fideval.windows.build`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fideval.windows.screen import hashing
from fideval.windows.screen import ngrams as ng
from fideval.windows.screen.ngrams import Hasher
from fideval.windows.screen.scan import Scan, scan


@dataclass
class Probe:
    """Sorted unique query hashes and their probe tables (see the module docstring)."""

    hashes: np.ndarray
    bits: int
    bucket_bits: int
    bitmap: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, hashes: np.ndarray, *, unique: bool = False) -> "Probe":
        """Probe tables over ``hashes`` (``unique``: they are sorted and unique already)."""
        q = np.asarray(hashes, np.uint64) if unique else ng.sorted_unique(np.asarray(hashes, np.uint64))
        lg = max(1, int(q.size - 1).bit_length())  # ceil(log2(size))
        bits = min(max(lg + 5, 7), 31)  # >= 32 bits per query (blocked Bloom, see build_probe); 256 MiB at most
        bucket_bits = min(lg, 28)
        bitmap, starts = hashing.build_probe(q, bits, bucket_bits)
        return cls(hashes=q, bits=bits, bucket_bits=bucket_bits, bitmap=bitmap, starts=starts)

    def find(self, h: np.ndarray) -> np.ndarray:
        """Index of each of ``h`` in :attr:`hashes`, or -1."""
        return hashing.lookup(np.ascontiguousarray(h, np.uint64), self.bitmap, self.bits, self.hashes, self.starts,
                              self.bucket_bits)


class Queries:
    """Evaluation n-gram hashes and whether each occurs in calibration, resolved by calibration passes.

    :meth:`overlap` answers for hashes already resolved and collects the others (answering ``None``);
    :meth:`resolve` runs one pass (:func:`scan`) for everything collected. Attribution pairs and origins
    accumulate over passes.
    """

    def __init__(self, hasher: Hasher):
        self.hasher = hasher
        self.known = np.zeros(0, np.uint64)  # sorted unique resolved hashes
        self.seen = np.zeros(0, bool)
        self.pending: list[np.ndarray] = []
        self.passes = 0
        self.documents = 0
        self.ngrams = 0
        self.pair_doc = np.zeros(0, np.int64)
        self.pair_hash = np.zeros(0, np.uint64)
        self.origins: dict[int, Any] = {}
        self._probe: Probe | None = None  # over ``known``, for _locate

    def _locate(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index in :attr:`known`, found) of each of ``h``: a probe of hash tables over :attr:`known` (made
        after each pass), not a binary search: for a million evaluation n-grams 0.03 s against 0.35-0.5 s
        (each search step a cache miss)."""
        if not self.known.size:
            return np.zeros(h.shape, np.int64), np.zeros(h.shape, bool)
        if self._probe is None:
            self._probe = Probe.of(self.known, unique=True)
        i = self._probe.find(h)
        found = i >= 0
        return np.maximum(i, 0), found

    def overlap(self, h: np.ndarray) -> "Overlap | None":
        """The overlap of n-grams ``h``, or ``None`` (and ``h`` is queued) if some are not resolved yet."""
        i, found = self._locate(h)
        if not found.all():
            self.pending.append(h[~found])
            return None
        hit = self.seen[i] if h.size else np.zeros(0, bool)
        return Overlap(total=int(h.size), matched=int(hit.sum()), matched_hashes=ng.sorted_unique(h[hit]))

    def contains(self, h: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``h`` occur in calibration (every one must be resolved)."""
        i, found = self._locate(h)
        if not found.all():
            raise ValueError(f"{int((~found).sum())} n-grams were never resolved (queue them and resolve first)")
        return self.seen[i] if h.size else np.zeros(h.shape, bool)

    @property
    def unresolved(self) -> int:
        return sum(p.size for p in self.pending)

    def resolve(self, docs: Iterable[tuple[Any, str]], **kw: Any) -> Scan | None:
        """One calibration pass for every queued hash (``docs``: (origin, text) in stream order; see
        :func:`~fideval.windows.screen.scan.scan`)."""
        new = ng.sorted_unique(np.concatenate(self.pending)) if self.pending else np.zeros(0, np.uint64)
        self.pending = []
        if self.known.size and new.size:
            new = new[~self._locate(new)[1]]
        if new.size == 0 and self.passes:
            return None
        probe = Probe.of(new)
        res = scan(docs, self.hasher, probe, **kw)
        self.passes += 1
        self.documents, self.ngrams = res.documents, res.ngrams
        allh = np.concatenate([self.known, probe.hashes])
        order = np.argsort(allh, kind="stable")
        self.known = allh[order]
        self._probe = None
        self.seen = np.concatenate([self.seen, res.seen])[order]
        self.pair_doc = np.concatenate([self.pair_doc, res.pair_doc])
        self.pair_hash = np.concatenate([self.pair_hash, res.pair_hash])
        self.origins.update(res.origins)
        return res


@dataclass(frozen=True)
class Overlap:
    """A window's (or conversation's) screen result: ``matched`` of ``total`` content n-grams seen."""

    total: int
    matched: int
    matched_hashes: np.ndarray  # sorted unique hashes that matched, for attribution

    @property
    def fraction(self) -> float:
        return self.matched / self.total if self.total else 0.0
