"""Coverage of the cluster BCa interval at small settings (bench/coverage.py runs the full grid)."""

import pytest

from fideval.stats.coverage import expanded_confidence, simulate


@pytest.mark.slow  # ~5 s of CPU; longer on a shared machine
def test_cluster_bca_covers_and_iid_token_does_not():
    r = simulate(replications=1000, clusters=128, rows=100, resamples=1000, sigma_b=0.3, seed=0)
    assert r.bca >= 0.93, r
    assert r.iid_token < 0.85, r  # tokens of a window are correlated: the iid interval is too narrow
    assert r.mean_width_bca > 1.5 * r.mean_width_iid
    assert r.bca_expanded >= r.bca


def test_expanded_confidence():
    assert 0.955 < expanded_confidence(0.95, 36) < 0.965
    assert abs(expanded_confidence(0.95, 100_000) - 0.95) < 1e-4
