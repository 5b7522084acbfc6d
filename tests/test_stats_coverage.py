"""Coverage of the cluster BCa interval at small settings (bench/coverage.py runs the full grid)."""

import importlib.util
import sys
from pathlib import Path

import pytest

# The simulation is a bench tool, not part of the package: load bench/coverage_sim.py by its path.
_spec = importlib.util.spec_from_file_location("coverage_sim", Path(__file__).resolve().parent.parent / "bench" / "coverage_sim.py")
coverage_sim = sys.modules["coverage_sim"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(coverage_sim)
expanded_confidence, simulate = coverage_sim.expanded_confidence, coverage_sim.simulate


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
