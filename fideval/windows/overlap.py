"""The 13-gram overlap screen: what fraction of a window's content n-grams occur in the calibration data.

Why: a quantized checkpoint whose scales were calibrated on some text is flattered when evaluated on
that same text. GPT-3 and lm-evaluation-harness flag contamination by 13-gram overlap; we screen each
window (default: at most 5 % of its content 13-grams seen in calibration) and each chat conversation
before packing (at most 2 %), and rebuild or drop what fails.

**Index the small side** (:class:`Queries`, what ``fideval windows`` uses). The screen only has to know
which *evaluation* n-grams occur in calibration, and the evaluation side is small (a million tokens)
while calibration sets are large (tens of millions to billions of tokens). So the evaluation n-grams are
hashed first and held as one sorted unique uint64 array with two probe tables
(:func:`fideval.windows.kernels.build_probe`): a blocked Bloom prefilter of ~32 bits per query (4 MB for
a million: one word read per probe, ~0.2 % of absent n-grams pass), and bucket starts over the top
log2(queries) bits for the exact 64-bit comparison of those that pass. Not a Bloom filter *instead* of
the hashes: the prefilter only saves work, every reported match is an exact 64-bit equality. The calibration stream is then hashed
batch by batch (:func:`scan`) and each of its n-grams probed as its document is hashed; nothing of
calibration is kept but the matches. (A jsonl source comes in blocks of bytes whose plain lines a compiled
parser unescapes straight into the batch, :func:`fideval.windows.sources.iter_blocks`: no Python string
per document.) Memory is O(evaluation n-grams + a few batches), whatever the
calibration size; there
is no sort of calibration hashes at all. The answer is exact up to 64-bit hash collisions (the
false-positive rate stays N / 2^64 per n-gram), so fractions equal a brute-force set computation.

Because the pass sees, for every match, the calibration document it came from, attribution ("which
calibration documents did this window match") comes out of the same pass: each batch keeps its distinct
(document, matched hash) pairs and the origins of the documents that matched (:func:`rank`).

The windows stage does not know every window it will screen before the pass (a rejected window is
replaced by one packed from later documents, a dropped conversation shifts the packing), so
:class:`Queries` accumulates: hashes it has not resolved are collected, and one pass resolves all of them;
``fideval windows`` packs ahead (spare windows) so that one pass is usually enough
(:mod:`fideval.windows.build`).

**Full index** (:class:`CalibrationIndex`, for callers that must ask about n-grams not known before the
pass, and a second, independent implementation the tests and the bench compare against): every calibration n-gram hash in one sorted unique uint64 array, built by hashing
batches into a buffer of ``merge_every`` entries that is sorted, deduplicated and merged into the index
when full (~8 bytes per distinct calibration n-gram: a 2 GB budget holds ~200 M). Exact in the same way.

Both use the same hashing (:mod:`fideval.windows.ngrams`), so they give the same fractions.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fideval.windows import kernels
from fideval.windows import ngrams as ng
from fideval.windows.sources import Blocks, TextBlock, batched, blocks_of

BATCH_CHARS = 256 << 10  # documents are hashed in batches of ~this many characters (cache-sized arrays)
SCAN_BATCH_CHARS = 2 << 20  # the calibration pass: bigger batches, fewer hand-offs between threads


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Hashing threads of the calibration pass (the compiled loop runs without the GIL): one core is left to the
# main thread, which reads the next batch and, being the faster side (a jsonl file through
# ``sources.iter_blocks``: ~0.12 s for the bench's 426 MB, against ~1.0 s of hashing on one core), hashes
# about 40 % of the batches itself (see :func:`scan`). On the 2-core bench machine a second worker only
# takes turns with it (a pass measured 0.76-0.80 s with one worker, 0.79-0.85 s with two). Two at most.
SCAN_THREADS = max(1, min(2, _cores() - 1))


_SCRATCH = threading.local()  # each hashing thread's work arrays (kernels.Scratch)


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

    def prepare(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The part of hashing that needs Python objects (normalising non-ASCII text, encoding tokens):
        done on the calling thread; the rest is :meth:`probe`, which needs no GIL."""
        if self.unit == "words":
            return ng.doc_buffer(texts)
        assert self.encode is not None, "the tokens unit needs a tokenizer"
        return ng.token_units([self.encode(t) for t in texts])

    def prepare_block(self, block: TextBlock) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`prepare` of a block of documents: for unit ``words`` the block's ASCII bytes are used as
        they are, only its Python strings are converted."""
        if self.unit == "words":
            return ng.block_buffer(block.buf, block.bounds, block.texts)
        return self.prepare([block.text(i) for i in range(len(block))])

    def probe(self, prepared: tuple[np.ndarray, np.ndarray], p: "Probe") -> tuple[int, np.ndarray, np.ndarray]:
        a, b = prepared
        if self.unit == "words":
            sc = getattr(_SCRATCH, "words", None)
            if sc is None:
                sc = _SCRATCH.words = kernels.Scratch()
            return kernels.scan_words(a, b, self.n, p.bitmap, p.bits, p.hashes, p.starts, p.bucket_bits, sc)
        return kernels.scan_units(a, b, self.n, p.bitmap, p.bits, p.hashes, p.starts, p.bucket_bits)


# == the small side: queries =================================================================================


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
        bitmap, starts = kernels.build_probe(q, bits, bucket_bits)
        return cls(hashes=q, bits=bits, bucket_bits=bucket_bits, bitmap=bitmap, starts=starts)

    def find(self, h: np.ndarray) -> np.ndarray:
        """Index of each of ``h`` in :attr:`hashes`, or -1."""
        return kernels.lookup(np.ascontiguousarray(h, np.uint64), self.bitmap, self.bits, self.hashes, self.starts,
                              self.bucket_bits)


@dataclass
class Scan:
    """One calibration pass against a :class:`Probe`: which queries were seen, counts, and for attribution
    every distinct (calibration document, matched hash) pair with the origins of those documents."""

    seen: np.ndarray  # bool, aligned with the probe's hashes
    documents: int
    ngrams: int  # calibration n-grams, with repeats
    pair_doc: np.ndarray  # int64 calibration document number (stream order)
    pair_hash: np.ndarray  # uint64
    origins: dict[int, Any]


def scan(docs: Iterable[tuple[Any, str]] | Blocks, hasher: Hasher, probe: Probe, *,
         batch_chars: int = SCAN_BATCH_CHARS, threads: int = SCAN_THREADS,
         on_batch: Callable[[int], None] | None = None) -> Scan:
    """Stream ``docs`` through ``probe``: (origin, text) pairs in stream order, taken in batches of
    ~``batch_chars`` characters, or :class:`~fideval.windows.sources.Blocks` (``sources.iter_blocks``:
    batches already made, most texts as bytes).

    The calling thread reads and prepares batch k+1 (it holds the GIL for what is Python: JSON lines the
    compiled reader leaves to ``json.loads``, non-ASCII texts to normalise) while up to ``threads`` workers
    run the compiled hash-and-probe loop on earlier batches (no GIL). When every worker is busy and has a
    batch queued, the calling thread hashes the batch it just prepared itself instead of waiting, so
    neither side idles, whichever is slower (reading or hashing: it depends on the data, the machine and
    its other jobs; on the bench, whose jsonl the compiled reader takes whole, one worker hashes ~60 % of
    the batches and the calling thread the rest, 0.76-0.80 s a pass against ~1.1 s of hashing alone).
    Results are taken in order, so counts, pairs and origins do not depend on timing. At most
    ``threads + 3`` batches are in flight: memory stays a few batches.
    """
    seen = np.zeros(probe.hashes.size, bool)
    pair_doc: list[np.ndarray] = []
    pair_hash: list[np.ndarray] = []
    origins: dict[int, Any] = {}
    counts = [0, 0]  # documents, n-grams
    inflight: deque = deque()

    def take() -> None:
        fut, base, block = inflight.popleft()
        grams, hd, hq = fut.result()
        counts[1] += int(grams)
        if hq.size:
            seen[hq] = True
            key = np.unique(hd * probe.hashes.size + hq)  # distinct (document, query) pairs
            d, q = np.divmod(key, probe.hashes.size)
            pair_doc.append(d + base)
            pair_hash.append(probe.hashes[q])
            for i in np.unique(d).tolist():
                origins[base + i] = block.origin(i)

    workers = max(1, threads)
    with ThreadPoolExecutor(workers) as pool:
        for block in (docs if isinstance(docs, Blocks) else blocks_of(docs, batch_chars)):
            prepared = hasher.prepare_block(block)
            if sum(not f.done() for f, _, _ in inflight) <= workers:  # a worker is free or will be next
                fut = pool.submit(hasher.probe, prepared, probe)
            else:  # every worker busy with a batch queued behind it: hash this one here (no GIL either)
                fut = Future()
                fut.set_result(hasher.probe(prepared, probe))
            inflight.append((fut, counts[0], block))
            counts[0] += len(block)
            if on_batch:
                on_batch(block.chars)
            while inflight and (inflight[0][0].done() or len(inflight) > workers + 2):
                take()
        while inflight:
            take()
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
    return Scan(seen=seen, documents=counts[0], ngrams=counts[1], pair_doc=cat(pair_doc, np.int64),
                pair_hash=cat(pair_hash, np.uint64), origins=origins)


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

    def resolve(self, docs: Iterable[tuple[Any, str]] | Blocks, **kw: Any) -> Scan | None:
        """One calibration pass for every queued hash (``docs``: (origin, text) in stream order, or
        :class:`~fideval.windows.sources.Blocks`; see :func:`scan`)."""
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


def rank(pair_doc: np.ndarray, pair_hash: np.ndarray, origins: dict[int, Any], targets: dict[str, np.ndarray],
         top_k: int = 3) -> dict[str, list[dict]]:
    """For each target (key -> its matched hashes), the ``top_k`` calibration documents sharing the most
    distinct n-grams with it (ties: earlier in the stream first). ``pair_*``: distinct (document, hash)."""
    out: dict[str, list[dict]] = {}
    for key, th in targets.items():
        if not th.size:
            continue
        d = pair_doc[np.isin(pair_hash, th)]
        docs, counts = np.unique(d, return_counts=True)
        order = np.lexsort((docs, -counts))[:top_k]
        out[key] = [{"document": origins[int(docs[j])], "shared_ngrams": int(counts[j])} for j in order]
    return out


def attribute(cal_docs: Iterable[tuple[Any, str]], targets: dict[str, np.ndarray], hasher: Hasher,
              top_k: int = 3) -> dict[str, list[dict]]:
    """A pass of its own over ``cal_docs`` ((origin, text) in stream order) for attribution alone: for each
    target (window id -> its matched hashes), the ``top_k`` calibration documents sharing the most distinct
    n-grams with it. (The windows stage gets the same from its screening pass, see :class:`Queries`.)"""
    targets = {k: v for k, v in targets.items() if v.size}
    if not targets:
        return {}
    res = scan(cal_docs, hasher, Probe.of(np.concatenate(list(targets.values()))))
    return rank(res.pair_doc, res.pair_hash, res.origins, targets, top_k)


# == the full index ==========================================================================================


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


def overlaps_of(h: np.ndarray, group: np.ndarray, n_groups: int,
                index: CalibrationIndex | Queries) -> tuple[np.ndarray, np.ndarray]:
    """(total, matched) n-gram counts per group for many documents at once: one lookup for all of them."""
    hit = index.contains(h)
    return (np.bincount(group, minlength=n_groups), np.bincount(group[hit], minlength=n_groups))
