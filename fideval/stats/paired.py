"""Paired comparisons of two token-weighted means on the same windows: difference and ratio.

Both figures (two builds, or two paths of one build) are resampled with the same windows — one count
matrix — so the difficulty the windows share cancels, and the interval is far narrower than either mean's.
The default interval of a ratio theta1 / theta2 is the cluster bootstrap-t (``studentized.py``) of its log;
a difference's default is MOVER (Zou & Donner 2008) from each mean's own log-scale bootstrap-t interval and
their correlation on the shared resamples (``mover=True``): the bootstrap-t of the difference itself misses
95 % on heavy-tailed windows (0.92 in bench/coverage.py), where MOVER, which carries each mean's skewness,
holds it. The bootstrap-t's standard error is linearised with per-window influence values (stratified by
domain as in ``studentized.py``):

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
from fideval.stats.studentized import (
    _strata,
    bounded,
    cluster_t_means,
    expanded_confidence,
    method_name,
    t_interval,
)

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
    mover: bool = False,
) -> dict[str, Any]:
    """PAIRED block: ``{estimate, ci, method, scale, se, flags, null, excludes, ..., cluster_bca: {...}}``.

    ``mover`` (a difference only): the interval is MOVER's (module docstring) from the two means' own
    log-scale bootstrap-t intervals; the bootstrap-t of the difference where those are not both bounded."""
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
    method = method_name(scale, symmetric, expand)
    if kind == "difference" and mover:
        got = _mover(s1, n1, s2, n2, st1, st2, counts, strata, confidence, symmetric, expand)
        if got is None:
            flags.append("mover_unavailable")
        else:
            ci, method, out["rho"] = got[0], got[1], got[2]
            out["scale"] = "log"
    excludes = (ci[0] is not None and ci[0] > null) or (ci[1] is not None and ci[1] < null)
    return out | {"ci": ci, "method": method, "se": se_fig, "flags": flags,
                  "excludes": bool(excludes), "cluster_bca": bca_block}


def _mover(s1, n1, s2, n2, st1, st2, counts, strata, confidence, symmetric, expand):
    """MOVER (Zou & Donner 2008) for m1 - m2 from each mean's interval [l_k, u_k] and their correlation rho:

        L = d - sqrt((m1 - l1)^2 + (u2 - m2)^2 - 2 rho (m1 - l1)(u2 - m2)),
        U = d + sqrt((u1 - m1)^2 + (m2 - l2)^2 - 2 rho (u1 - m1)(m2 - l2)),

    each interval the log-scale cluster bootstrap-t of that mean on the shared resamples, rho the
    correlation of the two resampled means. Returns (ci, method, rho), or None when an interval is not
    bounded (a degenerate or unbounded mean)."""
    a, b = cluster_t_means(np.stack([s1, s2], 1), np.stack([n1, n2], 1), counts, strata, "log", confidence,
                           symmetric=symmetric, expand=expand)
    if a is None or b is None or a["method"] == "degenerate" or b["method"] == "degenerate":
        return None
    if None in a["ci"] or None in b["ci"]:
        return None
    ok = np.isfinite(st1) & np.isfinite(st2)
    if ok.sum() < 2 or np.std(st1[ok]) == 0 or np.std(st2[ok]) == 0:
        return None
    rho = float(np.corrcoef(st1[ok], st2[ok])[0, 1])
    (m1, (l1, u1)), (m2, (l2, u2)) = (a["estimate"], a["ci"]), (b["estimate"], b["ci"])
    d = m1 - m2
    lo = d - np.sqrt(max((m1 - l1) ** 2 + (u2 - m2) ** 2 - 2 * rho * (m1 - l1) * (u2 - m2), 0.0))
    hi = d + np.sqrt(max((u1 - m1) ** 2 + (m2 - l2) ** 2 - 2 * rho * (u1 - m1) * (m2 - l2), 0.0))
    return [float(lo), float(hi)], "mover-" + method_name("log", symmetric, expand), rho
