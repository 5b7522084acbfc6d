"""The command line on the converter-written DeepSeek-V3 GGUF (deepseek2, Q8_0 + Q4_K, llama.cpp's MLA layout):
``fideval score --config`` scores it as a ``checkpoint:`` candidate with records whose KLD equals the KLD computed
independently (scipy, float64) against the dequantized-weights emulation (tests/test_gguf_moe.py's oracle folder);
``fideval validate`` passes it and refuses a build with llama.cpp's softmax fallback; a truncated GGUF is one line
and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from cli_runner import run_fideval
from gguf_rewrite import rewrite_gguf
from model_fixtures import tokens
from scipy.special import log_softmax, rel_entr
from test_gguf_moe import DATA, oracle_folder
from test_validate import config, refused, validate

from fideval.fsio import sha256_file
from fideval.model.runner import Runner
from fideval.store import StoreWriter

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf-moe-cli")
    ref = DATA / "deepseek_v3"
    gg = ref / "model.gguf"
    cut = tmp / "cut.gguf"
    cut.write_bytes(gg.read_bytes()[: gg.stat().st_size // 2])
    toks = tokens(64, n=2, length=16)
    ids = ["code-000.c0", "prose-000.c0"]
    w = StoreWriter(tmp / "teacher", {"model_id": "toy/deepseek", "model_revision": None, "tokenizer_sha256": None,
                                      "vocab_size": 64, "kind": "logits"})
    teacher = {}
    for k, x in Runner(ref).run(toks, canary=False):
        teacher[ids[k]] = x.numpy()
        w.write(ids[k], x, toks[k], window_id=ids[k].split(".c")[0], domain=ids[k].split("-")[0])
    w.finish()
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["model"] = {"path": str(ref), "id": "toy/deepseek", "revision": None}
    cfg["candidates"] = [{"name": "q4k", "checkpoint": str(gg), "paths": ["weights-only"]},
                         {"name": "cut", "checkpoint": str(cut), "paths": ["weights-only"]}]
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    return dict(tmp=tmp, ref=ref, gguf=gg, toks=toks, ids=ids, teacher=teacher)


def _score(s, name, out, **kw):
    return run_fideval("score", "--teacher", s["tmp"] / "teacher", "--config", s["tmp"] / "c.yaml", "--candidate", name,
                       "--path", "weights-only", "--out", out, "--device", "cpu", **kw)


def test_score_a_deepseek_gguf_candidate(setup):
    s = setup
    res = _score(s, "q4k", s["tmp"] / "rec")
    assert res.code == 0, res.stderr
    info = json.loads((s["tmp"] / "rec" / "score.json").read_text())["candidate_info"]
    assert info["checkpoint"]["sha256"] == sha256_file(s["gguf"])
    assert info["quantized_classes"] == ["attention", "dense_mlp", "lm_head", "routed_experts", "shared_experts"]
    assert info["bits_per_weight"]["per_class"]["routed_experts"]["bpw"] == pytest.approx((4.5 * 2 + 8.5) / 3)  # Q4_K gate/up, Q8_0 down
    emu_run = Runner(oracle_folder("deepseek_v3", s["tmp"] / "emu")).run(s["toks"], canary=False)
    emu = {s["ids"][k]: x.numpy() for k, x in emu_run}
    rec = pq.read_table(s["tmp"] / "rec" / "records.parquet").to_pandas()
    assert len(rec) == 2 * 15
    for row in rec.itertuples():
        p = log_softmax(s["teacher"][row.seq_id][row.position].astype(np.float64))
        q = log_softmax(emu[row.seq_id][row.position].astype(np.float64))
        assert row.kld == pytest.approx(rel_entr(np.exp(p), np.exp(q)).sum(), rel=1e-9, abs=1e-15)
    assert rec.kld.max() > 0


def test_truncated_gguf_is_one_line_and_writes_nothing(setup):
    s = setup
    out = s["tmp"] / "rec-cut"
    proc = _score(s, "cut", out)
    assert proc.code == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "cut.gguf: not a readable GGUF file" in proc.stderr
    assert not out.exists() or not any(out.iterdir())


def small_tokenizer(folder: Path, vocab: int) -> Path:
    """A word-level tokenizer of ``vocab`` tokens (BOS and EOS among them) into ``folder``: the committed GGUF fixture's
    model has a vocabulary of 64, and validate refuses a tokenizer larger than the model's vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    assert len(fast) == vocab
    fast.save_pretrained(str(folder))
    return folder


def test_validate_checks_the_gguf_metadata(tmp_path):
    ref = Path(shutil.copytree(DATA / "deepseek_v3", tmp_path / "ref", ignore=shutil.ignore_patterns("*.gguf")))
    small_tokenizer(ref, json.loads((ref / "config.json").read_text())["vocab_size"])
    good = DATA / "deepseek_v3" / "model.gguf"
    cand = [{"name": "b", "checkpoint": str(good), "paths": ["weights-only"]}]
    r = validate(config(tmp_path, ref, candidates=cand))
    assert r.code == 0, r.stderr
    fallback = rewrite_gguf(good, tmp_path / "softmax.gguf", drop_kv=("deepseek2.expert_gating_func",))
    cand = [{"name": "b", "checkpoint": str(fallback), "paths": ["weights-only"]}]
    refused(config(tmp_path, ref, candidates=cand), "candidates.b.checkpoint",
            "GGUF deepseek2.expert_gating_func = softmax (absent: llama.cpp's default) but the reference config's "
            "scoring_func = sigmoid: the build computes another model")
