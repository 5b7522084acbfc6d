"""Windows as bootstrap clusters, and the one resample matrix every figure shares.

Why clusters: tokens of one window share a document, a topic and a context, so their KLDs are correlated;
treating 73,728 tokens as independent would make intervals several times too narrow (see
``bench/coverage.py``). The independent unit is the window: cuts of a window (``<window>.c<j>``) and
every candidate/path/length scored on it belong to the same cluster, keyed by ``window_id``.

Why one matrix: the report draws a single ``[B, G]`` count matrix (how many times resample ``b`` takes
window ``g``) from the seed, and every figure — overall, per domain, per position bucket, path
differences, build-vs-build ratios — is evaluated on it. Figures are then jointly consistent (a ratio's
resamples are the ratio of the two builds' resamples) and a resampled mean is one matmul,
``counts @ S / counts @ N``.

Why stratified by domain: the design fixes how many windows each domain contributes, so windows are
resampled with replacement *within* their domain. A domain's resamples then never come up empty, and
with a single stratum the draws are exactly ``rng.integers(0, G, (B, G))`` — the indices
``scipy.stats.bootstrap`` draws — which is what the equivalence test relies on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Clusters:
    """The cluster (window) list of a report: ids sorted, each with its stratum (domain)."""

    ids: tuple[str, ...]
    strata: tuple[str, ...]

    @classmethod
    def from_pairs(cls, pairs: dict[str, str]) -> "Clusters":
        """``pairs`` maps window id -> domain. Sorted by id so the order never depends on input order."""
        ids = tuple(sorted(pairs))
        return cls(ids=ids, strata=tuple(pairs[i] for i in ids))

    @property
    def size(self) -> int:
        return len(self.ids)

    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.ids)}

    def codes(self, window_ids: Sequence[str] | np.ndarray) -> np.ndarray:
        """Cluster index of each row (int64); raises KeyError for an unknown window id."""
        idx = self.index()
        uniq, inv = np.unique(np.asarray(window_ids, dtype=object).astype(str), return_inverse=True)
        lut = np.array([idx[u] for u in uniq], dtype=np.int64)
        return lut[inv.reshape(-1)]

    def stratum_members(self) -> list[tuple[str, np.ndarray]]:
        """``(stratum, cluster indices)`` in sorted stratum order (the order draws are made in)."""
        s = np.asarray(self.strata, dtype=object)
        return [(name, np.flatnonzero(s == name)) for name in sorted(set(self.strata))]


def cluster_sums(codes: np.ndarray, values: np.ndarray, n_clusters: int) -> np.ndarray:
    """Per-cluster sum of ``values`` (float64), in cluster order."""
    return np.bincount(codes, weights=np.asarray(values, dtype=np.float64), minlength=n_clusters)


def resample_counts(
    clusters: Clusters | int, resamples: int, seed: int, *, stratified: bool = True
) -> np.ndarray:
    """The ``[B, G]`` float64 count matrix: row ``b`` says how often resample ``b`` takes each window.

    Draws come from ``numpy.random.default_rng(seed)``: for each stratum in sorted order,
    ``rng.integers(0, G_s, (B, G_s))`` indices, tallied with one ``bincount``. With one stratum (or
    ``stratified=False``, or an int ``clusters``) this is the index draw of ``scipy.stats.bootstrap``
    given the same generator. Float64 so that resampled sums are BLAS matmuls.
    """
    rng = np.random.default_rng(seed)
    if isinstance(clusters, int):
        groups = [np.arange(clusters)]
        g_total = clusters
    else:
        g_total = clusters.size
        groups = [m for _, m in clusters.stratum_members()] if stratified else [np.arange(g_total)]
    counts = np.zeros((resamples, g_total), dtype=np.float64)
    rows = np.arange(resamples, dtype=np.int64)[:, None]
    for members in groups:
        g = len(members)
        if g == 0:
            continue
        draws = rng.integers(0, g, (resamples, g), dtype=np.int64)
        tally = np.bincount((rows * g + draws).ravel(), minlength=resamples * g).reshape(resamples, g)
        counts[:, members] = tally
    return counts
