"""The route-controlled run (issue 42): the teacher's routes forced into a model's MoE layers.

Oracles: forcing a run's own routes into it reproduces its logits bit for bit (the teacher into the teacher; a
quantized candidate's free routes into that candidate), so forcing changes nothing but the choice of experts and
their weights; a candidate forced with the teacher's routes takes exactly the teacher's experts (its recorded routes
equal the teacher's); the CLI writes score.json's ``routes_forced`` block; routes of another model, another teacher
store, v1 files or altered files are refused in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import model_fixtures as mf
import numpy as np
import pytest
import torch
import yaml
from cli_runner import run_fideval

from fideval.errors import FidevalError
from fideval.formats import routes as rf
from fideval.model.routes import FileRoutes
from fideval.model.runner import Runner, RunnerOptions
from fideval.windows.layout import Sequences, length_dir, write_sequences

N, L = 6, 12
BEFORE = {"qwen3_moe": "attention", "deepseek_v3": "dense_mlp"}  # as tests/test_routing.py: routers' inputs change


def _source(folder, ids):
    _, index = rf.read_index(folder)
    return FileRoutes(rf.folder(folder), ids, index["layers"], index["n_experts"], index["top_k"])


def _logits(runner, toks):
    return {row: x.clone() for row, x in runner.run(toks)}


@pytest.fixture(scope="module", params=("qwen3_moe", "deepseek_v3"))
def setup(request, tmp_path_factory):
    fam = request.param
    tmp = tmp_path_factory.mktemp(f"forced-{fam}")
    model = mf.build(fam, tmp / "model")
    toks = mf.tokens(96, n=N, length=L, seed=5)
    ids = [f"{d}-{i:03d}.c0" for d, i in zip(["code"] * 3 + ["web"] * 3, [0, 1, 2, 0, 1, 2])]
    write_sequences(length_dir(tmp / "w", "cuts", L), Sequences(ids, ["code"] * 3 + ["web"] * 3, toks))
    cfg = {"run": "r", "model": {"path": str(model), "id": f"toy/{fam}", "revision": "local"},
           "domains": [{"name": d, "source": {"type": "local", "path": "x.jsonl"}} for d in ("code", "web")],
           "teacher": {"device": "cpu", "micro_batch": 4, "mlp_tokens": None}, "score": {"cpu_check_every": 5},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}, BEFORE[fam]: {"format": "mxfp4"}},
                           "paths": ["weights-only"]}]}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    tokens = tmp / "w" / "cuts-12" / "tokens.safetensors"
    res = run_fideval("teacher", "--config", tmp / "c.yaml", "--windows", tokens, "--out", tmp / "teacher", "--routes")
    assert res.code == 0, res.stderr
    for tag, extra in (("free", ["--routes"]), ("forced", ["--routes", "--teacher-routes"])):
        res = run_fideval("score", "--config", tmp / "c.yaml", "--candidate", "mx", "--path", "weights-only", "--device",
                          "cpu", "--teacher", tmp / "teacher", "--out", tmp / tag, *extra)
        assert res.code == 0, res.stderr
    return {"tmp": tmp, "fam": fam, "model": model, "toks": toks, "ids": ids, "cfg": tmp / "c.yaml", "tokens": tokens}


def _record(setup, opts: dict, folder) -> dict:
    """A run with ``opts`` that records its own routes into ``folder`` (routes and index, as `fideval score --routes`
    writes them); its logits by row."""
    rec = Runner(setup["model"], RunnerOptions(**opts, routes=True))
    free = {}
    for row, x in rec.run(setup["toks"]):
        free[row] = x.clone()
        rf.write_sequence(folder, setup["ids"][row], rec.routes.pop(row))
    rf.write_index(folder, "candidate", {"records_sha256": None})
    return free


def test_the_teachers_own_routes_give_its_logits_bit_for_bit(setup):
    opts = {"micro_batch": 4, "mlp_tokens": None}  # the canary repeats a forced micro-batch: it must be forced again
    free = _logits(Runner(setup["model"], RunnerOptions(**opts)), setup["toks"])
    forced = Runner(setup["model"], RunnerOptions(**opts, force_routes=_source(setup["tmp"] / "teacher", setup["ids"])))
    got = _logits(forced, setup["toks"])
    assert sorted(got) == sorted(free)
    for row in free:
        assert torch.equal(got[row], free[row]), row
    assert forced.canary is not None and forced.canary["identical"]


def test_the_throughput_modes_blocks_record_and_force_the_same_rows(setup, tmp_path):
    """MLP token blocks spanning micro-batches (mlp_tokens 20 over micro-batches of 4 x 12 tokens: blocks of one and
    of several micro-batches): the recorded ids are the whole-layer run's and forcing them back gives its bits."""
    opts = {"micro_batch": 1, "mlp_tokens": 30}
    free = _record(setup, opts, tmp_path)
    td, _ = rf.read_index(setup["tmp"] / "teacher")
    for sid in setup["ids"]:
        mine, whole = rf.read_sequence(tmp_path / "routes" / f"{sid}.safetensors"), rf.read_sequence(td / f"{sid}.safetensors")
        np.testing.assert_array_equal(mine["ids"], whole["ids"])
        np.testing.assert_allclose(mine["weights"], whole["weights"], rtol=2e-6, atol=0)
    forced = _logits(Runner(setup["model"], RunnerOptions(**opts, force_routes=_source(tmp_path, setup["ids"]))), setup["toks"])
    for row in free:
        assert torch.equal(forced[row], free[row]), row


def test_a_candidates_own_routes_give_its_free_run(setup, tmp_path):
    from fideval.config import load_config
    from fideval.model_source import locate
    from fideval.score.hooks_of import describe

    cfg = load_config(setup["cfg"])
    hooks, _ = describe(cfg, cfg.candidates[0], "weights-only", locate(cfg.model.path, cfg.model.revision))
    opts = {"micro_batch": 4, "mlp_tokens": None, **hooks}
    free = _record(setup, opts, tmp_path)
    forced = _logits(Runner(setup["model"], RunnerOptions(**opts, force_routes=_source(tmp_path, setup["ids"]))), setup["toks"])
    for row in free:
        assert torch.equal(forced[row], free[row]), row


def test_a_forced_candidate_takes_the_teachers_experts(setup):
    tmp = setup["tmp"]
    td, _ = rf.read_index(tmp / "teacher")
    fd, _ = rf.read_index(tmp / "forced")
    cd, _ = rf.read_index(tmp / "free")
    moved = 0
    for sid in setup["ids"]:
        t, f, c = (rf.read_sequence(d / f"{sid}.safetensors") for d in (td, fd, cd))
        np.testing.assert_array_equal(f["ids"], t["ids"])
        np.testing.assert_array_equal(f["weights"], t["weights"])
        moved += int((c["ids"] != t["ids"]).any())
    assert moved > 0  # the free candidate routes some positions elsewhere: the forced run is not the free run
    s = json.loads((tmp / "forced" / "score.json").read_text())
    block = s["candidate_info"]["routes_forced"]
    assert block["of"] == "teacher" and block["weights_dtype"] == "float32" and block["top_k"] == 2
    assert block["index_sha256"] == __import__("hashlib").sha256((td / rf.INDEX).read_bytes()).hexdigest()
    assert "routes_forced" not in json.loads((tmp / "free" / "score.json").read_text())["candidate_info"]
    free_kld = __import__("polars").read_parquet(tmp / "free" / "records.parquet")["kld"].mean()
    forced_kld = __import__("polars").read_parquet(tmp / "forced" / "records.parquet")["kld"].mean()
    assert forced_kld != free_kld and forced_kld > 0


def _one_line(res, text):
    assert res.code == 2, res.stderr
    assert text in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_wrong_routes_are_one_line(setup, tmp_path):
    tmp = setup["tmp"]
    base = ["score", "--config", setup["cfg"], "--candidate", "mx", "--path", "weights-only", "--device", "cpu",
            "--teacher-routes"]
    # a teacher store without routes
    res = run_fideval("teacher", "--config", setup["cfg"], "--windows", setup["tokens"], "--out", tmp_path / "bare")
    assert res.code == 0, res.stderr
    _one_line(run_fideval(*base, "--teacher", tmp_path / "bare", "--out", tmp_path / "o1"), "no routes")
    # routes of another teacher run (the float32 store's routes beside a bf16 store of the same tokens)
    res = run_fideval("teacher", "--config", setup["cfg"], "--windows", setup["tokens"], "--out", tmp_path / "bf",
                      "--dtype", "bfloat16")
    assert res.code == 0, res.stderr
    shutil.copytree(tmp / "teacher" / "routes", tmp_path / "bf" / "routes")
    _one_line(run_fideval(*base, "--teacher", tmp_path / "bf", "--out", tmp_path / "o2"), "were recorded with teacher shard")
    # an altered routes file
    t2 = tmp_path / "t2"
    shutil.copytree(tmp / "teacher", t2)
    f = t2 / "routes" / f"{setup['ids'][0]}.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    _one_line(run_fideval(*base, "--teacher", t2, "--out", tmp_path / "o3"), "its SHA-256 is not the one routes.json names")
    # a logit-store candidate has nothing to force
    _one_line(run_fideval("score", "--candidate", tmp / "teacher", "--teacher", tmp / "teacher", "--out", tmp_path / "o4",
                          "--teacher-routes"), "forces routes into a model run")


def test_routes_of_another_model_are_one_line(setup, tmp_path):
    src = _source(setup["tmp"] / "teacher", setup["ids"])
    src.n_experts = 16
    with pytest.raises(FidevalError, match="routed experts 16, this model 8"):
        Runner(setup["model"], RunnerOptions(mlp_tokens=None, force_routes=src))
    src = _source(setup["tmp"] / "teacher", setup["ids"])
    src.layers = [5, 6]
    with pytest.raises(FidevalError, match="MoE layers"):
        Runner(setup["model"], RunnerOptions(mlp_tokens=None, force_routes=src))
    with pytest.raises(FidevalError, match="no routed experts"):
        Runner(mf.build("llama", tmp_path / "dense"), RunnerOptions(force_routes=src))


def _sha(p):
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_the_fused_pass_routes_as_the_separate_passes(tmp_path):
    """`routing: decompose` from the config, in the throughput mode (MLP blocks across micro-batches): the fused pass
    writes the teacher's routes, the free path's routes and records, and the forced path's records byte for byte as the
    separate passes (`fideval teacher` and `fideval score --path weights-only[+teacher-routes]`) write them."""
    model = mf.build("qwen3_moe", tmp_path / "model")
    toks = mf.tokens(96, n=5, length=L, seed=7)
    ids = [f"code-{i:03d}.c0" for i in range(5)]
    write_sequences(length_dir(tmp_path / "w", "cuts", L), Sequences(ids, ["code"] * 5, toks))
    cfg = {"run": "f", "model": {"path": str(model), "id": "toy/qwen3_moe", "revision": "local"},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}}],
           "teacher": {"device": "cpu", "micro_batch": 2, "mlp_tokens": 30, "fused": True}, "score": {"cpu_check_every": 7},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}, "attention": {"format": "mxfp4"}},
                           "paths": ["weights-only"], "routing": "decompose"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    tokens = tmp_path / "w" / "cuts-12" / "tokens.safetensors"
    sep = tmp_path / "sep"
    res = run_fideval("teacher", "--config", tmp_path / "c.yaml", "--windows", tokens, "--domain", "code", "--out", sep / "teacher")
    assert res.code == 0, res.stderr
    for p in ("weights-only", "weights-only+teacher-routes"):
        res = run_fideval("score", "--config", tmp_path / "c.yaml", "--candidate", "mx", "--path", p, "--teacher", sep / "teacher",
                          "--out", sep / "records" / "mx" / p / "cuts" / "code")
        assert res.code == 0, res.stderr
    fused = tmp_path / "fused"
    res = run_fideval("fused", "--config", tmp_path / "c.yaml", "--windows", tokens, "--domain", "code", "--out",
                      fused / "teacher", "--records", fused / "records")
    assert res.code == 0, res.stderr
    free, forced = Path("records/mx/weights-only/cuts/code"), Path("records/mx/weights-only+teacher-routes/cuts/code")
    assert not (sep / forced / "routes").exists()  # the forced run's routes would be the teacher's: not recorded
    for rel in [Path("teacher/routes") / f"{s}.safetensors" for s in ids] + [free / "routes" / f"{s}.safetensors" for s in ids] \
            + [free / "records.parquet", forced / "records.parquet"]:
        assert _sha(sep / rel) == _sha(fused / rel), rel
    for where in (sep, fused):
        _, ti = rf.read_index(where / "teacher")
        _, ci = rf.read_index(where / free)
        assert ti["of"] == "teacher" and sorted(ti["sequences"]) == ids and ci["records_sha256"] == _sha(where / free / "records.parquet")
    import polars as pl

    paths = set(pl.read_parquet(fused / forced / "records.parquet")["path"].unique())
    assert paths == {"weights-only+teacher-routes"}
    assert json.loads((fused / forced / "score.json").read_text())["candidate_info"]["routes_forced"]["of"] == "teacher"


def test_validate_refuses_routing_a_dense_model_in_one_line(setup, tmp_path):
    dense = mf.build("llama", tmp_path / "dense")
    cfg = yaml.safe_load(setup["cfg"].read_text())
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({**cfg, "candidates": [{**cfg["candidates"][0], "routing": "decompose"}]}))
    res = run_fideval("validate", ok)
    assert ".routing" not in res.stdout + res.stderr, res.stdout + res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**cfg, "model": {**cfg["model"], "path": str(dense)},
                                   "candidates": [{"name": "q", "quant": {"attention": {"format": "mxfp4"}}, "routing": "record"}]}))
    res = run_fideval("validate", bad)
    out = res.stdout + res.stderr
    assert res.code != 0 and "candidates[0].routing" in out and "no routed experts" in out, out
    assert sum(".routing" in line for line in out.splitlines()) == 1, out


def test_the_throughput_warm_up_call_is_left_unforced_and_any_other_unannounced_call_refused():
    """On a GPU the throughput mode runs each MLP kind once on 64 tokens before its first block and drops the result
    (fideval.model.execution.throughput._warm): no micro-batch is announced then. The forcer lets that call take its
    own routes (it refused it, and so every forced run with the throughput mode on a GPU, on an H100 on 2026-12-07);
    any other call outside an announced micro-batch stays a one-line refusal."""
    from fideval.model.routes import RouteForcer

    forcer = RouteForcer(source=None)
    idx, w = torch.tensor([[1, 0]]), torch.tensor([[0.7, 0.3]])
    with pytest.raises(FidevalError, match="outside a micro-batch the runner announced"):
        forcer(0, idx, w)
    warming = [True]
    forcer.warming = lambda: warming[0]
    got = forcer(0, idx, w)
    assert got[0] is idx and got[1] is w
    warming[0] = False
    with pytest.raises(FidevalError, match="outside a micro-batch the runner announced"):
        forcer(0, idx, w)
