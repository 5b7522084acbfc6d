"""The analytic FLOP count (fideval.model.flops) against torch's own count of a forward of each tiny architecture."""

from __future__ import annotations

import model_fixtures as mf
import pytest
import torch

from fideval.model.flops import dims, flops_per_token, layer_params, mean_keys

ARCHS = sorted(mf.configs())


@pytest.mark.parametrize("name", ARCHS)
def test_count_equals_flop_counter_mode_of_a_forward(name):
    """Eager attention multiplies the whole L x L score matrix and eager experts run each expert on exactly the
    tokens routed to it, so FlopCounterMode's count of a forward is the analytic count with causal=False."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    cfg = mf.configs()[name]
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    n, L = 2, 16
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, cfg.vocab_size, (n, L)))
    got = flops_per_token(cfg, L, causal=False)
    assert got["total"] * n * L == counter.get_total_flops()
    assert got["moe"] > 0 if name in ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss") else got["moe"] == 0


@pytest.mark.parametrize(("length", "window"), [(16, None), (16, 4), (7, 8), (9, 1)])
def test_causal_keys_are_the_mask_s_true_entries(length, window):
    """The keys a query sees, counted from the boolean mask itself (a band of width ``window`` under the diagonal)."""
    i = torch.arange(length)
    mask = i[None, :] <= i[:, None]
    if window is not None:
        mask &= i[None, :] > i[:, None] - window
    assert mean_keys(length, window) == pytest.approx(mask.sum().item() / length, rel=1e-15)


def test_sliding_layers_count_their_window():
    cfg = mf.configs()["gpt_oss"]  # sliding_window 8, layer types alternate
    d = dims(cfg)
    assert d.windows == tuple(8 if t == "sliding_attention" else None for t in cfg.layer_types)
    want = sum(2 * d.score_per_key * mean_keys(32, w) for w in d.windows)
    assert flops_per_token(cfg, 32)["attn_scores"] == want < flops_per_token(cfg, 32, causal=False)["attn_scores"]


def test_deepseek_v3_by_hand():
    """DeepSeek-V3's published shapes: 37 B active parameters -> ~2 x 37 G FLOPs per token plus attention."""
    cfg = {"model_type": "deepseek_v3", "hidden_size": 7168, "vocab_size": 129280, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
           "first_k_dense_replace": 3}
    f = flops_per_token(cfg, 2048)
    proj = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert f["attn_proj"] == 2 * proj * 61
    assert f["attn_scores"] == 2 * 128 * (192 + 128) * (2048 + 1) / 2 * 61
    assert f["moe"] == 2 * 58 * (7168 * 256 + 9 * 3 * 7168 * 2048)
    assert f["dense_mlp"] == 2 * 3 * 3 * 7168 * 18432 and f["head"] == 2 * 7168 * 129280
    active = (f["total"] - f["attn_scores"]) / 2 + 129280 * 7168  # + the embedding, a lookup
    assert 36.5e9 < active < 38e9  # "37B activated" (DeepSeek-V3 technical report), MTP module left out
    per_layer = layer_params(cfg)
    assert per_layer[0] == proj + 3 * 7168 * 18432 + 4 * 7168
    assert per_layer[3] == proj + 257 * 3 * 7168 * 2048 + 7168 * 256 + 4 * 7168
    assert layer_params(cfg, world=8)[3] == proj + (32 + 1) * 3 * 7168 * 2048 + 7168 * 256 + 4 * 7168
