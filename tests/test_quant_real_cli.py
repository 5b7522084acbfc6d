"""``fideval score --config C --candidate NAME --path P`` on a ``checkpoint:`` candidate (a real GGUF build):
records whose KLD equals the one computed independently from the emulated candidate's logits, score.json's
``candidate_info`` (source, SHA-256, bits per weight), and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from cli_runner import run_fideval
from model_fixtures import build, tokens
from scipy.special import log_softmax, rel_entr
from test_quant_real_gguf import write_llama_gguf

from fideval.fsio import sha256_file
from fideval.model.runner import Runner, RunnerOptions
from fideval.quant.spec import compile_spec
from fideval.store import StoreWriter

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    ref = build("llama", tmp / "ref")
    gg = write_llama_gguf(ref, tmp / "q8.gguf", "Q8_0")
    bad = write_llama_gguf(ref, tmp / "bad.gguf", arch="falcon")
    toks = tokens(96, n=2, length=16)
    ids = ["code-000.c0", "prose-000.c0"]
    r = Runner(ref)
    w = StoreWriter(tmp / "teacher", {"model_id": "toy/llama", "model_revision": None, "tokenizer_sha256": None,
                                      "vocab_size": 96, "kind": "logits"})
    teacher = {}
    for k, x in r.run(toks, canary=False):
        teacher[ids[k]] = x.numpy()
        w.write(ids[k], x, toks[k], window_id=ids[k].split(".c")[0], domain=ids[k].split("-")[0])
    w.finish()
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["model"] = {"path": str(ref), "id": "toy/llama", "revision": None}
    cfg["candidates"] = [{"name": "q8", "checkpoint": str(gg), "paths": ["serving", "weights-only"]},
                         {"name": "bad", "checkpoint": str(bad), "paths": ["weights-only"]},
                         {"name": "gone", "checkpoint": str(tmp / "nope.gguf"), "paths": ["weights-only"]},
                         {"name": "plain", "checkpoint": str(ref), "paths": ["serving"]}]
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    return dict(tmp=tmp, ref=ref, gguf=gg, toks=toks, ids=ids, teacher=teacher)


def _score(s, name, path, out):
    return run_fideval("score", "--teacher", s["tmp"] / "teacher", "--config", s["tmp"] / "c.yaml", "--candidate", name,
                       "--path", path, "--out", out, "--device", "cpu")


@pytest.fixture(scope="module")
def weights_only(setup):
    """The GGUF candidate scored on its weights-only path, once per worker (xdist may split this module)."""
    res = _score(setup, "q8", "weights-only", setup["tmp"] / "rec")
    assert res.code == 0, res.stderr
    return setup


def test_score_a_gguf_candidate_weights_only(weights_only):
    s = weights_only
    info = json.loads((s["tmp"] / "rec" / "score.json").read_text())["candidate_info"]
    assert info["source"] == "checkpoint" and info["activations"] == "none"
    assert info["checkpoint"]["sha256"] == sha256_file(s["gguf"])
    assert info["bits_per_weight"]["per_class"]["attention"]["bpw"] == 8.5  # Q8_0: 34 bytes per 32
    assert info["quantized_classes"] == ["attention", "dense_mlp", "lm_head"]
    # oracle: KL(teacher || emulated gguf_q8_0) in float64 with scipy, row by row
    spec = compile_spec({c: {"format": "gguf_q8_0"} for c in ("attention", "dense_mlp", "lm_head")})
    emu_run = Runner(s["ref"], RunnerOptions(weight_transform=spec.weight_transform)).run(s["toks"], canary=False)
    emu = {s["ids"][k]: x.numpy() for k, x in emu_run}
    rec = pq.read_table(s["tmp"] / "rec" / "records.parquet").to_pandas()
    assert len(rec) == 2 * 15
    for row in rec.itertuples():
        p = log_softmax(s["teacher"][row.seq_id][row.position].astype(np.float64))
        q = log_softmax(emu[row.seq_id][row.position].astype(np.float64))
        assert row.kld == pytest.approx(rel_entr(np.exp(p), np.exp(q)).sum(), rel=1e-9, abs=1e-15)
    assert rec.kld.max() > 0


def test_serving_path_quantizes_activations(weights_only):
    s = weights_only
    res = _score(s, "q8", "serving", s["tmp"] / "rec-s")
    assert res.code == 0, res.stderr
    info = json.loads((s["tmp"] / "rec-s" / "score.json").read_text())["candidate_info"]
    assert info["activations"] == "e4m3 per 1x128"
    a = pq.read_table(s["tmp"] / "rec-s" / "records.parquet").column("kld").to_numpy()
    b = pq.read_table(s["tmp"] / "rec" / "records.parquet").column("kld").to_numpy()
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("name, path, expect", [
    ("bad", "weights-only", "GGUF architecture 'falcon' is not supported"),
    ("gone", "weights-only", "nope.gguf not found"),
    ("plain", "serving", "quantizes no module class, so 'serving' equals 'weights-only'"),
])
def test_bad_checkpoint_candidates_are_one_line(setup, name, path, expect):
    s = setup
    out = s["tmp"] / f"rec-{name}"
    proc = run_fideval("score", "--teacher", s["tmp"] / "teacher", "--config", s["tmp"] / "c.yaml", "--candidate", name,
                       "--path", path, "--out", out, "--device", "cpu", cwd=ROOT, fresh_process=True)
    assert proc.code == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and expect in proc.stderr
    assert not (out / "records.parquet").exists()
