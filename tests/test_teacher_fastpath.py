"""The runner's fast settings on the product path: the teacher records what it ran with (micro-batch, MLP token
block, chunk) and its profile; candidates run with the recorded settings; resumes keep them."""

from __future__ import annotations

import json

import model_fixtures as mf
import numpy as np
import pytest
import torch
import yaml
from cli_runner import run_fideval
from test_model_teacher import _windows

from fideval.formats.model import parse
from fideval.formats.score import RunProfile
from fideval.store import StoreReader

REV = "c" * 40


def _teacher(t, out, *extra):
    return run_fideval("teacher", "--model", t["model"], "--windows", t["tmp"] / "w" / "cuts-8" / "tokens.safetensors",
                       "--lengths", "cuts", "--device", "cpu", "--model-id", "toy/dsv3", "--model-revision", REV,
                       "--out", out, *extra)


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    """A tiny DeepSeek-V3's teacher store of the cuts (4 x 8 tokens) in the throughput mode on the CPU: micro-batches
    of 1, MLP blocks of 16 tokens (so blocks span micro-batches, and the canary's is its own)."""
    tmp = tmp_path_factory.mktemp("fast")
    model = mf.build("deepseek_v3", tmp / "model")
    _windows(tmp / "w")
    t = dict(tmp=tmp, model=model)
    res = _teacher(t, tmp / "teacher", "--micro-batch", "1", "--mlp-tokens", "16")
    assert res.code == 0, res.stderr
    t["stdout"] = res.stdout
    t["cfg"] = {"run": "t", "model": {"path": str(model), "id": "toy/dsv3", "revision": REV},
                "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}}],
                "candidates": [{"name": "same", "quant": {}, "paths": ["weights-only"]}]}
    return t


def _score(t, name, teacher=None, **teacher_keys):
    cfg = json.loads(json.dumps(t["cfg"]))
    if teacher_keys:
        cfg["teacher"] = teacher_keys
    path = t["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return run_fideval("score", "--teacher", teacher or t["tmp"] / "teacher", "--config", path, "--candidate", "same",
                       "--path", "weights-only", "--device", "cpu", "--out", t["tmp"] / name)


def test_the_store_records_the_settings_and_the_profile(fast):
    store = StoreReader(fast["tmp"] / "teacher")
    ran = json.loads(store.meta["teacher"])
    assert (ran["micro_batch"], ran["mlp_tokens"], ran["chunk_bytes"]) == (1, 16, None)
    prof = parse(RunProfile, json.loads(store.meta["profile"]), "profile")  # the documented model
    assert abs(sum(prof.parts.values()) - prof.wall_s) < 1e-5 and prof.tokens == 4 * 8
    assert {"startup", "attention", "moe", "dense_mlp", "head", "canary", "store_write", "other"} <= set(prof.parts)
    assert prof.model_flops > 0 and prof.flop_utilisation is None and set(prof.hidden) == {"load", "write"}
    assert "micro-batch 1, mlp tokens 16" in fast["stdout"] and "tokens/s" in fast["stdout"]
    # a shard carries the teacher block too (a killed run resumes from it), not the profile written at the end
    head = json.loads(json.dumps(store.meta))
    assert "profile" in head and json.loads(head["teacher"])["mlp_tokens"] == 16


def test_a_candidate_that_quantizes_nothing_reproduces_the_teacher_bit_for_bit(fast, monkeypatch):
    """The candidate path with the teacher's recorded settings, read from the manifest (the config sets none):
    the same bits, so every row's KLD is exactly 0; with the throughput mode off it would not be."""
    import fideval.model.runner as runner

    seen, real = [], runner.make_runner
    monkeypatch.setattr(runner, "make_runner", lambda w, o, **kw: seen.append(o) or real(w, o, **kw))
    res = _score(fast, "same")
    assert res.code == 0, res.stderr
    (o,) = seen
    assert (o.micro_batch, o.mlp_tokens, o.host_budget_bytes, o.profile, o.head) == (1, 16, None, True, "float32")
    summary = json.loads((fast["tmp"] / "same" / "score.json").read_text())
    ran = summary["candidate_info"]["run_settings"]
    assert summary["rows"] == 4 * 7 and ran["mlp_tokens"] == 16 and ran["lm_head"] == "float32"
    # the candidate's canary is recorded, and its logits being the teacher's (replayed from the hidden store), so is
    # its digest
    from fideval.model.execution.determinism import digest

    store = StoreReader(fast["tmp"] / "teacher")
    first = json.loads(store.meta["canary"])["seq_id"]
    assert ran["canary"]["identical"] is True and ran["canary"]["digest"] == "lin128-v1" and ran["canary"]["seq_id"] == first
    assert ran["canary"]["digest_start"] == ran["canary"]["digest_end"] == digest(torch.from_numpy(np.array(store.read(first)[0])))
    import pyarrow.parquet as pq

    kld = pq.read_table(fast["tmp"] / "same" / "records.parquet", columns=["kld"]).column("kld").to_numpy()
    assert len(kld) == 28 and np.all(kld == 0.0)
    prof = summary["profile"]
    assert abs(sum(prof["parts"].values()) - prof["wall_s"]) < 1e-5 and prof["tokens"] == 4 * 8
    assert prof["parts"]["scoring"] > 0 and prof["parts"]["moe"] > 0 and prof["parts"]["read_back"] > 0
    assert "tokens/s" in res.stdout


def test_the_same_model_without_the_teacher_s_block_differs(fast, tmp_path):
    """Control for the test above: the throughput mode does shape the bits, so recording it matters."""
    from fideval.model.runner import Runner, RunnerOptions

    store = StoreReader(fast["tmp"] / "teacher")
    toks = np.stack([store.token_ids(s) for s in store.seq_ids])
    plain = dict(Runner(fast["model"], RunnerOptions(micro_batch=1)).run(toks))
    blocks = dict(Runner(fast["model"], RunnerOptions(micro_batch=1, mlp_tokens=16)).run(toks))
    stored = {k: store.read(s)[0] for k, s in enumerate(store.seq_ids)}
    assert all(np.array_equal(blocks[k].numpy(), stored[k]) for k in stored)
    assert any(not np.array_equal(plain[k].numpy(), stored[k]) for k in stored)


@pytest.mark.parametrize(("key", "mine", "theirs"), [("mlp_tokens", 64, "16"), ("mlp_tokens", None, "16"), ("chunk_bytes", 4096, "None"),
                                                 ("lm_head", "bf16", "'float32'")])
def test_a_config_asking_for_other_settings_is_refused(fast, key, mine, theirs):
    msg = _score(fast, f"conflict-{key}-{mine}", **{key: mine}).error()
    assert f"config teacher.{key} is {mine!r} but" in msg and f"was made with {key} {theirs}" in msg
    assert _score(fast, f"auto-{key}", **{key: "auto"}).code == 0  # auto follows the store


def test_an_older_store_without_the_keys_means_no_throughput_mode(fast, tmp_path, monkeypatch):
    import shutil

    import fideval.model.runner as runner

    old = shutil.copytree(fast["tmp"] / "teacher", tmp_path / "old")
    man = json.loads((old / "manifest.json").read_text())
    block = json.loads(man["meta"]["teacher"])
    for k in ("mlp_tokens", "chunk_bytes"):
        block.pop(k)
    man["meta"]["teacher"] = json.dumps(block, sort_keys=True)
    (old / "manifest.json").write_text(json.dumps(man))
    seen, real = [], runner.make_runner
    monkeypatch.setattr(runner, "make_runner", lambda w, o, **kw: seen.append(o) or real(w, o, **kw))
    assert _score(fast, "old", teacher=old).code == 0
    assert (seen[0].micro_batch, seen[0].mlp_tokens) == (1, None)


def test_a_resume_keeps_the_store_s_settings(fast, tmp_path):
    """auto on a resume means what the store was written with (on a CPU auto alone would be no throughput mode),
    whether read from the manifest or, when there is none yet, from a shard's header; a number that differs is
    refused. Either way the rewritten shards are the original bytes."""
    import shutil

    store = shutil.copytree(fast["tmp"] / "teacher", tmp_path / "resumed")
    shards = sorted((store / "shards").glob("*.safetensors"))
    original = {p.name: p.read_bytes() for p in shards}
    shards[1].unlink()
    assert "was written with mlp_tokens 16, this run asks for 32" in _teacher(fast, store, "--mlp-tokens", "32").error()
    res = _teacher(fast, store)
    assert res.code == 0 and "1 sequences written, 3 already done" in res.stdout and "mlp tokens 16" in res.stdout
    assert {p.name: p.read_bytes() for p in sorted((store / "shards").glob("*.safetensors"))} == original
    (store / "manifest.json").unlink()  # no manifest: the settings come from the shards' own teacher block
    res = _teacher(fast, store)
    assert res.code == 0 and "mlp tokens 16" in res.stdout
    assert {p.name: p.read_bytes() for p in sorted((store / "shards").glob("*.safetensors"))} == original


def test_the_python_m_entry_takes_the_same_flags(fast, tmp_path, capsys):
    from fideval.model.teacher import main

    rc = main(["--model", str(fast["model"]), "--windows", str(fast["tmp"] / "w" / "cuts-8" / "tokens.safetensors"),
               "--lengths", "cuts", "--device", "cpu", "--model-id", "toy/dsv3", "--model-revision", REV,
               "--micro-batch", "2", "--mlp-tokens", "off", "--chunk-bytes", "1024", "--out", str(tmp_path / "m")])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["settings"] == {"micro_batch": 2, "mlp_tokens": None, "chunk_bytes": 1024} and out["profile"]["wall_s"] > 0
    assert main(["--model", str(fast["model"]), "--windows", str(fast["tmp"] / "w"), "--out", str(tmp_path / "n"),
                 "--mlp-tokens", "lots"]) == 2
    assert "--mlp-tokens 'lots': expected a positive integer, auto or off" in capsys.readouterr().err


def test_a_resume_computes_whole_chunks_and_checks_the_canary_against_the_stored_shard(fast, tmp_path):
    """Chunks of one sequence (--chunk-bytes = one cut's hidden states): a resume that misses the last sequence
    computes the last chunk alone (and the canary's repeat, which belongs to it); the canary's first pass is
    the stored first shard, and the repeat must equal it bit for bit."""
    store = tmp_path / "chunked"
    one = 8 * 64 * 4  # L x H x float32
    assert _teacher(fast, store, "--micro-batch", "1", "--mlp-tokens", "16", "--chunk-bytes", str(one)).code == 0
    shards = sorted((store / "shards").glob("*.safetensors"))
    original = {p.name: p.read_bytes() for p in shards}
    (store / "shards" / "prose-000.c1.safetensors").unlink()
    res = _teacher(fast, store)
    assert res.code == 0 and "1 sequences written, 3 already done; canary cuts-8 identical" in res.stdout, res.stdout
    assert {p.name: p.read_bytes() for p in sorted((store / "shards").glob("*.safetensors"))} == original
    canary = json.loads(StoreReader(store).meta["canary"])
    assert canary["seq_id"] == "code-000.c0" and canary["identical"] is True


def test_skipping_keeps_the_composition(fast):
    """Runner.iter_logits with a skip: the chunks holding a wanted sequence are computed whole (the same bits
    as a run over all), the others not at all."""
    from fideval.model.runner import Runner, RunnerOptions
    from fideval.windows.layout import Sequences

    toks = mf.tokens(mf.COMMON["vocab_size"], n=6, length=8)
    seqs = Sequences([f"s-{i:03d}" for i in range(6)], ["d"] * 6, toks)
    opts = RunnerOptions(micro_batch=1, mlp_tokens=16, host_budget_bytes=2 * 8 * 64 * 4)  # chunks of 2 sequences
    full = dict(Runner(fast["model"], opts).iter_logits(seqs))
    r = Runner(fast["model"], opts)
    part = dict(r.iter_logits(seqs, skip=lambda sid: sid != "s-003", stored_digest=lambda sid: None))
    assert list(part) == ["s-003"] and np.array_equal(part["s-003"].numpy(), full["s-003"].numpy())
    assert r.stats["chunks"] == 1 and r.canary is None  # chunk 1 of 3; the canary's chunks were not computed


def test_a_candidate_whose_canary_changed_fails_after_writing_its_records(fast, monkeypatch):
    """As the teacher: the records and score.json are written (score.json says what changed), the command fails in
    one line, and the report's canary check fails on that score.json."""
    from fideval.model.execution import hooks

    real = hooks.Canary.last

    def drifted(self, row, logits):
        real(self, row, logits + 1.0)

    monkeypatch.setattr(hooks.Canary, "last", drifted)
    res = _score(fast, "drift")
    assert res.code == 2 and res.stderr.count("fideval: error") == 1, res.stderr
    assert "the canary of same/weights-only" in res.stderr and "changed between the start and the end" in res.stderr
    summary = json.loads((fast["tmp"] / "drift" / "score.json").read_text())
    c = summary["candidate_info"]["run_settings"]["canary"]
    assert c["identical"] is False and c["digest_start"] != c["digest_end"]
    assert (fast["tmp"] / "drift" / "records.parquet").exists()
    from fideval.report.checks import canary
    from fideval.report.inputs import load_records

    check = canary([], load_records(fast["tmp"] / "drift"))
    assert check["status"] == "fail" and check["runs"] == 1 and "same/weights-only" in check["detail"]
