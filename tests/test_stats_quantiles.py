"""Quantiles and their window-bootstrap intervals against brute-force pooling."""

import numpy as np
import pytest

from fideval.stats.clusters import resample_counts
from fideval.stats.quantiles import bootstrap_quantiles, quantile_figures, quantiles

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
    figs = quantile_figures(vals, codes, resample_counts(40, 2000, 0), QS)
    for f, q in zip(figs, QS):
        assert f["ci"][0] <= f["estimate"] <= f["ci"][1]
        assert f["q"] == q and f["clusters"] == 40 and f["rows"] == vals.size
