"""Tiny DeepSeek-V3 releases for the reference-code backend: the vendor's ``ModelArgs`` shrunk (dim 256, 3 layers
of which 1 dense, 8 experts top-2 in 4 groups, YaRN on), random weights saved in the release's HF layout by
transformers' ``save_pretrained`` (per-expert tensors, ``model.layers.N...`` names), in float32 / bf16 or as an
FP8 release (E4M3 + 128x128 ``weight_scale_inv``, :mod:`fp8_fixtures`' encoder), with ``inference/`` a symlink
to the vendor's code in ``../shared/reference-code/deepseek-v3`` (never copied into the project).

Every dimension a linear's input runs along is a multiple of 128, so the vendor's ``gemm_impl="fp8"`` path
(``act_quant`` needs whole blocks) runs too; ``kv_a_proj_with_mqa`` has 144 rows (a partial block, like the
real 576). The routing bias is zero: the vendor's ``Gate`` uses it only at dim 7168, transformers always.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REFERENCE_CODE = Path(__file__).resolve().parents[2] / "shared" / "reference-code"
V3_CODE = REFERENCE_CODE / "deepseek-v3"
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def need_code() -> Path:
    if not (V3_CODE / "model.py").is_file():
        pytest.skip(f"DeepSeek-V3 reference code not found at {V3_CODE} (CI provides ../shared/reference-code)")
    return V3_CODE


def config(**over):
    import transformers as tf

    kw = dict(vocab_size=512, hidden_size=256, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32,
              qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
              n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, rms_norm_eps=1e-6,
              tie_word_embeddings=False, max_position_embeddings=128, rope_parameters=dict(YARN))
    kw.update(over)
    return tf.DeepseekV3Config(**kw)


def build(folder: Path, *, fp8: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0, ue8m0: bool = False,
          code: bool = True, **over) -> Path:
    """The release in ``folder`` (``fp8``: FP8 E4M3 decoder linears, else every tensor in ``dtype``)."""
    import fp8_fixtures as ff
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(**over), dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.zero_()
    model.save_pretrained(folder)
    path = folder / "model.safetensors"
    out = {}
    for k, v in load_file(str(path)).items():
        if k.endswith("e_score_correction_bias"):
            out[k] = v.float()
        elif fp8 and ff.is_quantized(k, v):
            out[k], out[k + "_scale_inv"] = ff.quantize(v, ue8m0)
        else:
            out[k] = v.to(torch.bfloat16 if fp8 else dtype)
    save_file(out, str(path), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    if fp8:
        cfg["quantization_config"] = {**ff.QC, **({"scale_fmt": "ue8m0"} if ue8m0 else {})}
    cfg["dtype"] = "bfloat16" if fp8 else str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    if code:
        (folder / "inference").symlink_to(need_code(), target_is_directory=True)
    return folder


def tokens(n: int = 2, L: int = 24, vocab: int = 512, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, L), generator=g)


def driver(folder: Path, *, dtype: torch.dtype = torch.float32, **kw):
    """The DeepSeek-V3 driver on ``folder`` at N = 1 (CPU, torch stand-in kernels)."""
    from fideval.model.reference.code import load_vendor_code
    from fideval.model.reference.deepseek_v3 import DeepseekV3Driver
    from fideval.model.weights.checkpoint import Checkpoint

    stand, prefer = DeepseekV3Driver.stand_ins(torch.device("cpu"))
    code = load_vendor_code(Path(folder) / "inference", trust=True, stand_ins=stand, prefer_vendor=prefer)
    ckpt = Checkpoint(folder)
    return DeepseekV3Driver(code, ckpt.config_dict, ckpt, dtype=dtype, **kw)


def layer_by_layer(drv, toks: torch.Tensor) -> torch.Tensor:
    """The driver's contract run by hand: float32 [B, L, V]."""
    h = drv.begin(toks)
    for i in range(drv.n_layers):
        h = drv.forward_layer(i, drv.load_layer(i), h)
    return drv.finish(h)
