"""KLD quantiles (median, p90, p99, p99.9) and their window-bootstrap percentile intervals.

Estimates are exact order statistics in float64 with numpy's ``method='linear'`` (Hyndman & Fan type 7:
h = (n - 1) q, x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]) over the sorted rows), the
method named in report.json.

Intervals resample windows with the report's shared count matrix (``clusters.py``) and take the type-7
quantile of the *pooled* resampled rows: a window drawn c times contributes each of its rows c times.
Materialising the pooled sample would cost B x rows; instead the rows are sorted once and, for resample
b, the number of pooled rows at or below sorted position j is sum_w c_bw C[j, w], where C[j, w] counts
window w's rows among the first j + 1 sorted rows. The order statistic k of resample b is the smallest j
whose pooled count exceeds k: a grid of P sorted positions (64..1024) brackets it with one matmul
(counts @ C[grid]^T), and inside the bracket (at most rows/P positions) a gather of counts[b, window of
row] and a cumulative sum finish it exactly: O(B G P + B rows / P * targets) in all. Percentile (not BCa) intervals:
the jackknife of a quantile is too unstable for a useful acceleration.

Where the rows above an estimate come from fewer than ``TAIL_WINDOWS`` effective windows
(``few_tail_windows``), the interval keeps its lower bound and its upper bound is null (unbounded): no window
resample can show a tail heavier than the sample's, so the percentile upper bound of such a quantile misses far
more often than its level says (bench/coverage.py: p99.9 two-sided covers 0.44 at 64 windows of a light-tailed,
high-spread shape, its misses below 0.1 %). A stated bound that does not hold is worse than none; with the rule
every quantile covers >= 0.935 on every measured shape with >= 64 windows (docs/formats-report.md).

From q = ``LOWER_ONLY_FROM`` (the p99 and p99.9) the upper bound is withheld whatever the tail windows
(``lower_bound_only``): among the runs that pass the tail-window gate the two-sided p99 covers only 0.50-0.89
where a minority pass it (64 windows of heavy-tailed windows, 128-256 of concentrated ones), no rule from the data
was found that separates its good runs (bench/coverage_thin.py, docs/formats-report.md "Thin evidence"), and its
lower bound holds (one-sided >= 0.96 at 97.5 %).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.stats.studentized import expanded_confidence

QUANTILE_METHOD = "linear (Hyndman-Fan type 7, numpy method='linear')"
_GRID = 0  # grid positions; 0 = chosen from rows, windows and targets
_CHUNK = 2048  # resamples per gather block (memory: _CHUNK x rows / P floats)
TAIL_WINDOWS = 25.0  # below this effective number of windows beyond the estimate: ``few_tail_windows``, no upper bound
LOWER_ONLY_FROM = 0.99  # quantiles from here: the lower bound alone, always (``lower_bound_only``; module docstring)


def quantiles(values: np.ndarray, qs: list[float]) -> list[float]:
    """Exact type-7 quantiles in float64."""
    return [float(v) for v in np.quantile(np.asarray(values, dtype=np.float64), qs, method="linear")]


def _cumulative_at(local: np.ndarray, g: int, points: np.ndarray) -> np.ndarray:
    """``[len(points), g]``: rows of each window among sorted positions 0..p, for each p in ``points`` (sorted)."""
    seg = np.searchsorted(points, np.arange(local.size), side="left")  # first point at or after each position
    keep = seg < points.size
    tab = np.zeros((points.size, g), dtype=np.int64)
    np.add.at(tab, (seg[keep], local[keep]), 1)
    return np.cumsum(tab, axis=0)


def order_statistics(local: np.ndarray, g: int, counts: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Sorted position of the k-th (0-based) pooled order statistic for each (resample, target).

    ``local``: window (0..g-1) of each sorted row; ``counts``: [B, g]; ``k``: [B, K]. One matmul gives
    every resample's pooled count at a grid of sorted positions; the answer lies between the last grid
    point whose count is <= k and the next, and within that gap the count is the grid count plus a
    running sum of counts[b, window of each row] — a gather and a cumsum over at most rows / grid rows.
    """
    r = local.size
    # grid size balancing the matmul (B g P, BLAS-fast) against the gathers (B r / P per target, ~30x slower)
    p = _GRID or int(np.clip(np.sqrt(30.0 * r * k.shape[1] / max(g, 1)), 64, 1024))
    grid = np.unique(np.concatenate([np.linspace(0, r - 1, min(p, r)).astype(np.int64), [r - 1]]))
    exact32 = float((counts @ np.bincount(local, minlength=g)).max()) < 2**24  # the largest pooled count
    dt = np.float32 if exact32 else np.float64  # float32 is exact for integer sums below 2**24
    cnt_grid = counts.astype(dt) @ _cumulative_at(local, g, grid).T.astype(dt)  # [B, P]
    gap = int(np.diff(grid).max()) if grid.size > 1 else 1
    out = np.empty(k.shape, dtype=np.int64)
    rows = np.arange(counts.shape[0])
    step = np.arange(gap + 1)
    for t in range(k.shape[1]):
        kt = k[:, t]
        first = np.minimum(
            (cnt_grid <= kt[:, None]).sum(axis=1), grid.size - 1
        )  # first grid point with cnt > k
        lo = np.where(first > 0, grid[np.maximum(first - 1, 0)] + 1, 0)
        base = np.where(first > 0, cnt_grid[rows, np.maximum(first - 1, 0)], 0.0).astype(np.float64)
        for c0 in range(0, rows.size, _CHUNK):
            sl = slice(c0, c0 + _CHUNK)
            idx = np.minimum(lo[sl, None] + step[None, :], r - 1)
            w = np.take_along_axis(counts[sl], local[idx], axis=1)
            cum = base[sl, None] + np.cumsum(w, axis=1)
            out[sl, t] = lo[sl] + np.argmax(cum > kt[sl, None], axis=1)
    return out


def bootstrap_quantiles(
    values: np.ndarray, codes: np.ndarray, counts: np.ndarray, qs: list[float]
) -> np.ndarray:
    """``[B, len(qs)]`` type-7 quantiles of the pooled rows of each window resample.

    ``codes`` is the cluster index of each row (columns of ``counts``).
    """
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    xs = values[order]
    present, local_sorted = np.unique(codes[order], return_inverse=True)
    c = np.ascontiguousarray(counts[:, present])
    sizes = np.bincount(local_sorted, minlength=present.size).astype(np.float64)
    m = c @ sizes  # pooled rows per resample
    qa = np.asarray(qs, dtype=np.float64)
    h = (m[:, None] - 1.0) * qa[None, :]
    k_lo = np.floor(h)
    frac = h - k_lo
    k_hi = np.minimum(k_lo + 1.0, m[:, None] - 1.0)
    pos = order_statistics(
        local_sorted.astype(np.int64), present.size, c, np.concatenate([k_lo, k_hi], axis=1)
    )
    x_lo, x_hi = xs[pos[:, : qa.size]], xs[pos[:, qa.size :]]
    return x_lo + frac * (x_hi - x_lo)


def tail_windows(values: np.ndarray, codes: np.ndarray, threshold: float) -> float:
    """Effective number of windows among the rows above ``threshold``: 1 / sum of squared window shares
    (inverse Simpson); 0.0 when no row is above it."""
    above = np.asarray(codes)[np.asarray(values) > threshold]
    if above.size == 0:
        return 0.0
    share = np.unique(above, return_counts=True)[1] / above.size
    return float(1.0 / np.sum(share * share))


def quantile_figures(
    values: np.ndarray, codes: np.ndarray, counts: np.ndarray, qs: list[float], confidence: float = 0.95,
    strata: int = 1, min_tail_windows: float = TAIL_WINDOWS, lower_only_from: float = LOWER_ONLY_FROM,
) -> list[dict[str, Any]]:
    """Each quantile's exact estimate and its window-bootstrap percentile interval at the expanded level
    (``strata``: domains among the windows); upper bound null below ``min_tail_windows`` and for q from
    ``lower_only_from`` (module docstring; 2 keeps every interval two-sided, as the coverage bench scores them)."""
    est = quantiles(values, qs)
    boot = bootstrap_quantiles(values, codes, counts, qs)
    n_clusters = int(np.unique(codes).size)
    level = expanded_confidence(confidence, n_clusters, strata)
    alpha = (1.0 - level) / 2.0
    out = []
    for i, q in enumerate(qs):
        lo, hi = np.quantile(boot[:, i], [alpha, 1.0 - alpha])
        flags = ["few_clusters"] if n_clusters < 30 else []
        tw = tail_windows(values, codes, est[i])
        few = tw < min_tail_windows
        if few:
            flags.append("few_tail_windows")
        if q >= lower_only_from:
            flags.append("lower_bound_only")
            few = True
        out.append(
            {
                "q": float(q),
                "estimate": est[i],
                "ci": [float(lo), None if few else float(hi)],
                "method": "cluster-percentile-expanded",
                "level": level,
                "quantile_method": QUANTILE_METHOD,
                "resamples": int(counts.shape[0]),
                "clusters": n_clusters,
                "rows": int(values.size),
                "tail_windows": tw,
                "flags": flags,
            }
        )
    return out
