"""Cluster BCa against scipy.stats.bootstrap (same resample indices), and its guards."""

import numpy as np
import pytest
from scipy import stats

from fideval.stats.bootstrap import bca_interval, cluster_bca_difference, cluster_bca_mean, cluster_bca_ratio
from fideval.stats.clusters import Clusters, resample_counts


def _windows(g=40, seed=0):
    rng = np.random.default_rng(seed)
    n = rng.integers(200, 2048, g).astype(np.float64)
    mu = rng.lognormal(-3.0, 0.8, g)
    s = mu * n * rng.gamma(20.0, 1 / 20.0, g)
    return s, n


def _ratio(s, n, axis=-1):
    return np.sum(s, axis=axis) / np.sum(n, axis=axis)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_bca_equals_scipy_with_same_indices(seed):
    s, n = _windows(seed=seed)
    b = 4000
    ref = stats.bootstrap(
        (s, n),
        _ratio,
        paired=True,
        vectorized=True,
        method="BCa",
        n_resamples=b,
        confidence_level=0.95,
        rng=np.random.default_rng(seed),
    )
    counts = resample_counts(len(s), b, seed)
    ours = cluster_bca_mean(s, n, counts, 0.95)
    # our resampled distribution is scipy's (same draws, different summation order)
    np.testing.assert_allclose(
        np.sort(counts @ s / (counts @ n)), np.sort(ref.bootstrap_distribution), rtol=1e-13
    )
    np.testing.assert_allclose(
        ours["ci"], [ref.confidence_interval.low, ref.confidence_interval.high], rtol=1e-12
    )
    assert ours["method"] == "cluster-bca"
    assert ours["estimate"] == pytest.approx(s.sum() / n.sum(), rel=1e-15)


def test_bca_agrees_with_scipy_across_seeds_within_monte_carlo_error():
    s, n = _windows(g=60, seed=3)
    lo_ours, hi_ours, lo_sp, hi_sp = [], [], [], []
    for seed in range(6):
        o = cluster_bca_mean(s, n, resample_counts(len(s), 3000, 100 + seed))
        r = stats.bootstrap(
            (s, n),
            _ratio,
            paired=True,
            vectorized=True,
            method="BCa",
            n_resamples=3000,
            rng=np.random.default_rng(900 + seed),
        ).confidence_interval
        lo_ours.append(o["ci"][0]), hi_ours.append(o["ci"][1]), lo_sp.append(r.low), hi_sp.append(r.high)
    width = np.mean(hi_sp) - np.mean(lo_sp)
    # seed-to-seed spread of an endpoint at B=3000 is a few % of the width; means of 6 agree to ~5 %
    assert abs(np.mean(lo_ours) - np.mean(lo_sp)) < 0.05 * width
    assert abs(np.mean(hi_ours) - np.mean(hi_sp)) < 0.05 * width
    assert np.std(lo_ours) < 0.1 * width


def test_ratio_and_difference_match_scipy_on_the_joint_statistic():
    s1, n = _windows(seed=11)
    s2 = s1 * np.random.default_rng(2).lognormal(0.1, 0.1, len(s1))
    b = 3000
    counts = resample_counts(len(n), b, 5)

    def ratio(a, c, m, axis=-1):
        return (np.sum(a, axis=axis) / np.sum(m, axis=axis)) / (np.sum(c, axis=axis) / np.sum(m, axis=axis))

    def diff(a, c, m, axis=-1):
        return (np.sum(a, axis=axis) - np.sum(c, axis=axis)) / np.sum(m, axis=axis)

    for fn, ours in (
        (ratio, cluster_bca_ratio(s1, n, s2, n, counts)),
        (diff, cluster_bca_difference(s1, n, s2, n, counts)),
    ):
        ref = stats.bootstrap(
            (s1, s2, n),
            fn,
            paired=True,
            vectorized=True,
            method="BCa",
            n_resamples=b,
            rng=np.random.default_rng(5),
        ).confidence_interval
        np.testing.assert_allclose(ours["ci"], [ref.low, ref.high], rtol=1e-11, atol=1e-15)
    # a ratio of builds that share windows is far tighter than either mean
    r = cluster_bca_ratio(s1, n, s2, n, counts)
    m = cluster_bca_mean(s1, n, counts)
    assert (r["ci"][1] - r["ci"][0]) / r["estimate"] < 0.5 * (m["ci"][1] - m["ci"][0]) / m["estimate"]


def test_guards():
    # identical windows: every resample gives the estimate
    s, n = np.full(40, 3.0), np.full(40, 100.0)
    r = cluster_bca_mean(s, n, resample_counts(40, 500, 0))
    assert r["method"] == "degenerate" and r["ci"] == [0.03, 0.03] and "degenerate" in r["flags"]
    # one window only
    assert (
        "degenerate"
        in cluster_bca_mean(np.array([1.0]), np.array([5.0]), resample_counts(1, 100, 0))["flags"]
    )
    # estimate below every resample: z0 undefined -> percentile fallback
    r = bca_interval(0.0, np.linspace(1, 2, 1000), np.linspace(0, 1, 40), 0.95)
    assert r["method"] == "cluster-percentile" and "z0_undefined" in r["flags"]
    assert r["ci"] == pytest.approx(list(np.quantile(np.linspace(1, 2, 1000), [0.025, 0.975])))
    # few clusters and an endpoint on fewer than 10 resamples (B = 200: 0.025 * 200 = 5)
    s, n = _windows(g=12)
    r = cluster_bca_mean(s, n, resample_counts(12, 200, 0))
    assert "few_clusters" in r["flags"] and "endpoint_few_resamples" in r["flags"]
    assert "few_clusters" not in cluster_bca_mean(*_windows(g=40), resample_counts(40, 1000, 0))["flags"]


def test_stratified_counts_keep_each_domain_size_and_are_seeded():
    cl = Clusters.from_pairs({f"{d}-{k:03d}": d for d in ("code", "math", "chat") for k in range(5 + len(d))})
    c = resample_counts(cl, 300, 42)
    for _, members in cl.stratum_members():
        assert np.all(c[:, members].sum(axis=1) == len(members))
    np.testing.assert_array_equal(c, resample_counts(cl, 300, 42))
    assert not np.array_equal(c, resample_counts(cl, 300, 43))
    # a single stratum reproduces scipy's index draw
    one = Clusters.from_pairs({f"x-{k:03d}": "x" for k in range(9)})
    idx = np.random.default_rng(4).integers(0, 9, (50, 9))
    np.testing.assert_array_equal(
        resample_counts(one, 50, 4), np.stack([np.bincount(r, minlength=9) for r in idx])
    )


def test_undefined_and_nonfinite_guards():
    c = resample_counts(10, 300, 0)
    n = np.full(10, 100.0)
    r = cluster_bca_ratio(np.ones(10), n, np.zeros(10), n, c)  # ratio over a zero-KLD build
    assert r["estimate"] is None and r["ci"] is None and r["flags"] == ["undefined"]
    s = np.zeros(10)
    s[3] = 1.0  # the denominator is zero in every resample that misses window 3
    r = cluster_bca_ratio(np.ones(10), n, s, n, c)
    assert "nonfinite_resamples" in r["flags"] and np.isfinite(r["ci"]).all()
