"""Cluster (window-block) BCa bootstrap for token-weighted means, their ratios and differences.

The figure is a ratio estimator: mean KLD = sum over windows of S_w / sum of N_w, where S_w is the sum of
a per-row figure over window w's rows and N_w its row count. Resampling windows (not tokens) keeps the
within-window correlation inside each resample, so the interval reflects how much the figure would move
with a different draw of windows — the honest unit of replication (``fideval/stats/clusters.py``).

Why BCa: per-window KLD is right-skewed (a few hard windows dominate), so the percentile interval is
biased low and the normal interval symmetric where it should not be. BCa corrects for the median bias
(z0: the share of resamples below the estimate, ties counted half) and for the skewness of the
estimator (acceleration a, from the leave-one-window-out jackknife, which for a ratio of sums is closed
form: theta_(-w) = (S - S_w) / (N - N_w), O(G)). The endpoints are the alpha1, alpha2 quantiles of the
resampled figures (linear interpolation, numpy's default = scipy's), with

    alpha1 = Phi(z0 + (z0 + z_a) / (1 - a (z0 + z_a))),   alpha2 = same with z_(1-a).

This is Efron & Tibshirani (1993) 14.3 and 15.4 (eq. 15.36), the formula of ``scipy.stats.bootstrap``;
``tests/test_stats_bootstrap.py`` checks equality with scipy given the same resample indices.

Guards (each adds a flag to the output rather than failing the report):
  ``degenerate``        fewer than two windows, or every resample gives the same value: the interval
                        collapses to the estimate;
  ``z0_undefined``      the estimate lies outside all resamples (z0 = +-inf): percentile interval instead;
  ``acceleration_undefined``  all jackknife values equal: a = 0 (bias-corrected percentile);
  ``endpoint_few_resamples``  an endpoint rests on fewer than 10 resamples beyond it (alpha1*B or
                        (1-alpha2)*B < 10): raise B;
  ``few_clusters``      fewer than 30 windows: the bootstrap's own coverage is then below nominal;
  ``nonfinite_resamples``  some resamples gave no finite value (no rows of the figure — possible only
                        when its windows are a strict subset of a stratum — or a zero denominator of a
                        ratio); those resamples are dropped;
  ``undefined``         the estimate itself is not finite (a ratio over a build with zero mean KLD):
                        estimate and interval are null.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import ndtr, ndtri

MIN_CLUSTERS = 30
MIN_TAIL_RESAMPLES = 10


def bca_interval(
    theta_hat: float, theta_star: np.ndarray, theta_jack: np.ndarray, confidence: float
) -> dict[str, Any]:
    """BCa interval from a bootstrap distribution and the jackknife values of the clusters present.

    Returns ``{estimate, ci: [lo, hi], method, z0, acceleration, se, flags}`` with plain floats.
    """
    theta_hat = float(theta_hat)
    ts = np.asarray(theta_star, dtype=np.float64)
    flags: list[str] = []
    finite = np.isfinite(ts)
    if not finite.all():
        flags.append("nonfinite_resamples")
        ts = ts[finite]
    jack = np.asarray(theta_jack, dtype=np.float64)
    if not np.isfinite(theta_hat):
        return {
            "estimate": None,
            "ci": None,
            "method": "undefined",
            "z0": None,
            "acceleration": None,
            "se": None,
            "flags": ["undefined"],
        }
    jack = jack[np.isfinite(jack)]
    out: dict[str, Any] = {
        "estimate": theta_hat,
        "z0": None,
        "acceleration": None,
        "se": float(np.std(ts, ddof=1)) if ts.size > 1 else 0.0,
    }
    if jack.size < 2 or ts.size < 2 or float(ts.max()) == float(ts.min()):
        out.update(ci=[theta_hat, theta_hat], method="degenerate", flags=flags + ["degenerate"])
        return out
    b = ts.size
    alpha = (1.0 - confidence) / 2.0
    p = (np.count_nonzero(ts < theta_hat) + np.count_nonzero(ts <= theta_hat)) / (2.0 * b)
    method = "cluster-bca"
    if p <= 0.0 or p >= 1.0:
        flags.append("z0_undefined")
        method = "cluster-percentile"
        a1, a2 = alpha, 1.0 - alpha
    else:
        z0 = float(ndtri(p))
        u = jack.mean() - jack
        den = float(np.sum(u * u))
        acc = float(np.sum(u**3)) / (6.0 * den**1.5) if den > 0.0 else float("nan")
        if not np.isfinite(acc):
            flags.append("acceleration_undefined")
            acc = 0.0
        za = float(ndtri(alpha))
        n1, n2 = z0 + za, z0 - za
        a1 = float(ndtr(z0 + n1 / (1.0 - acc * n1)))
        a2 = float(ndtr(z0 + n2 / (1.0 - acc * n2)))
        out.update(z0=z0, acceleration=acc)
    lo, hi = np.quantile(ts, [a1, a2])
    if min(a1 * b, (1.0 - a2) * b) < MIN_TAIL_RESAMPLES:
        flags.append("endpoint_few_resamples")
    if jack.size < MIN_CLUSTERS:
        flags.append("few_clusters")
    out.update(ci=[float(lo), float(hi)], method=method, flags=flags)
    return out


def _as2d(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a[:, None] if a.ndim == 1 else a


def ratio_means(
    s: np.ndarray, n: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Estimates, resampled values and jackknife values of token-weighted means, many at once.

    ``s``, ``n``: ``[G]`` or ``[G, F]`` per-window sums and counts of F figures (zero where a window has
    no rows of a figure). Returns ``(theta [F], theta_star [B, F], jack [G, F])``; jack[w] is the figure
    without window w (meaningful only where the window has rows).
    """
    s, n = _as2d(s), _as2d(n)
    st, nt = s.sum(axis=0), n.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = st / nt
        star = (counts @ s) / (counts @ n)
        jack = (st - s) / (nt - n)
    return theta, star, jack


def cluster_bca_means(
    s: np.ndarray, n: np.ndarray, counts: np.ndarray, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """Cluster BCa for each column of ``s``/``n`` (see :func:`ratio_means`); adds clusters and rows."""
    s, n = _as2d(s), _as2d(n)
    theta, star, jack = ratio_means(s, n, counts)
    out = []
    for f in range(s.shape[1]):
        present = n[:, f] > 0
        if not present.any():
            out.append(None)
            continue
        r = bca_interval(theta[f], star[:, f], jack[present, f], confidence)
        r.update(resamples=int(counts.shape[0]), clusters=int(present.sum()), rows=int(round(n[:, f].sum())))
        out.append(r)
    return out


def cluster_bca_mean(
    s: np.ndarray, n: np.ndarray, counts: np.ndarray, confidence: float = 0.95
) -> dict[str, Any]:
    """Cluster BCa interval of one token-weighted mean sum(S)/sum(N)."""
    return cluster_bca_means(s, n, counts, confidence)[0]


def _pair(s1, n1, s2, n2, counts, op, confidence: float) -> dict[str, Any]:
    t1, st1, j1 = ratio_means(s1, n1, counts)
    t2, st2, j2 = ratio_means(s2, n2, counts)
    present = (np.asarray(n1) > 0) | (np.asarray(n2) > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta, star, jack = op(t1[0], t2[0]), op(st1[:, 0], st2[:, 0]), op(j1[:, 0], j2[:, 0])
    r = bca_interval(theta, star, jack[present], confidence)
    r.update(resamples=int(counts.shape[0]), clusters=int(present.sum()))
    return r


def cluster_bca_ratio(s1, n1, s2, n2, counts: np.ndarray, confidence: float = 0.95) -> dict[str, Any]:
    """BCa interval of mean1 / mean2 with windows shared by id (same resamples, joint jackknife).

    Resampling both builds with the same windows cancels the window-to-window variation they share,
    which is why a ratio of two close builds has a far narrower interval than either mean.
    """
    return _pair(s1, n1, s2, n2, counts, np.divide, confidence)


def cluster_bca_difference(s1, n1, s2, n2, counts: np.ndarray, confidence: float = 0.95) -> dict[str, Any]:
    """BCa interval of mean1 - mean2 (e.g. serving minus weights-only), windows shared by id."""
    return _pair(s1, n1, s2, n2, counts, np.subtract, confidence)
