"""Paired comparisons of two token-weighted means on the same windows: difference and ratio.

Both figures (two builds, or two paths of one build) are resampled with the same windows — one count
matrix — so the difficulty the windows share cancels, and the interval is far narrower than either mean's.
The default interval is the cluster bootstrap-t (``studentized.py``) of the paired statistic: the
difference theta1 - theta2 on its own scale, the ratio theta1 / theta2 on the log scale. Its standard error
is linearised with per-window influence values (stratified by domain as in ``studentized.py``):

    difference:  u_w = (S1_w - theta1 N1_w) / N1 - (S2_w - theta2 N2_w) / N2
    log ratio:   u_w = (S1_w - theta1 N1_w) / S1 - (S2_w - theta2 N2_w) / S2        (S = sum S_w)
    V = sum_h G_h / (G_h - 1) sum_{w in h} (u_w - ubar_h)^2,

and in resample b the same with that resample's theta*, N*, S* (residuals centred at the full-sample
estimate, so the sums of squares are taken without cancellation). The cluster BCa of the same statistic
(``bootstrap.cluster_bca_ratio`` / ``cluster_bca_difference``, joint jackknife) is kept beside it. Each
result says whether its interval excludes the no-difference value (0 for a difference, 1 for a ratio).
``tests/test_stats_paired.py`` checks both against scipy's paired bootstrap drawing the same window indices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.stats.bootstrap import MIN_CLUSTERS, cluster_bca_difference, cluster_bca_ratio
from fideval.stats.studentized import _strata, bounded, expanded_confidence, method_name, t_interval

KINDS = {"difference": ("identity", 0.0), "ratio": ("log", 1.0)}


def _coefficients(kind: str, t1, t2, n1, n2, s1, s2, d1, d2) -> list:
    """Per-resample coefficients of the influence u = sum_i a_i v_i over v = (x1, n1, x2, n2), x = S - theta N."""
    if kind == "difference":
        return [1.0 / n1, d1 / n1, -1.0 / n2, -d2 / n2]
    return [1.0 / s1, d1 / s1, -1.0 / s2, -d2 / s2]


def _paired_variance(v: np.ndarray, a: list, counts: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """sum_h G_h/(G_h-1) [sum c u^2 - (sum c u)^2 / G_h] per resample, u = sum_i a_i v_i (v: [G, K])."""
    k = v.shape[1]
    pairs = [(i, j) for i in range(k) for j in range(i, k)]
    cols = np.concatenate([v, np.stack([v[:, i] * v[:, j] for i, j in pairs], axis=1)], axis=1)
    total = np.zeros(counts.shape[0])
    for m in groups:
        gh = m.size
        if gh < 2:
            continue
        sums = counts[:, m] @ cols[m]  # [B, K + K(K+1)/2]
        e1 = sum(a[i] * sums[:, i] for i in range(k))
        e2 = sum((1.0 if i == j else 2.0) * a[i] * a[j] * sums[:, k + p] for p, (i, j) in enumerate(pairs))
        total += gh / (gh - 1.0) * np.maximum(e2 - e1 * e1 / gh, 0.0)
    return total


def paired_interval(
    kind: str,
    s1: np.ndarray,
    n1: np.ndarray,
    s2: np.ndarray,
    n2: np.ndarray,
    counts: np.ndarray,
    strata: np.ndarray | None = None,
    *,
    confidence: float = 0.95,
    seed: int | None = None,
    symmetric: bool = False,
    expand: bool = False,
) -> dict[str, Any]:
    """PAIRED block: ``{estimate, ci, method, scale, se, flags, null, excludes, ..., cluster_bca: {...}}``."""
    scale, null = KINDS[kind]
    s1, n1, s2, n2 = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (s1, n1, s2, n2))
    g = s1.size
    groups = [m for m in _strata(strata, g)]
    present = (n1 > 0) | (n2 > 0)
    n_strata = sum(1 for m in groups if present[m].any())
    meta = {"unit": "window", "confidence": confidence, "resamples": int(counts.shape[0]), "seed": seed,
            "strata": n_strata, "clusters": int(present.sum()), "null": null}
    bca_fn = cluster_bca_difference if kind == "difference" else cluster_bca_ratio
    bca = bca_fn(s1, n1, s2, n2, counts, confidence)
    bca_block = {k: bca[k] for k in ("estimate", "ci", "method", "z0", "acceleration", "se", "flags")} | meta
    bca_block["excludes"] = None if bca["ci"] is None else not (bca["ci"][0] <= null <= bca["ci"][1])
    flags: list[str] = []
    with np.errstate(invalid="ignore", divide="ignore"):
        t1, t2 = s1.sum() / n1.sum(), s2.sum() / n2.sum()
        est = t1 - t2 if kind == "difference" else t1 / t2
    out = {"estimate": float(est) if np.isfinite(est) else None, "scale": scale} | meta
    if not np.isfinite(est) or (kind == "ratio" and not (t1 > 0 and t2 > 0)):
        return out | {"ci": None, "method": "undefined", "se": None, "flags": ["undefined"], "excludes": None,
                      "cluster_bca": bca_block}
    v = np.stack([s1 - t1 * n1, n1, s2 - t2 * n2, n2], axis=1)
    big_s1, big_s2, big_n1, big_n2 = s1.sum(), s2.sum(), n1.sum(), n2.sum()
    a0 = _coefficients(kind, t1, t2, big_n1, big_n2, big_s1, big_s2, 0.0, 0.0)
    se = float(np.sqrt(_paired_variance(v, a0, np.ones((1, g)), groups)[0]))  # on the scale (log: relative)
    se_fig = se * float(est) if scale == "log" else se  # the figure's own (delta method)
    c_s1, c_n1, c_s2, c_n2 = counts @ s1, counts @ n1, counts @ s2, counts @ n2
    with np.errstate(invalid="ignore", divide="ignore"):
        st1, st2 = c_s1 / c_n1, c_s2 / c_n2
        a = _coefficients(kind, st1, st2, c_n1, c_n2, c_s1, c_s2, t1 - st1, t2 - st2)
        se_star = np.sqrt(_paired_variance(v, a, counts, groups))
        stat = st1 - st2 if kind == "difference" else np.log(st1) - np.log(st2)
        g_hat = est if kind == "difference" else np.log(est)
        t = (stat - g_hat) / se_star
    if int(present.sum()) < MIN_CLUSTERS:
        flags.append("few_clusters")
    if int(present.sum()) < 2 or not se > 0.0 or np.isfinite(t).sum() < 2:
        return out | {"ci": [float(est), float(est)], "method": "degenerate", "se": se_fig,
                      "flags": flags + ["degenerate"], "excludes": False, "cluster_bca": bca_block}
    if not np.isfinite(t).all():
        flags.append("nonfinite_resamples")
    level = expanded_confidence(confidence, int(present.sum()), n_strata) if expand else confidence
    lo, hi, used = t_interval(float(est), se_fig, t, scale, level, symmetric)
    ci = bounded(lo, hi, level, used, symmetric, flags)
    excludes = (ci[0] is not None and ci[0] > null) or (ci[1] is not None and ci[1] < null)
    return out | {"ci": ci, "method": method_name(scale, symmetric, expand), "se": se_fig, "flags": flags,
                  "excludes": bool(excludes), "cluster_bca": bca_block}
