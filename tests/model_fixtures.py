"""Tiny random checkpoints in the Hugging Face layout (``save_pretrained``) for the runner's tests.

Every architecture the runner supports, small enough that a full transformers forward is the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

COMMON = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False)


def configs() -> dict[str, object]:
    import transformers as tf

    return {
        "llama": tf.LlamaConfig(**COMMON, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2),
        "qwen2": tf.Qwen2Config(**COMMON, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2),
        "qwen3": tf.Qwen3Config(**COMMON, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2, head_dim=16),
        "mixtral": tf.MixtralConfig(**COMMON, intermediate_size=48, num_hidden_layers=2, num_key_value_heads=2,
                                    num_local_experts=4, num_experts_per_tok=2),
        "qwen3_moe": tf.Qwen3MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                       num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, head_dim=16),
        "deepseek_v3": tf.DeepseekV3Config(**COMMON, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                                           num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                                           num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
                                           q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                           v_head_dim=16, routed_scaling_factor=2.5),
        "gpt_oss": tf.GptOssConfig(**COMMON, intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2,
                                   num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=8),
    }


def build(name: str, folder: Path, *, seed: int = 0, **save_kw) -> Path:
    """Random weights (std 0.1 so that routing and logits are far from degenerate), saved with save_pretrained."""
    return build_config(configs()[name], folder, seed=seed, **save_kw)


def build_config(config, folder: Path, *, seed: int = 0, **save_kw) -> Path:
    """:func:`build` for any transformers config (tests/family_fixtures.py's)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("sinks"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    model.save_pretrained(folder, **save_kw)
    return Path(folder)


def reference_logits(folder: Path, tokens: np.ndarray, dtype=torch.float32) -> torch.Tensor:
    """transformers' own full-model forward (the oracle), float32 logits [n, L, V]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.float()


def tokens(vocab: int, n: int = 3, length: int = 24, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(n, length)).astype(np.int32)


def rewrite(folder: Path, edit) -> None:
    """Apply ``edit(dict name -> tensor) -> dict`` to a single-file checkpoint in place."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    sd = load_file(str(path))
    save_file(edit(dict(sd)), str(path), metadata={"format": "pt"})


def set_config(folder: Path, **kv) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(kv)
    p.write_text(json.dumps(cfg))
