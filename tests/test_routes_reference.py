"""Routes of the vendor's own code (issue 42, ``model.implementation: reference``): recorded and forced at the vendor's
``Gate`` (fideval/model/reference/gate_routes.py) for DeepSeek-V3 (sigmoid, group-limited top-k, scaled), V3.2-Exp
(sigmoid, normalised, scaled, float32 weights) and V4.1-Flash (sqrt-softplus, bias choosing only, normalised, scaled).

Oracles: the routes the vendor's own ``Gate`` returns inside the vendor's own ``Transformer.forward`` (a forward
hook on its Gate modules, independent of fideval's) on the same micro-batches -- ids and weights equal, bit for
bit; the teacher's own recorded routes forced back into the reference runner give its logits bit for bit, canary
included, while routes that differ move them; ``fideval teacher --routes`` with the reference code writes the routes
its runner records, and the index names the store's shards; a second rank records what the first does, every
expert id, equal to the vendor's own forward at N = 2.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import ref_deepseek_v3 as rv3
import ref_deepseek_v32 as rv32
import ref_deepseek_v41 as rv41
import torch
import torch.multiprocessing as mp

from fideval.errors import FidevalError
from fideval.formats import routes as rf
from fideval.model.routes import FileRoutes
from fideval.model.runner import RunnerOptions, make_runner

N = 4  # sequences; micro-batches of 2
FAMILIES = {  # family -> (code folder, run dtype, tokens per sequence, experts, top-k, MoE layers)
    "v3": (rv3.V3_CODE, torch.float32, 16, 8, 2, [1, 2]),
    "v32": (rv32.VENDOR, torch.float32, 24, 8, 2, [1, 2]),
    "v41": (rv41.V41, torch.bfloat16, 24, 4, 2, [0, 1, 2, 3, 4, 5]),
}


def _need(fam: str):
    if not (FAMILIES[fam][0] / "model.py").is_file():
        pytest.skip(f"vendor code not at {FAMILIES[fam][0]} (CI provides ../shared/reference-code)")


def _model(fam: str, folder, **kw):
    if fam == "v3":
        return rv3.build(folder, **kw)
    if fam == "v32":
        return rv32.write_tiny_v32(folder, dtype=torch.float32, **kw)
    return rv41.write_tiny_v41(folder, dtype="bf16", **kw)


def _opts(fam: str, **kw) -> RunnerOptions:
    return RunnerOptions(implementation="reference", trust_remote_code=True, micro_batch=2, dtype=FAMILIES[fam][1], **kw)


def _gate_oracle(drv, toks: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per MoE layer: (ids [B, L, k], weights [B, L, k]) as the vendor's own Gate returns them in the vendor's own
    ``Transformer.forward`` on ``toks`` (one batch)."""
    seen, handles = {}, []

    def prepare(model):
        for i, layer in enumerate(model.layers):
            for mod in layer.modules():
                if isinstance(mod, drv.m.Gate):
                    handles.append(mod.register_forward_hook(
                        lambda _m, _a, out, i=i: seen.__setitem__(i, (out[1].clone(), out[0].clone()))))

    try:
        drv.vendor_logits(toks, prepare=prepare)
    finally:
        for h in handles:
            h.remove()
    b, length = toks.shape
    return {i: (ids.reshape(b, length, -1), w.reshape(b, length, -1)) for i, (ids, w) in seen.items()}


def _write(folder, ids: list[str], routes: dict) -> FileRoutes:
    for row, sid in enumerate(ids):
        rf.write_sequence(folder, sid, routes[row])
    index = rf.write_index(folder, "teacher", {})
    return FileRoutes(rf.folder(folder), ids, index["layers"], index["n_experts"], index["top_k"])


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def rec(request, tmp_path_factory):
    """One family: its tiny release, a reference run recording routes (micro-batches of 2, chunks of one micro-batch
    so that the canary's second pass falls in another chunk), its logits and routes, and the routes as files."""
    fam = request.param
    _need(fam)
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp(f"refroutes-{fam}")
    model = _model(fam, tmp / "model")
    length = FAMILIES[fam][2]
    toks = torch.randint(0, 512, (N, length), generator=torch.Generator().manual_seed(7)).numpy()
    runner = make_runner(model, _opts(fam, routes=True))
    runner.host_budget = 2 * length * runner.hidden_size * torch.empty((), dtype=runner.dtype).element_size()
    assert runner.chunk_sequences(length) == 2
    logits, routes = {}, {}
    for row, x in runner.run(toks):
        logits[row], routes[row] = x.clone(), runner.routes.pop(row)
    assert runner.canary is not None and runner.canary["identical"]
    assert not runner.routes.rows  # every row's routes taken; the canary's second pass recorded none
    ids = [f"code-{i:03d}.c0" for i in range(N)]
    source = _write(tmp / "teacher", ids, routes)
    return dict(fam=fam, tmp=tmp, model=model, toks=toks, logits=logits, routes=routes, ids=ids, source=source,
                budget=runner.host_budget)


def test_recorded_routes_are_the_vendor_gates(rec):
    from fideval.model.reference.runner import open_driver

    fam = rec["fam"]
    _, dtype, length, n_exp, k, layers = FAMILIES[fam]
    drv = open_driver(rec["model"], trust=True, dtype=dtype)  # a driver of its own: no fideval hook on its modules
    for a in range(0, N, 2):  # the runner's micro-batches
        oracle = _gate_oracle(drv, torch.from_numpy(rec["toks"][a:a + 2]).long())
        assert sorted(oracle) == layers
        for r in range(2):
            got = rec["routes"][a + r]
            assert list(got.layers) == layers and got.n_experts == n_exp and got.ids.shape == (len(layers), length, k)
            for j, layer in enumerate(layers):
                ids, w = oracle[layer]
                np.testing.assert_array_equal(got.ids[j], ids[r].numpy().astype(np.int16))
                assert got.weights.dtype == w.dtype and torch.equal(got.weights[j], w[r]), (layer, a + r)
    every = np.concatenate([rec["routes"][r].ids.ravel() for r in range(N)])
    assert set(every.tolist()) == set(range(n_exp))  # every expert is chosen somewhere: not a degenerate router
    w = torch.stack([rec["routes"][r].weights for r in range(N)]).double()
    scale = {"v3": 2.5, "v32": 2.5, "v41": 1.5}[fam]  # normalised, then x route_scale
    assert (w.sum(-1) - scale).abs().max().item() < 1e-5


def _run(rec, **kw):
    """The fixture's run again (its micro-batches and chunks) with ``kw``'s options, recording: (runner, logits, routes)."""
    runner = make_runner(rec["model"], _opts(rec["fam"], routes=True, **kw))
    runner.host_budget = rec["budget"]
    out, took = {}, {}
    for row, x in runner.run(rec["toks"]):
        out[row], took[row] = x.clone(), runner.routes.pop(row)
    return runner, out, took


def test_the_teachers_own_routes_give_its_logits_bit_for_bit(rec):
    runner, got, took = _run(rec, force_routes=rec["source"])
    assert sorted(got) == sorted(rec["logits"])
    for row in got:
        assert torch.equal(got[row], rec["logits"][row]), row
        np.testing.assert_array_equal(took[row].ids, rec["routes"][row].ids)
    # the canary's second pass (another chunk) was forced again: bit-identical to its first
    assert runner.canary is not None and runner.canary["identical"]


class _Shifted:
    """The recorded routes with every expert id moved to the next expert (weights kept): other routes."""

    def __init__(self, inner: FileRoutes):
        self.inner = inner
        self.layers, self.n_experts, self.top_k = inner.layers, inner.n_experts, inner.top_k

    def reset(self):
        self.inner.reset()

    def lookup(self, row, layer):
        ids, w = self.inner.lookup(row, layer)
        return (ids + 1) % self.n_experts, w


def test_other_routes_are_what_the_experts_take(rec):
    n_exp = FAMILIES[rec["fam"]][3]
    runner, got, took = _run(rec, force_routes=_Shifted(rec["source"]))
    for row in got:
        assert not torch.equal(got[row], rec["logits"][row]), row  # forcing is not a no-op
        np.testing.assert_array_equal(took[row].ids, (rec["routes"][row].ids + 1) % n_exp)  # recorded after forcing
        assert torch.equal(took[row].weights, rec["routes"][row].weights)
    assert runner.canary["identical"]


def test_grouped_experts_take_the_forced_routes(rec, tmp_path):
    """``model.reference_experts: grouped`` calls the vendor's Gate as a module: its routes are recorded and forced."""
    _, free, routes = _run(rec, reference_experts="grouped")
    own = _write(tmp_path, rec["ids"], routes)
    runner, got, _ = _run(rec, reference_experts="grouped", force_routes=own)
    assert all(torch.equal(got[row], free[row]) for row in free) and runner.canary["identical"]
    assert runner.driver.kernels["routed_experts"].startswith("grouped: ")  # the grouped path ran, not the vendor's loop
    _, moved, took = _run(rec, reference_experts="grouped", force_routes=_Shifted(own))
    for row in free:
        assert not torch.equal(moved[row], free[row]), row
        np.testing.assert_array_equal(took[row].ids, (routes[row].ids + 1) % FAMILIES[rec["fam"]][3])


def test_teacher_routes_through_the_cli(rec, tmp_path):
    """``fideval teacher --routes`` with ``model.implementation: reference``: routes/ beside the store, the index naming
    each sequence's shard, each file the routes the reference runner records for those tokens."""
    import hashlib

    import yaml
    from cli_runner import run_fideval
    from test_model_teacher import _windows

    from fideval.store import StoreReader

    fam, model = rec["fam"], rec["model"]
    sha = hashlib.sha256((model / "tokenizer.json").read_bytes()).hexdigest() if fam == "v41" else "b" * 64
    _windows(tmp_path / "w", vocab=512, tokenizer_sha=sha)
    cfg = {"run": "t", "model": {"path": str(model), "id": f"toy/{fam}", "revision": "a" * 40, "implementation": "reference",
                                 "trust_remote_code": True},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}},
                       {"name": "prose", "source": {"type": "local", "path": "y.jsonl"}}],
           "teacher": {"device": "cpu", "micro_batch": 2, "dtype": str(FAMILIES[fam][1]).removeprefix("torch.")},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}}, "paths": ["weights-only"]}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = run_fideval("teacher", "--config", tmp_path / "c.yaml", "--windows", tmp_path / "w" / "cuts-8" / "tokens.safetensors",
                      "--lengths", "cuts", "--out", tmp_path / "teacher", "--routes")
    assert res.code == 0, res.stderr
    store = StoreReader(tmp_path / "teacher")
    d, index = rf.read_index(tmp_path / "teacher")
    _, _, _, n_exp, k, layers = FAMILIES[fam]
    assert index["of"] == "teacher" and index["layers"] == layers and index["n_experts"] == n_exp and index["top_k"] == k
    assert index["weights_dtype"] == "float32"
    ids = sorted(store.seq_ids)
    assert sorted(index["sequences"]) == ids and len(ids) == 4
    manifest = json.loads((tmp_path / "teacher" / "manifest.json").read_text())
    assert all(index["shards"][s] and index["shards"][s] in json.dumps(manifest) for s in ids)
    toks = np.stack([store.token_ids(s) for s in ids]).astype(np.int64)
    runner = make_runner(model, _opts(fam, routes=True))
    for row, _ in runner.run(toks, canary=False):
        r = rf.read_sequence(d / f"{ids[row]}.safetensors")
        want = runner.routes.pop(row)
        np.testing.assert_array_equal(r["ids"], want.ids)
        assert torch.equal(torch.from_numpy(r["weights"]), want.weights.float())
    # score's route control on the reference code: the MXFP4 candidate forced with the teacher's routes takes them
    res = run_fideval("score", "--config", tmp_path / "c.yaml", "--candidate", "mx", "--path", "weights-only", "--device",
                      "cpu", "--teacher", tmp_path / "teacher", "--out", tmp_path / "forced", "--routes", "--teacher-routes")
    assert res.code == 0, res.stderr
    fd, _ = rf.read_index(tmp_path / "forced")
    for s in ids:
        f, t = rf.read_sequence(fd / f"{s}.safetensors"), rf.read_sequence(d / f"{s}.safetensors")
        np.testing.assert_array_equal(f["ids"], t["ids"])
        np.testing.assert_array_equal(f["weights"], t["weights"])
    assert json.loads((tmp_path / "forced" / "score.json").read_text())["candidate_info"]["routes_forced"]["of"] == "teacher"


def test_routes_of_another_model_are_one_line(rec, tmp_path):
    fam = rec["fam"]
    _, _, _, n_exp, k, layers = FAMILIES[fam]
    src = FileRoutes(rec["source"].folder, rec["ids"], layers, 2 * n_exp, k)
    with pytest.raises(FidevalError, match=f"routed experts {2 * n_exp}, this model {n_exp}"):
        make_runner(rec["model"], _opts(fam, force_routes=src))
    src = FileRoutes(rec["source"].folder, rec["ids"], [9], n_exp, k)
    with pytest.raises(FidevalError, match="MoE layers"):
        make_runner(rec["model"], _opts(fam, force_routes=src))
    if fam == "v3":  # every layer dense: nothing routes
        dense = rv3.build(tmp_path / "dense", first_k_dense_replace=3)
        with pytest.raises(FidevalError, match="no routed experts: there are no routes to record"):
            make_runner(dense, _opts(fam, routes=True))
        with pytest.raises(FidevalError, match="no routed experts: there are no routes to force"):
            make_runner(dense, _opts(fam, force_routes=src))


# -- two ranks ------------------------------------------------------------------------------------------------------
def _worker(rank: int, world: int, folder: str, toks: np.ndarray, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        r = make_runner(folder, _opts("v3", routes=True), rank=rank, world=world, group=dist.group.WORLD)
        got = {row: r.routes.pop(row) for row, _ in r.run(toks)}
        np.save(f"{out}/r{rank}-ids.npy", np.stack([got[i].ids for i in range(len(toks))]))
        np.save(f"{out}/r{rank}-w.npy", torch.stack([got[i].weights for i in range(len(toks))]).numpy())
        oracle = _gate_oracle(r.driver, torch.from_numpy(toks[:2]).long())  # the vendor's forward at N = 2
        np.save(f"{out}/r{rank}-oracle-ids.npy", np.stack([oracle[i][0].numpy() for i in (1, 2)], 1))
        np.save(f"{out}/r{rank}-oracle-w.npy", np.stack([oracle[i][1].numpy() for i in (1, 2)], 1))
        dist.barrier()  # every rank past its last collective before any tears the group down (gloo aborted a rank)
    finally:
        dist.destroy_process_group()


def test_two_ranks_record_every_expert_id(tmp_path):
    _need("v3")
    folder = rv3.build(tmp_path / "model")
    toks = rv3.tokens(N, 16, seed=9).numpy()
    mp.start_processes(_worker, args=(2, str(folder), toks, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")  # not fork: this process may hold V3.2's one-process group
    ids = [np.load(tmp_path / f"r{r}-ids.npy") for r in range(2)]
    w = [np.load(tmp_path / f"r{r}-w.npy") for r in range(2)]
    np.testing.assert_array_equal(ids[0], ids[1])  # every rank routes every token alike, before its cut
    np.testing.assert_array_equal(w[0], w[1])
    assert set(ids[0].ravel().tolist()) == set(range(8))  # ids of both ranks' experts (rank 0 owns 0-3, rank 1 4-7)
    for r in range(2):  # the first micro-batch against the vendor's own forward at N = 2
        np.testing.assert_array_equal(ids[0][:2], np.load(tmp_path / f"r{r}-oracle-ids.npy").astype(np.int16))
        np.testing.assert_array_equal(w[0][:2], np.load(tmp_path / f"r{r}-oracle-w.npy"))
