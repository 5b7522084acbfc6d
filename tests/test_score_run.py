"""``fideval score`` end to end on tiny stores made with StoreWriter: records, score.json, and every refusal."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from cli_runner import run_fideval
from scipy.special import log_softmax, rel_entr

from fideval.errors import FidevalError
from fideval.formats.records import COLUMNS
from fideval.fsio import sha256_file
from fideval.score import run as score_run
from fideval.score.candidate import Candidate, CandidateShard
from fideval.store import StoreReader, StoreWriter

VOCAB = 300
LENGTHS = {"code-000.c0": 9, "code-000.c1": 9, "prose-000.c0": 2}  # the last: a one-row shard


def _meta(vocab=VOCAB):
    return {"model_id": "toy/teacher", "model_revision": "0" * 40, "tokenizer_sha256": "a" * 64,
            "vocab_size": vocab, "kind": "logits"}


def _make(root, logits_of, tokens_of, vocab=VOCAB):
    w = StoreWriter(root, _meta(vocab))
    for sid in LENGTHS:
        w.write(sid, logits_of[sid], tokens_of[sid], window_id=sid.split(".c")[0], domain=sid.split("-")[0])
    w.finish()
    return root


@pytest.fixture()
def stores(tmp_path):
    rng = np.random.default_rng(0)
    tokens = {s: rng.integers(0, VOCAB, n).astype(np.int32) for s, n in LENGTHS.items()}
    ref = {s: (rng.standard_normal((n, VOCAB)) * 3).astype(np.float32) for s, n in LENGTHS.items()}
    cand = {s: (x + rng.standard_normal(x.shape).astype(np.float32) * 0.2).astype(np.float32) for s, x in ref.items()}
    return dict(teacher=_make(tmp_path / "teacher", ref, tokens), candidate=_make(tmp_path / "cand", cand, tokens),
                ref=ref, cand=cand, tokens=tokens, tmp=tmp_path)


def _invoke(*args):
    return run_fideval("score", *args)


def test_cli_scores_a_candidate_store(stores):
    out = stores["tmp"] / "records"
    res = _invoke("--teacher", stores["teacher"], "--candidate", stores["candidate"], "--out", out,
                  "--cpu-check-every", 3, "--device", "cpu", "--name", "q4")
    assert res.code == 0, res.stderr
    table = pq.read_table(out / "records.parquet")
    assert [(f.name, str(f.type)) for f in table.schema] == [(n, {"string": "string", "int32": "int32", "float64": "double",
                                                               "bool": "bool"}[k]) for n, k in COLUMNS]
    assert pq.ParquetFile(out / "records.parquet").num_row_groups == len(LENGTHS)  # one per shard
    df = table.to_pandas()
    assert len(df) == sum(n - 1 for n in LENGTHS.values())
    for _, row in df.sample(6, random_state=0).iterrows():
        sid, r = row.seq_id, row.position
        lp = log_softmax(stores["ref"][sid][r].astype(np.float64))
        lq = log_softmax(stores["cand"][sid][r].astype(np.float64))
        assert row.token == stores["tokens"][sid][r + 1] and row.length == LENGTHS[sid]
        assert row.kld == pytest.approx(rel_entr(np.exp(lp), np.exp(lq)).sum(), rel=1e-10, abs=1e-14)
        assert row.nll_ref == pytest.approx(-lp[row.token], rel=1e-12)
        assert row.top1 == (np.argmax(lp) == np.argmax(lq)) and row.ref_correct == (np.argmax(lp) == row.token)
        assert row.window_id == sid.split(".c")[0] and row.candidate == "q4" and row.path == "store"
    s = json.loads((out / "score.json").read_text())
    assert s["format"] == "fideval.score" and s["version"] == 1 and s["rows"] == len(df) and s["length"] is None
    assert s["teacher"]["manifest_sha256"] == sha256_file(stores["teacher"] / "manifest.json")
    assert s["teacher"]["kind"] == "logits"
    # the candidate store's provenance: as given, its manifest's hash, and the identity its manifest records
    assert s["candidate_info"] == {"source": "store", "store": str(stores["candidate"]), "kind": "logits",
                                   "manifest_sha256": sha256_file(stores["candidate"] / "manifest.json"),
                                   "model_id": "toy/teacher", "model_revision": "0" * 40}
    # run rows 0, 3, 6, 9, 12, 15 (global count) plus each shard's first and last: {0,3,6,7} {8,9,12,15} {16}
    assert s["cpu_check"]["rows_checked"] == 9 and 0 < s["cpu_check"]["max_rel_diff"] <= 2e-12
    assert s["kernel"] == "torch" and s["device"] == "cpu" and s["nonfinite_rows"] == 0 and s["self_check"] is None


def test_self_check_alone_and_before_a_candidate(stores):
    out = stores["tmp"] / "self"
    res = _invoke("--teacher", stores["teacher"], "--self-check", "--out", out, "--device", "cpu")
    assert res.code == 0, res.stderr
    df = pq.read_table(out / "records.parquet").to_pandas()
    assert (df.kld == 0).all() and (df.rkld == 0).all() and df.top1.all() and (df.dp == 0).all()
    s = json.loads((out / "score.json").read_text())
    assert s["self_check"] == {"max_kld": 0.0, "top1": 1.0, "rows": len(df)}
    out2 = stores["tmp"] / "both"
    res = _invoke("--teacher", stores["teacher"], "--candidate", stores["candidate"], "--self-check", "--out", out2)
    assert res.code == 0, res.stderr
    s2 = json.loads((out2 / "score.json").read_text())
    assert s2["self_check"]["max_kld"] == 0.0 and s2["rows"] == len(df)
    assert pq.read_table(out2 / "records.parquet").column("kld").to_numpy().min() > 0


def test_vocab_mismatch_is_one_line_before_scoring(stores):
    rng = np.random.default_rng(1)
    wide = _make(stores["tmp"] / "wide", {s: rng.standard_normal((n, VOCAB + 1)).astype(np.float32) for s, n in LENGTHS.items()},
                 stores["tokens"], vocab=VOCAB + 1)
    out = stores["tmp"] / "r"
    proc = run_fideval("score", "--teacher", stores["teacher"], "--candidate", wide, "--out", out, fresh_process=True)
    assert proc.code == 2
    assert proc.stderr.count("\n") == 1 and "vocab_size 301 differs from the teacher's 300" in proc.stderr
    assert not out.exists()


def test_token_mismatch_names_the_shard(stores):
    tokens = {s: t.copy() for s, t in stores["tokens"].items()}
    tokens["code-000.c1"][4] += 1
    other = _make(stores["tmp"] / "other", stores["cand"], tokens)
    res = _invoke("--teacher", stores["teacher"], "--candidate", other, "--out", stores["tmp"] / "r")
    assert "shard code-000.c1: candidate token ids differ from the teacher's (first at position 4)" in res.error()
    assert not (stores["tmp"] / "r" / "records.parquet").exists()


def _runner_like(stores, nan_at=None):
    """A model run's candidate, as fideval.model.runner.iter_logits feeds it: float32 [L, V] with all L rows."""
    def shards():
        for sid in LENGTHS:
            x = torch.from_numpy(stores["cand"][sid].copy())
            if nan_at and nan_at[0] == sid:
                x[nan_at[1], 7] = float("nan")
            yield CandidateShard(sid, x)
    return Candidate(name="q4", path="serving", shards=shards())


def _on_cpu(**kw):
    return score_run.ScoreSettings(device="cpu", **kw)


def test_iterator_candidates_and_nonfinite_rows(stores):
    teacher = StoreReader(stores["teacher"])
    out = stores["tmp"] / "it"
    s = score_run.score_candidate(teacher, _runner_like(stores), out, _on_cpu(cpu_check_every=1))
    assert s["rows"] == 17 and s["cpu_check"]["rows_checked"] == 17 and s["path"] == "serving"
    with pytest.raises(FidevalError, match=r"shard code-000\.c1: row 5 .*NaN"):
        score_run.score_candidate(teacher, _runner_like(stores, ("code-000.c1", 5)), stores["tmp"] / "bad", _on_cpu())
    assert not (stores["tmp"] / "bad" / "records.parquet").exists()
    s = score_run.score_candidate(teacher, _runner_like(stores, ("code-000.c1", 5)), stores["tmp"] / "skip",
                                  _on_cpu(on_nonfinite="skip"))
    df = pq.read_table(stores["tmp"] / "skip" / "records.parquet").to_pandas()
    assert s["nonfinite_rows"] == 1 and len(df) == 16 and 5 not in df[df.seq_id == "code-000.c1"].position.values
    with pytest.raises(FidevalError, match="does not match the teacher's vocab 300"):
        wrong = Candidate(name="x", path="serving", shards=[CandidateShard("code-000.c0", torch.zeros(9, 299))])
        score_run.score_candidate(teacher, wrong, stores["tmp"] / "v", _on_cpu())


def test_cpu_check_failure_fails_loudly_and_writes_nothing(stores, monkeypatch):
    real = score_run.score_tensors

    def off_by_a_little(ref, cand, targets, kernel):
        figs, flags, bad = real(ref, cand, targets, kernel)
        figs[:, 0] *= 1 + 1e-10  # a kernel bug far below what any test of the mean would see
        return figs, flags, bad

    monkeypatch.setattr(score_run, "score_tensors", off_by_a_little)
    with pytest.raises(FidevalError, match="CPU check failed: kld differs from the float64 reference"):
        score_run.score_candidate(StoreReader(stores["teacher"]), _runner_like(stores), stores["tmp"] / "f", _on_cpu())
    assert not (stores["tmp"] / "f").exists() or not any((stores["tmp"] / "f").iterdir())


# --- settings read back from the teacher manifest (a model-run candidate scored with --config) ---------------

REV = "a" * 40


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    """A tiny llama's teacher store of the cuts alone, made with ``--micro-batch 4`` from the cuts' token file
    (the file the workflow's teacher rule declares), and a config whose candidate emulates MXFP4 dense MLPs."""
    import model_fixtures as mf
    from test_model_teacher import _windows

    tmp = tmp_path_factory.mktemp("taught")
    model = mf.build("llama", tmp / "model")
    _windows(tmp / "w", tokenizer_sha="b" * 64)
    res = run_fideval("teacher", "--model", model, "--windows", tmp / "w" / "cuts-8" / "tokens.safetensors", "--lengths", "cuts",
                      "--micro-batch", "4", "--device", "cpu", "--model-id", "toy/llama", "--model-revision", REV, "--out", tmp / "teacher")
    assert res.code == 0, res.stderr
    cfg = {"run": "t", "model": {"path": str(model), "id": "toy/llama", "revision": REV},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}}], "score": {"cpu_check_tolerance": 1e-9},
           "candidates": [{"name": "mx", "quant": {"dense_mlp": {"format": "mxfp4"}}, "paths": ["weights-only"]}]}
    return dict(tmp=tmp, model=model, cfg=cfg)


def _score_config(t, name, **edits):
    import yaml

    cfg = json.loads(json.dumps(t["cfg"]))
    for key, value in edits.items():  # "teacher__micro_batch": 2 -> cfg["teacher"]["micro_batch"] = 2
        section, field = key.split("__")
        cfg.setdefault(section, {})[field] = value
    path = t["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return run_fideval("score", "--teacher", t["tmp"] / "teacher", "--config", path, "--candidate", "mx", "--path", "weights-only",
                       "--device", "cpu", "--out", t["tmp"] / name)


def test_teacher_given_a_token_file_runs_that_length_alone(taught):
    store = StoreReader(taught["tmp"] / "teacher")
    assert sorted(store.seq_ids) == ["code-000.c0", "code-000.c1", "prose-000.c0", "prose-000.c1"]
    ran = json.loads(store.meta["teacher"])
    assert ran["micro_batch"] == 4 and ran["dtype"] == "float32"
    assert store.meta["tokenizer_sha256"] == "b" * 64  # from eval-windows.json beside the token file's folder
    # a token file whose length --lengths leaves out is refused, not silently run
    res = run_fideval("teacher", "--model", taught["model"], "--windows", taught["tmp"] / "w" / "cuts-8" / "tokens.safetensors",
                      "--lengths", "windows", "--out", taught["tmp"] / "never")
    assert "holds cuts, not --lengths windows" in res.error()
    assert not (taught["tmp"] / "never").exists()


@pytest.mark.parametrize(("key", "mine", "theirs"), [("micro_batch", 2, 4), ("dtype", "bfloat16", "'float32'")])
def test_config_conflicting_with_the_teacher_manifest_is_refused(taught, key, mine, theirs):
    msg = _score_config(taught, f"conflict-{key}", **{f"teacher__{key}": mine}).error()
    assert f"config teacher.{key} is {mine!r} but" in msg and f"was made with {key} {theirs}" in msg
    assert not (taught["tmp"] / f"conflict-{key}").exists()


def test_config_leaving_the_keys_out_follows_the_manifest(taught, monkeypatch):
    import fideval.model.runner as runner

    seen, real = [], runner.make_runner
    monkeypatch.setattr(runner, "make_runner", lambda w, o, **kw: seen.append((o.micro_batch, o.dtype)) or real(w, o, **kw))
    res = _score_config(taught, "follows")
    assert res.code == 0, res.stderr
    assert seen == [(4, torch.float32)]  # the manifest's micro-batch, not the config's default of 1
    # the same key set to the manifest's value is no conflict
    assert _score_config(taught, "agrees", teacher__micro_batch=4).code == 0
    summary = json.loads((taught["tmp"] / "follows" / "score.json").read_text())
    assert summary["rows"] == 4 * 7 and summary["candidate_info"]["source"] == "emulated"
    assert summary["cpu_check"]["tolerance"] == 1e-9 and summary["cpu_check"]["every"] == 1000  # score: read, defaults kept


@pytest.mark.parametrize(("key", "value", "needle"), [("model__id", "other/model", "model id other/model differs"),
                                                        ("model__revision", "c" * 40, f"model revision {'c' * 40} differs")])
def test_config_with_another_model_identity_is_refused(taught, key, value, needle):
    assert needle in _score_config(taught, f"identity-{key}", **{key: value}).error()


def test_config_model_with_another_tokenizer_is_refused(taught, tmp_path):
    import shutil

    model = shutil.copytree(taught["model"], tmp_path / "model")
    (model / "tokenizer.json").write_text("{}")
    t = {**taught, "cfg": {**taught["cfg"], "model": {**taught["cfg"]["model"], "path": str(model)}}, "tmp": taught["tmp"]}
    msg = _score_config(t, "tokenizer").error()
    assert f"tokenizer SHA-256 {sha256_file(model / 'tokenizer.json')} differs" in msg and "b" * 64 in msg


def test_score_settings_take_the_option_then_the_config_then_the_default():
    from fideval.config import ScoreConfig

    ScoreSettings = score_run.ScoreSettings
    cfg = ScoreConfig(cpu_check_every=7, cpu_check_tolerance=1e-9, on_nonfinite="skip")
    assert ScoreSettings.of() == ScoreSettings(cpu_check_every=1000, cpu_check_tolerance=2e-12, on_nonfinite="fail")
    assert ScoreSettings.of(cfg) == ScoreSettings(cpu_check_every=7, cpu_check_tolerance=1e-9, on_nonfinite="skip")
    got = ScoreSettings.of(cfg, cpu_check_every=None, cpu_check_tolerance=3e-10, device="cpu", kernel="torch")
    assert (got.cpu_check_every, got.cpu_check_tolerance, got.on_nonfinite, got.device, got.kernel) == (7, 3e-10, "skip", "cpu", "torch")
    with pytest.raises(FidevalError, match="--on-nonfinite 'drop'"):
        ScoreSettings.of(cfg, on_nonfinite="drop")
