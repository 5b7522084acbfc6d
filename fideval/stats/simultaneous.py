"""Simultaneous (family-wise) intervals for many builds on the same windows: max-t over the joint cluster bootstrap.

K builds scored on the same G windows give token-weighted means theta_k = sum_w S_kw / sum_w N_kw. Every build
is resampled with the SAME window draws (the report's one count matrix, ``clusters.resample_counts``), so each
resample b gives all K means at once and every pairwise statistic on it. For the family of the K(K-1)/2 pairwise
log ratios (or differences) the interval of pair (i, j) is

    g_ij -+ q se_ij,        q = the level-quantile over resamples of  M*_b = max_(i<j) |t*_b,ij|,
    t*_b,ij = (g*_b,ij - g_ij) / se*_b,ij,

g = log(theta_i / theta_j) (a ratio, back-transformed) or theta_i - theta_j (a difference), se the stratified
linearised standard error of ``paired.py`` (influence values of the pair, windows as primary sampling units) and
se*_b the same computed in resample b. Because every |t*_b,ij| <= M*_b, all the intervals hold together with the
stated probability (the max-t / "single-step" method of Westfall & Young 1993, 2.6; Romano & Wolf 2005), and
by the union bound on the same draws q is at most the largest member's Bonferroni quantile (each |t*| at level
1 - alpha / m, m pairs): never wider than Bonferroni with a common critical value, and narrower where the pairs'
t* are correlated (they share builds and windows). The level is the report's expanded
level (``studentized.expanded_confidence``: G windows, H domains) when ``expand``, as the report's paired
intervals are, so with two builds (one pair) the max is |t*| itself and each interval is the report's symmetric
bootstrap-t interval of that pair (``paired.paired_interval(..., symmetric=True, expand=True)``; for a
difference its bootstrap-t with ``mover=False``: MOVER has no joint form).

The same max-t over the K builds' own means (log scale, ``resampled_se``) gives simultaneous intervals for the
means themselves. A build with a zero mean, or a pair whose standard error is 0, is degenerate: its interval is
the estimate and it is left out of the max.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.stats.studentized import _strata, expanded_confidence, linearized_variance, resampled_se

KINDS = ("ratio", "difference")


def _products(v: np.ndarray, counts: np.ndarray, groups: list[np.ndarray]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per stratum with >= 2 windows: (G_h, counts @ v [B, C], counts @ (v_i v_j) [B, C, C]) over columns v [G, C]."""
    out = []
    c = v.shape[1]
    for m in groups:
        if m.size < 2:
            continue
        vm = v[m]
        cm = counts[:, m]
        p1 = cm @ vm
        p2 = (cm @ (vm[:, :, None] * vm[:, None, :]).reshape(m.size, c * c)).reshape(counts.shape[0], c, c)
        out.append((m.size, p1, p2))
    return out


def _variance(prods, idx: list[int], coef: list[np.ndarray]) -> np.ndarray:
    """sum_h G_h/(G_h-1) [sum c u^2 - (sum c u)^2 / G_h] with u = sum_i coef_i v_idx_i (coef per resample)."""
    total = 0.0
    for gh, p1, p2 in prods:
        e1 = sum(a * p1[:, i] for a, i in zip(coef, idx))
        e2 = sum(a * b * p2[:, i, j] for a, i in zip(coef, idx) for b, j in zip(coef, idx))
        total = total + gh / (gh - 1.0) * np.maximum(e2 - e1 * e1 / gh, 0.0)
    return np.asarray(total, dtype=np.float64)


def pair_statistics(
    kind: str, s: np.ndarray, n: np.ndarray, counts: np.ndarray, strata: np.ndarray | None = None
) -> dict[str, Any]:
    """The K builds' pairwise statistics on the shared resamples.

    ``s``, ``n``: ``[G, K]`` per-window sums and rows; returns ``pairs`` [(i, j)], ``estimate`` [P] (the
    ratio theta_i / theta_j, or the difference), ``g`` [P] (its value on the interval's scale: log ratio, or the
    difference), ``se`` [P] (on that scale), ``t`` [B, P] (studentized resampled values; non-finite where
    undefined) and ``g_star`` [B, P].
    """
    if kind not in KINDS:
        raise ValueError(kind)
    s, n = np.asarray(s, dtype=np.float64), np.asarray(n, dtype=np.float64)
    g_n, k = s.shape
    groups = _strata(strata, g_n)
    big_s, big_n = s.sum(axis=0), n.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = big_s / big_n
        cs, cn = counts @ s, counts @ n
        star = cs / cn
    # columns: x_k = S_k - theta_k N_k and N_k, interleaved
    v = np.empty((g_n, 2 * k))
    v[:, 0::2] = s - theta[None, :] * n
    v[:, 1::2] = n
    prods = _products(v, counts, groups)
    full = _products(v, np.ones((1, g_n)), groups)
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    est, g, se = np.empty(len(pairs)), np.empty(len(pairs)), np.empty(len(pairs))
    t = np.empty((counts.shape[0], len(pairs)))
    g_star = np.empty_like(t)
    for p, (i, j) in enumerate(pairs):
        idx = [2 * i, 2 * i + 1, 2 * j, 2 * j + 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            di, dj = theta[i] - star[:, i], theta[j] - star[:, j]
            if kind == "difference":
                a0 = [1.0 / big_n[i], 0.0, -1.0 / big_n[j], 0.0]
                a = [1.0 / cn[:, i], di / cn[:, i], -1.0 / cn[:, j], -dj / cn[:, j]]
                est[p] = g[p] = theta[i] - theta[j]
                g_star[:, p] = star[:, i] - star[:, j]
            else:
                a0 = [1.0 / big_s[i], 0.0, -1.0 / big_s[j], 0.0]
                a = [1.0 / cs[:, i], di / cs[:, i], -1.0 / cs[:, j], -dj / cs[:, j]]
                est[p] = theta[i] / theta[j]
                g[p] = np.log(theta[i]) - np.log(theta[j])
                g_star[:, p] = np.log(star[:, i]) - np.log(star[:, j])
            se[p] = float(np.sqrt(_variance(full, idx, [np.float64(x) for x in a0])[0]))
            t[:, p] = (g_star[:, p] - g[p]) / np.sqrt(_variance(prods, idx, a))
    return {"pairs": pairs, "estimate": est, "g": g, "se": se, "t": t, "g_star": g_star, "theta": theta,
            "theta_star": star}


def level(confidence: float, s_n: np.ndarray, strata: np.ndarray | None, expand: bool) -> float:
    """The level the max-t quantile is taken at: ``confidence``, or its expansion for G windows in H domains."""
    if not expand:
        return confidence
    n = np.asarray(s_n)
    present = (n > 0).any(axis=1) if n.ndim == 2 else n > 0
    groups = _strata(strata, present.size)
    h = sum(1 for m in groups if present[m].any())
    return expanded_confidence(confidence, int(present.sum()), h)


def max_t_quantile(t: np.ndarray, valid: np.ndarray, lev: float) -> tuple[float, int]:
    """The ``lev`` quantile of max over the valid columns of |t*| (resamples with a non-finite valid t dropped);
    returns (q, resamples used)."""
    a = np.abs(t[:, valid])
    ok = np.isfinite(a).all(axis=1)
    m = a[ok].max(axis=1)
    return float(np.quantile(m, lev)), int(ok.sum())


def simultaneous_pairs(
    kind: str,
    s: np.ndarray,
    n: np.ndarray,
    counts: np.ndarray,
    strata: np.ndarray | None = None,
    *,
    confidence: float = 0.95,
    expand: bool = True,
) -> dict[str, Any]:
    """Family-wise intervals of every pairwise ratio (or difference) of the K builds (module docstring).

    Returns ``{pairs, estimate, se, ci [P, 2], quantile, level, resamples_used, degenerate [P]}``; a degenerate
    pair's interval is its estimate."""
    st = pair_statistics(kind, s, n, counts, strata)
    valid = np.isfinite(st["g"]) & (st["se"] > 0)
    lev = level(confidence, n, strata, expand)
    q, used = max_t_quantile(st["t"], valid, lev) if valid.any() else (float("nan"), 0)
    ci = np.empty((len(st["pairs"]), 2))
    for p in range(len(st["pairs"])):
        if not valid[p]:
            ci[p] = st["estimate"][p]
            continue
        lo, hi = st["g"][p] - q * st["se"][p], st["g"][p] + q * st["se"][p]
        ci[p] = (np.exp(lo), np.exp(hi)) if kind == "ratio" else (lo, hi)
    return {"pairs": st["pairs"], "estimate": st["estimate"], "se": st["se"], "ci": ci, "quantile": q, "level": lev,
            "resamples_used": used, "degenerate": ~valid, "stats": st}


def simultaneous_means(
    s: np.ndarray,
    n: np.ndarray,
    counts: np.ndarray,
    strata: np.ndarray | None = None,
    *,
    confidence: float = 0.95,
    expand: bool = True,
) -> dict[str, Any]:
    """Family-wise intervals of the K builds' own means on the log scale: log theta_k -+ q se_k / theta_k, q the
    level-quantile of max_k |t*_k| (t*_k the report's bootstrap-t of each mean). ``{estimate, se, ci, quantile}``."""
    s, n = np.asarray(s, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = s.sum(axis=0) / n.sum(axis=0)
        se = np.sqrt(linearized_variance(s, n, strata))
        star, se_star = resampled_se(s, n, counts, strata)
        t = (np.log(star) - np.log(theta)[None, :]) / (se_star / star)
    valid = (theta > 0) & (se > 0)
    lev = level(confidence, n, strata, expand)
    q, used = max_t_quantile(t, valid, lev) if valid.any() else (float("nan"), 0)
    ci = np.stack([theta, theta], axis=1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        half = q * se / theta
        ci[valid] = np.stack([theta * np.exp(-half), theta * np.exp(half)], axis=1)[valid]
    return {"estimate": theta, "se": se, "ci": ci, "quantile": q, "level": lev, "resamples_used": used,
            "theta_star": star}


def dominated(size: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """[K] whether each build is dominated: another build is no larger and has no higher mean, one of them
    strictly (lower is better on both). ``mean`` may be [B, K] (one row per resample): then [B, K]."""
    size = np.asarray(size, dtype=np.float64)
    m = np.asarray(mean, dtype=np.float64)
    le_s = size[:, None] <= size[None, :]  # [j, k]: j no larger than k
    lt_s = size[:, None] < size[None, :]
    le_m = m[..., :, None] <= m[..., None, :]
    lt_m = m[..., :, None] < m[..., None, :]
    dom = le_s & le_m & (lt_s | lt_m)  # [..., j, k]: j dominates k
    return dom.any(axis=-2)


def homogeneous_groups(order: list[int], separated: set[tuple[int, int]]) -> list[list[int]]:
    """Maximal runs of builds, consecutive in ``order`` (by estimate), no two of which are ``separated`` (their
    simultaneous interval excludes no difference): the builds the data cannot tell apart (Tukey's homogeneous
    subsets). Runs may overlap; a build apart from all others is a group of its own."""
    def sep(a: int, b: int) -> bool:
        return (a, b) in separated or (b, a) in separated

    runs: list[list[int]] = []
    for start in range(len(order)):
        end = start
        while end + 1 < len(order) and not any(sep(order[x], order[end + 1]) for x in range(start, end + 1)):
            end += 1
        run = order[start:end + 1]
        if not any(set(run) <= set(r) for r in runs):
            runs.append(run)
    return runs
