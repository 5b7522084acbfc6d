"""The fused pass's runner (fideval.model.lockstep): several models through each chunk from one read of every
layer, each model's logits bit-identical to its own separate pass (the oracle: :class:`Runner` alone)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fideval.errors import FidevalError
from fideval.model.execution.determinism import digest
from fideval.model.lockstep import Lockstep
from fideval.model.runner import Runner, RunnerOptions
from fideval.timing.timeline import Timeline
from tests import fp8_fixtures as f8

SPECS = ({"routed_experts": "mxfp4"}, {"routed_experts": "nvfp4", "attention": "fp8_block", "lm_head": "mxfp4"})


def _options(spec, serving: bool, **kw):
    if spec is None:
        return RunnerOptions(**kw)
    from fideval.quant.spec import compile_spec

    s = compile_spec(spec)
    return RunnerOptions(weight_transform=s.weight_transform, act_transform=s.act_transform if serving else None, **kw)


def _separate(folder, spec, serving, toks, **kw):
    r = Runner(folder, _options(spec, serving, **kw))
    return {k: digest(v) for k, v in r.run(toks)}, r.canary


@pytest.mark.parametrize("kw", [dict(micro_batch=1), dict(micro_batch=2, mlp_tokens=24, host_budget_bytes=4 * 12 * 256 * 4)],
                         ids=["plain", "blocks-chunks"])
def test_every_model_gets_its_separate_pass_bits(tmp_path, kw):
    """Teacher (FP8 release dequantized) and two emulated candidates (serving and weights-only) in lockstep on
    the tiny FP8 DeepSeek-V3: every model's logits equal its own Runner's, the canary of each model holds, and each
    layer is read once per chunk (not once per model)."""
    folder = f8.build("deepseek_v3", "aligned", tmp_path / "fp8")
    toks = np.random.default_rng(3).integers(0, f8.V, size=(6, 12)).astype(np.int32)
    models = [(None, False), (SPECS[0], True), (SPECS[1], False)]
    tl = Timeline(on=False)
    runners = [Runner(folder, _options(s, sv, **kw), timeline=tl) for s, sv in models]
    reads = []
    real_read = runners[0].adapter.read_layer

    def counting(i, *a, **k):
        reads.append(i)
        return real_read(i, *a, **k)

    runners[0].adapter.read_layer = counting
    for r in runners[1:]:
        r.adapter.read_layer = lambda *a, **k: pytest.fail("a candidate read a layer itself")
    fused: list[dict] = [{} for _ in models]
    order = []
    for k, row, logits in Lockstep(runners).run_models(toks):
        fused[k][row] = digest(logits)
        order.append((k, row))
    for k, (spec, serving) in enumerate(models):
        alone, canary = _separate(folder, spec, serving, toks, **kw)
        assert fused[k] == alone, f"model {k}"
        assert runners[k].canary is None  # the lockstep keeps the verdicts: one per model
    assert len(reads) == 3 * runners[0].stats["chunks"]  # 3 layers, each read once per chunk for all models
    assert runners[0].stats["chunks"] == (2 if "host_budget_bytes" in kw else 1)
    at = {kr: n for n, kr in enumerate(order)}
    assert all(at[(0, row)] < n for (k, row), n in at.items() if k)  # a row's teacher logits come first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kw", [dict(micro_batch=2, mlp_tokens=24, host_budget_bytes=4 * 12 * 256 * 2)], ids=["blocks-chunks"])
def test_every_model_gets_its_separate_pass_bits_on_the_gpu(tmp_path, kw):
    """The GPU path: the read stays in pinned host memory and each model copies it to the device; bf16 compute,
    the bf16 lm head where exact, states on the device or pinned on the host."""
    folder = f8.build("deepseek_v3", "aligned", tmp_path / "fp8")
    toks = np.random.default_rng(3).integers(0, f8.V, size=(6, 12)).astype(np.int32)
    models = [(None, False), (SPECS[0], True), (SPECS[1], False)]
    for budget in (None, 0):  # sized (states on the device) and 0 (states pinned on the host)
        opts = dict(device="cuda", dtype=torch.bfloat16, device_budget_bytes=budget, **kw)
        tl = Timeline(on=False)
        runners = [Runner(folder, _options(s, sv, **opts), timeline=tl) for s, sv in models]
        fused: list[dict] = [{} for _ in models]
        for k, row, logits in Lockstep(runners).run_models(toks):
            fused[k][row] = digest(logits)
        for k, (spec, serving) in enumerate(models):
            assert fused[k] == _separate(folder, spec, serving, toks, **opts)[0], f"model {k}, budget {budget}"


def test_the_canaries_are_kept_per_model(tmp_path):
    folder = f8.build("deepseek_v3", "aligned", tmp_path / "fp8")
    toks = np.random.default_rng(4).integers(0, f8.V, size=(3, 10)).astype(np.int32)
    tl = Timeline(on=False)
    lock = Lockstep([Runner(folder, _options(s, True), timeline=tl) for s in (None, SPECS[0])])
    list(lock.run_models(toks))
    assert [c["identical"] for c in lock.canaries] == [True, True]
    assert lock.canaries[0]["digest_start"] != lock.canaries[1]["digest_start"]


def test_models_that_cannot_share_a_pass_are_refused(tmp_path):
    folder = f8.build("deepseek_v3", "aligned", tmp_path / "fp8")
    tl = Timeline(on=False)
    with pytest.raises(FidevalError, match="one micro_batch for every model"):
        Lockstep([Runner(folder, RunnerOptions(micro_batch=1), timeline=tl), Runner(folder, RunnerOptions(micro_batch=2), timeline=tl)])
    other = f8.build("deepseek_v3", "aligned", tmp_path / "other", seed=1)
    with pytest.raises(FidevalError, match="every model on the reference weights"):
        Lockstep([Runner(folder, timeline=tl), Runner(other, timeline=tl)])
    with pytest.raises(FidevalError, match="one dtype"):
        Lockstep([Runner(folder, timeline=tl), Runner(folder, RunnerOptions(dtype=torch.bfloat16), timeline=tl)])


@pytest.fixture
def no_cycle_collector():
    import gc

    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_a_units_weights_are_freed_when_it_is_dropped_without_the_cycle_collector(tmp_path, no_cycle_collector):
    """Every tensor of every unit is freed by reference counting alone, the moment its step is done: a closure
    that keeps a layer's experts alive in a reference cycle (the routed experts' wrapped forward) would hold its
    weights until a full collection, which at DeepSeek-V3 size is a third 23 GB layer on the GPU. The ledger
    watches every parameter and buffer, so it sees such a leak; the cycle collector is off while the runs go."""
    from fideval.model.execution.prefetch import Ledger

    folder = f8.build("deepseek_v3", "aligned", tmp_path / "fp8")
    toks = np.random.default_rng(5).integers(0, f8.V, size=(4, 10)).astype(np.int32)
    models = [(None, False), (SPECS[0], True), (SPECS[1], False)]
    for spec, serving in models:  # separate passes: at most the current unit and the one prefetched
        ledger = Ledger()
        list(Runner(folder, _options(spec, serving, micro_batch=2, mlp_tokens=20), ledger=ledger).run(toks))
        assert (ledger.added, ledger.released, ledger.now) == (5, 5, 0), spec
        assert ledger.peak <= 2 * ledger.largest
    ledger, tl = Ledger(), Timeline(on=False)
    runners = [Runner(folder, _options(s, sv, micro_batch=2), timeline=tl, ledger=ledger) for s, sv in models]
    list(Lockstep(runners).run_models(toks))
    assert (ledger.added, ledger.released, ledger.now) == (15, 15, 0)


def _cycled(mod: torch.nn.Module) -> torch.nn.Module:
    """``mod`` with a forward closure kept on itself that holds it: a reference cycle, as hooks.install once made."""
    mod.forward = lambda x: type(mod).forward(mod, x)
    return mod


def test_the_ledger_follows_tensors_so_a_submodule_kept_in_a_cycle_is_not_released(no_cycle_collector):
    """The ledger's own oracle is the cycle collector: a layer whose submodule is held in a reference cycle (a
    forward closure kept on the submodule itself) counts as resident until gc.collect() frees it; the same unit key
    tracked twice (a later run's chunk 0) is two entries."""
    import gc

    from fideval.model.execution.prefetch import Ledger

    ledger = Ledger()
    plain = torch.nn.Linear(4, 4)
    ledger.track((0, 1), plain)
    outer = torch.nn.Sequential(_cycled(torch.nn.Linear(4, 4, bias=False)), torch.nn.LayerNorm(4))
    ledger.track((0, 1), outer)
    assert (ledger.added, ledger.now) == (2, (20 + 16 + 8) * 4)
    del plain
    assert (ledger.released, ledger.now) == (1, 24 * 4)
    del outer
    assert (ledger.released, ledger.now) == (1, 16 * 4)  # the norm went; the cycled Linear's weight did not
    gc.collect()
    assert (ledger.released, ledger.now, ledger.units) == (2, 0, {})
