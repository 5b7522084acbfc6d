"""Coverage of the report's intervals at small settings (bench/coverage.py runs the full table)."""

import importlib.util
import sys
from pathlib import Path

import pytest

# The simulation is a bench tool, not part of the package: load bench/coverage_sim.py by its path.
_spec = importlib.util.spec_from_file_location("coverage_sim", Path(__file__).resolve().parent.parent / "bench" / "coverage_sim.py")
coverage_sim = sys.modules["coverage_sim"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(coverage_sim)


@pytest.mark.slow  # ~20 s of CPU; longer on a shared machine
def test_default_covers_where_bca_and_iid_do_not():
    from fideval.stats.intervals import DEFAULTS

    assert DEFAULTS["non-negative mean (KLD, reverse KLD)"] == "cluster-bootstrap-t-log-symmetric-expanded"
    t = coverage_sim.replicate(coverage_sim.SHAPES["heavy-high"], 64, 400, 1000, seed=1)
    default, bca = t.coverage("cluster-bootstrap-t-log-symmetric-expanded"), t.coverage("cluster-bca")
    assert default >= 0.92, default  # 0.95 nominal; 400 replications: Monte Carlo sd 1.1 points
    assert bca < default and t.coverage("iid-token") < 0.8


@pytest.mark.slow
def test_top1_default_covers_and_iid_wilson_does_not():
    t = coverage_sim.replicate(coverage_sim.SHAPES["top1-0.95-high"], 64, 400, 1000, seed=2)
    assert t.coverage("cluster-bootstrap-t-logit-symmetric-expanded") >= 0.92
    assert t.coverage("wilson") < 0.6  # tokens of a window agree together


def test_design_sizes_and_truth():
    assert list(coverage_sim.allocate(32, (1, 1, 2, 3, 4, 5))) == [2, 2, 4, 6, 8, 10]
    assert sum(coverage_sim.allocate(512, (1, 1, 1, 1, 1, 1))) == 512
    s = coverage_sim.SHAPES["heavy-unequal"]
    sizes = coverage_sim.allocate(64, s.domain_weights)
    assert coverage_sim.truth(s, sizes) == pytest.approx(0.02 * sum(a * b for a, b in zip(sizes, s.domain_levels)) / 64)
    p = coverage_sim.truth(coverage_sim.SHAPES["top1-0.95-low"], coverage_sim.allocate(64, (1,) * 6))
    assert 0.93 < p < 0.95  # E[expit(logit 0.95 + 0.5 Z)] < 0.95 (concave near 1)


def test_expanded_confidence():
    from fideval.stats.studentized import expanded_confidence

    assert 0.955 < expanded_confidence(0.95, 36) < 0.965
    assert 0.97 < expanded_confidence(0.95, 36, 6) < 0.98  # 6 domains: t with 30 degrees of freedom
    assert abs(expanded_confidence(0.95, 100_000) - 0.95) < 1e-4
