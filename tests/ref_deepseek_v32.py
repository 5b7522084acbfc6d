"""A tiny random DeepSeek-V3.2-Exp in the HF release layout, with the vendor's reference code beside it.

``write_tiny_v32(folder)`` writes ``config.json`` (model_type ``deepseek_v32``, transformers' field names, YaRN
rope scaling as the release has it), ``model.safetensors`` under the release's names (per-expert
``mlp.experts.<e>.gate_proj.weight``; the indexer's ``self_attn.indexer.{wq_b,wk,k_norm,weights_proj}``) and an
``inference/`` symlink to ``../shared/reference-code/deepseek-v3.2-exp``. With ``fp8=True`` every linear the
vendor runs in FP8 (attention, indexer ``wq_b``/``wk``, MLPs, experts) is stored as E4M3 with float32 128x128
``weight_scale_inv`` (UE8M0 powers of two, as the release) and ``quantization_config`` says so; embeddings,
norms, the router, ``weights_proj`` and the head stay in ``dtype``. The sizes are the vendor's constraints at
their smallest: 128-wide ``kv_lora_rank``/``index_head_dim`` (its act_quant groups), and for FP8 every linear
input a multiple of 128; ``index_topk`` 16 so that sequences of more than 16 tokens exercise the top-k.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

VENDOR = Path(__file__).resolve().parents[2] / "shared" / "reference-code" / "deepseek-v3.2-exp"

CONFIG = dict(
    architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", vocab_size=512, hidden_size=128,
    intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=3, first_k_dense_replace=1, moe_layer_freq=1,
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32,
    qk_rope_head_dim=32, v_head_dim=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
    topk_group=1, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5,
    index_n_heads=4, index_head_dim=128, index_topk=16, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=10000.0,
    rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                  "mscale": 1.0, "mscale_all_dim": 1.0},
    max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False, bos_token_id=0, eos_token_id=1,
    num_nextn_predict_layers=0,
)
FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
          "scale_fmt": "ue8m0"}


def shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the release (HF names) and its shape."""
    d, q, kv, nope, rope, v = (cfg[k] for k in ("hidden_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                "qk_rope_head_dim", "v_head_dim"))
    h, ih, idim, e = cfg["num_attention_heads"], cfg["index_n_heads"], cfg["index_head_dim"], cfg["n_routed_experts"]
    out = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,), "lm_head.weight": (cfg["vocab_size"], d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                    p + "self_attn.q_a_proj.weight": (q, d), p + "self_attn.q_a_layernorm.weight": (q,),
                    p + "self_attn.q_b_proj.weight": (h * (nope + rope), q),
                    p + "self_attn.kv_a_proj_with_mqa.weight": (kv + rope, d), p + "self_attn.kv_a_layernorm.weight": (kv,),
                    p + "self_attn.kv_b_proj.weight": (h * (nope + v), kv), p + "self_attn.o_proj.weight": (d, h * v),
                    p + "self_attn.indexer.wq_b.weight": (ih * idim, q), p + "self_attn.indexer.wk.weight": (idim, d),
                    p + "self_attn.indexer.k_norm.weight": (idim,), p + "self_attn.indexer.k_norm.bias": (idim,),
                    p + "self_attn.indexer.weights_proj.weight": (ih, d)})
        if i < cfg["first_k_dense_replace"]:
            mlps = [(p + "mlp.", cfg["intermediate_size"])]
        else:
            out.update({p + "mlp.gate.weight": (e, d), p + "mlp.gate.e_score_correction_bias": (e,)})
            mlps = [(f"{p}mlp.experts.{j}.", cfg["moe_intermediate_size"]) for j in range(e)]
            mlps.append((p + "mlp.shared_experts.", cfg["moe_intermediate_size"] * cfg["n_shared_experts"]))
        for mp, inter in mlps:
            out.update({mp + "gate_proj.weight": (inter, d), mp + "up_proj.weight": (inter, d), mp + "down_proj.weight": (d, inter)})
    return out


def is_fp8_linear(name: str) -> bool:
    """What the vendor builds as an FP8 ``Linear`` (everything but norms, router, weights_proj, embed, head)."""
    return (name.endswith("proj.weight") or name.endswith("wq_b.weight") or name.endswith("wk.weight")) \
        and "weights_proj" not in name


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 with 128x128 UE8M0 block scales (edge blocks partial), as DeepSeek's releases store weights."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / 128), math.ceil(cols / 128)
    scale = torch.empty(br, bc)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for a in range(br):
        for b in range(bc):
            blk = w[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128].float()
            s = 2.0 ** math.ceil(math.log2(max(float(blk.abs().max()), 1e-8) / 448))
            scale[a, b] = s
            q[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128] = (blk / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, scale


def write_tiny_v32(folder: str | Path, dtype: torch.dtype = torch.bfloat16, fp8: bool = False, seed: int = 0,
                   link_code: bool = True, **overrides) -> Path:
    """Write the tiny model; ``overrides`` replace config.json fields (the tensors follow them)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**CONFIG, **overrides, "torch_dtype": str(dtype).removeprefix("torch.")}
    if fp8:
        cfg["quantization_config"] = FP8_QC
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes(cfg).items():
        if name.endswith("e_score_correction_bias"):
            t = torch.zeros(shape)
        elif len(shape) == 1:  # norms near 1, the indexer's LayerNorm bias near 0
            t = (0.0 if name.endswith("bias") else 1.0) + 0.1 * torch.randn(shape, generator=g)
        elif "embed_tokens" in name:
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        if fp8 and is_fp8_linear(name):
            tensors[name], tensors[name + "_scale_inv"] = quantize_blocks(t)
        else:
            tensors[name] = t.to(dtype).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    if link_code and not (folder / "inference").exists():
        os.symlink(VENDOR, folder / "inference")
    return folder
