"""Parity with llama.cpp: fideval's import + score reproduces what llama-perplexity printed, within its print
precision.

Fixture (``tests/data/llamacpp/kld_parity/``, written once by ``tools/llamacpp/export_check.py``): a tiny llama's
``--kl-divergence-base`` file from llama-perplexity (``base.kld``, the F32 reference), the same file for its
Q4_K_M build (``cand.kld``), and the statistics llama-perplexity printed for ``--kl-divergence`` of that build
against ``base.kld`` (``llama_perplexity.json``). fideval imports both files and scores one against the other as
stored (both lossy). llama.cpp scores the build's exact logits instead, and sums only the reference's entries above
-16 nats without renormalising; on this model every log-prob is above -16 and the uint16 steps are ~1.4e-4 nats, so
the two differ by well under the last printed digit (1e-6 nats, 0.001 % for Same top p). The statistics are
computed the way perplexity.cpp computes them (median of an even count: the mean of the two middle values;
percentiles interpolated at f*(n-1)) from fideval's records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fideval.score.candidate import from_store
from fideval.score.lossy import RULE_BOTH
from fideval.score.run import score_candidate
from fideval.store import StoreReader
from fideval.store.llamacpp import import_llamacpp

FIX = Path(__file__).parent / "data" / "llamacpp" / "kld_parity"
PRINTED = json.loads((FIX / "llama_perplexity.json").read_text())["printed"]
FRACTIONS = {"p99.9": 0.999, "p99": 0.99, "p95": 0.95, "p90": 0.90, "p10": 0.10, "p5": 0.05, "p1": 0.01}


def _llamacpp_stats(kld: np.ndarray, top1: np.ndarray) -> dict[str, float]:
    v = np.sort(kld)
    n = len(v)

    def pct(f: float) -> float:
        p = np.float32(f) * (n - 1)  # perplexity.cpp: float fraction*(size-1)
        i = int(p)
        return float((1 - (p - i)) * v[i] + (p - i) * v[min(i + 1, n - 1)])

    out = {"mean": float(kld.mean()), "max": float(v[-1]), "min": float(v[0]),
           "median": float(0.5 * (v[n // 2] + v[n // 2 - 1]) if n % 2 == 0 else v[n // 2]),
           "same_top_p_percent": 100.0 * float(np.mean(top1))}
    return out | {k: pct(f) for k, f in FRACTIONS.items()}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parity")
    import_llamacpp(FIX / "base.kld", tmp / "teacher", model_id="tiny-llama-f32")
    import_llamacpp(FIX / "cand.kld", tmp / "cand", model_id="tiny-llama-f32")
    teacher = StoreReader(tmp / "teacher")
    s = score_candidate(teacher, from_store(StoreReader(tmp / "cand"), teacher, "q4_k_m", "store"), tmp / "rec")
    return s, pl.read_parquet(tmp / "rec" / "records.parquet")


def test_rows_are_llamacpps(scored):
    s, rec = scored
    assert s["lossy_rule"] == RULE_BOTH
    assert len(rec) == 4 * 31 and rec["position"].min() == 32 and rec["position"].max() == 62


@pytest.mark.parametrize("stat", ["mean", "median", "p99.9", "p99", "p95", "p90", "p10", "p5", "p1", "max", "min"])
def test_kld_statistics_within_print_precision(scored, stat):
    _, rec = scored
    got = _llamacpp_stats(rec["kld"].to_numpy(), rec["top1"].to_numpy())[stat]
    assert abs(got - PRINTED[stat]) <= 1e-6, f"{stat}: fideval {got:.8f}, llama.cpp printed {PRINTED[stat]:.6f}"


def test_same_top_p_as_printed(scored):
    _, rec = scored
    got = _llamacpp_stats(rec["kld"].to_numpy(), rec["top1"].to_numpy())["same_top_p_percent"]
    assert round(got, 3) == PRINTED["same_top_p_percent"]
