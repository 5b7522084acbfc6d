"""``fideval fused`` (issue 23): the teacher store and every emulated candidate's records from one pass must be the
separate verbs' bytes -- ``fideval teacher``, ``fideval score --config`` per candidate and path, ``fideval score
--self-check`` -- on the tiny FP8 DeepSeek-V3 release (tests/fp8_fixtures.py), fresh and after an interruption."""

from __future__ import annotations

import hashlib
import json

import fp8_fixtures as f8
import numpy as np
import pytest
import yaml
from cli_runner import run_fideval

from fideval.windows.layout import Sequences, length_dir, write_sequences

CANDIDATES = [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}}, "paths": ["serving", "weights-only"]},
              {"name": "nv", "quant": {"routed_experts": {"format": "nvfp4"}, "attention": {"format": "fp8_block"}},
               "paths": ["weights-only"]}]


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fused")
    model = f8.build("deepseek_v3", "aligned", tmp / "fp8")
    toks = np.random.default_rng(5).integers(0, f8.V, size=(5, 12)).astype(np.int32)
    ids = [f"code-{i:03d}.c0" for i in range(5)]
    write_sequences(length_dir(tmp / "w", "cuts", 12), Sequences(ids, ["code"] * 5, toks))
    cfg = {"run": "f", "model": {"path": str(model), "id": "toy/dsv3-fp8", "revision": "local"},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}}],
           "teacher": {"device": "cpu", "micro_batch": 2, "mlp_tokens": 24, "fused": True},
           "score": {"cpu_check_every": 7}, "candidates": CANDIDATES}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    tokens = tmp / "w" / "cuts-12" / "tokens.safetensors"
    sep = tmp / "sep"
    res = run_fideval("teacher", "--config", tmp / "c.yaml", "--windows", tokens, "--domain", "code", "--out", sep / "teacher")
    assert res.code == 0, res.stderr
    for c in CANDIDATES:
        for p in c["paths"]:
            res = run_fideval("score", "--config", tmp / "c.yaml", "--candidate", c["name"], "--path", p, "--teacher",
                              sep / "teacher", "--out", sep / "records" / c["name"] / p / "cuts" / "code")
            assert res.code == 0, res.stderr
    # on the teacher's device, as the fused pass scores it (on a GPU machine `auto` would take the Triton kernel, whose
    # float64 figures differ from the CPU torch kernel's within the CPU check's tolerance, not bit for bit)
    res = run_fideval("score", "--self-check", "--device", "cpu", "--teacher", sep / "teacher", "--out",
                      sep / "records/teacher-self/store/cuts/code")
    assert res.code == 0, res.stderr
    return {"tmp": tmp, "tokens": tokens, "sep": sep, "cfg": tmp / "c.yaml"}


def _fused(s, where):
    return run_fideval("fused", "--config", s["cfg"], "--windows", s["tokens"], "--domain", "code",
                       "--out", where / "teacher", "--records", where / "records")


def _same_bytes(s, where):
    sep = s["sep"]
    shards = sorted((sep / "teacher" / "shards").glob("*.safetensors"))
    assert len(shards) == 5
    for f in shards:
        assert _sha(f) == _sha(where / "teacher" / "shards" / f.name), f.name
    recs = sorted(sep.glob("records/**/records.parquet"))
    assert len(recs) == 4  # mx serving, mx weights-only, nv weights-only, the self-check
    for f in recs:
        assert _sha(f) == _sha(where / f.relative_to(sep)), f
        a, b = (json.loads((g.parent / "score.json").read_text()) for g in (f, where / f.relative_to(sep)))
        assert (a["rows"], a["cpu_check"]["rows_checked"], a["candidate_info"]) == \
               (b["rows"], b["cpu_check"]["rows_checked"], b["candidate_info"])


def test_the_fused_pass_writes_the_separate_passes_bytes(setup):
    where = setup["tmp"] / "fused"
    res = _fused(setup, where)
    assert res.code == 0, res.stderr
    _same_bytes(setup, where)
    from fideval.store import StoreReader

    meta = StoreReader(where / "teacher").meta
    assert json.loads(meta["fused"]) == ["mx/serving", "mx/weights-only", "nv/weights-only"]
    assert json.loads(meta["canary"])["identical"] is True
    assert "4 records folders" in res.stdout and "nv/weights-only identical" in res.stdout
    prof = json.loads(meta["profile"])
    assert prof["tokens"] == 4 * 5 * 12 and abs(sum(prof["parts"].values()) - prof["wall_s"]) < 1e-5
    assert not list(where.glob("records/**/records.partial"))


def test_an_interrupted_fused_pass_resumes_to_the_same_bytes(setup, monkeypatch):
    """Interrupted after the third candidate shard: the teacher shards on disk and the records scored against them
    are kept; the rerun computes only the chunks holding what is missing, and ends with the same bytes."""
    from fideval.score import fused

    where = setup["tmp"] / "resumed"
    real, calls = fused._Scoring.score, []

    def stop(self, sid, logits):
        calls.append(sid)
        if len(calls) == 9:
            raise KeyboardInterrupt
        return real(self, sid, logits)

    monkeypatch.setattr(fused._Scoring, "score", stop)
    res = _fused(setup, where)
    assert res.code != 0 and "run the same command again to resume" in res.stderr
    kept = list(where.glob("records/**/records.partial/*.json"))
    assert kept and len(list((where / "teacher" / "shards").glob("*.safetensors"))) >= 2
    monkeypatch.setattr(fused._Scoring, "score", real)
    res = _fused(setup, where)
    assert res.code == 0, res.stderr
    assert "already done" in res.stdout
    _same_bytes(setup, where)


def test_configs_the_fused_pass_cannot_run_are_refused_in_one_line(setup, tmp_path):
    cfg = yaml.safe_load(setup["cfg"].read_text())
    for edit, words in ((lambda c: c["teacher"].update(model_parallel=2), "model_parallel 2"),
                        (lambda c: c.update(candidates=[]), "at least one emulated candidate")):
        c = json.loads(json.dumps(cfg))
        edit(c)
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(c))
        res = run_fideval("fused", "--config", tmp_path / "bad.yaml", "--windows", setup["tokens"], "--domain", "code",
                          "--out", tmp_path / "t", "--records", tmp_path / "r")
        assert words in res.error()
        assert not (tmp_path / "t").exists()


def test_without_the_self_check_the_candidates_are_unchanged(setup):
    where = setup["tmp"] / "noself"
    res = run_fideval("fused", "--config", setup["cfg"], "--windows", setup["tokens"], "--domain", "code",
                      "--out", where / "teacher", "--records", where / "records", "--no-self-check")
    assert res.code == 0, res.stderr
    assert not (where / "records" / "teacher-self").exists() and "3 records folders" in res.stdout
    sep = setup["sep"] / "records" / "mx" / "serving" / "cuts" / "code" / "records.parquet"
    assert _sha(sep) == _sha(where / "records" / "mx" / "serving" / "cuts" / "code" / "records.parquet")


def test_validate_refuses_teacher_fused_where_the_pass_would(setup, tmp_path):
    """`fideval validate` asks fideval.score.fused.refusal: one line naming the file and teacher.fused."""
    cfg = yaml.safe_load(setup["cfg"].read_text())
    ok = run_fideval("validate", setup["cfg"])  # (the fixture has no corpus or tokenizer: other lines, not this one)
    assert "teacher.fused" not in ok.stdout + ok.stderr
    cfg["model"]["implementation"] = "reference"
    cfg["model"]["trust_remote_code"] = True
    cfg["candidates"] = [{"name": "real", "checkpoint": str(tmp_path / "no.gguf"), "paths": ["weights-only"]}]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    res = run_fideval("validate", tmp_path / "bad.yaml")
    assert res.code == 2 and "Traceback" not in res.stderr
    line = [ln for ln in (res.stdout + res.stderr).splitlines() if "teacher.fused" in ln]
    assert len(line) == 1 and "model.implementation: transformers" in line[0] and "bad.yaml" in line[0]


def test_running_out_of_gpu_memory_is_one_line_that_says_what_to_change(setup, tmp_path, monkeypatch):
    import torch

    from fideval.score import fused

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has ...\nmore")

    monkeypatch.setattr(fused, "run_fused", oom)
    res = run_fideval("fused", "--config", setup["cfg"], "--windows", setup["tokens"], "--domain", "code",
                      "--out", tmp_path / "t", "--records", tmp_path / "r")
    line = res.error()
    assert "ran out of GPU memory" in line and "teacher.fused: false" in line


def test_a_windows_folder_of_two_lengths_is_one_line_and_writes_nothing(setup, tmp_path):
    from fideval.windows.layout import length_dir

    root = tmp_path / "w"
    for kind, L in (("windows", 24), ("cuts", 12)):
        toks = np.zeros((2, L), np.int32)
        write_sequences(length_dir(root, kind, L), Sequences(["code-000", "code-001"] if kind == "windows" else
                                                             ["code-000.c0", "code-000.c1"], ["code"] * 2, toks))
    res = run_fideval("fused", "--config", setup["cfg"], "--windows", root, "--domain", "code",
                      "--out", tmp_path / "t", "--records", tmp_path / "r")
    assert "takes one token file" in res.error()
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()


def test_the_start_line_says_when_the_fused_pass_needs_more_chunks_than_a_separate_pass(setup, tmp_path, monkeypatch):
    """On a GPU the sizing shares the chunk's states among the pass's models, so the fused pass may need more chunks
    than a separate pass, each re-materialising every unit of every model (slower on an 80 GB GPU at DeepSeek-V3
    layer sizes, docs/runner.md): the start line says so. The GPU's sizing is stood in for (the CPU sizes nothing):
    2 sequences a chunk for the pass's 4 models, 6 for one; 5 sequences."""
    from fideval.model import sizing
    from fideval.model import teacher_pass as teacher_mod
    from fideval.score.fused import chunks_note

    per_seq = 12 * 256 * 4  # L x hidden x float32
    asked = []

    def gpu_like(dev, dtype, config, seqs, todo, out, world, group, req, recorded, reference=False, models=1, stored_bytes=None,
                 grouped_experts=False):
        asked.append((models, todo))
        return sizing.Settings(micro_batch=2, mlp_tokens=24, chunk_bytes=(2 if models > 1 else 6) * per_seq, plan={"models": models})

    monkeypatch.setattr(teacher_mod, "sized_settings", gpu_like)
    res = _fused(setup, tmp_path / "f")
    assert res.code == 0, res.stderr
    assert asked == [(4, 5), (1, 5)]  # teacher + 2 candidate paths of mx + nv's weights-only; then a separate pass
    assert "5 of 5 sequences to compute in 3 chunks" in res.stderr
    assert "a separate pass would compute 1 chunk here" in res.stderr and "teacher.fused: false may be faster" in res.stderr
    assert chunks_note(5, 6, 6) == "" and chunks_note(256, 256, 1302) == ""
    assert "compute 1 chunk here" in chunks_note(256, 120, 1302)  # the H100 rehearsal: 3 chunks fused, 1 separate
