"""The layer-major runner against transformers' own full-model forward (the oracle), per architecture."""

from __future__ import annotations

import model_fixtures as mf
import pytest
import torch

from fideval.model.runner import Runner, RunnerOptions

ARCHS = list(mf.configs())


def _max_diff(out: dict, ref: torch.Tensor) -> float:
    return max(float((out[k] - ref[k]).abs().max()) for k in range(ref.shape[0]))


@pytest.mark.parametrize("name", ARCHS)
def test_float32_parity(tmp_path, name):
    folder = mf.build(name, tmp_path / name)
    toks = mf.tokens(mf.COMMON["vocab_size"], n=3, length=24)
    ref = mf.reference_logits(folder, toks)
    runner = Runner(folder, RunnerOptions(micro_batch=2))
    out = dict(runner.run(toks))
    assert sorted(out) == [0, 1, 2]
    assert all(v.dtype == torch.float32 and tuple(v.shape) == (24, mf.COMMON["vocab_size"]) for v in out.values())
    assert float(ref.abs().max()) > 1.0  # logits are not degenerate
    assert _max_diff(out, ref) <= 1e-5
    assert runner.canary["identical"]


@pytest.mark.parametrize("name", ["llama", "deepseek_v3", "gpt_oss"])
def test_bfloat16_difference(tmp_path, name):
    """bf16 layers vs transformers in bf16: a few bf16 ulps of the largest logit (measured; see docs/runner.md)."""
    folder = mf.build(name, tmp_path / name)
    toks = mf.tokens(mf.COMMON["vocab_size"], n=2, length=16)
    ref = mf.reference_logits(folder, toks, torch.bfloat16)
    out = dict(Runner(folder, RunnerOptions(micro_batch=2, dtype=torch.bfloat16)).run(toks))
    d = _max_diff(out, ref)
    assert d <= 4 * 2.0**-8 * float(ref.abs().max())


def test_sharded_checkpoint(tmp_path):
    folder = mf.build("qwen3_moe", tmp_path / "m", max_shard_size="60KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    toks = mf.tokens(mf.COMMON["vocab_size"], n=2, length=12)
    ref = mf.reference_logits(folder, toks)
    assert _max_diff(dict(Runner(folder).run(toks)), ref) <= 1e-5


def test_fused_expert_layout_on_disk(tmp_path):
    """The fused transformers-5 layout (mlp.experts.gate_up_proj [E, 2I, H]) reads like the per-expert one."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    per_expert = mf.build("deepseek_v3", tmp_path / "per")
    model = AutoModelForCausalLM.from_pretrained(per_expert, dtype=torch.float32)
    fused = tmp_path / "fused"
    fused.mkdir()
    (fused / "config.json").write_text((per_expert / "config.json").read_text())
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in sd
    save_file(sd, str(fused / "model.safetensors"))
    toks = mf.tokens(mf.COMMON["vocab_size"], n=2, length=12)
    a = dict(Runner(per_expert).run(toks))
    b = dict(Runner(fused).run(toks))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _max_diff(b, mf.reference_logits(per_expert, toks)) <= 1e-5


def test_tied_embeddings(tmp_path):
    import transformers as tf

    folder = tmp_path / "tied"
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**{**mf.COMMON, "tie_word_embeddings": True}, intermediate_size=64, num_hidden_layers=1,
                         num_key_value_heads=4)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    toks = mf.tokens(mf.COMMON["vocab_size"], n=1, length=8)
    assert _max_diff(dict(Runner(folder).run(toks)), mf.reference_logits(folder, toks)) <= 1e-5


@pytest.mark.parametrize("name", ARCHS)
def test_mlp_over_token_blocks(tmp_path, name):
    """The throughput mode: attention per micro-batch, the MLP/MoE over blocks spanning micro-batches."""
    folder = mf.build(name, tmp_path / name)
    toks = mf.tokens(mf.COMMON["vocab_size"], n=3, length=24)
    ref = mf.reference_logits(folder, toks)
    runner = Runner(folder, RunnerOptions(micro_batch=1, mlp_tokens=48, profile=True))
    out = dict(runner.run(toks))
    assert _max_diff(out, ref) <= 1e-5
    assert runner.stats.get("mlp_s", 0) + runner.stats.get("moe_s", 0) > 0 and runner.stats["attn_s"] > 0
