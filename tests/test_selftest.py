"""``fideval selftest``: the runner against transformers' own forward on a real model folder; a planted mismatch
(a patched layer) fails it in one line."""

from __future__ import annotations

import json
from pathlib import Path

import family_fixtures as ff
import model_fixtures as mf
import pytest
import torch
from cli_runner import run_fideval

from fideval.config import DEMO_ROOT
from fideval.model.adapters import Adapter
from fideval.model.selftest import kld_rows, tolerance

DEMO = DEMO_ROOT / "model"


def test_demo_model_passes_and_prints_its_table(tmp_path):
    out = tmp_path / "selftest.json"
    r = run_fideval("selftest", "--model", DEMO, "--device", "cpu", "--sequences", "2", "--length", "32", "--out", out)
    assert r.code == 0, r.stderr
    for label in ("architecture", "max |delta logit|", "mean KLD", "selftest passed"):
        assert label in r.stdout
    got = json.loads(out.read_text())
    assert got["arch"] == "DeepseekV3ForCausalLM" and got["passed"] and got["max_abs_delta"] <= 1e-5
    assert got["max_abs_logit"] > 1.0 and got["mean_kld"] < 1e-10


@pytest.mark.parametrize("name", ["gemma2", "qwen3_next", "llama4_text"])
def test_tiny_models_of_three_families_pass(tmp_path, name):
    folder = mf.build_config(ff.configs()[name], tmp_path / name)
    res = run_fideval("selftest", "--model", folder, "--device", "cpu", "--sequences", "2", "--length", "24", "--json")
    assert res.code == 0, res.stderr
    r = json.loads(res.stdout[:res.stdout.rindex("}") + 1])
    assert r["passed"] and r["max_abs_delta"] <= 1e-5 and r["max_abs_logit"] > 1.0
    assert res.stdout.rstrip().endswith("selftest passed")


def test_a_planted_mismatch_fails_in_one_line(monkeypatch):
    """A patched layer (layer 1's attention output scaled by 1.01 as it is materialised): the runner no longer
    computes the model transformers computes, and selftest says so in one line, exit 2."""
    original = Adapter.materialize

    def patched(self, i, layer, tensors, dtype, experts, weight_transform):
        mod = original(self, i, layer, tensors, dtype, experts, weight_transform)
        if i == 1:
            with torch.no_grad():
                mod.self_attn.o_proj.weight.mul_(1.01)
        return mod

    monkeypatch.setattr(Adapter, "materialize", patched)
    r = run_fideval("selftest", "--model", DEMO, "--device", "cpu", "--sequences", "2", "--length", "16")
    line = r.error()
    assert "the runner's logits differ from transformers' forward: max |delta logit|" in line
    assert "max |delta logit|" in r.stdout  # the table is printed before the verdict


def test_bfloat16_bound_and_kld_oracle():
    assert tolerance(torch.float32, 30.0) == 1e-4
    assert tolerance(torch.bfloat16, 32.0) == 4 * 2.0**-8 * 32.0
    p = torch.tensor([[0.0, 1.0, 2.0]])
    q = torch.tensor([[0.5, 1.0, 1.0]])
    pp, qq = torch.softmax(p.double(), -1), torch.softmax(q.double(), -1)
    assert float(kld_rows(p, q)[0]) == pytest.approx(float((pp * (pp / qq).log()).sum()), rel=1e-12)
    assert float(kld_rows(p, p)[0]) == 0.0


def test_model_or_config_exactly_one(tmp_path):
    assert "exactly one of --model DIR and --config FILE" in run_fideval("selftest").error()


def test_not_a_checkpoint_is_one_line(tmp_path):
    assert "config.json" in run_fideval("selftest", "--model", tmp_path, "--device", "cpu").error()


def test_config_gives_the_model_device_and_dtype(tmp_path):
    """What the workflow's selftest rule runs: the config's model (demo://model), teacher dtype, --device given."""
    out = tmp_path / "s.json"
    r = run_fideval("selftest", "--config", Path(__file__).resolve().parents[1] / "configs" / "demo.yaml", "--device", "cpu",
                    "--sequences", "1", "--length", "16", "--out", out)
    assert r.code == 0, r.stderr
    got = json.loads(out.read_text())
    assert got["passed"] and got["model"].endswith("model") and got["dtype"] == "float32"


def test_an_fp8_release_is_refused_and_with_if_possible_recorded_as_not_run(tmp_path):
    """transformers cannot be the oracle of an FP8 release (its loader mis-reads partial scale blocks): plain
    selftest refuses in one line; the workflow's `--if-possible` records 'not_run' with the reason and exits 0, so
    the flagship configs (FP8 releases, models larger than one job's memory) still reach their teacher."""
    import fp8_fixtures as fx

    folder = fx.build("deepseek_v3", "aligned", tmp_path / "fp8")
    assert "selftest cannot check an FP8 release" in run_fideval("selftest", "--model", folder, "--device", "cpu").error()
    out = tmp_path / "selftest.json"
    r = run_fideval("selftest", "--model", folder, "--device", "cpu", "--if-possible", "--out", out)
    assert r.code == 0, r.stderr
    assert r.stdout.startswith("selftest not run: ") and "FP8 release" in r.stdout
    got = json.loads(out.read_text())
    assert got["status"] == "not_run" and got["passed"] is None and "FP8 release" in got["reason"]


def test_a_model_larger_than_the_memory_is_not_run_with_if_possible(monkeypatch, tmp_path):
    import os

    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda k: 1 if k == "SC_AVPHYS_PAGES" else real(k))
    r = run_fideval("selftest", "--model", DEMO, "--device", "cpu", "--if-possible", "--json")
    assert r.code == 0 and "selftest not run: " in r.stdout and "GiB are available" in r.stdout


def test_model_given_as_demo_url_resolves_like_a_config_path():
    r = run_fideval("selftest", "--model", "demo://model", "--device", "cpu", "--sequences", "2", "--length", "16")
    assert r.code == 0, r.stderr
    assert r.stdout.rstrip().endswith("selftest passed")
