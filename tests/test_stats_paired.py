"""Paired build comparisons against scipy's paired bootstrap drawing the same window indices: the default
(cluster bootstrap-t, its statistic computed window by window here) and the BCa beside it."""

import numpy as np
import pytest
from scipy import stats

from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.paired import paired_interval


def _builds(g=40, seed=0, effect=1.3, noise=0.15):
    rng = np.random.default_rng(seed)
    n = rng.integers(100, 600, g).astype(float)
    mu = rng.lognormal(-4.0, 0.8, g)  # window difficulty, shared by both builds
    s2 = mu * n * rng.gamma(8.0, 1 / 8.0, g)
    s1 = s2 * effect * rng.lognormal(0.0, noise, g)
    return s1, n, s2, n.copy()


def _var(u, strata):
    v = 0.0
    for h in np.unique(strata):
        x = u[strata == h]
        if x.size > 1:
            v += x.size / (x.size - 1) * np.sum((x - x.mean()) ** 2)
    return v


def _stat(kind, s1, n1, s2, n2):
    """The figure and its linearised se on the interval's scale, window by window (no count matrix)."""
    t1, t2 = s1.sum() / n1.sum(), s2.sum() / n2.sum()
    if kind == "difference":
        u = (s1 - t1 * n1) / n1.sum() - (s2 - t2 * n2) / n2.sum()
        return t1 - t2, np.sqrt(_var(u, np.zeros(len(u))))
    u = (s1 - t1 * n1) / s1.sum() - (s2 - t2 * n2) / s2.sum()
    return np.log(t1 / t2), np.sqrt(_var(u, np.zeros(len(u))))


@pytest.mark.parametrize("symmetric, expand", [(False, False), (True, True)])
@pytest.mark.parametrize("kind", ["difference", "ratio"])
def test_default_equals_scipy_paired_bootstrap_t_on_the_same_indices(kind, symmetric, expand):
    s1, n1, s2, n2 = _builds()
    b, seed = 3000, 17
    g_hat, se = _stat(kind, s1, n1, s2, n2)

    def t_stat(a, c, d, e):
        g_b, se_b = _stat(kind, a, c, d, e)
        return (g_b - g_hat) / se_b

    ref = stats.bootstrap((s1, n1, s2, n2), t_stat, paired=True, vectorized=False, method="percentile",
                          n_resamples=b, rng=np.random.default_rng(seed))
    g = len(s1)
    level = 1 - 2 * stats.norm.cdf(np.sqrt(g / (g - 1)) * stats.t.ppf(0.025, g - 1)) if expand else 0.95
    if symmetric:
        q_hi = np.quantile(np.abs(ref.bootstrap_distribution), level)
        q_lo = -q_hi
    else:
        q_lo, q_hi = np.quantile(ref.bootstrap_distribution, [(1 - level) / 2, (1 + level) / 2])
    lo, hi = g_hat - q_hi * se, g_hat - q_lo * se
    want = [lo, hi] if kind == "difference" else [np.exp(lo), np.exp(hi)]
    ours = paired_interval(kind, s1, n1, s2, n2, resample_counts(len(s1), b, seed), seed=seed,
                           symmetric=symmetric, expand=expand)
    np.testing.assert_allclose(ours["ci"], want, rtol=1e-9)
    est = np.exp(g_hat) if kind == "ratio" else g_hat
    assert ours["estimate"] == pytest.approx(est, rel=1e-12) and ours["excludes"] is True
    name = "cluster-bootstrap-t" if kind == "difference" else "cluster-bootstrap-t-log"
    assert ours["method"] == name + "-symmetric-expanded" * symmetric
    assert (ours["null"], ours["resamples"], ours["seed"], ours["clusters"], ours["strata"]) == (
        0.0 if kind == "difference" else 1.0, b, seed, 40, 1)


@pytest.mark.parametrize("kind", ["difference", "ratio"])
def test_bca_beside_equals_scipy_paired_bca(kind):
    s1, n1, s2, n2 = _builds(seed=3)
    b = 2000

    def fig(a, c, d, e, axis=-1):
        t1, t2 = a.sum(axis) / c.sum(axis), d.sum(axis) / e.sum(axis)
        return t1 - t2 if kind == "difference" else t1 / t2

    ref = stats.bootstrap((s1, n1, s2, n2), fig, paired=True, vectorized=True, method="BCa", n_resamples=b,
                          rng=np.random.default_rng(4)).confidence_interval
    ours = paired_interval(kind, s1, n1, s2, n2, resample_counts(len(s1), b, 4), seed=4)["cluster_bca"]
    np.testing.assert_allclose(ours["ci"], [ref.low, ref.high], rtol=1e-11)
    assert ours["method"] == "cluster-bca" and ours["excludes"] is True


def test_pairing_narrows_and_identical_builds_do_not_differ():
    s1, n1, s2, n2 = _builds(effect=1.05, noise=0.05)
    counts = resample_counts(len(s1), 2000, 0)
    r = paired_interval("ratio", s1, n1, s2, n2, counts)
    unpaired = paired_interval("ratio", s1, n1, np.roll(s2, 7), np.roll(n2, 7), counts)  # windows not matched
    assert r["ci"][1] - r["ci"][0] < 0.3 * (unpaired["ci"][1] - unpaired["ci"][0])
    same = paired_interval("difference", s2, n2, s2, n2, counts)
    assert same["method"] == "degenerate" and same["excludes"] is False and same["estimate"] == 0.0


def test_stratified_pairs_and_their_se():
    s1, n1, s2, n2 = _builds(g=36, seed=5)
    strata = np.arange(36) % 3
    cl = Clusters.from_pairs({f"{w:03d}": f"d{strata[w]}" for w in range(36)})
    # Clusters sorts ids; with these ids the order is the window order
    counts = resample_counts(cl, 1000, 2)
    r = paired_interval("difference", s1, n1, s2, n2, counts, strata, seed=2)
    t1, t2 = s1.sum() / n1.sum(), s2.sum() / n2.sum()
    u = (s1 - t1 * n1) / n1.sum() - (s2 - t2 * n2) / n2.sum()
    assert r["se"] == pytest.approx(np.sqrt(_var(u, strata)), rel=1e-10) and r["strata"] == 3
    assert r["ci"][0] < r["estimate"] < r["ci"][1]


def test_undefined_ratio():
    n = np.full(10, 100.0)
    r = paired_interval("ratio", np.ones(10), n, np.zeros(10), n, resample_counts(10, 300, 0))
    assert r["estimate"] is None and r["ci"] is None and r["excludes"] is None


def test_mover_difference_equals_one_built_from_scipy_on_the_same_indices():
    """The default of a difference: MOVER from each mean's symmetric, expanded log bootstrap-t interval and
    the correlation of the resampled means, each piece from scipy.stats.bootstrap drawing the same windows."""
    s1, n1, s2, n2 = _builds(seed=6)
    g, b, seed = len(s1), 2000, 23
    level = 1 - 2 * stats.norm.cdf(np.sqrt(g / (g - 1)) * stats.t.ppf(0.025, g - 1))

    def window_se(s, n):
        t = s.sum() / n.sum()
        return np.sqrt(_var(s - t * n, np.zeros(len(s)))) / n.sum()

    def boot(stat):
        return stats.bootstrap((s1, n1, s2, n2), stat, paired=True, vectorized=False, method="percentile",
                               n_resamples=b, rng=np.random.default_rng(seed)).bootstrap_distribution

    ends = []
    for s, n, k in ((s1, n1, 0), (s2, n2, 1)):
        m, se = s.sum() / n.sum(), window_se(s, n)

        def t_stat(a, c, d, e, m=m, k=k):
            sw, nw = (a, c) if k == 0 else (d, e)
            mb = sw.sum() / nw.sum()
            return (np.log(mb) - np.log(m)) / (window_se(sw, nw) / mb)

        q = np.quantile(np.abs(boot(t_stat)), level)
        ends.append((m, m * np.exp(-q * se / m), m * np.exp(q * se / m)))
    rho = np.corrcoef(boot(lambda a, c, d, e: a.sum() / c.sum()), boot(lambda a, c, d, e: d.sum() / e.sum()))[0, 1]
    (m1, l1, u1), (m2, l2, u2) = ends
    d = m1 - m2
    want = [d - np.sqrt((m1 - l1) ** 2 + (u2 - m2) ** 2 - 2 * rho * (m1 - l1) * (u2 - m2)),
            d + np.sqrt((u1 - m1) ** 2 + (m2 - l2) ** 2 - 2 * rho * (u1 - m1) * (m2 - l2))]
    ours = paired_interval("difference", s1, n1, s2, n2, resample_counts(g, b, seed), seed=seed, symmetric=True,
                           expand=True, mover=True)
    np.testing.assert_allclose(ours["ci"], want, rtol=1e-9)
    assert ours["method"] == "mover-cluster-bootstrap-t-log-symmetric-expanded" and ours["excludes"] is True
    assert ours["rho"] == pytest.approx(rho, rel=1e-9) and ours["estimate"] == pytest.approx(d, rel=1e-12)
    # identical builds: no spread in the difference, nothing to combine
    same = paired_interval("difference", s2, n2, s2, n2, resample_counts(g, 500, 0), mover=True)
    assert same["method"] == "degenerate" and same["excludes"] is False
