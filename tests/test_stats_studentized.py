"""Cluster bootstrap-t: the linearised variance against statsmodels' cluster-robust variance, each resample's
standard error against a direct computation on the expanded resample, and the interval against scipy's
bootstrap drawing the same window indices with an independently computed studentized statistic."""

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats

from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.studentized import cluster_t_means, linearized_variance, resampled_se


def _rows(g=24, seed=0, strata=1):
    """Token rows of g windows: (values, window code per row, stratum per window)."""
    rng = np.random.default_rng(seed)
    n = rng.integers(5, 40, g)
    mu = rng.lognormal(-4.0, 0.8, g)
    codes = np.repeat(np.arange(g), n)
    x = mu[codes] * rng.lognormal(-1.0, 1.4, codes.size)
    return x, codes, np.arange(g) % strata


def _sums(x, codes, g):
    return np.bincount(codes, weights=x, minlength=g), np.bincount(codes, minlength=g).astype(float)


def _cluster_se_statsmodels(x, codes):
    fit = sm.OLS(x, np.ones((x.size, 1))).fit(cov_type="cluster", cov_kwds={"groups": codes})
    return float(fit.params[0]), float(fit.bse[0])


def _stratified_variance_loop(s, n, strata):
    """The textbook formula, window by window."""
    theta = s.sum() / n.sum()
    v = 0.0
    for h in np.unique(strata):
        e = [s[w] - theta * n[w] for w in range(len(s)) if strata[w] == h]
        if len(e) > 1:
            m = sum(e) / len(e)
            v += len(e) / (len(e) - 1) * sum((ei - m) ** 2 for ei in e)
    return v / n.sum() ** 2


def test_linearized_variance_is_statsmodels_cluster_robust_variance():
    for seed in range(3):
        x, codes, _ = _rows(seed=seed)
        s, n = _sums(x, codes, 24)
        est, se = _cluster_se_statsmodels(x, codes)
        assert s.sum() / n.sum() == pytest.approx(est, rel=1e-12)
        assert np.sqrt(linearized_variance(s, n)[0]) == pytest.approx(se, rel=1e-10)


def test_stratified_variance_matches_the_formula_and_a_window_without_rows_counts():
    x, codes, strata = _rows(g=30, seed=4, strata=3)
    s, n = _sums(x, codes, 30)
    assert linearized_variance(s, n, strata)[0] == pytest.approx(_stratified_variance_loop(s, n, strata), rel=1e-12)
    s[5] = n[5] = 0.0  # a window without rows of this figure keeps e_w = 0 (domain estimation)
    assert linearized_variance(s, n, strata)[0] == pytest.approx(_stratified_variance_loop(s, n, strata), rel=1e-12)


@pytest.mark.parametrize("strata", [1, 3])
def test_each_resample_se_is_the_se_of_the_expanded_resample(strata):
    g = 30
    x, codes, st = _rows(g=g, seed=2, strata=strata)
    s, n = _sums(x, codes, g)
    cl = Clusters.from_pairs({f"{w:03d}": f"d{st[w]}" for w in range(g)})
    counts = resample_counts(cl, 40, 9)
    star, se = resampled_se(s, n, counts, st)
    for b in range(40):
        idx = np.repeat(np.arange(g), counts[b].astype(int))  # the drawn windows, each a cluster of its own
        ref_theta = s[idx].sum() / n[idx].sum()
        ref_v = _stratified_variance_loop(s[idx], n[idx], st[idx])
        assert star[b, 0] == pytest.approx(ref_theta, rel=1e-12)
        assert se[b, 0] == pytest.approx(np.sqrt(ref_v), rel=1e-8)
        if strata == 1 and b < 5:  # and statsmodels on the resample's token rows
            rows = np.concatenate([x[codes == w] for w in idx])
            rc = np.concatenate([np.full(int(n[w]), k) for k, w in enumerate(idx)])
            assert se[b, 0] == pytest.approx(_cluster_se_statsmodels(rows, rc)[1], rel=1e-8)


@pytest.mark.parametrize("symmetric, expand", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("scale", ["log", "identity"])
def test_bootstrap_t_equals_scipy_drawing_the_same_windows(scale, symmetric, expand):
    g, b, conf = 40, 2000, 0.95
    x, codes, _ = _rows(g=g, seed=7)
    s, n = _sums(x, codes, g)
    theta = s.sum() / n.sum()
    se = np.sqrt(_stratified_variance_loop(s, n, np.zeros(g)))
    gfun = np.log if scale == "log" else (lambda v: v)
    dg = (lambda v: 1.0 / v) if scale == "log" else (lambda v: 1.0)

    def t_stat(sw, nw):  # one resample's studentized statistic, computed window by window
        th = sw.sum() / nw.sum()
        se_b = np.sqrt(_stratified_variance_loop(sw, nw, np.zeros(len(sw))))
        return (gfun(th) - gfun(theta)) / (dg(th) * se_b)

    ref = stats.bootstrap((s, n), t_stat, paired=True, vectorized=False, method="percentile",
                          n_resamples=b, rng=np.random.default_rng(3))
    t_ref = ref.bootstrap_distribution
    # the small-sample expansion: Student's t_(G-1) quantile times sqrt(G / (G-1)), as a normal level
    level = 1 - 2 * stats.norm.cdf(np.sqrt(g / (g - 1)) * stats.t.ppf(0.025, g - 1)) if expand else conf
    if symmetric:
        q_hi = np.quantile(np.abs(t_ref), level)
        q_lo = -q_hi
    else:
        q_lo, q_hi = np.quantile(t_ref, [(1 - level) / 2, (1 + level) / 2])
    if scale == "log":
        want = [theta * np.exp(-q_hi * se / theta), theta * np.exp(-q_lo * se / theta)]
    else:
        want = [theta - q_hi * se, theta - q_lo * se]
    (ours,) = cluster_t_means(s, n, resample_counts(g, b, 3), None, scale, conf, symmetric=symmetric, expand=expand)
    np.testing.assert_allclose(ours["ci"], want, rtol=1e-9)
    name = "cluster-bootstrap-t-log" if scale == "log" else "cluster-bootstrap-t"
    assert ours["method"] == name + "-symmetric" * symmetric + "-expanded" * expand
    assert ours["estimate"] == pytest.approx(theta) and ours["se"] == pytest.approx(se, rel=1e-12)
    assert ours["ci"][0] < theta < ours["ci"][1]
    assert (ours["resamples"], ours["clusters"], ours["strata"]) == (b, g, 1)


def test_logit_scale_for_a_proportion_stays_inside_zero_one():
    rng = np.random.default_rng(5)
    n = rng.integers(100, 400, 36).astype(float)
    y = rng.binomial(n.astype(int), np.clip(rng.normal(0.995, 0.004, 36), 0, 1)).astype(float)
    (r,) = cluster_t_means(y, n, resample_counts(36, 2000, 0), None, "logit")
    assert r["method"] == "cluster-bootstrap-t-logit" and 0.0 < r["ci"][0] < r["estimate"] < r["ci"][1] < 1.0


def test_guards():
    n = np.full(40, 100.0)
    counts = resample_counts(40, 500, 0)
    # zero mean KLD (a self-score): the log scale's boundary -> degenerate at the estimate
    (r,) = cluster_t_means(np.zeros(40), n, counts, None, "log")
    assert r["method"] == "degenerate" and r["ci"] == [0.0, 0.0] and "degenerate" in r["flags"]
    # every window agrees on every row
    (r,) = cluster_t_means(n.copy(), n, counts, None, "logit")
    assert r["method"] == "degenerate" and r["ci"] == [1.0, 1.0]
    # identical windows: se = 0
    (r,) = cluster_t_means(np.full(40, 3.0), n, counts, None, "log")
    assert r["method"] == "degenerate"
    # few clusters, a singleton stratum, and a column without rows
    s, nn = np.array([[1.0, 0], [2, 0], [3, 0], [5, 0]]), np.array([[10.0, 0], [10, 0], [12, 0], [9, 0]])
    st = np.array([0, 0, 0, 1])
    cl = Clusters.from_pairs({"a-0": "a", "a-1": "a", "a-2": "a", "b-0": "b"})
    r = cluster_t_means(s, nn, resample_counts(cl, 300, 1), st, "log")
    assert r[1] is None and "few_clusters" in r[0]["flags"] and "singleton_stratum" in r[0]["flags"]
    assert r[0]["strata"] == 2 and "endpoint_few_resamples" in r[0]["flags"]
