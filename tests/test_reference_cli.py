"""``fideval teacher`` and ``fideval score --config`` with ``model.implementation: reference`` on a tiny DeepSeek-V3
release (tests/ref_deepseek_v3.py): the store holds the driver's own logits and records the code's SHA-256 per
file and its kernels; an MXFP4 routed-experts candidate computes what the vendor's own forward computes on
weights quantize-dequantized here with fideval.quant's MXFP4; refusals are one line and write nothing."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import numpy as np
import pytest
import ref_deepseek_v3 as rv3
import torch
import yaml
from cli_runner import run_fideval
from test_model_teacher import _windows

from fideval.store import StoreReader

REV = "a" * 40


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    rv3.need_code()
    tmp = tmp_path_factory.mktemp("refcli")
    model = rv3.build(tmp / "model")
    _windows(tmp / "w", vocab=512, tokenizer_sha="b" * 64)
    cfg = {"run": "t", "model": {"path": str(model), "id": "toy/v3", "revision": REV, "implementation": "reference",
                                 "trust_remote_code": True},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}}],
           "teacher": {"device": "cpu", "micro_batch": 2},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}}, "paths": ["weights-only"]}]}
    path = tmp / "ref.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = run_fideval("teacher", "--config", path, "--windows", tmp / "w" / "cuts-8" / "tokens.safetensors",
                      "--lengths", "cuts", "--out", tmp / "teacher")
    assert res.code == 0, res.stderr
    return dict(tmp=tmp, model=model, cfg=cfg, path=path)


def test_teacher_store_holds_the_drivers_logits_and_the_codes_provenance(taught):
    store = StoreReader(taught["tmp"] / "teacher")
    ran = json.loads(store.meta["teacher"])
    assert ran["implementation"] == "reference" and ran["runner"] == "fideval.model.reference.runner"
    code = ran["reference_code"]
    assert code["files"]["model.py"] == hashlib.sha256((rv3.V3_CODE / "model.py").read_bytes()).hexdigest()
    assert code["kernels"]["attention"].startswith("vendor MLA")
    assert ran["micro_batch"] == 2 and ran["mlp_tokens"] is None
    drv = rv3.driver(taught["model"])
    ids = sorted(store.seq_ids)
    toks = torch.from_numpy(np.stack([store.token_ids(s) for s in ids[:2]]).astype(np.int64))
    ref = rv3.layer_by_layer(drv, toks)  # the store's first micro-batch, as the runner composed it
    for k, sid in enumerate(ids[:2]):
        assert torch.equal(torch.from_numpy(np.asarray(store.read(sid)[0], dtype=np.float32)), ref[k])


def test_mxfp4_experts_candidate_is_the_vendors_forward_on_mxfp4_weights(taught, tmp_path):
    from fideval.config import load_config
    from fideval.quant.base import get_format
    from fideval.score.candidate import from_config

    cfg = load_config(taught["path"])
    cand = from_config(cfg, "mx", "weights-only", StoreReader(taught["tmp"] / "teacher"), "cpu")
    assert cand.info["run_settings"]["reference_code"]["implementation"] == "reference"
    got = {s.seq_id: s.logits for s in cand.shards}
    # the independent emulation: the release with its routed experts quantize-dequantized here, the vendor's forward
    emu = tmp_path / "emu"
    shutil.copytree(taught["model"], emu, symlinks=True)
    from safetensors.torch import load_file, save_file

    sd = load_file(str(emu / "model.safetensors"))
    mx = get_format("mxfp4")
    n = 0
    for k, v in sd.items():
        if ".mlp.experts." in k and k.endswith("_proj.weight"):
            sd[k], n = mx.quant_dequant(v, None, None), n + 1
    assert n == 2 * 8 * 3
    save_file(sd, str(emu / "model.safetensors"), metadata={"format": "pt"})
    drv = rv3.driver(emu)
    store = StoreReader(taught["tmp"] / "teacher")
    ids = sorted(store.seq_ids)
    toks = torch.from_numpy(np.stack([store.token_ids(s) for s in ids]).astype(np.int64))
    for a in range(0, len(ids), 2):
        ref = drv.vendor_logits(toks[a:a + 2])
        for k in range(2):
            mine = torch.as_tensor(np.asarray(got[ids[a + k]]))[-1]
            assert (mine - ref[k]).abs().max().item() <= 1e-6 * ref.abs().max().item()
            teacher = torch.from_numpy(np.asarray(store.read(ids[a + k])[0], dtype=np.float32))[-1]
            assert (mine - teacher).abs().max().item() > 1e-3  # MXFP4 experts moved the logits


def test_score_with_the_reference_config_records_the_code(taught):
    res = run_fideval("score", "--teacher", taught["tmp"] / "teacher", "--config", taught["path"], "--candidate", "mx",
                      "--path", "weights-only", "--device", "cpu", "--out", taught["tmp"] / "scored")
    assert res.code == 0, res.stderr
    summary = json.loads((taught["tmp"] / "scored" / "score.json").read_text())
    info = summary["candidate_info"]
    assert info["run_settings"]["reference_code"]["files"]["model.py"] == \
        hashlib.sha256((rv3.V3_CODE / "model.py").read_bytes()).hexdigest()
    assert summary["rows"] == 4 * 7
    import polars as pl

    kld = pl.read_parquet(taught["tmp"] / "scored" / summary["records"])["kld"].to_numpy()
    assert len(kld) == 4 * 7 and np.isfinite(kld).all() and 0 < kld.mean() < 5 and math.isfinite(kld.max())


def test_scoring_in_another_implementation_than_the_teacher_is_refused(taught):
    cfg = json.loads(json.dumps(taught["cfg"]))
    cfg["model"]["implementation"] = "transformers"
    path = taught["tmp"] / "tf.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = run_fideval("score", "--teacher", taught["tmp"] / "teacher", "--config", path, "--candidate", "mx",
                      "--path", "weights-only", "--device", "cpu", "--out", taught["tmp"] / "never")
    assert "model.implementation is 'transformers' but" in res.error()
    assert not (taught["tmp"] / "never").exists()


def test_reference_without_trust_is_a_one_line_refusal(taught):
    cfg = json.loads(json.dumps(taught["cfg"]))
    cfg["model"]["trust_remote_code"] = False
    path = taught["tmp"] / "untrusted.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = run_fideval("teacher", "--config", path, "--windows", taught["tmp"] / "w", "--out", taught["tmp"] / "never2")
    assert "set model.trust_remote_code: true" in res.error()
    assert not (taught["tmp"] / "never2").exists()


def test_teacher_options_select_the_reference_code_without_a_config(taught, tmp_path, monkeypatch):
    from fideval.model import sizing

    asked, choose = [], sizing.choose
    monkeypatch.setattr(sizing, "choose", lambda *a, **kw: asked.append(kw) or choose(*a, **kw))
    w = taught["tmp"] / "w" / "cuts-8" / "tokens.safetensors"
    res = run_fideval("teacher", "--model", taught["model"], "--windows", w, "--lengths", "cuts", "--device", "cpu",
                      "--micro-batch", "2", "--implementation", "reference", "--out", tmp_path / "never")
    assert "needs explicit trust" in res.error() and not (tmp_path / "never").exists()
    res = run_fideval("teacher", "--model", taught["model"], "--windows", w, "--lengths", "cuts", "--device", "cpu",
                      "--micro-batch", "2", "--implementation", "reference", "--trust-remote-code", "--out", tmp_path / "s")
    assert res.code == 0, res.stderr
    a, b = StoreReader(tmp_path / "s"), StoreReader(taught["tmp"] / "teacher")
    assert json.loads(a.meta["teacher"])["implementation"] == "reference"
    assert all(np.array_equal(a.read(s)[0], b.read(s)[0]) for s in b.seq_ids)
    assert [(kw["math_attention"], kw["split_heads"]) for kw in asked] == [(True, True)]  # the vendor's attention


def test_the_configs_grouped_experts_reach_the_teacher_and_the_candidate(taught, tmp_path):
    """model.reference_experts: grouped in the config reaches the teacher's and the candidate's runners: the store's
    provenance and score.json say what computed the routed experts; on the CPU the grouped path's logits are the vendor
    loop's bit for bit (docs/runner.md, 'Grouped experts'), so the store's shards are the vendor loop's bytes; a resumed
    store refuses the other experts path in one line (it is part of the settings' fingerprint)."""
    cfg = {**taught["cfg"], "model": {**taught["cfg"]["model"], "reference_experts": "grouped"}}
    path = tmp_path / "grouped.yaml"
    path.write_text(yaml.safe_dump(cfg))
    w = taught["tmp"] / "w" / "cuts-8" / "tokens.safetensors"
    res = run_fideval("teacher", "--config", path, "--windows", w, "--lengths", "cuts", "--out", tmp_path / "teacher")
    assert res.code == 0, res.stderr
    grouped, vendor = StoreReader(tmp_path / "teacher"), StoreReader(taught["tmp"] / "teacher")
    assert "grouped" in json.loads(grouped.meta["teacher"])["reference_code"]["kernels"]["routed_experts"]
    assert "grouped" not in json.loads(vendor.meta["teacher"])["reference_code"]["kernels"].get("routed_experts", "")
    for sid in grouped.seq_ids:  # the shards' meta names the path; their rows are the vendor loop's
        a, b = (np.asarray(s.read(sid)[0], dtype=np.float32) for s in (grouped, vendor))
        assert np.array_equal(a, b), sid
    res = run_fideval("score", "--teacher", tmp_path / "teacher", "--config", path, "--candidate", "mx", "--path",
                      "weights-only", "--device", "cpu", "--out", tmp_path / "scored")
    assert res.code == 0, res.stderr
    ran = json.loads((tmp_path / "scored" / "score.json").read_text())["candidate_info"]["run_settings"]
    assert "grouped" in ran["reference_code"]["kernels"]["routed_experts"]
    # resuming the grouped store with the vendor's loop: refused, nothing written
    shards = tmp_path / "teacher" / "shards"
    last = sorted(shards.glob("*.safetensors"))[-1]
    for f in shards.glob(last.name.removesuffix(".safetensors") + ".*"):
        f.unlink()
    before = {f.name: f.read_bytes() for f in shards.glob("*.safetensors")}
    res = run_fideval("teacher", "--config", path, "--windows", w, "--lengths", "cuts", "--out", tmp_path / "teacher",
                      "--reference-experts", "vendor")
    assert res.code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert {f.name: f.read_bytes() for f in shards.glob("*.safetensors")} == before  # the finished shards kept
