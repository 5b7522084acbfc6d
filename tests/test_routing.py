"""Routing fidelity (issue 42): routes recorded by ``fideval teacher --routes`` and ``fideval score --routes`` against
the family's own router module (transformers' ``mlp.gate``, run directly on the same layer inputs), for a softmax
top-k router (Qwen3-MoE) and a sigmoid, group-limited, bias-corrected, scaled one (DeepSeek-V3); ``fideval routes``'s
figures against a direct computation; the stores' shards and the records byte-identical with the switch off."""

from __future__ import annotations

import hashlib
import json

import model_fixtures as mf
import numpy as np
import pytest
import torch
import yaml
from cli_runner import run_fideval

from fideval.errors import FidevalError
from fideval.formats import routes as rf
from fideval.report.routing import routing
from fideval.windows.layout import Sequences, length_dir, write_sequences

FAMILIES = ("qwen3_moe", "deepseek_v3")
N, L = 8, 12
# experts and what runs before the first MoE layer in MXFP4: the routers' inputs change from the first MoE layer on
# (DeepSeek-V3's MLA has a kv_b_proj of 16 columns, which MXFP4's block of 32 does not divide: its dense layer 0 instead)
BEFORE = {"qwen3_moe": "attention", "deepseek_v3": "dense_mlp"}


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module", params=FAMILIES)
def run(request, tmp_path_factory):
    fam = request.param
    tmp = tmp_path_factory.mktemp(f"routing-{fam}")
    model = mf.build(fam, tmp / "model")
    toks = mf.tokens(96, n=N, length=L, seed=3)
    ids = [f"{d}-{i:03d}.c0" for d, i in zip(["code"] * 4 + ["web"] * 4, [0, 1, 2, 3, 0, 1, 2, 3])]
    write_sequences(length_dir(tmp / "w", "cuts", L), Sequences(ids, ["code"] * 4 + ["web"] * 4, toks))
    cfg = {"run": "r", "model": {"path": str(model), "id": f"toy/{fam}", "revision": "local"},
           "domains": [{"name": d, "source": {"type": "local", "path": "x.jsonl"}} for d in ("code", "web")],
           "teacher": {"device": "cpu", "micro_batch": 3, "mlp_tokens": None}, "score": {"cpu_check_every": 7},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}, BEFORE[fam]: {"format": "mxfp4"}},
                           "paths": ["weights-only"]}]}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    tokens = tmp / "w" / "cuts-12" / "tokens.safetensors"
    out = {"tmp": tmp, "fam": fam, "model": model, "toks": toks, "ids": ids, "cfg": tmp / "c.yaml", "tokens": tokens}
    for tag, extra in (("on", ["--routes"]), ("off", [])):
        res = run_fideval("teacher", "--config", tmp / "c.yaml", "--windows", tokens, "--out", tmp / tag / "teacher", *extra)
        assert res.code == 0, res.stderr
        res = run_fideval("score", "--config", tmp / "c.yaml", "--candidate", "mx", "--path", "weights-only", "--device", "cpu",
                          "--teacher", tmp / tag / "teacher", "--out", tmp / tag / "records", *extra)
        assert res.code == 0, res.stderr
    return out


def _router_oracle(model_dir, toks):
    """Per MoE layer: (ids [n, L, k], weights [n, L, k]) of the family's own router module run on the inputs transformers'
    full forward hands that layer's MoE block."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seen = {}
    for i, layer in enumerate(m.model.layers):
        if hasattr(layer.mlp, "gate"):
            layer.mlp.register_forward_pre_hook(lambda mod, a, i=i: seen.__setitem__(i, a[0].detach().clone()))
    out = {}
    with torch.no_grad():
        m(torch.from_numpy(toks.astype(np.int64)))
        for i, x in sorted(seen.items()):
            _, w, idx = m.model.layers[i].mlp.gate(x)
            k = idx.shape[-1]
            out[i] = (idx.reshape(len(toks), -1, k).numpy(), w.reshape(len(toks), -1, k).numpy())
    return out


def test_recorded_routes_are_the_family_routers(run):
    oracle = _router_oracle(run["model"], run["toks"])
    d, index = rf.read_index(run["tmp"] / "on" / "teacher")
    assert index["of"] == "teacher" and index["layers"] == sorted(oracle) and index["n_experts"] == 8 and index["top_k"] == 2
    assert sorted(index["sequences"]) == sorted(run["ids"])
    if run["fam"] == "deepseek_v3":
        assert index["layers"] == [1, 2]  # first_k_dense_replace=1: layer 0 is dense
    manifest = json.loads((run["tmp"] / "on" / "teacher" / "manifest.json").read_text())
    shards = json.dumps(manifest)
    for row, sid in enumerate(run["ids"]):
        r = rf.read_sequence(d / f"{sid}.safetensors")
        # float32 run: the weights are kept as the experts took them (float32), widened to float32 when read
        assert r["seq_id"] == sid and r["ids"].dtype == np.int16 and r["weights_dtype"] == "float32" and r["version"] == 2
        assert index["sequences"][sid]["sha256"] == _sha(d / f"{sid}.safetensors")
        assert index["shards"][sid] in shards  # the shard it belongs to, as the manifest names it
        for j, layer in enumerate(r["layers"]):
            ids, w = oracle[layer]
            np.testing.assert_array_equal(r["ids"][j], ids[row].astype(np.int16))
            # the oracle's batch of 8 against the runner's micro-batches of 3: float32 sums a few ulp apart
            np.testing.assert_allclose(r["weights"][j], w[row].astype(np.float32), rtol=2e-6, atol=0)
    if run["fam"] == "deepseek_v3":  # the scaled weights: normalised to 1 then x routed_scaling_factor 2.5
        w = np.stack([rf.read_sequence(d / f"{s}.safetensors")["weights"] for s in run["ids"]]).astype(np.float64)
        np.testing.assert_allclose(w.sum(-1), 2.5, rtol=1e-6)


def test_the_switch_changes_no_byte(run):
    on, off = run["tmp"] / "on", run["tmp"] / "off"
    shards = sorted((off / "teacher" / "shards").glob("*.safetensors"))
    assert len(shards) == N
    for f in shards:
        assert _sha(f) == _sha(on / "teacher" / "shards" / f.name), f.name
    assert _sha(off / "records" / "records.parquet") == _sha(on / "records" / "records.parquet")
    assert not (off / "teacher" / "routes").exists() and not (off / "records" / "routes").exists()
    _, index = rf.read_index(on / "records")
    assert index["of"] == "candidate" and index["records_sha256"] == _sha(on / "records" / "records.parquet")


def test_the_teacher_against_itself_agrees_everywhere(run):
    t = run["tmp"] / "on" / "teacher"
    r = routing(t, t, resamples=200)
    assert r["format"] == "fideval.routing" and r["version"] == 1 and r["tokens"] == N * L and r["windows"] == N
    for blocks in [r["overall"]] + r["per_layer"]:
        for f in ("exact_agreement", "jaccard", "top1"):
            assert blocks[f]["estimate"] == 1.0 and blocks[f]["ci"] == [1.0, 1.0]
        assert blocks["l1_drift"]["estimate"] == 0.0
    assert r["overall"]["any_flip"]["estimate"] == 0.0 and r["overall"]["no_flip"]["estimate"] == 1.0


def _direct(t_dir, c_dir, ids, layers, n_experts=8):
    """The figures by plain Python over sets and dicts, per layer and pooled (means over positions)."""
    n_l = len(layers)
    acc = {f: np.zeros(n_l) for f in ("exact", "jac", "top1", "l1", "first")}
    pos = 0
    for sid in ids:
        t, c = rf.read_sequence(t_dir / f"{sid}.safetensors"), rf.read_sequence(c_dir / f"{sid}.safetensors")
        for p in range(t["ids"].shape[1]):
            pos += 1
            first = None
            for j in range(n_l):
                ti, ci = [int(x) for x in t["ids"][j, p]], [int(x) for x in c["ids"][j, p]]
                tw, cw = [float(x) for x in t["weights"][j, p]], [float(x) for x in c["weights"][j, p]]
                a, b = set(ti), set(ci)
                acc["exact"][j] += a == b
                acc["jac"][j] += len(a & b) / len(a | b)
                acc["top1"][j] += ti[tw.index(max(tw))] == ci[cw.index(max(cw))]
                dt, dc = dict(zip(ti, tw)), dict(zip(ci, cw))
                acc["l1"][j] += sum(abs(dt.get(e, 0.0) - dc.get(e, 0.0)) for e in range(n_experts))
                if a != b and first is None:
                    first = j
            if first is not None:
                acc["first"][first] += 1
    return {k: v / pos for k, v in acc.items()}, pos


def test_a_quantized_candidate_gives_the_direct_figures(run):
    t, c = run["tmp"] / "on" / "teacher", run["tmp"] / "on" / "records"
    r = routing(t, c, resamples=300, seed=4)
    want, pos = _direct(t / "routes", c / "routes", run["ids"], r["layers"])
    assert r["tokens"] == pos
    for j, blk in enumerate(r["per_layer"]):
        for f, k in (("exact_agreement", "exact"), ("jaccard", "jac"), ("top1", "top1"), ("l1_drift", "l1"), ("first_flip", "first")):
            assert blk[f]["estimate"] == pytest.approx(want[k][j], rel=1e-12, abs=1e-12), (blk["layer"], f)
        lo, hi = blk["exact_agreement"]["ci"]
        assert lo <= blk["exact_agreement"]["estimate"] <= hi
        assert blk["exact_agreement"]["unit"] == "window" and blk["exact_agreement"]["clusters"] == N
    assert r["overall"]["exact_agreement"]["estimate"] == pytest.approx(want["exact"].mean(), rel=1e-12)
    assert r["overall"]["l1_drift"]["estimate"] == pytest.approx(want["l1"].mean(), rel=1e-12)
    assert r["overall"]["any_flip"]["estimate"] == pytest.approx(want["first"].sum(), rel=1e-12)
    assert want["exact"].min() < 1.0  # the quantized build does send some positions elsewhere
    # the verb: routing.json (the same figures) and the plot
    res = run_fideval("routes", "--teacher", t, "--candidate", c, "--out", run["tmp"] / "routing.json", "--resamples", "300",
                      "--seed", "4")
    assert res.code == 0, res.stderr
    assert json.loads((run["tmp"] / "routing.json").read_text()) == json.loads(json.dumps(r))
    assert (run["tmp"] / "routing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refusals_are_one_line(run, tmp_path):
    t = run["tmp"] / "on" / "teacher"
    res = run_fideval("score", "--candidate", str(t), "--teacher", t, "--out", tmp_path / "x", "--routes")
    assert res.code == 2 and "--routes records a model run's routes" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = run_fideval("routes", "--teacher", t, "--candidate", run["tmp"] / "off" / "records", "--out", tmp_path / "r.json")
    assert res.code == 2 and "no routes" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    with pytest.raises(FidevalError, match="no routed experts"):
        from fideval.model.runner import Runner, RunnerOptions

        Runner(mf.build("llama", tmp_path / "dense"), RunnerOptions(routes=True))


def test_routes_of_another_model_or_damaged_are_one_line(run, tmp_path):
    import shutil

    t = run["tmp"] / "on" / "teacher" / "routes"
    other = tmp_path / "other" / "routes"
    shutil.copytree(run["tmp"] / "on" / "records" / "routes", other)
    index = json.loads((other / "routes.json").read_text())
    (other / "routes.json").write_text(json.dumps({**index, "n_experts": 16}))
    with pytest.raises(FidevalError, match="n_experts 16, the teacher's 8"):
        routing(t, other)
    (other / "routes.json").write_text(json.dumps(index))
    sid = run["ids"][0]
    (other / f"{sid}.safetensors").write_bytes(b"\x00" * 40)
    res = run_fideval("routes", "--teacher", t, "--candidate", other.parent, "--out", tmp_path / "r.json")
    assert res.code == 2 and "not a routes file" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    few = tmp_path / "few" / "routes"
    few.mkdir(parents=True)
    shutil.copy(t / f"{sid}.safetensors", few / f"{sid}.safetensors")
    rf.write_index(few.parent, "candidate", {"records_sha256": None})
    r = routing(few.parent, few.parent, resamples=100)  # one window: a degenerate interval, not an error
    assert r["sequences"] == 1 and "degenerate" in r["overall"]["top1"]["flags"]
    with pytest.raises(FidevalError, match="lack 7 of the candidate's sequences"):
        routing(few.parent, t)


def _mp_worker(rank: int, world: int, port: int, folder: str, toks: np.ndarray, out: str) -> None:
    import os

    import torch.distributed as dist

    from fideval.model.runner import Runner, RunnerOptions

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        r = Runner(folder, RunnerOptions(micro_batch=2, routes=True), rank=rank, world=world, group=dist.group.WORLD)
        got = {row: r.routes.pop(row) for row, _ in r.run(toks)}
        np.save(f"{out}/ids{rank}.npy", np.stack([got[k].ids for k in sorted(got)]))
        np.save(f"{out}/w{rank}.npy", np.stack([got[k].weights for k in sorted(got)]))
        dist.barrier()  # every rank past its last collective before any tears the group down (gloo aborted a rank)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_model_parallel_ranks_record_every_expert_id(tmp_path):
    """Two gloo ranks, each holding half the experts: both record the full ids (before the rank's cut), those of one rank."""
    import socket

    import torch.multiprocessing as mp

    from fideval.model.runner import Runner, RunnerOptions

    folder = mf.build("deepseek_v3", tmp_path / "m")
    toks = mf.tokens(96, n=3, length=16)
    one = Runner(folder, RunnerOptions(micro_batch=2, routes=True))
    single = {row: one.routes.pop(row) for row, _ in one.run(toks)}
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    mp.start_processes(_mp_worker, args=(2, port, str(folder), toks, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    ids = [np.load(tmp_path / f"ids{r}.npy") for r in range(2)]
    w = [np.load(tmp_path / f"w{r}.npy") for r in range(2)]
    want = np.stack([single[k].ids for k in sorted(single)])
    assert ids[0].max() >= 4  # ids of the other rank's experts are there
    np.testing.assert_array_equal(ids[0], ids[1])
    np.testing.assert_array_equal(w[0], w[1])
    np.testing.assert_array_equal(ids[0], want)
    np.testing.assert_allclose(w[0].astype(np.float64), np.stack([single[k].weights for k in sorted(single)]).astype(np.float64),
                               rtol=1e-3)
