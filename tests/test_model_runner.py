"""Runner behaviour beyond parity: reproducibility, the quantization hooks, and bounded weight memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import model_fixtures as mf
import numpy as np
import pytest
import torch

from fideval.model.execution.determinism import digest
from fideval.model.runner import Runner, RunnerOptions

V = mf.COMMON["vocab_size"]


def test_same_run_twice_is_bit_identical_and_chunking_does_not_change_bits(tmp_path):
    folder = mf.build("deepseek_v3", tmp_path / "m")
    toks = mf.tokens(V, n=5, length=16)
    a = Runner(folder, RunnerOptions(micro_batch=2))
    first = {k: digest(v) for k, v in a.run(toks)}
    second = {k: digest(v) for k, v in Runner(folder, RunnerOptions(micro_batch=2)).run(toks)}
    assert first == second
    assert a.canary["identical"] and a.canary["digest_start"] == first[0]
    # a host budget of two sequences' hidden states forces three chunks (each re-reads every layer)
    small = Runner(folder, RunnerOptions(micro_batch=2, host_budget_bytes=2 * 16 * 64 * 4))
    third = {k: digest(v) for k, v in small.run(toks)}
    assert small.stats["chunks"] == 3 and third == first


def _bf16_round(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


def test_weight_transform_applies_once_to_the_named_classes(tmp_path):
    """Oracle: transformers' model with the same parameters rounded by hand, by explicit parameter name."""
    from transformers import AutoModelForCausalLM

    folder = mf.build("deepseek_v3", tmp_path / "m")
    seen: list[tuple[str, str]] = []

    def wt(cls, name, t):
        seen.append((cls, name))
        return _bf16_round(t) if cls in ("routed_experts", "attention", "lm_head") else t

    toks = mf.tokens(V, n=2, length=12)
    out = dict(Runner(folder, RunnerOptions(weight_transform=wt)).run(toks))
    classes = {c for c, _ in seen}
    assert classes == {"routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head", "embedding"}
    assert [n for c, n in seen if c == "embedding"] == ["model.embed_tokens.weight"]  # only a gguf_mix quantizes it
    assert len(seen) == len(set(seen))  # once per tensor per run
    assert ("routed_experts", "model.layers.2.mlp.experts.gate_up_proj") in seen
    assert not any("norm" in n or "mlp.gate.weight" in n for _, n in seen)

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    attn = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("experts.gate_up_proj", "experts.down_proj", "lm_head.weight")) or \
                    any(n.endswith(f"self_attn.{a}.weight") for a in attn):
                p.copy_(_bf16_round(p))
        ref = model(torch.from_numpy(toks.astype(np.int64))).logits
    assert max(float((out[k] - ref[k]).abs().max()) for k in range(2)) <= 1e-5


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss"])
def test_a_spec_quantizes_the_loads_own_tensor_in_place_with_the_same_bits(tmp_path, family):
    """A transform taking ``out=`` (a compiled spec's) writes into the tensor the load owns -- no second copy of a
    fused expert tensor; gpt-oss's experts are transposed views -- and the logits are the copying path's bits."""
    from fideval.quant.spec import compile_spec

    folder = mf.build(family, tmp_path / "m")
    spec = compile_spec({"routed_experts": "mxfp4", "attention": "fp8_block", "lm_head": "nvfp4"})
    calls: list[tuple[str, bool]] = []

    def in_place(cls, name, t, out=None):
        calls.append((cls, out is t))
        return spec.weight_transform(cls, name, t, out=out)

    toks = mf.tokens(V, n=2, length=12)
    copying = {k: digest(v) for k, v in Runner(folder, RunnerOptions(
        weight_transform=lambda c, n, t: spec.weight_transform(c, n, t))).run(toks)}
    owned = {k: digest(v) for k, v in Runner(folder, RunnerOptions(weight_transform=in_place)).run(toks)}
    assert owned == copying
    assert {c for c, same in calls if same} >= {"routed_experts", "attention", "lm_head"} and all(s for _, s in calls)


def test_act_transform_reaches_every_module_input(tmp_path):
    """Oracle: forward pre-hooks by explicit module name plus a hand-written per-expert loop in transformers' model."""
    from transformers import AutoModelForCausalLM

    def f(x):  # smooth and nonlinear, so applying it at the wrong place shows
        return 0.9 * x + 0.05 * x * x

    folder = mf.build("deepseek_v3", tmp_path / "m")
    toks = mf.tokens(V, n=2, length=12)
    classes = ("routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head")
    out = dict(Runner(folder, RunnerOptions(act_transform={c: f for c in classes})).run(toks))

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hooked = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "shared_experts.gate_proj",
              "shared_experts.up_proj", "shared_experts.down_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
              "layers.0.mlp.down_proj", "lm_head")
    n_hooks = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.endswith(hooked):
            mod.register_forward_pre_hook(lambda m, a: (f(a[0]),))
            n_hooks += 1
        if name.endswith("mlp.experts"):
            def loop(hidden, idx, w, self=mod):
                acc = torch.zeros_like(hidden)
                for e in range(self.num_experts):
                    tok, slot = torch.where(idx == e)
                    gate, up = (f(hidden[tok]) @ self.gate_up_proj[e].T).chunk(2, dim=-1)
                    y = f(self.act_fn(gate) * up) @ self.down_proj[e].T
                    acc.index_add_(0, tok, y * w[tok, slot, None])
                return acc
            mod.forward = loop
    assert n_hooks == 3 * 5 + 2 * 3 + 3 + 1
    with torch.no_grad():
        ref = model(torch.from_numpy(toks.astype(np.int64))).logits
    plain = dict(Runner(folder).run(toks))
    assert max(float((plain[k] - ref[k]).abs().max()) for k in range(2)) > 1e-2  # the transform matters
    assert max(float((out[k] - ref[k]).abs().max()) for k in range(2)) <= 1e-5


PEAK = textwrap.dedent("""
    import sys, time, numpy as np, torch
    torch.set_num_threads(1)
    from fideval.model.runner import Runner, RunnerOptions
    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    toks = np.zeros((2, 16), np.int32)
    list(Runner(sys.argv[2]).run(toks))  # imports and allocator warm-up on a tiny model
    slow = {"attention": lambda x: (time.sleep(0.03), x)[1]}  # compute outlasts every prefetch
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak-RSS mark
    base = status("VmRSS:")
    r = Runner(sys.argv[1], RunnerOptions(act_transform=slow))
    list(r.run(toks))
    print(status("VmHWM:") - base, r.ledger.peak, r.ledger.largest, r.ledger.added, r.ledger.released)
""")


def test_peak_weight_memory_is_at_most_two_and_a_half_layers(tmp_path):
    import transformers as tf

    big = tmp_path / "big"
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=4)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(big)
    layer_bytes = (4 * 256 * 256 + 3 * 256 * 1024 + 2 * 256) * 4
    total = (big / "model.safetensors").stat().st_size
    assert total > 6 * layer_bytes  # the whole checkpoint is far above the limit we check
    tiny = mf.build("llama", tmp_path / "tiny")
    # every large allocation through mmap, so a freed layer leaves the resident set at once
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    res = subprocess.run([sys.executable, "-c", PEAK, str(big), str(tiny)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rss, peak, largest, added, released = map(int, res.stdout.split()[-5:])
    assert largest == layer_bytes
    assert added == released == 10  # embed, 8 layers, head: every unit was freed
    assert peak == 2 * layer_bytes  # current + prefetched, never more
    assert rss <= 2.5 * layer_bytes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_warm_up_runs_once_per_mlp_kind_and_changes_no_bit(tmp_path):
    """On CUDA each MLP kind (dense, MoE) is run once on a few tokens before its first real block; the logits
    stay transformers' (float32 parity) and the same run twice is bit-identical."""
    folder = mf.build("deepseek_v3", tmp_path / "m")
    toks = mf.tokens(V, n=4, length=16)
    r = Runner(folder, RunnerOptions(device="cuda", micro_batch=2, mlp_tokens=48, profile=True))
    got = {k: v.cpu() for k, v in r.run(toks)}
    st = r.finish_profile()
    assert st["warmup_s"] > 0 and len(r.blocks.warmed) == 2 and not r.warming
    again = {k: digest(v) for k, v in Runner(folder, RunnerOptions(device="cuda", micro_batch=2, mlp_tokens=48)).run(toks)}
    assert {k: digest(v) for k, v in got.items()} == again
    ref = mf.reference_logits(folder, toks)
    for k, v in got.items():
        assert float((v - ref[k]).abs().max()) < 1e-4


def test_weights_come_only_through_the_weight_source(tmp_path):
    """Any WeightSource stands in for a checkpoint folder: the runner reads every tensor through it, and the
    logits are the folder's, bit for bit."""
    from fideval.model.weights.checkpoint import Checkpoint, WeightSource

    folder = mf.build("qwen3_moe", tmp_path / "m")
    ck = Checkpoint(folder)
    read: list[str] = []

    class Source:  # not a Checkpoint: only the protocol's members
        dir, config_dir, config_dict = ck.dir, ck.config_dir, ck.config_dict

        def __contains__(self, key):
            return key in ck

        def info(self, key):
            return ck.info(key)

        def read(self, key, rows=None, pin=False, out=None):
            read.append(key)
            return ck.read(key, rows=rows, pin=pin, out=out)

    src = Source()
    assert isinstance(src, WeightSource) and not isinstance(src, Checkpoint)
    toks = mf.tokens(V, n=2, length=8)
    got = dict(Runner(src).run(toks, canary=False))
    want = dict(Runner(folder).run(toks, canary=False))
    assert sorted(got) == [0, 1] and all(torch.equal(got[k], want[k]) for k in want)
    assert sorted(set(read)) == sorted(ck.tensors)  # every tensor of the checkpoint, each through the source


def test_act_transform_keys_must_be_module_classes(tmp_path):
    folder = mf.build("llama", tmp_path / "m")
    with pytest.raises(ValueError, match=r"act_transform keys \['mlp'\] are not module classes"):
        Runner(folder, RunnerOptions(act_transform={"mlp": lambda x: x}))
