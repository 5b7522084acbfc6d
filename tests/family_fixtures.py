"""Tiny random configs of the families beyond tests/model_fixtures.py's seven, each exercising its layer types
(sliding/full, soft-capping, dense-first layers, shared experts...), for tests/test_model_families.py.

Kept apart from model_fixtures.configs() on purpose: the FLOP count, expert, quant and parallel tests iterate
over that table, and their families' extra modules (Granite's ``block_sparse_moe``, Qwen2-MoE's gated shared
expert) are not theirs to cover.
"""

from __future__ import annotations

from model_fixtures import COMMON

MOE = dict(num_key_value_heads=2, num_experts_per_tok=2)


class _Available:
    """transformers' config classes by name; one the installed version lacks (5.17 on the GPU image may) makes a
    stand-in whose call returns None, and :func:`configs` leaves that family out."""

    def __getattr__(self, name):
        import transformers

        return getattr(transformers, name, lambda **kw: None)


def configs() -> dict[str, object]:
    tf = _Available()
    layers4 = dict(num_hidden_layers=4)
    built = {
        "mistral": tf.MistralConfig(**COMMON, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2,
                                    head_dim=16, sliding_window=8),
        "phi3": tf.Phi3Config(**COMMON, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2,
                              partial_rotary_factor=0.5, pad_token_id=0),
        "gemma2": tf.Gemma2Config(**COMMON, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2,
                                  head_dim=16, sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                  query_pre_attn_scalar=16),
        "gemma3_text": tf.Gemma3TextConfig(**COMMON, intermediate_size=96, num_key_value_heads=2, head_dim=16,
                                           sliding_window=8, final_logit_softcapping=3.0, attn_logit_softcapping=5.0,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                           num_hidden_layers=3, query_pre_attn_scalar=16),
        "qwen2_moe": tf.Qwen2MoeConfig(**COMMON, **MOE, intermediate_size=96, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=48, num_experts=8, mlp_only_layers=[0],
                                       num_hidden_layers=3, use_sliding_window=True, sliding_window=8,
                                       max_window_layers=3),
        "olmoe": tf.OlmoeConfig(**COMMON, **MOE, intermediate_size=32, num_experts=8, num_hidden_layers=2),
        "deepseek_v2": tf.DeepseekV2Config(**COMMON, num_key_value_heads=4, intermediate_size=96,
                                           moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
                                           n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                                           topk_method="group_limited_greedy", first_k_dense_replace=1, q_lora_rank=32,
                                           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                           routed_scaling_factor=2.0),
        "glm4_moe": tf.Glm4MoeConfig(**COMMON, **MOE, intermediate_size=96, moe_intermediate_size=32,
                                     num_hidden_layers=3, n_routed_experts=8, n_shared_experts=1, n_group=2,
                                     topk_group=1, first_k_dense_replace=1, head_dim=16, partial_rotary_factor=0.5,
                                     use_qk_norm=True, routed_scaling_factor=2.5),
        "ernie4_5_moe": tf.Ernie4_5_MoeConfig(**COMMON, **MOE, intermediate_size=96, moe_intermediate_size=32,
                                              num_hidden_layers=3, moe_num_experts=8, moe_num_shared_experts=1,
                                              moe_layer_start_index=1, moe_layer_interval=1, head_dim=16),
        "granitemoe": tf.GraniteMoeConfig(**COMMON, **MOE, intermediate_size=32, num_local_experts=4,
                                          num_hidden_layers=2, embedding_multiplier=3.0, residual_multiplier=0.5,
                                          attention_multiplier=0.2, logits_scaling=2.0),
        "hunyuan_v1_moe": tf.HunYuanMoEV1Config(**COMMON, **MOE, intermediate_size=32, num_experts=8,
                                                num_hidden_layers=2, head_dim=16, moe_topk=2, num_shared_expert=1),
        "dots1": tf.Dots1Config(**COMMON, **MOE, intermediate_size=96, moe_intermediate_size=32,
                                num_hidden_layers=3, n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1,
                                first_k_dense_replace=1, head_dim=16, sliding_window=8, use_sliding_window=True,
                                max_window_layers=2, routed_scaling_factor=2.5),
        "minimax_m2": tf.MiniMaxM2Config(**COMMON, **MOE, intermediate_size=32, num_local_experts=8,
                                         num_hidden_layers=2, head_dim=16, rotary_dim=8),
        "glm4_moe_lite": tf.Glm4MoeLiteConfig(**COMMON, **MOE, intermediate_size=96, moe_intermediate_size=32,
                                              num_hidden_layers=3, n_routed_experts=8, n_shared_experts=1,
                                              mlp_layer_types=["dense", "sparse", "sparse"], q_lora_rank=32,
                                              kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16),
        "llama4_text": tf.Llama4TextConfig(**COMMON, **MOE, intermediate_size=32, intermediate_size_mlp=96,
                                           num_local_experts=4, head_dim=16, attention_chunk_size=8,
                                           no_rope_layer_interval=2, interleave_moe_layer_step=2, **layers4,
                                           floor_scale=4, attn_temperature_tuning=True),
        "qwen3_next": tf.Qwen3NextConfig(**COMMON, **MOE, intermediate_size=96, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=32, num_experts=8, head_dim=16,
                                         linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                                         linear_num_value_heads=4, **layers4,
                                         layer_types=["linear_attention", "full_attention"] * 2),
        "minimax": tf.MiniMaxConfig(**COMMON, **MOE, intermediate_size=32, num_local_experts=4, head_dim=16,
                                    block_size=8, **layers4,
                                    layer_types=["linear_attention", "full_attention"] * 2),
        "deepseek_v32": tf.DeepseekV32Config(**COMMON, num_key_value_heads=4, intermediate_size=96,
                                             moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
                                             n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                                             first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, index_topk=8,
                                             index_head_dim=16, index_n_heads=2),
    }
    return {k: v for k, v in built.items() if v is not None}
