"""The command line on a ``gguf_mix`` candidate: ``fideval score --config`` scores the emulated Q4_K_M of the tiny
DeepSeek-V3 with records EQUAL to those of llama-quantize's own Q4_K_M GGUF scored as a ``checkpoint:`` candidate
(tests/data/llamacpp/mix, tools/llamacpp/mix_ggufs.py); ``fideval quant inspect`` prints the mix's types per class."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from cli_runner import run_fideval
from model_fixtures import tokens

from fideval.model.runner import Runner
from fideval.store import StoreWriter

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "llamacpp" / "moe" / "deepseek_v3"
MIX = ROOT / "tests" / "data" / "llamacpp" / "mix"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf-mix-cli")
    toks = tokens(64, n=2, length=16)
    ids = ["code-000.c0", "prose-000.c0"]
    w = StoreWriter(tmp / "teacher", {"model_id": "toy/deepseek", "model_revision": None, "tokenizer_sha256": None,
                                      "vocab_size": 64, "kind": "logits"})
    for k, x in Runner(REF).run(toks, canary=False):
        w.write(ids[k], x, toks[k], window_id=ids[k].split(".c")[0], domain=ids[k].split("-")[0])
    w.finish()
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["model"] = {"path": str(REF), "id": "toy/deepseek", "revision": None}
    cfg["candidates"] = [{"name": "mix", "quant": {"gguf_mix": "Q4_K_M"}, "paths": ["weights-only", "serving"]},
                         {"name": "real", "checkpoint": str(MIX / "deepseek_v3" / "Q4_K_M.gguf"), "paths": ["weights-only"]}]
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    return tmp


def _score(tmp, name, out, path="weights-only"):
    res = run_fideval("score", "--teacher", tmp / "teacher", "--config", tmp / "c.yaml", "--candidate", name,
                      "--path", path, "--out", out, "--device", "cpu")
    assert res.code == 0, res.stderr
    return pq.read_table(out / "records.parquet").to_pandas(), json.loads((out / "score.json").read_text())["candidate_info"]


def test_score_an_emulated_mix_equals_llama_quantizes_gguf(setup):
    emu, info = _score(setup, "mix", setup / "rec-mix")
    real, _ = _score(setup, "real", setup / "rec-real")
    assert len(emu) == 2 * 15 and emu.kld.max() > 0
    assert (emu.kld.to_numpy() == real.kld.to_numpy()).all()
    assert info["source"] == "emulated" and info["quant"] == {"gguf_mix": "Q4_K_M"}
    per = info["bits_per_weight"]["per_class"]
    assert per["lm_head"]["types"] == {"Q6_K": 1} and per["embedding"]["types"] == {"Q4_K": 1}
    serving, _ = _score(setup, "mix", setup / "rec-serving", "serving")  # E4M3 activations of every class: another model
    assert not (serving.kld.to_numpy() == emu.kld.to_numpy()).all()


def test_quant_inspect_prints_the_mix_types_per_class():
    res = run_fideval("quant", "inspect", "--model", MIX / "llama", "--quant", "gguf_mix=Q4_K_M")
    assert res.code == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[2:]}
    assert "Q4_K x1" in rows["embedding"] and "Q6_K x1" in rows["lm_head"] and "4.5000" in rows["embedding"]
    assert "F16 x8" in rows["dense_mlp"] and "Q5_0 x8" in rows["attention"]  # rows of 16 and of 32: the fallbacks
    bad = run_fideval("quant", "inspect", "--model", MIX / "llama", "--quant", "gguf_mix=Q9_K")
    assert bad.code == 2 and bad.stderr.count("\n") == 1 and "unknown gguf mix 'Q9_K'" in bad.stderr
