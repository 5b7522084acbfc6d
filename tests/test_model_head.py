"""The lm head's two arithmetics (fideval.model.execution.head): which one a run takes, that it is recorded and adopted, and
on the GPU that the bf16 head's logits are float32 sums of the float32 head's own products (a float64 oracle)."""

from __future__ import annotations

import json

import model_fixtures as mf
import numpy as np
import pytest
import torch
from cli_runner import run_fideval

from fideval.errors import FidevalError
from fideval.model.execution import head
from fideval.model.runner import Runner, RunnerOptions
from fideval.model.teacher_pass import adopt_head

V = mf.COMMON["vocab_size"]


def test_exact_is_true_only_for_bfloat16_values():
    w = torch.randn(64, 32).bfloat16().float()
    assert head.exact(w)
    w[3, 5] += 2.0**-20  # below a bf16 ulp of values of order 1: no longer a bfloat16 value
    assert not head.exact(w)
    assert not head.exact(torch.tensor([float("nan")]))  # NaN never compares equal: the float32 head takes it


def test_unusable_says_why():
    cpu = torch.device("cpu")
    assert "GPU" in head.unusable(cpu, torch.bfloat16, None)
    if torch.cuda.is_available():
        gpu = torch.device("cuda")
        assert "float32" in head.unusable(gpu, torch.float32, None)
        assert "activations" in head.unusable(gpu, torch.bfloat16, {"lm_head": lambda x: x})
        assert head.unusable(gpu, torch.bfloat16, {"routed_experts": lambda x: x}) is None


def test_cpu_runs_take_the_float32_head_and_refuse_bf16(tmp_path):
    folder = mf.build("qwen3", tmp_path / "m")
    assert Runner(folder, RunnerOptions(dtype=torch.bfloat16)).head_mode == "float32"
    with pytest.raises(FidevalError, match="lm head bf16 cannot run here: it needs a GPU") as e:
        Runner(folder, RunnerOptions(dtype=torch.bfloat16, head="bf16"))
    assert "\n" not in str(e.value)
    with pytest.raises(FidevalError, match="lm head mode 'fp16' is not known"):
        Runner(folder, RunnerOptions(head="fp16"))


def _bf16_model(name, folder):
    """A tiny model saved in bfloat16, as releases are (the fixtures save float32)."""
    folder = mf.build(name, folder)
    mf.rewrite(folder, lambda sd: {k: v.bfloat16() if v.is_floating_point() else v for k, v in sd.items()})
    return folder


def _pretend_gpu(monkeypatch):
    """The choice's own logic on a CPU: the setting passes (only CUDA has the bf16 -> float32 GEMM)."""
    monkeypatch.setattr(head, "unusable", lambda device, dtype, act: None if dtype == torch.bfloat16 else "float32 layers")


def test_auto_takes_bf16_only_for_a_bfloat16_exact_head(tmp_path, monkeypatch):
    _pretend_gpu(monkeypatch)
    folder = _bf16_model("qwen3", tmp_path / "m")  # its head is exact
    assert Runner(folder, RunnerOptions(dtype=torch.bfloat16)).head_mode == "bf16"
    assert Runner(folder, RunnerOptions(dtype=torch.bfloat16, head="float32")).head_mode == "float32"
    assert Runner(folder, RunnerOptions(dtype=torch.float32)).head_mode == "float32"

    def nudge(cls, name, t):  # a quantized head whose values are not bfloat16 (as a GGUF Q6_K head's)
        return t + 2.0**-20 if cls == "lm_head" else t

    def other(cls, name, t):  # a transform of other classes leaves the head exact
        return t * 0.5 if cls == "routed_experts" else t

    assert Runner(folder, RunnerOptions(dtype=torch.bfloat16, weight_transform=nudge)).head_mode == "float32"
    assert Runner(folder, RunnerOptions(dtype=torch.bfloat16, weight_transform=other)).head_mode == "bf16"
    with pytest.raises(FidevalError, match="not bfloat16 values"):
        Runner(folder, RunnerOptions(dtype=torch.bfloat16, weight_transform=nudge, head="bf16"))


def test_a_head_stored_in_bfloat16_is_not_read_to_choose(tmp_path, monkeypatch):
    """Stored bf16 and no weight transform: exact from the header, no read of the head (vocab x hidden) at start."""
    _pretend_gpu(monkeypatch)
    folder = _bf16_model("qwen3", tmp_path / "m")

    def read_head(self):
        raise AssertionError("the head was read to choose its mode")

    monkeypatch.setattr(Runner, "_head_weights", read_head)
    assert Runner(folder, RunnerOptions(dtype=torch.bfloat16)).head_mode == "bf16"


def test_a_float32_checkpoint_head_is_not_exact(tmp_path, monkeypatch):
    _pretend_gpu(monkeypatch)
    folder = mf.build("llama", tmp_path / "m")  # float32 values: the bf16 head would round them
    assert Runner(folder, RunnerOptions(dtype=torch.bfloat16)).head_mode == "float32"


def test_adopt_head_keeps_a_resumed_store_bit_identical():
    assert adopt_head("auto", None, "s") == "auto"
    assert adopt_head("auto", "bf16", "s") == "bf16" and adopt_head("auto", "float32", "s") == "float32"
    assert adopt_head("float32", "float32", "s") == "float32"
    with pytest.raises(FidevalError, match="s was written with lm head 'bf16', this run asks for 'float32'"):
        adopt_head("float32", "bf16", "s")
    with pytest.raises(FidevalError, match="lm head 'x' is not known"):
        adopt_head("x", None, "s")


def test_teacher_records_the_head_and_a_resume_refuses_another(tmp_path):
    from fideval.store import StoreReader
    from fideval.windows.layout import Sequences, length_dir, write_sequences

    model = mf.build("qwen3", tmp_path / "model")
    win = np.random.default_rng(3).integers(0, V, size=(2, 16)).astype(np.int32)
    write_sequences(length_dir(tmp_path / "w", "windows", 16), Sequences(["a-000", "b-000"], ["a", "b"], win))
    out = tmp_path / "store"
    args = ("--model", model, "--windows", tmp_path / "w", "--out", out, "--device", "cpu")
    res = run_fideval("teacher", *args)
    assert res.code == 0, res.stderr
    assert json.loads(StoreReader(out).meta["teacher"])["lm_head"] == "float32"
    man = json.loads((out / "manifest.json").read_text())  # as if a GPU had written it with the bf16 head
    man["meta"]["teacher"] = json.dumps({**json.loads(man["meta"]["teacher"]), "lm_head": "bf16"})
    (out / "manifest.json").write_text(json.dumps(man))
    res = run_fideval("teacher", *args, "--lm-head", "float32")
    assert "was written with lm head 'bf16', this run asks for 'float32'" in res.error()
    fresh = tmp_path / "fresh"  # what the setting alone rules out is refused before the store folder exists
    res = run_fideval("teacher", "--model", model, "--windows", tmp_path / "w", "--out", fresh, "--device", "cpu",
                      "--dtype", "bfloat16", "--lm-head", "bf16")
    assert "lm head bf16 cannot run here: it needs a GPU" in res.error() and not fresh.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_head_sums_the_float32_heads_products():
    """Bf16Head against a float64 oracle of the same bfloat16 operands (DeepSeek-V3's hidden size): within float32
    summation error, as the float32 GEMM of the same operands is."""
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 7168, device="cuda", generator=g).bfloat16()
    w = (torch.randn(4096, 7168, device="cuda", generator=g) * 0.02).bfloat16()
    oracle = x.double() @ w.double().t()
    fast = head.Bf16Head(w)(x)
    slow = torch.nn.functional.linear(x.float(), w.float())
    assert fast.dtype == torch.float32 and fast.shape == (64, 4096)
    scale = float((x.double().abs() @ w.double().abs().t()).max())  # the sums' magnitude: float32 error ~ eps x this
    err_fast, err_slow = float((fast.double() - oracle).abs().max()), float((slow.double() - oracle).abs().max())
    print(f"bf16 head max error {err_fast:.3g}, float32 head {err_slow:.3g}, sum magnitude {scale:.3g}")
    assert err_fast <= 2.0**-20 * scale and err_slow <= 2.0**-20 * scale


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_head_run_differs_from_float32_head_only_by_sum_order(tmp_path):
    folder = _bf16_model("qwen3_moe", tmp_path / "m")
    toks = mf.tokens(V, n=3, length=24)
    fast_r = Runner(folder, RunnerOptions(device="cuda", dtype=torch.bfloat16, micro_batch=2))
    assert fast_r.head_mode == "bf16"
    fast = {k: v.cpu() for k, v in fast_r.run(toks)}
    slow = {k: v.cpu() for k, v in Runner(folder, RunnerOptions(device="cuda", dtype=torch.bfloat16, micro_batch=2,
                                                                  head="float32")).run(toks)}
    big = max(float(v.abs().max()) for v in slow.values())
    d = max(float((fast[k] - slow[k]).abs().max()) for k in slow)
    print(f"bf16 vs float32 head: max |delta logit| {d:.3g} at |logit| {big:.3g}")
    assert d <= 1e-5 * big
    assert fast_r.canary["identical"]


def test_the_setting_refusal_is_the_same_for_the_reference_code():
    """Both backends take the bf16 head where the setting allows it (tests/test_reference_head.py: the reference
    runner's): refused before any weight is read only for what the setting rules out."""
    for impl in ("transformers", "reference"):
        assert "needs a GPU" in head.setting_refusal(impl, "cpu", torch.bfloat16)
        assert head.setting_refusal(impl, "cuda", torch.bfloat16) is None


def test_a_head_that_changes_between_loads_is_refused(tmp_path, monkeypatch):
    """The mode is chosen on the head as first loaded; a transform that gives other values later is a one-line error,
    never a bf16 head over values it would round."""
    _pretend_gpu(monkeypatch)
    folder = _bf16_model("qwen3", tmp_path / "m")
    calls = []

    def drifting(cls, name, t):
        if cls == "lm_head":
            calls.append(name)
            return t if len(calls) == 1 else t + 2.0**-20
        return t

    runner = Runner(folder, RunnerOptions(dtype=torch.bfloat16, weight_transform=drifting))
    assert runner.head_mode == "bf16"
    with pytest.raises(FidevalError, match="the lm head's weights changed between loads") as e:
        dict(runner.run(mf.tokens(V, n=1, length=8)))
    assert "\n" not in str(e.value)
