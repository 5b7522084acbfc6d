"""The reference-code runner (fideval.model.reference.runner): the transformers runner's interface and outer loop
with a family driver doing the model; its logits are the driver's own layer-by-layer logits, bit for bit."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest
import ref_deepseek_v3 as rv3
import torch

from fideval.errors import FidevalError
from fideval.model.runner import RunnerOptions, make_runner


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    rv3.need_code()
    return rv3.build(tmp_path_factory.mktemp("v3") / "fp8", fp8=True)


def _opts(**kw):
    return RunnerOptions(implementation="reference", trust_remote_code=True, **kw)


def _seqs(n=5, L=16):
    toks = rv3.tokens(n, L, seed=7).numpy().astype(np.int32)
    return SimpleNamespace(ids=[f"s{i}" for i in range(n)], tokens=toks)


@pytest.mark.parametrize("mb,prefetch", [(1, True), (2, False), (2, True)])
def test_runner_logits_are_the_drivers_layer_by_layer(model, mb, prefetch):
    seqs = _seqs()
    r = make_runner(model, _opts(micro_batch=mb, prefetch=prefetch, profile=True))
    got = dict(r.iter_logits(seqs))
    assert list(got) == seqs.ids
    drv = rv3.driver(model)
    for a in range(0, 5, mb):
        ref = rv3.layer_by_layer(drv, torch.from_numpy(seqs.tokens[a:a + mb]).long())
        for k in range(ref.shape[0]):
            assert torch.equal(got[seqs.ids[a + k]], ref[k])
    assert r.canary["identical"] is True and r.canary["seq_id"] == "s0"
    stats = r.finish_profile()
    assert stats["tokens"] == 5 * 16 and {"moe", "attention", "dense_mlp", "head"} <= set(stats["parts"])
    assert r.ledger.peak <= 2 * r.ledger.largest  # the current layer and the one prefetched, never the model


def test_skipped_sequences_keep_the_composition(model):
    seqs = _seqs(4)
    opts = _opts(micro_batch=2, host_budget_bytes=2 * 16 * 256 * 4)  # chunks of 2 sequences
    full = dict(make_runner(model, opts).iter_logits(seqs))
    r = make_runner(model, opts)
    part = dict(r.iter_logits(seqs, skip={"s0", "s1"}.__contains__))
    assert list(part) == ["s2", "s3"] and r.stats["chunks"] == 1
    assert all(torch.equal(part[k], full[k]) for k in part)


def test_provenance_records_every_files_sha256_and_the_kernels(model):
    r = make_runner(model, _opts())
    p = r.provenance()
    assert p["implementation"] == "reference" and p["family"] == "deepseek_v3"
    assert p["files"]["model.py"] == hashlib.sha256((rv3.V3_CODE / "model.py").read_bytes()).hexdigest()
    assert set(p["files"]) >= {"model.py", "kernel.py", "convert.py", "configs/config_671B.json"}
    assert p["modules"] == {"kernel": "fideval.model.reference.deepseek_v3_kernels"}
    assert p["kernels"]["weight_dequant"] == "fideval.model.reference.deepseek_v3_kernels"
    assert "FP8 E4M3" in r.weights_description and "reference code" in r.weights_description
    assert r.vocab_size == 512


def test_refusals_are_one_line_errors(model, tmp_path):
    with pytest.raises(FidevalError, match="needs explicit trust"):
        make_runner(model, RunnerOptions(implementation="reference"))
    with pytest.raises(FidevalError, match="does not exist"):
        make_runner(model, _opts(code=str(tmp_path / "nowhere")))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model.py").write_text("class ModelArgs:\n    pass\n")
    with pytest.raises(FidevalError, match="does not define Transformer, Block"):
        make_runner(model, _opts(code=str(tmp_path / "other")))
    with pytest.raises(FidevalError, match="model.implementation 'vllm'"):
        make_runner(model, RunnerOptions(implementation="vllm"))
