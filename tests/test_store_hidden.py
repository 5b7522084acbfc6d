"""Hidden teacher stores (issue 41): the final norm's output and the head beside it, the FP32 logits replayed.

The oracle for replay is the logit store of the same run: ``fideval teacher --store logits`` on the same model,
windows and settings. Replayed logits must equal its logits bit for bit on the CPU at the lengths the demo uses (the
float32 GEMM takes the same kernel from a few dozen rows a call), and a candidate scored against either teacher
must give the same records; below that, within float32 sum-order rounding (measured here)."""

from __future__ import annotations

import json
import shutil

import model_fixtures as mf
import numpy as np
import pytest
import torch
from cli_runner import run_fideval

from fideval.errors import FidevalError
from fideval.model.teacher import run_teacher
from fideval.store import StoreReader
from fideval.store.reader import open_rows
from fideval.windows.layout import Sequences, length_dir, write_sequences

V = mf.COMMON["vocab_size"]


def _windows(root, length=600, n=2, seed=3):
    rng = np.random.default_rng(seed)
    win = rng.integers(0, V, size=(n, length)).astype(np.int32)
    ids = [f"{d}-000" for d in ("code", "prose", "web", "math")[:n]]
    write_sequences(length_dir(root, "windows", length), Sequences(ids, [i.split("-")[0] for i in ids], win))
    return win


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """One model, one set of windows, a logit store and a hidden store of the same run settings (and a candidate:
    the same architecture with other weights, as a logit store)."""
    tmp = tmp_path_factory.mktemp("hidden")
    model = mf.build("qwen3_moe", tmp / "model")
    other = mf.build("qwen3_moe", tmp / "other", seed=1)
    win = _windows(tmp / "w")
    kw = dict(device="cpu", kinds=("windows",), model_id="tiny/q", model_revision="r1")
    run_teacher(model, tmp / "w", tmp / "logits", store="logits", **kw)
    run_teacher(model, tmp / "w", tmp / "hidden", store="hidden", **kw)
    run_teacher(other, tmp / "w", tmp / "cand", store="logits", **kw)
    run_teacher(other, tmp / "w", tmp / "cand-hidden", store="hidden", **kw)
    return {"tmp": tmp, "model": model, "other": other, "win": win}


def test_a_hidden_store_keeps_the_norm_output_and_the_head(pair):
    tmp = pair["tmp"]
    r = StoreReader(tmp / "hidden")
    assert r.kind == "hidden" and int(r.meta["hidden_size"]) == mf.COMMON["hidden_size"]
    block = json.loads(r.meta["head"])
    from safetensors.torch import load_file

    w = load_file(str(tmp / "hidden" / "head.safetensors"))["weight"]
    ref = load_file(str(pair["model"] / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(w, ref.to(w.dtype))  # the head as released (the tiny model's is float32)
    import hashlib

    assert block["weight_sha256"] == hashlib.sha256(w.numpy().tobytes()).hexdigest()
    assert block["sha256"] == hashlib.sha256((tmp / "hidden" / "head.safetensors").read_bytes()).hexdigest()
    assert (block["lm_head"], block["finish"], block["source"], block["tied"], block["hidden_dtype"]) == \
        ("float32", None, "lm_head.weight", False, "float32")
    # the shard is the final norm's output: transformers' own model gives the same states
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(pair["model"], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        states = m.model(torch.from_numpy(pair["win"][:1]).long()).last_hidden_state[0]
    hidden, tokens = r.read_hidden("code-000")
    assert tokens.tolist() == pair["win"][0].tolist() and hidden.dtype == torch.float32
    assert float((hidden - states).abs().max()) <= 1e-5
    # 36x smaller at DeepSeek sizes; here H = 64 against V = 96 a row
    lg = StoreReader(tmp / "logits")
    assert r.entry("code-000")["bytes"] < lg.entry("code-000")["bytes"]


def test_replay_is_the_logit_store_bit_for_bit(pair):
    tmp = pair["tmp"]
    a, b = StoreReader(tmp / "logits"), open_rows(tmp / "hidden")
    for sid in a.seq_ids:
        la, ta = a.read(sid)
        lb, tb = b.read(sid)
        assert np.array_equal(ta, tb) and la.dtype == lb.dtype == np.float32
        assert la.tobytes() == lb.tobytes(), sid
    # StoreReader.read on a hidden store replays through the store's own head, the same bits
    assert StoreReader(tmp / "hidden").read("prose-000")[0].tobytes() == a.read("prose-000")[0].tobytes()


def test_replay_on_few_rows_is_within_float32_rounding(tmp_path):
    """Below a few dozen rows a call, the CPU's float32 GEMM may take another kernel than the teacher's: then replay is
    float32 sum-order rounding away from the logit store, never more."""
    model = mf.build("llama", tmp_path / "m")
    _windows(tmp_path / "w", length=7)
    kw = dict(device="cpu", kinds=("windows",), micro_batch=2)
    run_teacher(model, tmp_path / "w", tmp_path / "l", store="logits", **kw)
    run_teacher(model, tmp_path / "w", tmp_path / "h", store="hidden", **kw)
    a, b = StoreReader(tmp_path / "l"), StoreReader(tmp_path / "h")
    for sid in a.seq_ids:
        la, lb = a.read(sid)[0], b.read(sid)[0]
        rel = np.abs(la - lb).max() / max(np.abs(la).max(), 1e-30)
        assert rel <= 4 * np.finfo(np.float32).eps * 64  # H = 64 terms summed in another order


def _score(*args):
    return run_fideval("score", *args, "--device", "cpu")


def test_a_candidate_scores_the_same_against_either_teacher(pair):
    import pyarrow.parquet as pq

    tmp = pair["tmp"]
    for teacher in ("logits", "hidden"):
        res = _score("--teacher", tmp / teacher, "--candidate", tmp / "cand", "--out", tmp / f"rec-{teacher}", "--self-check")
        assert res.code == 0, res.stderr
    a, b = (pq.read_table(tmp / f"rec-{t}" / "records.parquet") for t in ("logits", "hidden"))
    for col in ("kld", "rkld", "top1", "nll_teacher", "nll_candidate"):
        if col in a.column_names:
            assert a.column(col).to_pylist() == b.column(col).to_pylist(), col
    s = json.loads((tmp / "rec-hidden" / "score.json").read_text())
    assert s["teacher"]["kind"] == "hidden" and s["self_check"]["max_kld"] == 0.0
    assert s["teacher"]["head_sha256"] == json.loads(StoreReader(tmp / "hidden").meta["head"])["weight_sha256"]
    # a hidden candidate store replays through its own head: the same records as its logit store
    res = _score("--teacher", tmp / "hidden", "--candidate", tmp / "cand-hidden", "--out", tmp / "rec-hh", "--name", "cand")
    assert res.code == 0, res.stderr
    c = pq.read_table(tmp / "rec-hh" / "records.parquet")
    assert c.column("kld").to_pylist() == b.column("kld").to_pylist()


def test_a_store_without_its_head_file_takes_the_model_head_checked(pair, tmp_path):
    tmp = pair["tmp"]
    bare = shutil.copytree(tmp / "hidden", tmp_path / "bare")
    (bare / "head.safetensors").unlink()
    res = _score("--teacher", bare, "--candidate", tmp / "cand", "--out", tmp_path / "r0")
    msg = res.error()
    assert "head file head.safetensors is missing" in msg and "--head-from" in msg
    res = _score("--teacher", bare, "--candidate", tmp / "cand", "--out", tmp_path / "r1", "--head-from", pair["other"])
    msg = res.error()  # the other model's head: both digests named
    want = json.loads(StoreReader(bare).meta["head"])["weight_sha256"]
    assert "is not the store's head " + want[:16] in msg
    res = _score("--teacher", bare, "--candidate", tmp / "cand", "--out", tmp_path / "r2", "--head-from", pair["model"])
    assert res.code == 0, res.stderr
    res = _score("--teacher", tmp / "logits", "--candidate", tmp / "cand", "--out", tmp_path / "r3")
    assert res.code == 0, res.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r2" / "records.parquet").column("kld").to_pylist() == \
        pq.read_table(tmp_path / "r3" / "records.parquet").column("kld").to_pylist()


def test_verify_checks_the_head_and_the_states(pair, tmp_path):
    tmp = pair["tmp"]
    res = run_fideval("verify", tmp / "hidden")
    assert res.code == 0, res.stdout + res.stderr
    bad = shutil.copytree(tmp / "hidden", tmp_path / "bad")
    from safetensors.torch import load_file, save_file

    w = load_file(str(bad / "head.safetensors"))["weight"]
    w[0, 0] += 1.0
    save_file({"weight": w}, str(bad / "head.safetensors"))
    res = run_fideval("verify", bad)
    assert res.code == 1 and "head.safetensors: SHA-256 differs from the manifest's head block" in res.stdout + res.stderr
    res = _score("--teacher", bad, "--candidate", tmp / "cand", "--out", tmp_path / "r")
    assert "is not the store's head" in res.error()


def test_bad_hidden_stores_are_one_line(pair, tmp_path):
    tmp = pair["tmp"]
    # a truncated shard
    t = shutil.copytree(tmp / "hidden", tmp_path / "trunc")
    p = t / "shards" / "code-000.safetensors"
    p.write_bytes(p.read_bytes()[:-100])
    msg = _score("--teacher", t, "--candidate", tmp / "cand", "--out", tmp_path / "r1").error()
    assert "code-000.safetensors" in msg and "truncated" in msg
    # a store written by a newer fideval (manifest version 3): this one reads 1 and 2
    n = shutil.copytree(tmp / "hidden", tmp_path / "newer")
    man = json.loads((n / "manifest.json").read_text())
    man["version"] = "3"
    (n / "manifest.json").write_text(json.dumps(man))
    msg = _score("--teacher", n, "--candidate", tmp / "cand", "--out", tmp_path / "r2").error()
    assert "store version '3' (a newer fideval); this fideval reads version 1, 2" in msg
    # a head block whose hidden size is not the shards'
    h = shutil.copytree(tmp / "hidden", tmp_path / "hsize")
    man = json.loads((h / "manifest.json").read_text())
    block = json.loads(man["meta"]["head"])
    block["hidden_size"] = 65
    man["meta"]["head"] = json.dumps(block)
    (h / "manifest.json").write_text(json.dumps(man))
    msg = _score("--teacher", h, "--candidate", tmp / "cand", "--out", tmp_path / "r3").error()
    assert "head hidden_size 65 differs from the store's 64" in msg
    for r in ("r1", "r2", "r3"):
        assert not (tmp_path / r / "records.parquet").exists()


def test_a_resumed_store_refuses_another_kind_or_head(pair, tmp_path):
    tmp = pair["tmp"]
    kw = dict(device="cpu", kinds=("windows",), model_id="tiny/q", model_revision="r1")
    with pytest.raises(FidevalError, match="has kind 'hidden', this run writes 'logits'"):
        run_teacher(pair["model"], tmp / "w", shutil.copytree(tmp / "hidden", tmp_path / "k"), store="logits", **kw)
    # half a store (one shard), then another model's head: refused before anything is written
    half = shutil.copytree(tmp / "hidden", tmp_path / "half")
    (half / "manifest.json").unlink()
    (half / "shards" / "prose-000.safetensors").unlink()
    before = (half / "head.safetensors").read_bytes()
    with pytest.raises(FidevalError):
        run_teacher(pair["other"], tmp / "w", half, store="hidden", **kw)
    assert (half / "head.safetensors").read_bytes() == before


def test_the_reference_codes_hidden_store_replays_its_own_float32_head(tmp_path):
    """DeepSeek's own inference code as the teacher (model.implementation: reference): the hidden store keeps what its
    ``finish`` hands the head (the final norm's output) and the head it applies (``F.linear(x.float(), W)``, W float32),
    and replays the logit store's bytes."""
    import ref_deepseek_v3 as rv3

    rv3.need_code()
    model = rv3.build(tmp_path / "model")
    _windows(tmp_path / "w", length=120)  # the tiny release's max_seq_len is 128
    common = ("--model", model, "--windows", tmp_path / "w", "--device", "cpu", "--implementation", "reference",
              "--trust-remote-code")
    for kind in ("hidden", "logits"):
        res = run_fideval("teacher", *common, "--out", tmp_path / kind, "--store", kind)
        assert res.code == 0, res.stderr
    h, lg = StoreReader(tmp_path / "hidden"), StoreReader(tmp_path / "logits")
    block = json.loads(h.meta["head"])
    assert (block["lm_head"], block["finish"], block["source"]) == ("float32", None, "head.weight (the reference code's)")
    assert json.loads(h.meta["teacher"])["implementation"] == "reference"
    for sid in lg.seq_ids:
        assert h.read(sid)[0].tobytes() == lg.read(sid)[0].tobytes(), sid


def test_materialize_writes_the_logit_store_a_logits_run_writes(pair, tmp_path):
    tmp = pair["tmp"]
    out = tmp_path / "mat"
    res = run_fideval("store", "materialize", tmp / "hidden", "--out", out, "--device", "cpu")
    assert res.code == 0, res.stderr
    assert "2 shards written, 0 already done" in res.stdout
    a, m = StoreReader(tmp / "logits"), StoreReader(out)
    assert m.kind == "logits" and m.seq_ids == a.seq_ids
    for sid in a.seq_ids:  # the shards' logit and token bytes are the logits run's
        assert m.read(sid)[0].tobytes() == a.read(sid)[0].tobytes()
        assert m.entry(sid)["rows"] == a.entry(sid)["rows"]
    mat = json.loads(m.meta["materialized"])
    assert mat["head_sha256"] == json.loads(StoreReader(tmp / "hidden").meta["head"])["weight_sha256"]
    assert m.meta["settings_sha256"] == a.meta["settings_sha256"]  # the same teacher, computed with the same settings
    assert run_fideval("verify", out).code == 0
    # resumable; and a logit store is not materialized again
    res = run_fideval("store", "materialize", tmp / "hidden", "--out", out, "--device", "cpu")
    assert res.code == 0 and "0 shards written, 2 already done" in res.stdout
    assert "already holds its logits" in run_fideval("store", "materialize", tmp / "logits", "--out", tmp_path / "x").error()


def test_every_store_has_a_dataset_card(pair):
    import yaml

    tmp = pair["tmp"]
    text = (tmp / "hidden" / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    r = StoreReader(tmp / "hidden")
    block = json.loads(r.meta["head"])
    x = front["x_fideval"]
    assert (x["kind"], x["model_id"], x["model_revision"], x["head_sha256"]) == ("hidden", "tiny/q", "r1", block["weight_sha256"])
    assert x["sequences"] == 2 and x["rows"] == 1200 and front["size_categories"] == ["1K<n<10K"]
    import hashlib

    assert x["manifest_sha256"] == hashlib.sha256((tmp / "hidden" / "manifest.json").read_bytes()).hexdigest()
    assert x["bytes"] == sum(r.entry(s)["bytes"] for s in r.seq_ids) + block["bytes"]
    for sid in r.seq_ids:  # each sequence's token hash, as the windows name it
        tokens = r.token_ids(sid)
        assert f"| {sid} | {sid} | 600 | `{hashlib.sha256(tokens.astype('<i4').tobytes()).hexdigest()}` |" in text
    assert yaml.safe_load((tmp / "logits" / "README.md").read_text().split("---\n")[1])["x_fideval"]["kind"] == "logits"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_states_keep_their_dtype_and_score_as_the_logit_store(tmp_path):
    """A bfloat16 run's states leave the GPU as bfloat16 (the background writer's page-locked copy keeps the dtype),
    and a candidate scored on the GPU against the replayed teacher gives the logit store's figures."""
    import pyarrow.parquet as pq

    from fideval.store.shard import read_header

    model, other = mf.build("qwen3_moe", tmp_path / "m"), mf.build("qwen3_moe", tmp_path / "o", seed=1)
    _windows(tmp_path / "w", length=600)
    kw = dict(device="cuda", dtype="bfloat16", kinds=("windows",))
    for out, m, kind in (("h", model, "hidden"), ("l", model, "logits"), ("c", other, "logits")):
        run_teacher(m, tmp_path / "w", tmp_path / out, store=kind, **kw)
    h = StoreReader(tmp_path / "h")
    assert read_header(h.path("code-000")).dtype == "BF16" and json.loads(h.meta["head"])["hidden_dtype"] == "bfloat16"
    assert h.entry("code-000")["bytes"] < 600 * mf.COMMON["hidden_size"] * 2 + 8192
    for t in ("h", "l"):
        res = run_fideval("score", "--teacher", tmp_path / t, "--candidate", tmp_path / "c", "--out", tmp_path / f"r{t}",
                          "--device", "cuda", "--self-check")
        assert res.code == 0, res.stderr
    a, b = (pq.read_table(tmp_path / f"r{t}" / "records.parquet").column("kld").to_numpy() for t in ("h", "l"))
    assert np.allclose(a, b, rtol=1e-5, atol=1e-9), float(np.abs(a - b).max())


def test_the_stores_of_a_run_share_one_head_file(pair, tmp_path):
    """The workflow's stores sit side by side (teacher/<length>/<domain>/): a store whose sibling already holds the same
    head hard-links that file; another head is written, not linked."""
    import os

    tmp = pair["tmp"]
    kw = dict(device="cpu", kinds=("windows",), model_id="tiny/q", model_revision="r1")
    run = tmp_path / "teacher" / "windows-600"
    for d in ("a", "b"):
        run_teacher(pair["model"], tmp / "w", run / d, store="hidden", **kw)
    run_teacher(pair["other"], tmp / "w", run / "c", store="hidden", **kw)
    heads = [os.stat(run / d / "head.safetensors") for d in "abc"]
    assert heads[0].st_ino == heads[1].st_ino and heads[0].st_nlink == 2
    assert heads[2].st_ino != heads[0].st_ino and heads[2].st_nlink == 1
    for d in "abc":
        assert run_fideval("verify", run / d).code == 0
    (run / "a" / "head.safetensors").unlink()  # one store's link gone: the other's head is whole
    assert run_fideval("verify", run / "b").code == 0
