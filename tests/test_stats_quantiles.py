"""Quantiles and their window-bootstrap intervals against brute-force pooling."""

import numpy as np
import pytest

from fideval.stats.clusters import resample_counts
from fideval.stats.quantiles import LOWER_ONLY_FROM, TAIL_WINDOWS, bootstrap_quantiles, quantile_figures, quantiles

QS = [0.5, 0.9, 0.99, 0.999]


def _data(g=12, rows=300, seed=0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(rows // 2, rows, g)
    codes = np.repeat(np.arange(g), sizes)
    vals = rng.lognormal(-3, 1.5, codes.size) * rng.lognormal(0, 0.5, g)[codes]
    vals[::5] = vals[1]  # ties
    vals[::11] = 0.0
    return vals, codes


def test_estimates_are_type7():
    vals, _ = _data()
    assert quantiles(vals, QS) == list(np.quantile(vals, QS, method="linear"))
    x = np.array([4.0, 1.0, 3.0, 2.0])
    assert quantiles(x, [0.5, 0.9]) == [2.5, pytest.approx(3.7)]  # h = 3q: x(1.5) and x(2.7)


@pytest.mark.parametrize("grid,chunk", [(512, 2048), (7, 16), (2, 5)])
def test_bootstrap_quantiles_equal_pooled_resamples(grid, chunk, monkeypatch):
    import fideval.stats.quantiles as qm

    monkeypatch.setattr(qm, "_GRID", grid)
    monkeypatch.setattr(qm, "_CHUNK", chunk)
    vals, codes = _data()
    counts = resample_counts(12, 60, 3)
    counts[:, 5] = 0.0  # a window absent from some resamples entirely
    got = bootstrap_quantiles(vals, codes, counts, QS)
    for b in range(60):
        pooled = np.repeat(vals, counts[b][codes].astype(int))
        np.testing.assert_array_equal(got[b], np.quantile(pooled, QS))


def test_quantile_figures_interval_contains_estimate():
    vals, codes = _data(g=40, rows=200, seed=2)
    figs = quantile_figures(vals, codes, resample_counts(40, 2000, 0), QS, min_tail_windows=0, lower_only_from=2)
    for f, q in zip(figs, QS):
        assert f["ci"][0] <= f["estimate"] <= f["ci"][1]
        assert f["q"] == q and f["clusters"] == 40 and f["rows"] == vals.size


def test_quantile_interval_is_the_percentile_at_the_expanded_level():
    """The interval is numpy's type-7 quantile of brute-force pooled resample quantiles at the level
    Hesterberg's expansion gives (scipy's t quantile, the normal cdf), not at the stated 95 %."""
    from scipy import stats

    vals, codes = _data(g=40, rows=200, seed=4)
    counts = resample_counts(40, 400, 1)
    figs = quantile_figures(vals, codes, counts, QS, 0.95, strata=2, min_tail_windows=0, lower_only_from=2)
    level = 1 - 2 * stats.norm.cdf(np.sqrt(40 / 38) * stats.t.ppf(0.025, 38))
    assert level > 0.95
    pooled = np.array([np.quantile(np.repeat(vals, counts[b][codes].astype(int)), QS) for b in range(400)])
    for i, f in enumerate(figs):
        assert f["method"] == "cluster-percentile-expanded" and f["level"] == pytest.approx(level, abs=1e-12)
        a = (1 - level) / 2
        np.testing.assert_allclose(f["ci"], np.quantile(pooled[:, i], [a, 1 - a]), rtol=0, atol=0)


def test_tail_windows_counts_the_windows_beyond_the_quantile():
    # 100 rows: window 0 holds the 10 largest, windows 1-3 the rest; above the p90 estimate sit
    # only window 0's rows -> 1 effective window (flagged); the median's tail spans all four windows
    codes = np.repeat(np.arange(4), [25, 25, 25, 25])
    vals = np.concatenate([np.r_[np.full(15, 0.5), np.linspace(10, 20, 10)], np.full(25, 1.0), np.full(25, 2.0),
                           np.full(25, 3.0)])
    figs = quantile_figures(vals, codes, resample_counts(4, 50, 0), [0.5, 0.9])
    above = codes[vals > figs[0]["estimate"]]
    shares = np.bincount(above) / above.size
    assert figs[0]["tail_windows"] == pytest.approx(1 / np.sum(shares[shares > 0] ** 2))
    assert figs[1]["tail_windows"] == 1.0 and "few_tail_windows" in figs[1]["flags"]


def test_few_tail_windows_keeps_the_lower_bound_and_states_no_upper_bound():
    """Below TAIL_WINDOWS (25) effective tail windows the upper bound is null (unbounded) and the lower bound is the same
    percentile the two-sided interval would have; at or above it both bounds are stated."""
    vals, codes = _data(g=40, rows=200, seed=4)
    counts = resample_counts(40, 400, 1)
    both = quantile_figures(vals, codes, counts, QS, min_tail_windows=0, lower_only_from=2)
    figs = quantile_figures(vals, codes, counts, QS)
    flagged = [f["tail_windows"] < TAIL_WINDOWS for f in figs]
    assert flagged[-1] and not flagged[0]  # p99.9 of ~6,000 rows: ~6 rows above it, from at most as many windows
    for f, b, few in zip(figs, both, flagged):
        lower_only = f["q"] >= LOWER_ONLY_FROM  # the p99 and p99.9: the lower bound alone, whatever the tail
        assert f["ci"][0] == b["ci"][0] and f["estimate"] == b["estimate"]
        assert f["ci"][1] == (None if few or lower_only else b["ci"][1])
        assert ("few_tail_windows" in f["flags"]) == few
        assert ("lower_bound_only" in f["flags"]) == lower_only


def test_p99_keeps_only_its_lower_bound_even_with_many_tail_windows():
    """Issue 48: the two-sided p99 that passes the tail-window gate covers 0.50-0.89 where few runs pass it; from
    q = 0.99 the interval is [lower, null] with ``lower_bound_only``, the lower bound the same percentile of the
    pooled resampled rows (checked directly), while the median and p90 stay two-sided."""
    from scipy import stats

    vals, codes = _data(g=200, rows=100, seed=9)
    counts = resample_counts(200, 300, 2)
    figs = quantile_figures(vals, codes, counts, QS, min_tail_windows=0)
    level = 1 - 2 * stats.norm.cdf(np.sqrt(200 / 199) * stats.t.ppf(0.025, 199))
    pooled = np.array([np.quantile(np.repeat(vals, counts[b][codes].astype(int)), QS) for b in range(300)])
    for i, f in enumerate(figs):
        lo = np.quantile(pooled[:, i], (1 - level) / 2)
        assert f["ci"][0] == pytest.approx(lo, rel=1e-12)
        if f["q"] >= 0.99:
            assert f["ci"][1] is None and "lower_bound_only" in f["flags"] and "few_tail_windows" not in f["flags"]
        else:
            assert f["ci"][1] == pytest.approx(np.quantile(pooled[:, i], (1 + level) / 2), rel=1e-12)
            assert "lower_bound_only" not in f["flags"]
