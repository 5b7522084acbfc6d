"""Coverage simulation: does the 95 % cluster BCa interval cover the true mean 95 % of the time?

Data with between-window variation, like real KLD: window w has a mean mu_w = base * LogNormal(0, sigma_b)
and N_w rows drawn uniformly in [rows/2, rows]; each row is mu_w * Gamma(shape, 1/shape) (mean mu_w,
right-skewed). N_w is independent of mu_w, so the token-weighted mean estimates E[mu_w] =
base * exp(sigma_b^2 / 2) — the true mean every interval is scored against.

Scored beside the cluster BCa the report uses:
  * the interval that treats tokens as independent (mean +- z sd / sqrt(rows)) — why the window is the
    unit: with correlated tokens it covers far less than 95 %;
  * an *expanded* BCa (Hesterberg 2015): the same resamples with the nominal level widened so that
    z = sqrt(G / (G - 1)) t_(G-1), which offsets the bootstrap's narrowness with few windows. The report
    does not use it (it would no longer be scipy's BCa); it is here to size that small-sample gap.
Used by ``bench/coverage.py`` (full size) and ``tests/test_stats_coverage.py`` (small).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.special import ndtr, ndtri

from fideval.stats.bootstrap import bca_interval, ratio_means
from fideval.stats.clusters import resample_counts


@dataclass(frozen=True)
class CoverageResult:
    replications: int
    clusters: int
    resamples: int
    sigma_b: float
    bca: float
    bca_expanded: float
    iid_token: float
    mean_width_bca: float
    mean_width_iid: float


def expanded_confidence(confidence: float, g: int) -> float:
    """Nominal level whose normal quantile is sqrt(g/(g-1)) times the t_(g-1) quantile of ``confidence``."""
    a = (1.0 - confidence) / 2.0
    return float(1.0 - 2.0 * ndtr(math.sqrt(g / (g - 1.0)) * stats.t.ppf(a, g - 1)))


def simulate(
    replications: int = 400,
    clusters: int = 40,
    rows: int = 200,
    resamples: int = 2000,
    sigma_b: float = 0.6,
    shape: float = 0.5,
    base: float = 0.02,
    confidence: float = 0.95,
    seed: int = 0,
) -> CoverageResult:
    rng = np.random.default_rng(seed)
    truth = base * math.exp(sigma_b**2 / 2.0)
    z = float(ndtri(0.5 + confidence / 2.0))
    conf_x = expanded_confidence(confidence, clusters)
    hit_bca = hit_x = hit_iid = 0
    w_bca = w_iid = 0.0
    for rep in range(replications):
        sizes = rng.integers(rows // 2, rows + 1, clusters)
        mu = base * rng.lognormal(0.0, sigma_b, clusters)
        codes = np.repeat(np.arange(clusters), sizes)
        x = mu[codes] * rng.gamma(shape, 1.0 / shape, codes.size)
        s = np.bincount(codes, weights=x, minlength=clusters)
        n = sizes.astype(np.float64)
        theta, star, jack = ratio_means(s, n, resample_counts(clusters, resamples, seed * 1_000_003 + rep))
        lo, hi = bca_interval(theta[0], star[:, 0], jack[:, 0], confidence)["ci"]
        hit_bca += lo <= truth <= hi
        w_bca += hi - lo
        xlo, xhi = bca_interval(theta[0], star[:, 0], jack[:, 0], conf_x)["ci"]
        hit_x += xlo <= truth <= xhi
        half = z * x.std(ddof=1) / math.sqrt(x.size)
        hit_iid += abs(x.mean() - truth) <= half
        w_iid += 2 * half
    return CoverageResult(
        replications,
        clusters,
        resamples,
        sigma_b,
        hit_bca / replications,
        hit_x / replications,
        float(hit_iid) / replications,
        w_bca / replications,
        float(w_iid) / replications,
    )
