"""Cluster bootstrap-t (studentized) intervals for token-weighted means, on a transformed scale.

The report's default interval for every mean (KLD, reverse KLD, delta NLL, top-k agreement), chosen from
the coverage table of ``bench/coverage.py`` (docs/formats-report.md, "Measured coverage"): on heavy-tailed,
clustered data the cluster BCa of ``bootstrap.py`` covers 89-93 % at its stated 95 % with 64-128 windows;
the symmetric bootstrap-t below, at a level expanded for few windows, covers >= 93 % on every mean and
top-1 shape of that bench with >= 64 windows. Not on concentrated windows (a few windows carrying much of a
mean KLD: 0.87-0.94, as low as 0.48 for a rare burst; bench/coverage_thin.py), where no variant tried reaches
0.93 and the figure is flagged instead (``fideval/stats/concentration.py``).

The figure is the ratio estimator theta = sum_w S_w / sum_w N_w over windows w (clusters) in strata h
(domains). Its linearised (Taylor, ratio-estimator) variance with windows as primary sampling units,
stratified by domain, is

    V(theta) = sum_h G_h / (G_h - 1) * sum_{w in h} (e_w - ebar_h)^2 / N^2,     e_w = S_w - theta N_w,

G_h the windows of stratum h, ebar_h their mean residual, N = sum N_w. With one stratum this is the
cluster-robust ("CR1") variance of a regression of the rows on a constant, which is
``statsmodels``' ``cov_type='cluster'`` (the test's oracle). A window without rows of the figure keeps
e_w = 0 and still counts in G_h (domain estimation: the subpopulation's size is random too).

The bootstrap-t resamples windows within their stratum (the report's shared count matrix) and studentizes
each resample by its own linearised standard error, on a scale g chosen per figure: ``log`` for a
non-negative mean (KLD), ``logit`` for a proportion (agreement), ``identity`` for a signed one (delta NLL,
a difference of builds):

    t*_b = (g(theta*_b) - g(theta)) / (g'(theta*_b) se*_b),
    equal-tailed:  g^-1( g(theta) - t*_(1-alpha) g'(theta) se ,  g(theta) - t*_(alpha) g'(theta) se ),
    symmetric:     g^-1( g(theta) -+ q g'(theta) se ),  q the level-quantile of |t*|,

and ``expand`` replaces the stated level by the one whose normal quantile is sqrt(G / (G - H)) times
Student's t_(G-H) quantile of it (Hesterberg 2015's small-sample expansion; G windows, H domains), which
offsets the bootstrap's narrowness with few windows. The report's default is symmetric and expanded
(``intervals.VARIANT``). The resampled t quantiles are taken with numpy's default (linear) method.

The transformed scale keeps the interval inside the figure's range and makes the studentized statistic
nearly pivotal; studentizing is what corrects the skewness that the percentile-based BCa under-corrects
with few heavy-tailed windows (Hall 1992, ch. 3; Davison & Hinkley 1997, 5.2). Resamples whose t is not
finite (a resample of identical windows, se* = 0; a resample at the scale's boundary) are dropped and
flagged.

Guards, as flags: ``degenerate`` (fewer than two windows with rows, se = 0, or the estimate on the scale's
boundary: a zero mean KLD, an agreement of exactly 0 or 1 — the interval collapses to the estimate);
``nonfinite_resamples``; ``endpoint_few_resamples`` (fewer than 10 resamples beyond an endpoint's t*
quantile); ``unbounded`` (an endpoint overflowed the scale's inverse: null); ``few_clusters`` (< 30
windows); ``singleton_stratum`` (a stratum of one window adds no variance: it is in every resample).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.stats.bootstrap import MIN_CLUSTERS, MIN_TAIL_RESAMPLES

SCALES = ("identity", "log", "logit")


def method_name(scale: str, symmetric: bool = False, expand: bool = False) -> str:
    """``cluster-bootstrap-t[-log|-logit][-symmetric][-expanded]``."""
    name = "cluster-bootstrap-t" if scale == "identity" else f"cluster-bootstrap-t-{scale}"
    return name + ("-symmetric" if symmetric else "") + ("-expanded" if expand else "")


def _g(scale: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        if scale == "log":
            return np.log(x)
        if scale == "logit":
            return np.log(x) - np.log1p(-x)
        return np.asarray(x, dtype=np.float64)


def _dg(scale: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        if scale == "log":
            return 1.0 / x
        if scale == "logit":
            return 1.0 / (x * (1.0 - x))
        return np.ones_like(np.asarray(x, dtype=np.float64))


def _ginv(scale: str, y: float) -> float:
    with np.errstate(over="ignore"):
        if scale == "log":
            return float(np.exp(y))
        if scale == "logit":
            return float(1.0 / (1.0 + np.exp(-y)))
    return float(y)


def _as2d(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a[:, None] if a.ndim == 1 else a


def _strata(strata: np.ndarray | None, g: int) -> list[np.ndarray]:
    if strata is None:
        return [np.arange(g)]
    s = np.asarray(strata)
    return [np.flatnonzero(s == v) for v in np.unique(s)]


def linearized_variance(
    s: np.ndarray, n: np.ndarray, strata: np.ndarray | None = None
) -> np.ndarray:
    """``[F]`` stratified cluster (ratio-estimator) variance of sum(s)/sum(n), per column (module docstring)."""
    s, n = _as2d(s), _as2d(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = s.sum(axis=0) / n.sum(axis=0)
    e = s - theta[None, :] * n
    v = np.zeros(s.shape[1])
    for m in _strata(strata, s.shape[0]):
        gh = m.size
        if gh < 2:
            continue
        eh = e[m]
        v += gh / (gh - 1.0) * np.sum((eh - eh.mean(axis=0)) ** 2, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return v / n.sum(axis=0) ** 2


def resampled_se(
    s: np.ndarray, n: np.ndarray, counts: np.ndarray, strata: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(theta* [B, F], se* [B, F])``: each resample's estimate and its own linearised standard error.

    A resample takes window w c_bw times; its stratum h holds sum_{w in h} c_bw = G_h draws, each a
    cluster of its own. Residuals are centred at the full-sample estimate first (x_w = S_w - theta N_w,
    so e*_w = x_w - d_b N_w with d_b = theta*_b - theta small), which keeps the sums of squares, taken as
    five matmuls per stratum, clear of cancellation.
    """
    s, n = _as2d(s), _as2d(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = s.sum(axis=0) / n.sum(axis=0)
        star = (counts @ s) / (counts @ n)
    x = s - theta[None, :] * n
    d = star - theta[None, :]
    f = s.shape[1]
    groups = [m for m in _strata(strata, s.shape[0]) if m.size >= 2]
    # one matmul: for each stratum the five per-window columns x, n, x^2, x n, n^2, zero outside it
    z = np.zeros((s.shape[0], len(groups), 5, f))
    for k, m in enumerate(groups):
        xm, nm = x[m], n[m]
        z[m, k] = np.stack([xm, nm, xm * xm, xm * nm, nm * nm], axis=1)
    sums = (counts @ z.reshape(s.shape[0], -1)).reshape(counts.shape[0], len(groups), 5, f)
    ss = np.zeros_like(star)
    for k, m in enumerate(groups):
        gh = m.size
        cx, cn, cxx, cxn, cnn = (sums[:, k, i] for i in range(5))
        e1 = cx - d * cn  # sum of c e
        e2 = cxx - 2.0 * d * cxn + d * d * cnn  # sum of c e^2
        ss += gh / (gh - 1.0) * np.maximum(e2 - e1 * e1 / gh, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(ss) / (counts @ n)
    return star, se


def expanded_confidence(confidence: float, g: int, h: int = 1) -> float:
    """The nominal level whose normal quantile is sqrt(g / (g - h)) times Student's t_(g-h) quantile of
    ``confidence`` (Hesterberg 2015's small-sample expansion, with g windows in h strata)."""
    from scipy import stats
    from scipy.special import ndtr

    if g - h < 1:
        return confidence
    a = (1.0 - confidence) / 2.0
    return float(1.0 - 2.0 * ndtr(np.sqrt(g / (g - h)) * stats.t.ppf(a, g - h)))


def t_interval(
    theta: float, se: float, t_star: np.ndarray, scale: str, confidence: float, symmetric: bool = False
) -> tuple[float, float, int]:
    """Endpoints from the resampled studentized values; returns (lo, hi, finite resamples used).

    ``symmetric``: g(theta) -+ q se_g with q the ``confidence`` quantile of |t*| (the symmetric bootstrap-t)."""
    ts = np.asarray(t_star, dtype=np.float64)
    ts = ts[np.isfinite(ts)]
    alpha = (1.0 - confidence) / 2.0
    if symmetric:
        q = float(np.quantile(np.abs(ts), confidence))
        q_lo, q_hi = -q, q
    else:
        q_lo, q_hi = np.quantile(ts, [alpha, 1.0 - alpha])
    gt, sg = float(_g(scale, np.float64(theta))), float(_dg(scale, np.float64(theta))) * se
    return _ginv(scale, gt - q_hi * sg), _ginv(scale, gt - q_lo * sg), int(ts.size)


def bounded(lo: float, hi: float, level: float, used: int, symmetric: bool, flags: list[str]) -> list[float | None]:
    """The endpoints as written: a non-finite one (the scale's inverse overflowed: t* so far out that the
    interval has no finite end) is null and flagged ``unbounded``; ``endpoint_few_resamples`` when fewer
    than 10 resamples lie beyond an endpoint's t* quantile."""
    tail = (1.0 - level) * used if symmetric else (1.0 - level) / 2.0 * used
    if tail < MIN_TAIL_RESAMPLES:
        flags.append("endpoint_few_resamples")
    out = [float(x) if np.isfinite(x) else None for x in (lo, hi)]
    if None in out:
        flags.append("unbounded")
    return out


def _degenerate(theta: float, se: float | None, flags: list[str]) -> dict[str, Any]:
    return {"estimate": theta, "ci": [theta, theta], "method": "degenerate", "se": se,
            "flags": flags + ["degenerate"]}


def cluster_t_means(
    s: np.ndarray,
    n: np.ndarray,
    counts: np.ndarray,
    strata: np.ndarray | None = None,
    scales: str | list[str] = "log",
    confidence: float = 0.95,
    *,
    symmetric: bool = False,
    expand: bool = False,
) -> list[dict[str, Any] | None]:
    """The cluster bootstrap-t interval of each column of ``s``/``n`` on its scale (one per column, or one for all).

    Returns per column ``{estimate, ci, method, se, flags, resamples, clusters, strata, rows}`` (None for a
    column without rows). ``strata``: a stratum label per window (None: one stratum); ``counts`` must have
    been drawn within those strata.
    """
    s, n = _as2d(s), _as2d(n)
    f = s.shape[1]
    scales = [scales] * f if isinstance(scales, str) else list(scales)
    star, se_star = resampled_se(s, n, counts, strata)
    se = np.sqrt(linearized_variance(s, n, strata))
    groups = _strata(strata, s.shape[0])
    out: list[dict[str, Any] | None] = []
    for j in range(f):
        present = n[:, j] > 0
        if not present.any():
            out.append(None)
            continue
        sc = scales[j]
        theta = float(s[:, j].sum() / n[:, j].sum())
        g_present = int(present.sum())
        n_strata = sum(1 for m in groups if present[m].any())
        flags: list[str] = []
        if any(m.size == 1 and present[m].any() for m in groups):
            flags.append("singleton_stratum")
        meta = {"resamples": int(counts.shape[0]), "clusters": g_present, "strata": n_strata,
                "rows": int(round(n[:, j].sum()))}
        if g_present < MIN_CLUSTERS:
            flags.append("few_clusters")
        boundary = (sc == "log" and theta <= 0.0) or (sc == "logit" and not 0.0 < theta < 1.0)
        if g_present < 2 or not se[j] > 0.0 or boundary:
            out.append(_degenerate(theta, float(se[j]) if np.isfinite(se[j]) else None, flags) | meta)
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            t = (_g(sc, star[:, j]) - _g(sc, np.float64(theta))) / (_dg(sc, star[:, j]) * se_star[:, j])
        if not np.isfinite(t).all():
            flags.append("nonfinite_resamples")
        if np.isfinite(t).sum() < 2:
            out.append(_degenerate(theta, float(se[j]), flags) | meta)
            continue
        level = expanded_confidence(confidence, g_present, n_strata) if expand else confidence
        lo, hi, used = t_interval(theta, float(se[j]), t, sc, level, symmetric)
        ci = bounded(lo, hi, level, used, symmetric, flags)
        out.append({"estimate": theta, "ci": ci, "method": method_name(sc, symmetric, expand), "scale": sc,
                    "se": float(se[j]), "flags": flags} | meta)
    return out
