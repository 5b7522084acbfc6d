"""Tiny DeepSeek-V4.1-Flash checkpoints for the reference-code backend's tests.

The vendor's ``ModelArgs`` shrunk with its structure kept: six layers with compress ratios 0, 2 and 1, two
kv-source layers (1, 3) whose compressed KV the next layers share, three index sources (1, 3, 5), a candidate
source (3) whose blocks layer 5's indexer reads, Engram on layers 0 and 2 (n-grams up to 3, two heads, a
~250-row table each, hashed over a 512-token WordLevel tokenizer whose case pairs collapse), hc_mult 2, and a
window of 8 with top-4 indexing, so sequences past ~12 tokens use compressed KV and the indexer's top-k.
Weights are random, made as the release stores them: FP8 e4m3 dense linears with E8M0 32x32 block scales,
FP4 e2m1 experts packed two per byte (stored as I8) with E8M0 per-32 scales, FP8 Engram rows with per-32
scales, the rest bf16/fp32; ``dtype="bf16"`` gives the all-bf16 variant. The folder's ``inference/`` is a
symlink to the shared vendor code (the project holds no copy of it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

V41 = Path(__file__).resolve().parents[2] / "shared" / "reference-code" / "deepseek-v4.1-flash"
MISSING = "the vendor's DeepSeek-V4.1-Flash code is not at ../shared/reference-code/deepseek-v4.1-flash"

TINY = dict(
    vocab_size=512, dim=128, moe_inter_dim=64, n_layers=6, n_mtp_layers=0, n_heads=4,
    n_routed_experts=4, n_shared_experts=1, n_activated_experts=2, score_func="sqrtsoftplus", route_scale=1.5,
    swiglu_limit=10.0, q_lora_rank=64, head_dim=64, rope_head_dim=16, norm_eps=1e-20, o_groups=4, o_lora_rank=32,
    window_size=8, compress_ratios=[0, 2, 2, 1, 1, 1], kv_source_layers=[1, 3], index_source_layers=[1, 3, 5],
    original_seq_len=16, rope_theta=10000, rope_factor=4, beta_fast=32, beta_slow=1, compress_rope_theta=160000,
    index_n_heads=4, index_head_dim=32, index_topk=4, candidate_source_layer=3, candidate_topk_blocks=2,
    candidate_block_size=4, hc_mult=2, hc_sinkhorn_iters=20, hc_eps=1e-6,
    engram_layer_ids=[0, 2], engram_max_ngram_size=3, engram_vocab_size=50, engram_n_heads=2, engram_head_dim=32,
    engram_pad_id=2, dspark_block_size=0, vision_n_layers=0,
)


def vendor_code():
    from fideval.model.reference.code import load_vendor_code

    return load_vendor_code(V41, trust=True)


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A WordLevel tokenizer: ids 2k and 2k+1 are ``w<k>`` and ``W<k>``, which Engram's normaliser merges."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {("w" if i % 2 == 0 else "W") + str(i // 2): i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def _pow2_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2((amax / qmax).clamp_min(2.0**-100))))


def fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [out, in] -> (e4m3 [out, in], e8m0 [ceil(out/32), ceil(in/32)]): 32x32 blocks, power-of-two scales."""
    out, inp = w.shape
    pad = torch.zeros(-(-out // 32) * 32, -(-inp // 32) * 32, dtype=torch.float32)
    pad[:out, :inp] = w
    blocks = pad.unflatten(0, (-1, 32)).unflatten(2, (-1, 32))  # [ob, 32, ib, 32]
    s = _pow2_scale(blocks.abs().amax(dim=(1, 3)), 448.0)
    q = (blocks / s[:, None, :, None]).flatten(0, 1).flatten(1, 2)[:out, :inp]
    return q.clamp(-448, 448).to(torch.float8_e4m3fn), s.to(torch.float8_e8m0fnu)


def _fill(name: str, p: torch.Tensor, g: torch.Generator, kc) -> dict[str, torch.Tensor]:
    """Stored tensors for one vendor parameter (its scale, if any, comes with the weight)."""
    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    if name.endswith(".scale"):
        return {}
    if p.dtype == torch.float4_e2m1fn_x2:
        w = randn(p.shape[0], p.shape[1] * 2, std=(p.shape[1] * 2) ** -0.5).to(torch.bfloat16)
        q, s = kc.fp4_act_quant(w, 32)
        return {name: q.view(torch.int8), name[:-6] + "scale": s}
    if p.dtype == torch.float8_e4m3fn and ".engram.embed." in name:
        q, s = kc.act_quant(randn(*p.shape).to(torch.bfloat16), 32, "ue8m0", torch.float8_e8m0fnu)
        return {name: q, name[:-6] + "scale": s}
    if p.dtype == torch.float8_e4m3fn:
        q, s = fp8_blocks(randn(*p.shape, std=p.shape[1] ** -0.5))
        return {name: q, name[:-6] + "scale": s}
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name or leaf in ("q_weight", "k_weight"):
        t = 1 + randn(*p.shape, std=0.1)
    elif leaf == "attn_sink":
        t = randn(*p.shape, std=0.5)
    elif leaf == "bias":
        t = randn(*p.shape, std=0.1)
    elif leaf.startswith("hc_") and leaf.endswith("_fn"):
        t = randn(*p.shape, std=0.05)
    elif leaf.startswith("hc_") and leaf.endswith("_base"):
        t = randn(*p.shape, std=0.5)
    elif leaf.startswith("hc_") and leaf.endswith("_scale"):
        t = 0.5 + torch.rand(*p.shape, generator=g)
    elif name == "embed.weight":
        t = randn(*p.shape)
    else:  # linear weights kept in float: bf16 in the release even where the vendor promotes them to fp32
        return {name: randn(*p.shape, std=p.shape[-1] ** -0.5).to(torch.bfloat16)}
    return {name: t.to(p.dtype)}


def write_tiny_v41(folder: Path, *, dtype: str = "fp8", seed: int = 0, **overrides) -> Path:
    """A model folder: config.json (ModelArgs fields, as the release's), model.safetensors in the vendor's
    names and storage formats, tokenizer.json, and ``inference/`` -> the shared vendor code."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    code = vendor_code()
    m, eng, kc = code.model, code.module("engram"), code.module("kernel_cpu")
    cfg = {**TINY, **overrides, "dtype": dtype, "expert_dtype": "fp4" if dtype == "fp8" else None}
    write_tokenizer(folder, cfg["vocab_size"])
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    cfg["engram_compressed_vocab_size"] = eng.build_compressed_token_map(tok)[1]
    args = m.ModelArgs(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()},
                       engram_num_embeddings=(1, 1))
    layout = eng.EngramLayout.from_args(args)
    cfg["engram_num_embeddings"] = [int(sum(sum(p) for p in layer)) for layer in layout.primes]
    args = m.ModelArgs(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
    import torch.utils.deterministic as det

    saved, fill = (m.world_size, m.rank, m.default_dtype), det.fill_uninitialized_memory
    det.fill_uninitialized_memory = False  # deterministic mode (a run in this process) has no fill for FP4
    try:
        with m.set_dtype(torch.bfloat16):
            model = m.Transformer(args, tok)
    finally:
        m.world_size, m.rank, m.default_dtype = saved
        det.fill_uninitialized_memory = fill
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        tensors.update(_fill(name, p, g, kc))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    link = folder / "inference"
    if not link.exists():
        link.symlink_to(V41, target_is_directory=True)
    return folder
