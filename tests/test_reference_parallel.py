"""Model parallel N through the vendor's own sharding (its ``world_size``/``rank`` globals, ParallelEmbedding,
column/row-parallel linears, experts split by rank) on gloo: N = 2 and 4 give the N = 1 logits within float32
reassociation (the row-parallel and MoE all-reduces sum per-rank partial sums), every rank holds the same
gathered logits, and at N = 2 the last position equals the vendor's own ``Transformer.forward`` run at N = 2."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import ref_deepseek_v3 as rv3
import torch
import torch.multiprocessing as mp

# measured (docs/runner.md, "Reference code: DeepSeek-V3"): N=2 1.0e-5, N=4 1.3e-5, on logits up to 6.4
BOUND = 5e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, folder: str, toks: np.ndarray, out: str) -> None:
    import torch.distributed as dist

    from fideval.model.runner import RunnerOptions, make_runner

    torch.set_num_threads(1)
    # the rendezvous through a file in the test's own folder: a port picked free can be taken by another process
    # (the SLURM tests' torchrun, gloo's own connections) before the ranks bind it
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        opts = RunnerOptions(implementation="reference", trust_remote_code=True, micro_batch=2)
        r = make_runner(folder, opts, rank=rank, world=world, group=dist.group.WORLD)
        logits = np.stack([v.numpy() for _, v in sorted(r.run(toks))])
        np.save(f"{out}/r{rank}.npy", logits)
        np.save(f"{out}/r{rank}-largest.npy", np.array([r.ledger.largest]))
        if world == 2:
            last = r.driver.finish(_last_hidden(r.driver, torch.from_numpy(toks[:2]).long()))
            np.save(f"{out}/r{rank}-ours-last.npy", last.numpy())
            np.save(f"{out}/r{rank}-vendor.npy", r.driver.vendor_logits(torch.from_numpy(toks[:2]).long()).numpy())
        dist.barrier()  # every rank past its last collective before any tears the group down (gloo aborted a rank)
    finally:
        dist.destroy_process_group()


def _last_hidden(drv, toks):
    h = drv.begin(toks)
    for i in range(drv.n_layers):
        h = drv.forward_layer(i, drv.load_layer(i), h)
    return h[:, -1]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    from fideval.model.runner import RunnerOptions, make_runner

    rv3.need_code()
    folder = rv3.build(tmp_path_factory.mktemp("mp") / "f32")
    toks = rv3.tokens(4, 16, seed=9).numpy()
    r = make_runner(folder, RunnerOptions(implementation="reference", trust_remote_code=True, micro_batch=2))
    return folder, toks, np.stack([v.numpy() for _, v in sorted(r.run(toks))]), r.ledger.largest


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_model_parallel_matches_one_rank(single, tmp_path, world):
    folder, toks, ref, largest = single
    mp.start_processes(_worker, args=(world, str(folder), toks, str(tmp_path)), nprocs=world, join=True,
                       start_method="fork")
    outs = [np.load(tmp_path / f"r{r}.npy") for r in range(world)]
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])  # every rank holds the same gathered logits
    diff = float(np.abs(outs[0] - ref).max())
    print(f"reference DeepSeek-V3 N={world}: max |dlogit| = {diff:.3g} (max |logit| {np.abs(ref).max():.3g})")
    assert 0 < diff <= BOUND
    assert np.load(tmp_path / "r0-largest.npy")[0] < largest  # a rank loads its slice of a layer, not all of it
    if world == 2:
        for r in range(2):  # the vendor's own forward at N = 2: the same blocks, the head on the same shape
            assert np.array_equal(np.load(tmp_path / f"r{r}-ours-last.npy"), np.load(tmp_path / f"r{r}-vendor.npy"))


@pytest.mark.slow
def test_teacher_under_torchrun_with_the_reference_code(single, tmp_path):
    """The teacher's torchrun entry point with --implementation reference: 2 gloo ranks, rank 0 writes, the
    store equals the one-rank store within the bound and records model parallel 2 and the code."""
    import json
    import subprocess
    import sys

    from fideval.model.teacher import run_teacher
    from fideval.store import StoreReader
    from fideval.windows.layout import Sequences, length_dir, write_sequences

    folder, toks, _, _ = single
    write_sequences(length_dir(tmp_path / "w", "windows", 16), Sequences(["a-000", "b-000"], ["a", "b"], toks[:2].astype(np.int32)))
    run_teacher(folder, tmp_path / "w", tmp_path / "one", kinds=("windows",), device="cpu", implementation="reference",
                trust_remote_code=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(_free_port()), "-m", "fideval.model.teacher", "--model", str(folder), "--windows",
                          str(tmp_path / "w"), "--out", str(tmp_path / "two"), "--device", "cpu", "--lengths", "windows",
                          "--implementation", "reference", "--trust-remote-code"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    one, two = StoreReader(tmp_path / "one"), StoreReader(tmp_path / "two")
    meta = json.loads(two.meta["teacher"])
    assert meta["model_parallel"] == 2 and meta["implementation"] == "reference" and json.loads(two.meta["canary"])["identical"]
    assert max(float(np.abs(one.read(s)[0] - two.read(s)[0]).max()) for s in one.seq_ids) <= BOUND
