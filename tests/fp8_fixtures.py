"""Tiny FP8 releases in the real layout (DeepSeek-V3, Qwen3-FP8; Kimi-K2 is DeepSeek-V3 under another
``model_type``): F8_E4M3 ``X.weight`` with float32 ``X.weight_scale_inv`` [ceil(out/128), ceil(in/128)] for every
linear of the decoder layers (routed experts per expert, as on the Hub), bf16 norms, router, embedding and lm head
(DeepSeek's ``e_score_correction_bias`` float32), ``quantization_config`` as released.

Two sizes per architecture:

* ``aligned``: every dimension a multiple of 128 or a single block. The only shapes transformers 5.25's
  ``Fp8Dequantize`` reads right: it derives the block from the scale grid (``rows // scale_rows``), so 192 rows
  with 2 scale rows become blocks of 96, and 176 rows with 2 scale rows raise.
* ``edges``: partial edge blocks after full ones (hidden 192, DeepSeek's kv_a_proj_with_mqa at 176 rows like
  the real 576, moe_intermediate 160), where :func:`ref_dequant` is the oracle.

The encoder is written here with torch's own float8 cast (nothing from fideval), and :func:`ref_dequant` is
DeepSeek's ``weight_dequant`` block by block, also independent of fideval.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

QC = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
B = 128
V = 96
SIZES = ("aligned", "edges")


def config(arch: str, size: str):
    import transformers as tf

    common = dict(vocab_size=V, num_attention_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if arch == "qwen3":
        dims = dict(hidden_size=256, head_dim=32, intermediate_size=96) if size == "aligned" else \
            dict(hidden_size=192, head_dim=48, intermediate_size=320)  # q_proj 192 rows, mlp 320: partial last blocks
        return tf.Qwen3Config(**common, **dims, num_hidden_layers=2, num_key_value_heads=2)
    if arch == "deepseek_v3":
        dims = dict(hidden_size=256, intermediate_size=128, moe_intermediate_size=96, q_lora_rank=128, kv_lora_rank=48) \
            if size == "aligned" else \
            dict(hidden_size=192, intermediate_size=320, moe_intermediate_size=160, q_lora_rank=192, kv_lora_rank=160)
        return tf.DeepseekV3Config(**common, **dims, num_hidden_layers=3, num_key_value_heads=4, n_routed_experts=8,
                                   n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                                   first_k_dense_replace=1, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
                                   routed_scaling_factor=2.5)
    raise KeyError(arch)


def is_quantized(name: str, t: torch.Tensor) -> bool:
    """What the releases quantize: every linear weight of the decoder layers, not the router (mlp.gate)."""
    return t.ndim == 2 and name.startswith("model.layers.") and (name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight"))


def quantize(w: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's weight_quant per 128x128 block: s = amax/448 (UE8M0: rounded up to a power of two), q = e4m3(w/s)."""
    r, c = w.shape
    s = torch.empty(math.ceil(r / B), math.ceil(c / B), dtype=torch.float32)
    q = torch.empty(r, c, dtype=torch.float8_e4m3fn)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = w[i * B:(i + 1) * B, j * B:(j + 1) * B].float()
            sc = blk.abs().max() / 448.0
            if ue8m0:
                sc = torch.exp2(torch.ceil(torch.log2(sc)))
            s[i, j] = sc
            q[i * B:(i + 1) * B, j * B:(j + 1) * B] = (blk / sc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, s


def ref_dequant(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """DeepSeek's weight_dequant: each block's fp8.to(float32) * its scale, then one rounding to ``dtype``."""
    y = torch.empty(q.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            y[i * B:(i + 1) * B, j * B:(j + 1) * B] = q[i * B:(i + 1) * B, j * B:(j + 1) * B].to(torch.float32) * s[i, j]
    return y.to(dtype)


def build(arch: str, size: str, folder: Path, *, seed: int = 0, ue8m0: bool = False) -> Path:
    """A random model (std 0.1, as tests/model_fixtures.py), saved with save_pretrained (the Hub's per-expert
    layout), then its safetensors rewritten as the FP8 release and its config given the quantization_config."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(arch, size), dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    model.save_pretrained(folder)
    path = Path(folder) / "model.safetensors"
    out = {}
    for k, v in load_file(str(path)).items():
        if is_quantized(k, v):
            out[k], out[k + "_scale_inv"] = quantize(v, ue8m0)
        else:
            out[k] = v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)
    save_file(out, str(path), metadata={"format": "pt"})
    cfg = json.loads((Path(folder) / "config.json").read_text())
    cfg["quantization_config"] = {**QC, **({"scale_fmt": "ue8m0"} if ue8m0 else {})}
    cfg["dtype"] = "bfloat16"
    (Path(folder) / "config.json").write_text(json.dumps(cfg, indent=2))
    return Path(folder)


def dequantized(fp8: Path, dst: Path, dtype: torch.dtype) -> Path:
    """The release with every fp8 weight replaced by :func:`ref_dequant` in ``dtype`` (other tensors as stored),
    loaded by transformers and written with its save_pretrained: the unquantized checkpoint of the same weights."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    sd = load_file(str(fp8 / "model.safetensors"))
    plain = {k: ref_dequant(v, sd[k + "_scale_inv"], dtype) if k + "_scale_inv" in sd else v
             for k, v in sd.items() if not k.endswith("_scale_inv")}
    tmp = dst.parent / (dst.name + "-files")
    tmp.mkdir(parents=True)
    save_file(plain, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((fp8 / "config.json").read_text())
    cfg.pop("quantization_config")
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    (tmp / "config.json").write_text(json.dumps(cfg))
    AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype).save_pretrained(dst)
    return dst


def edit(folder: Path, fn) -> None:
    """Apply ``fn(dict name -> tensor) -> dict`` to the release's safetensors in place."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    save_file(fn(dict(load_file(str(path)))), str(path), metadata={"format": "pt"})


def transformers_fp8(folder: Path, dtype: torch.dtype):
    """transformers' own loading of the release, ``FineGrainedFP8Config(dequantize=True)`` (its CPU path).

    transformers checks that accelerate is installed before any FP8 load, though the dequantize path never
    uses it (no FP8 modules are swapped in); the check is skipped here instead of installing accelerate."""
    import transformers.quantizers.quantizer_finegrained_fp8 as qf
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    old = qf.is_accelerate_available
    qf.is_accelerate_available = lambda: True
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype,
                                                    quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
    finally:
        qf.is_accelerate_available = old
