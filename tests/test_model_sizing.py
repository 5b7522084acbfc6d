"""Run settings chosen from GPU memory (fideval.model.sizing): CPU defaults, the documented formula's bounds,
overrides, a resumed store's settings, and the DeepSeek-V3 figures quoted in docs/runner.md."""

from __future__ import annotations

import pytest
import torch

from fideval.errors import FidevalError
from fideval.model import sizing
from fideval.model.flops import layer_params

GiB = 1 << 30
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "vocab_size": 129280, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3}


def _fits(st: sizing.Settings, L: int, free: int) -> float:
    """Bytes the chosen run needs at its largest moment, recomputed from the footprint (an independent sum)."""
    fp = sizing.footprint(DSV3, torch.bfloat16, L)
    mb = st.micro_batch * L
    phase = max(mb * (fp.attention + fp.scores), mb * fp.head, (st.mlp_tokens or mb) * fp.mlp)
    return 2 * fp.unit_bytes + sizing.RESERVE_BYTES + sizing.RESERVE_FRACTION * free + phase + st.chunk_bytes


def test_cpu_keeps_today_s_defaults_and_takes_explicit_values():
    assert sizing.choose("cpu", torch.float32, DSV3, 2048).recorded() == {"micro_batch": 1, "mlp_tokens": None, "chunk_bytes": None}
    got = sizing.choose("cpu", torch.float32, DSV3, 2048, micro_batch=3, mlp_tokens=96, chunk_bytes=1 << 20)
    assert got.recorded() == {"micro_batch": 3, "mlp_tokens": 96, "chunk_bytes": 1 << 20} and got.device_budget_bytes is None


@pytest.mark.parametrize(("L", "micro", "chunk_seqs"), [(2048, 8, 2048), (8192, 2, 512)])
def test_deepseek_v3_on_an_h200(L, micro, chunk_seqs):
    """139 GiB free, bfloat16: the figures docs/runner.md quotes, and the run fits the memory it was sized for."""
    free = 139 * GiB
    st = sizing.choose("cuda", torch.bfloat16, DSV3, L, free_bytes=free)
    assert (st.micro_batch, st.mlp_tokens) == (micro, 65536)
    assert st.chunk_bytes == chunk_seqs * L * 7168 * 2  # 2^22 tokens: the cap, whole blocks of 65,536
    assert st.plan["weights_bytes"] == 2 * layer_params(DSV3)[3] * 2  # two MoE layers (23.0 GB each)
    assert _fits(st, L, free) <= free and st.device_budget_bytes >= st.chunk_bytes


@pytest.mark.parametrize("free_gib", [60, 70, 80, 100, 139])
def test_less_memory_never_chooses_more(free_gib):
    big = sizing.choose("cuda", torch.bfloat16, DSV3, 2048, free_bytes=139 * GiB)
    st = sizing.choose("cuda", torch.bfloat16, DSV3, 2048, free_bytes=free_gib * GiB)
    assert st.mlp_tokens % (st.micro_batch * 2048) == 0 and st.chunk_bytes % (st.mlp_tokens * 7168 * 2) == 0
    assert st.micro_batch <= big.micro_batch and st.mlp_tokens <= big.mlp_tokens and st.chunk_bytes <= big.chunk_bytes
    assert _fits(st, 2048, free_gib * GiB) <= free_gib * GiB


def test_too_little_memory_is_one_line():
    with pytest.raises(FidevalError, match=r"40.0 GiB free holds neither two of the model's largest units \(2 x 21.4 GiB\)"):
        sizing.choose("cuda", torch.bfloat16, DSV3, 2048, free_bytes=40 * GiB)


def test_overrides_and_few_sequences():
    st = sizing.choose("cuda", torch.bfloat16, DSV3, 2048, free_bytes=139 * GiB, micro_batch=3, mlp_tokens=None)
    assert st.micro_batch == 3 and st.mlp_tokens is None and st.chunk_bytes % (3 * 2048 * 7168 * 2) == 0
    assert sizing.choose("cuda", torch.bfloat16, DSV3, 2048, free_bytes=139 * GiB, n_sequences=12).micro_batch == 3
    eager = sizing.footprint({**DSV3, "_attn_implementation": "eager"}, torch.bfloat16, 2048, math_attention=True)
    assert eager.scores == 128 * 2048 * (2 * 2 + 4)


def test_materialised_scores_are_sized_per_rank():
    """The reference code's attention holds [heads, L, L] scores (compute dtype, float32 softmax, cast back): at
    8,192 tokens on an H200 one DeepSeek-V3 sequence's scores (68.7 GB) leave room for a smaller chunk, and the
    run still fits; at model parallel 4 a rank holds a quarter of the heads (the vendor's code; transformers'
    attention is replicated); on 100 GiB it is a one-line refusal."""
    free, L = 139 * GiB, 8192
    fused = sizing.choose("cuda", torch.bfloat16, DSV3, L, free_bytes=free, micro_batch=1, mlp_tokens=None)
    math = sizing.choose("cuda", torch.bfloat16, DSV3, L, free_bytes=free, micro_batch=1, mlp_tokens=None,
                         math_attention=True)
    fp = sizing.footprint(DSV3, torch.bfloat16, L, math_attention=True)
    assert fp.scores == 128 * L * (2 * 2 + 4) and math.plan["math_attention"] is True
    assert L * fp.scores > 68e9 and math.chunk_bytes < fused.chunk_bytes and math.chunk_bytes >= L * 7168 * 2
    need = 2 * fp.unit_bytes + sizing.RESERVE_BYTES + sizing.RESERVE_FRACTION * free + L * (fp.attention + fp.scores)
    assert need + math.chunk_bytes <= free
    assert sizing.footprint(DSV3, torch.bfloat16, L, world=4, math_attention=True, split_heads=True).scores == 32 * L * 8
    assert sizing.footprint(DSV3, torch.bfloat16, L, world=4, math_attention=True).scores == fp.scores  # replicated
    with pytest.raises(FidevalError, match="one sequence of 8192 tokens"):
        sizing.choose("cuda", torch.bfloat16, DSV3, L, free_bytes=100 * GiB, micro_batch=1, mlp_tokens=None,
                      math_attention=True)


@pytest.mark.parametrize(("text", "want"), [("auto", "auto"), ("AUTO", "auto"), ("off", None), (None, None), ("65536", 65536), (7, 7)])
def test_parse(text, want):
    assert sizing.parse(text, "--mlp-tokens") == want


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "64k", ""])
def test_parse_refuses(text):
    with pytest.raises(FidevalError, match="--mlp-tokens"):
        sizing.parse(text, "--mlp-tokens")
    with pytest.raises(FidevalError, match="must be a positive integer or auto"):
        sizing.parse("off", "--micro-batch", off=False)


def test_a_resumed_store_s_settings_fill_every_auto():
    ran = {"micro_batch": 4, "mlp_tokens": 65536, "chunk_bytes": None}
    assert sizing.adopt({"micro_batch": "auto", "mlp_tokens": "auto", "chunk_bytes": "auto"}, ran, "s") == ran
    assert sizing.adopt({"micro_batch": 4, "mlp_tokens": "auto", "chunk_bytes": None}, ran, "s") == ran
    assert sizing.adopt({"micro_batch": 2}, None, "s") == {"micro_batch": 2}
    with pytest.raises(FidevalError, match="store x was written with mlp_tokens 65536, this run asks for 1024"):
        sizing.adopt({"micro_batch": "auto", "mlp_tokens": 1024, "chunk_bytes": "auto"}, ran, "store x")


def test_a_fused_pass_shares_the_states_among_its_models_and_counts_the_next_unit_as_stored():
    """models=3 (fideval.model.lockstep): the chunk's states are a third each; W adds the next unit as stored -- a
    byte a weight for an FP8 release, the compute dtype's bytes otherwise."""
    free, L = 139 * GiB, 2048
    one = sizing.choose("cuda", torch.bfloat16, DSV3, L, free_bytes=free)
    unit = layer_params(DSV3)[3] * 2
    fp8 = sizing.choose("cuda", torch.bfloat16, DSV3, L, free_bytes=free, models=3, stored_bytes=1)
    bf16 = sizing.choose("cuda", torch.bfloat16, DSV3, L, free_bytes=free, models=3)
    assert fp8.plan["weights_bytes"] == one.plan["weights_bytes"] + unit // 2
    assert bf16.plan["weights_bytes"] == one.plan["weights_bytes"] + unit
    assert fp8.device_budget_bytes * 3 <= fp8.plan["state_bytes"] and fp8.chunk_bytes <= fp8.device_budget_bytes


def test_grouped_experts_count_their_stacked_copy_per_rank():
    """The vendor's code with grouped experts keeps a stacked copy of a MoE layer's local experts: DeepSeek-V3's
    256 experts x (gate, up, down) of 7,168 x 2,048 in bf16, 22.5 GB on one rank, an eighth of it at model parallel 8;
    the weights term grows by exactly that, the activations' room shrinks by it, and the chunk gives way."""
    free = 139 * GiB
    for world in (1, 8):
        plain = sizing.choose("cuda", torch.bfloat16, DSV3, 2048, free_bytes=free, world=world, split_heads=True,
                              math_attention=True)
        grouped = sizing.choose("cuda", torch.bfloat16, DSV3, 2048, free_bytes=free, world=world, split_heads=True,
                                math_attention=True, grouped_experts=True)
        stacked = 256 // world * 3 * 7168 * 2048 * 2
        assert grouped.plan["weights_bytes"] - plain.plan["weights_bytes"] == stacked
        assert grouped.plan["activation_bytes"] == plain.plan["activation_bytes"] - stacked
        assert grouped.chunk_bytes <= plain.chunk_bytes and grouped.micro_batch <= plain.micro_batch
    assert sizing.stacked_experts_bytes(DSV3, torch.bfloat16) == 22_548_578_304
    dense = {k: v for k, v in DSV3.items() if k not in ("n_routed_experts", "moe_intermediate_size", "n_shared_experts",
                                                        "num_experts_per_tok", "first_k_dense_replace")}
    assert sizing.stacked_experts_bytes(dense, torch.bfloat16) == 0
