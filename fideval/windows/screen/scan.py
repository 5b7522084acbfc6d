"""The streamed calibration pass: every calibration n-gram probed against the evaluation-side index.

The calibration stream is hashed batch by batch (:func:`scan`) and each of its n-grams probed as its
document is hashed (``hashing.scan_words``/``scan_units``); nothing of calibration is kept but the matches.
Memory is O(evaluation n-grams + a few batches), whatever the calibration size; there is no sort of
calibration hashes at all. The answer is exact up to 64-bit hash collisions, so fractions equal a
brute-force set computation (the tests check it).

Because the pass sees, for every match, the calibration document it came from, attribution ("which
calibration documents did this window match") comes out of the same pass: each batch keeps its distinct
(document, matched hash) pairs and the origins of the documents that matched (:func:`rank`).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fideval.windows.screen import hashing
from fideval.windows.screen.ngrams import Hasher

if TYPE_CHECKING:
    from fideval.windows.screen.index import Probe

SCAN_BATCH_CHARS = 2 << 20  # the calibration pass: batches of ~this many characters, few hand-offs between threads


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Hashing threads of the calibration pass (the compiled loop runs without the GIL): one core is left to the
# main thread, which reads the next batch and hashes one itself whenever every worker is busy (see
# :func:`scan`). On the 2-core bench machine a second worker only takes turns with it. Two at most.
SCAN_THREADS = max(1, min(2, _cores() - 1))

_SCRATCH = threading.local()  # each hashing thread's work arrays (hashing.Scratch)


def probe_batch(hasher: Hasher, prepared: tuple[np.ndarray, np.ndarray], p: Probe) -> tuple[int, np.ndarray, np.ndarray]:
    """(n-grams hashed, document and query index of each hit) of one prepared batch (``Hasher.prepare``):
    the compiled hash-and-probe loop, which needs no GIL."""
    a, b = prepared
    if hasher.unit == "words":
        sc = getattr(_SCRATCH, "words", None)
        if sc is None:
            sc = _SCRATCH.words = hashing.Scratch()
        return hashing.scan_words(a, b, hasher.n, p.bitmap, p.bits, p.hashes, p.starts, p.bucket_bits, sc)
    return hashing.scan_units(a, b, hasher.n, p.bitmap, p.bits, p.hashes, p.starts, p.bucket_bits)


def batched(docs: Iterable, size_of: Callable[[Any], int], limit: int) -> Iterator[list]:
    """``docs`` in consecutive lists, each closed once its items' sizes reach ``limit``."""
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
class Scan:
    """One calibration pass against a :class:`~fideval.windows.screen.index.Probe`: which queries were
    seen, counts, and for attribution every distinct (calibration document, matched hash) pair with the
    origins of those documents."""

    seen: np.ndarray  # bool, aligned with the probe's hashes
    documents: int
    ngrams: int  # calibration n-grams, with repeats
    pair_doc: np.ndarray  # int64 calibration document number (stream order)
    pair_hash: np.ndarray  # uint64
    origins: dict[int, Any]


def scan(docs: Iterable[tuple[Any, str]], hasher: Hasher, probe: Probe, *, batch_chars: int = SCAN_BATCH_CHARS,
         threads: int = SCAN_THREADS, on_batch: Callable[[int], None] | None = None) -> Scan:
    """Stream ``docs`` ((origin, text) pairs in stream order, taken in batches of ~``batch_chars``
    characters) through ``probe``.

    The calling thread reads and prepares batch k+1 (it holds the GIL for what is Python: reading the
    source, normalising non-ASCII texts) while up to ``threads`` workers run the compiled hash-and-probe
    loop on earlier batches (no GIL). When every worker is busy and has a batch queued, the calling thread
    hashes the batch it just prepared itself instead of waiting, so neither side idles, whichever is slower.
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
        fut, base, batch = inflight.popleft()
        grams, hd, hq = fut.result()
        counts[1] += int(grams)
        if hq.size:
            seen[hq] = True
            key = np.unique(hd * probe.hashes.size + hq)  # distinct (document, query) pairs
            d, q = np.divmod(key, probe.hashes.size)
            pair_doc.append(d + base)
            pair_hash.append(probe.hashes[q])
            for i in np.unique(d).tolist():
                origins[base + i] = batch[i][0]

    workers = max(1, threads)
    with ThreadPoolExecutor(workers) as pool:
        for batch in batched(docs, lambda d: len(d[1]), batch_chars):
            prepared = hasher.prepare([t for _, t in batch])
            if sum(not f.done() for f, _, _ in inflight) <= workers:  # a worker is free or will be next
                fut = pool.submit(probe_batch, hasher, prepared, probe)
            else:  # every worker busy with a batch queued behind it: hash this one here (no GIL either)
                fut = Future()
                fut.set_result(probe_batch(hasher, prepared, probe))
            inflight.append((fut, counts[0], batch))
            counts[0] += len(batch)
            if on_batch:
                on_batch(sum(len(t) for _, t in batch))
            while inflight and (inflight[0][0].done() or len(inflight) > workers + 2):
                take()
        while inflight:
            take()
    return Scan(seen=seen, documents=counts[0], ngrams=counts[1], pair_doc=_cat(pair_doc, np.int64),
                pair_hash=_cat(pair_hash, np.uint64), origins=origins)


def _cat(xs: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(xs) if xs else np.zeros(0, dtype)


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
