"""The reference code's runner: its head's mode (float32 as the vendor computes it, or bf16 on a GPU: the same
products, fideval.model.execution.head) and its embedding and head loaded on the prefetch thread
(fideval/model/reference/runner.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import ref_deepseek_v3 as rv3
import torch

from fideval.errors import FidevalError
from fideval.model.runner import RunnerOptions, make_runner

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    rv3.need_code()
    return rv3.build(tmp_path_factory.mktemp("h3") / "m", fp8=True)


def _opts(**kw):
    return RunnerOptions(implementation="reference", trust_remote_code=True, micro_batch=2, **kw)


def _toks():
    return np.random.default_rng(0).integers(0, 512, size=(4, 24)).astype(np.int32)


def test_on_the_cpu_auto_takes_float32_and_an_asked_bf16_head_is_one_line(v3):
    r = make_runner(v3, _opts(dtype=torch.bfloat16))
    assert r.head_mode == "float32" and r.export_head()[1]["lm_head"] == "float32"
    with pytest.raises(FidevalError, match="lm head bf16 cannot run here: it needs a GPU"):
        make_runner(v3, _opts(dtype=torch.bfloat16, head="bf16"))
    with pytest.raises(FidevalError, match="lm head mode 'fp16' is not known"):
        make_runner(v3, _opts(head="fp16"))


def test_the_embedding_and_head_load_on_the_prefetch_thread_once_a_run(v3, monkeypatch):
    """The first chunk reads them on the prefetch thread (the head while the last layer computes); later chunks reuse
    them; the logits are the ones the driver's own begin / finish give when nothing was preloaded."""
    plain = dict(make_runner(v3, _opts(prefetch=False)).run(_toks()))
    r = make_runner(v3, _opts(host_budget_bytes=1))  # a chunk a micro-batch: two chunks
    seen = []
    real = type(r.driver).preload

    def preload(drv, part):
        seen.append((part, threading.current_thread().name, drv._embed is None if part == "embed" else drv._head is None))
        return real(drv, part)

    monkeypatch.setattr(type(r.driver), "preload", preload)
    got = dict(r.run(_toks()))
    assert r.stats["chunks"] == 2
    assert [(p, t) for p, t, _ in seen] == [("embed", "fideval-prefetch"), ("head", "fideval-prefetch")] * 2
    assert [fresh for _, _, fresh in seen] == [True, True, False, False]
    assert sorted(got) == sorted(plain) and all(torch.equal(got[k], plain[k]) for k in plain)


def test_a_hidden_run_preloads_the_head_for_its_norm(v3):
    r = make_runner(v3, _opts(output="hidden"))
    states = dict(r.run(_toks()))
    assert r.driver._head is not None and sorted(states) == [0, 1, 2, 3]
    assert all(tuple(v.shape) == (24, r.hidden_size) for v in states.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_auto_takes_the_bf16_head_within_float32_sum_order(v3):
    """bf16 x bf16 products are exact in float32: the bf16 head differs from the vendor's float32 one only by the
    order of its float32 sums (the transformers runner's bound, tests/test_model_head.py)."""
    fast_r = make_runner(v3, _opts(dtype=torch.bfloat16, device="cuda"))
    assert fast_r.head_mode == "bf16" and fast_r.export_head()[1]["lm_head"] == "bf16"
    fast = {k: v.cpu() for k, v in fast_r.run(_toks())}
    slow_r = make_runner(v3, _opts(dtype=torch.bfloat16, device="cuda", head="float32"))
    assert slow_r.head_mode == "float32"
    slow = {k: v.cpu() for k, v in slow_r.run(_toks())}
    big = max(float(v.abs().max()) for v in slow.values())
    d = max(float((fast[k] - slow[k]).abs().max()) for k in slow)
    print(f"reference bf16 vs float32 head: max |delta logit| {d:.3g} at |logit| {big:.3g}")
    assert d <= 1e-5 * big
