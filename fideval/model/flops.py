"""Analytic model FLOPs per token of a decoder-only LM, from its transformers config; and weight bytes per layer.

Why analytic: model FLOP utilisation (useful FLOPs / wall / peak) must not depend on how a run computes them
(micro-batches, token blocks, the canary's extra micro-batch, warm-ups): it counts the GEMMs of one forward
pass of the model itself. Counted (2 FLOPs per multiply-add), per token and per layer:

* attention projections: MLA (DeepSeek-V3) q_a/q_b (or q), kv_a, kv_b, o; otherwise q, k, v, o (GQA);
* attention scores: q.k and p.v, 2 x heads x (qk head dim + v head dim) per key, over the keys a query sees:
  (L + 1) / 2 on average for a causal mask (``causal=False``: all L, what an eager forward multiplies),
  ``min(i + 1, window)`` for a sliding-window layer;
* MLP: a MoE layer's router (H x E), its top-k routed experts and shared experts, 3 GEMMs each (gate, up,
  down); a dense layer's 3 GEMMs; the lm head (H x V).

Norms, rotary, softmax, routing arithmetic and residual adds are not counted (they are not GEMMs), which is the
convention of published MFU figures. ``tests/test_model_flops.py`` checks the count against
``torch.utils.flop_counter.FlopCounterMode`` on a forward of each tiny architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# what the counts read a model's sizes from: transformers' config, or a config.json as a dict (a family transformers
# has no config of: the vendor driver's sizing_config(), fideval.model.reference)
ModelConfig: TypeAlias = "PretrainedConfig | dict[str, Any]"


def _get(cfg: ModelConfig, name: str, default: Any = None) -> Any:
    v = cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)
    return default if v is None else v


@dataclass(frozen=True)
class Dims:
    """The sizes FLOPs and weight bytes are made of (one layer's multiply-adds per token)."""

    hidden: int
    vocab: int
    layers: int
    attn_proj: int  # multiply-adds of the attention projections per token
    score_per_key: int  # multiply-adds of q.k and p.v per (query, key) pair, all heads
    router: int  # H x E on a MoE layer
    expert: int  # one routed expert's 3 GEMMs per token (3 H I)
    top_k: int
    experts: int
    shared: int  # shared experts' 3 GEMMs per token
    dense: int  # a dense layer's 3 GEMMs per token
    moe_layers: tuple[bool, ...]
    windows: tuple[int | None, ...]  # sliding window per layer, None for full causal attention
    moe_intermediate: int
    q_dim: int  # per token: all heads' query width
    k_dim: int
    v_dim: int  # all heads' value width (the attention output before o_proj)


def dims(cfg: ModelConfig) -> Dims:
    """The sizes of ``cfg`` (a transformers config or its config.json dict)."""
    mt = _get(cfg, "model_type", "")
    H, V, n = int(_get(cfg, "hidden_size")), int(_get(cfg, "vocab_size")), int(_get(cfg, "num_hidden_layers"))
    heads = int(_get(cfg, "num_attention_heads"))
    kv_heads = int(_get(cfg, "num_key_value_heads", heads))
    if _get(cfg, "kv_lora_rank"):  # MLA
        q_lora, kv_lora = int(_get(cfg, "q_lora_rank", 0)), int(_get(cfg, "kv_lora_rank"))
        nope, rope, v = int(_get(cfg, "qk_nope_head_dim")), int(_get(cfg, "qk_rope_head_dim")), int(_get(cfg, "v_head_dim"))
        qk = nope + rope
        q = H * q_lora + q_lora * heads * qk if q_lora else H * heads * qk
        proj = q + H * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * H
        per_key, q_dim, k_dim, v_dim = heads * (qk + v), heads * qk, heads * qk, heads * v
    else:
        hd = int(_get(cfg, "head_dim", H // heads))
        proj = H * heads * hd + 2 * H * kv_heads * hd + heads * hd * H
        per_key, q_dim, k_dim, v_dim = heads * 2 * hd, heads * hd, kv_heads * hd, heads * hd
    inter = int(_get(cfg, "intermediate_size", 0))
    if mt == "deepseek_v3":
        E, moe_i = int(_get(cfg, "n_routed_experts", 0)), int(_get(cfg, "moe_intermediate_size", 0))
        shared = 3 * H * moe_i * int(_get(cfg, "n_shared_experts", 0))
        first = int(_get(cfg, "first_k_dense_replace", 0))
        moe = tuple(bool(E) and i >= first for i in range(n))
    elif mt == "qwen3_moe":
        E, moe_i, shared = int(_get(cfg, "num_experts", 0)), int(_get(cfg, "moe_intermediate_size", 0)), 0
        only, step = set(_get(cfg, "mlp_only_layers", []) or []), int(_get(cfg, "decoder_sparse_step", 1))
        moe = tuple(i not in only and E > 0 and (i + 1) % step == 0 for i in range(n))
    elif mt in ("mixtral", "gpt_oss"):
        E, moe_i, shared = int(_get(cfg, "num_local_experts", 0)), inter, 0
        moe = (E > 0,) * n
    else:
        E, moe_i, shared, moe, inter = _other_families(cfg, n, H, inter)
    win = _get(cfg, "sliding_window")
    types_ = _get(cfg, "layer_types")
    if types_:
        windows = tuple(int(win) if t == "sliding_attention" and win else None for t in types_[:n])
    else:  # as fideval.model.adapters.Adapter.layer_type: Mixtral and Qwen3-MoE slide every layer when set
        windows = (int(win) if win and mt in ("mixtral", "qwen3_moe") else None,) * n
    return Dims(hidden=H, vocab=V, layers=n, attn_proj=proj, score_per_key=per_key, router=H * E, expert=3 * H * moe_i,
                top_k=int(_get(cfg, "num_experts_per_tok", 0)) if E else 0, experts=E, shared=shared, dense=3 * H * inter,
                moe_layers=moe, windows=windows, moe_intermediate=moe_i, q_dim=q_dim, k_dim=k_dim, v_dim=v_dim)


def _other_families(cfg: ModelConfig, n: int, H: int, inter: int) -> tuple[int, int, int, tuple[bool, ...], int]:
    """Routed experts, their intermediate size, shared experts' multiply-adds, which layers are MoE and the dense
    layers' intermediate size, for the families beyond the seven above (fideval.model.families), from the config
    keys each names them by. Their attention is counted as standard (linear-attention and indexer layers differ:
    an estimate for sizing and utilisation, checked against the layers' own parameter counts in
    tests/test_model_families.py, not against a FLOP counter)."""
    E = next((int(_get(cfg, k)) for k in ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
              if _get(cfg, k)), 0)
    if not E:
        return 0, 0, 0, (False,) * n, inter
    moe_i = int(_get(cfg, "moe_intermediate_size", 0)) or inter
    shared_i = (int(_get(cfg, "n_shared_experts", 0)) * moe_i or int(_get(cfg, "shared_expert_intermediate_size", 0))
                or int(_get(cfg, "moe_num_shared_experts", 0)) * moe_i or int(_get(cfg, "num_shared_expert", 0)) * inter
                or (inter if _get(cfg, "model_type") == "llama4_text" else 0))
    if _get(cfg, "mlp_layer_types"):
        moe = tuple(t == "sparse" for t in _get(cfg, "mlp_layer_types")[:n])
    elif _get(cfg, "moe_layers") is not None and not isinstance(_get(cfg, "moe_layers"), bool):
        moe = tuple(i in set(_get(cfg, "moe_layers")) for i in range(n))
    elif _get(cfg, "moe_layer_interval"):
        a, b = int(_get(cfg, "moe_layer_start_index", 0)), _get(cfg, "moe_layer_end_index", n - 1)
        step, last = int(_get(cfg, "moe_layer_interval")), n - 1 if b in (None, -1) else int(b)
        moe = tuple((i + 1) % step == 0 and a <= i <= last for i in range(n))
    else:
        first = int(_get(cfg, "first_k_dense_replace", 0))
        only, step = set(_get(cfg, "mlp_only_layers", []) or []), int(_get(cfg, "decoder_sparse_step", 1))
        moe = tuple(i >= first and i not in only and (i + 1) % step == 0 for i in range(n))
    dense_i = int(_get(cfg, "intermediate_size_mlp", 0)) or inter
    return E, moe_i, 3 * H * shared_i, moe, dense_i


def mean_keys(length: int, window: int | None = None, causal: bool = True) -> float:
    """Keys a query attends to, averaged over the L positions of a sequence."""
    if not causal:
        return float(length)
    if window is None or window >= length:
        return (length + 1) / 2
    w = int(window)  # positions 0..w-1 see i + 1 keys, the rest see w
    return (w * (w + 1) / 2 + (length - w) * w) / length


def flops_per_token(cfg: ModelConfig, length: int, causal: bool = True) -> dict[str, float]:
    """Model FLOPs per token of a forward over sequences of ``length``, by part, and their ``total``.

    Parts: ``attn_proj``, ``attn_scores``, ``moe`` (router + routed top-k + shared experts), ``dense_mlp``,
    ``head``; summed over the layers."""
    d = dims(cfg)
    scores = sum(2 * d.score_per_key * mean_keys(length, w, causal) for w in d.windows)
    n_moe = sum(d.moe_layers)
    out = {"attn_proj": 2.0 * d.attn_proj * d.layers, "attn_scores": float(scores),
           "moe": 2.0 * n_moe * (d.router + d.top_k * d.expert + d.shared),
           "dense_mlp": 2.0 * (d.layers - n_moe) * d.dense, "head": 2.0 * d.hidden * d.vocab}
    out["total"] = sum(out.values())
    return out


def layer_params(cfg: ModelConfig, world: int = 1) -> list[int]:
    """Parameters of each decoder layer as one rank holds them (routed experts split over ``world`` ranks):
    the attention projections, routed and shared experts, router, dense MLP and norms."""
    d = dims(cfg)
    out = []
    for moe in d.moe_layers:
        mlp = (d.experts // max(world, 1)) * d.expert + d.shared + d.router if moe else d.dense
        out.append(d.attn_proj + mlp + 4 * d.hidden)
    return out
