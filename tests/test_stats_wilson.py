"""Wilson intervals against scipy and statsmodels; the design effect against its definition."""

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.proportion import proportion_confint

from fideval.stats.wilson import design_effect, wilson_figure, wilson_interval


@pytest.mark.parametrize(
    "k,n", [(0, 10), (10, 10), (1, 2), (937, 1000), (70_000, 73_728), (3, 73_728), (12345, 54321)]
)
@pytest.mark.parametrize("conf", [0.9, 0.95, 0.99])
def test_wilson_matches_scipy_and_statsmodels(k, n, conf):
    ours = wilson_interval(k, n, conf)
    sp = binomtest(k, n).proportion_ci(confidence_level=conf, method="wilson")
    sm = proportion_confint(k, n, alpha=1 - conf, method="wilson")
    np.testing.assert_allclose(ours, [sp.low, sp.high], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours, sm, rtol=0, atol=1e-12)


def test_design_effect_definition_and_interval():
    rng = np.random.default_rng(0)
    n = rng.integers(500, 2000, 36).astype(float)
    p_w = np.clip(rng.normal(0.9, 0.05, 36), 0, 1)
    y = rng.binomial(n.astype(int), p_w).astype(float)
    p = y.sum() / n.sum()
    g = len(n)
    v_clu = g / (g - 1) * np.sum((y - p * n) ** 2) / n.sum() ** 2
    deff = design_effect(y, n)
    assert deff == pytest.approx(v_clu / (p * (1 - p) / n.sum()), rel=1e-12)
    assert deff > 3  # between-window variation of 0.05 on ~1000 rows each
    f = wilson_figure(y, n)
    assert f["estimate"] == pytest.approx(p)
    w, d = f["wilson"]["ci"], f["wilson_deff"]["ci"]
    assert d[0] < w[0] < p < w[1] < d[1]
    np.testing.assert_allclose(d, wilson_interval(p * n.sum() / deff, n.sum() / deff), rtol=1e-14)


def test_design_effect_near_one_for_iid_tokens():
    rng = np.random.default_rng(1)
    deffs = []
    for _ in range(50):
        n = np.full(60, 400.0)
        y = rng.binomial(400, 0.8, 60).astype(float)
        deffs.append(design_effect(y, n))
    assert 0.9 < np.mean(deffs) < 1.1
