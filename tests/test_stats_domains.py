"""Per-domain means on few windows (fideval/stats/domains.py): the domain-pooled t-interval against statsmodels'
one-way model with a domain effect, the domain's own variance against the linearised one, and the union the
report prints."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats

from fideval.stats.concentration import DOMAIN_MIN_WINDOWS
from fideval.stats.domains import MIN_WINDOWS, UNION, domain_mean, pooled_domain_intervals
from fideval.stats.studentized import linearized_variance


def _columns(sizes, rows=None, seed=0):
    """[G, H] per-domain columns (zero outside the domain) of log-normal windows; equal rows when ``rows``."""
    rng = np.random.default_rng(seed)
    h, g = len(sizes), sum(sizes)
    dom = np.repeat(np.arange(h), sizes)
    n = np.full(g, float(rows)) if rows else rng.integers(50, 300, g).astype(float)
    s = n * np.exp(np.linspace(-1, 1, h))[dom] * rng.lognormal(-0.5, 1.0, g)
    onehot = (dom[:, None] == np.arange(h)[None, :]).astype(float)
    return s[:, None] * onehot, n[:, None] * onehot, dom


def test_pooled_interval_is_the_one_way_model_of_statsmodels():
    """With equal rows a window, u_w = m_w / theta_d - 1: the pooled variance is the residual mean square of
    statsmodels' OLS of m_w / theta_d on domain dummies, and its coefficient intervals (1 -+ t se) give ours on the
    log scale: theta_d exp(-+ t se)."""
    sizes = [5, 9, 12, 20]
    s, n, dom = _columns(sizes, rows=100, seed=3)
    theta = s.sum(0) / n.sum(0)
    r = (s.sum(1) / n.sum(1)) / theta[dom]
    fit = sm.OLS(r, (dom[:, None] == np.arange(len(sizes))[None, :]).astype(float)).fit()
    ols = fit.conf_int(alpha=0.05)
    got = pooled_domain_intervals(s, n, 0.95, larger_of_own=False)
    for d, f in enumerate(got):
        half = ols[d, 1] - 1.0  # t_(G-H) sqrt(mse / G_d)
        assert f["df"] == fit.df_resid == sum(sizes) - len(sizes)
        assert f["ci"][0] == pytest.approx(theta[d] * np.exp(-half), rel=1e-10)
        assert f["ci"][1] == pytest.approx(theta[d] * np.exp(half), rel=1e-10)
        assert f["pooled_se"] == pytest.approx(theta[d] * np.sqrt(fit.mse_resid / sizes[d]), rel=1e-10)


def test_own_variance_is_the_linearised_one_and_the_larger_is_taken():
    sizes = [8, 10, 14]
    s, n, dom = _columns(sizes, seed=5)
    own_lin = np.sqrt(linearized_variance(s, n, dom))  # tested against statsmodels' cluster-robust variance
    pooled = pooled_domain_intervals(s, n, 0.9, larger_of_own=False)
    both = pooled_domain_intervals(s, n, 0.9)
    q = stats.t.ppf(0.95, sum(sizes) - len(sizes))
    for d in range(len(sizes)):
        theta = s[:, d].sum() / n[:, d].sum()
        assert both[d]["own_se"] == pytest.approx(own_lin[d], rel=1e-10)
        se = max(both[d]["own_se"], pooled[d]["pooled_se"])
        assert both[d]["se"] == pytest.approx(se, rel=1e-12)
        assert both[d]["ci"][1] == pytest.approx(theta * np.exp(q * se / theta), rel=1e-10)
    # a domain far more spread than the rest: its own se exceeds the pooled one and is used
    s2 = s.copy()
    s2[dom == 2, 2] *= np.exp(3.0 * np.random.default_rng(1).standard_normal((dom == 2).sum()))
    f = pooled_domain_intervals(s2, n, 0.9)[2]
    assert f["own_se"] > f["pooled_se"] and f["se"] == f["own_se"]


def test_degenerate_and_bad_input():
    s, n, _ = _columns([1, 6], seed=2)
    out = pooled_domain_intervals(np.c_[s, np.zeros(len(s))], np.c_[n, np.zeros(len(n))])
    assert out[0]["flags"] == ["degenerate"] and out[0]["ci"][0] == out[0]["ci"][1]  # one window
    assert out[1]["df"] == 5 and out[1]["pooled_domains"] == 1 and out[2] is None  # no rows
    with pytest.raises(ValueError, match="one shape"):
        pooled_domain_intervals(s, n[:, :1])
    with pytest.raises(ValueError, match="confidence"):
        pooled_domain_intervals(s, n, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        pooled_domain_intervals(-s, n)


def _fig(g, ci=(0.05, 0.2), method="cluster-bootstrap-t-log-symmetric-expanded"):
    return {"estimate": 0.1, "ci": list(ci), "method": method, "clusters": g, "flags": []}


def test_the_printed_per_domain_interval():
    pooled = {"ci": [0.07, 0.25], "se": 0.01, "own_se": 0.008, "pooled_se": 0.01, "df": 40, "pooled_domains": 4,
              "clusters": 12, "flags": []}
    f = domain_mean(_fig(12), pooled)
    assert f["ci"] == [0.05, 0.25] and f["method"] == UNION and f["flags"] == ["few_windows"]
    assert f["bootstrap_t"]["ci"] == [0.05, 0.2] and f["pooled_t"]["ci"] == [0.07, 0.25]
    # each part says how it was made: the bootstrap-t with the figure's resamples, the pooled one a closed form
    assert f["pooled_t"]["resamples"] is None and f["pooled_t"]["strata"] == 4 and f["pooled_t"]["clusters"] == 12
    assert domain_mean(_fig(12) | {"resamples": 400, "seed": 3}, pooled)["bootstrap_t"]["resamples"] == 400
    assert domain_mean(_fig(12, (0.08, None)), pooled)["ci"] == [0.07, None]  # an unbounded end stays unbounded
    few = domain_mean(_fig(MIN_WINDOWS - 1), pooled)
    assert few["ci"] == [None, None] and few["flags"] == ["few_windows", "too_few_windows"]
    assert few["bootstrap_t"]["ci"] == [0.05, 0.2]
    many = domain_mean(_fig(DOMAIN_MIN_WINDOWS), pooled)  # from 64 windows: the union too, not flagged
    assert many["ci"] == [0.05, 0.25] and many["method"] == UNION and many["flags"] == []
    assert domain_mean(_fig(3, method="degenerate"), pooled) == _fig(3, method="degenerate")
    kept = domain_mean(_fig(12), None)  # nothing to pool: the domain's own interval, flagged
    assert kept["ci"] == [0.05, 0.2] and kept["method"] != UNION and kept["flags"] == ["few_windows"]
