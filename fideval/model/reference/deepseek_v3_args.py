"""A DeepSeek-V3 / Kimi-K2 ``config.json`` (Hugging Face) as the reference code's ``ModelArgs``.

The vendor's ``generate.py`` reads its own ``configs/config_671B.json``; a release carries the HF
``config.json``. The fields map one to one, except where the reference code cannot express what the HF
config says; those are one-line errors here, not silently different models:

* RMSNorm eps is fixed at 1e-6 in the reference code; the MLP activation is SiLU; no attention bias;
  untied embeddings; rotary pairs interleaved (``rope_interleave``);
* routing: ``scoring_func`` softmax or sigmoid; with sigmoid the weights are always renormalised
  (``norm_topk_prob`` must be true); every layer from ``first_k_dense_replace`` on is MoE (``moe_layer_freq`` 1);
* RoPE: none, or YaRN whose ``mscale`` equals ``mscale_all_dim`` (the reference scales the softmax by
  ``mscale_all_dim`` only and has no separate cos/sin attention factor). The reference applies YaRN only
  when ``max_seq_len > original_seq_len``, so ``max_seq_len`` is set above ``original_seq_len`` exactly when
  the config asks for YaRN (caches are sized per chunk by the driver, not by ``max_seq_len``).

The vendor's ``Gate`` has its ``e_score_correction_bias`` only when ``dim == 7168`` (the 671B model); a
smaller model's bias is not used by the reference code, whatever the release holds, and without it the vendor
ranks expert groups by their best score (``amax``) where transformers (and the vendor at 7168) sums the top 2:
on a small model with ``n_group > 1`` the two implementations route differently (docs/runner.md measures it).
A config without ``scoring_func`` routes by sigmoid, as transformers' DeepSeek-V3 always does.
"""

from __future__ import annotations

import dataclasses

from fideval.errors import FidevalError

MODEL_TYPES = ("deepseek_v3", "kimi_k2")
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
             "num_attention_heads", "n_routed_experts", "num_experts_per_tok", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim")


def _bad(where: str, what: str, hint: str = "use model.implementation: transformers for this checkpoint") -> FidevalError:
    return FidevalError(f"{where}: {what}, which DeepSeek-V3's reference code cannot express", hint=hint)


def rope_of(cfg: dict) -> tuple[str, dict, float]:
    """(rope type, its parameters, theta) from ``rope_parameters`` (transformers 5) or ``rope_scaling`` (releases)."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0)) if isinstance(rope, dict) else None
    return kind, rope if isinstance(rope, dict) else {}, theta


def model_args(model_module, cfg: dict, where: str = "config.json"):
    """The vendor ``ModelArgs`` for ``cfg``; a config it cannot take is a one-line :class:`FidevalError`."""
    mt = cfg.get("model_type")
    if mt not in MODEL_TYPES:
        raise FidevalError(f"{where}: model_type {mt!r} is not DeepSeek-V3's ({', '.join(MODEL_TYPES)})",
                           hint="the DeepSeek-V3 reference code runs deepseek_v3 and kimi_k2 checkpoints")
    missing = [k for k in _REQUIRED if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool) or cfg[k] <= 0]
    if missing:
        raise FidevalError(f"{where}: {missing[0]} is missing or not a positive integer", hint="fix config.json")
    checks = (("rms_norm_eps", 1e-6, "RMSNorm eps {!r} (the reference code fixes 1e-6)"),
              ("hidden_act", "silu", "hidden_act {!r}"), ("attention_bias", False, "attention_bias {!r}"),
              ("tie_word_embeddings", False, "tie_word_embeddings {!r}"), ("rope_interleave", True, "rope_interleave {!r}"),
              ("moe_layer_freq", 1, "moe_layer_freq {!r}"))
    for key, want, what in checks:
        if key in cfg and cfg[key] != want:
            raise _bad(where, what.format(cfg[key]))
    score = cfg.get("scoring_func", "sigmoid")  # what transformers' DeepSeek-V3 always computes (and the releases say)
    if score not in ("softmax", "sigmoid"):
        raise _bad(where, f"scoring_func {score!r}")
    if score == "sigmoid" and cfg.get("norm_topk_prob", True) is not True:
        raise _bad(where, "sigmoid routing without norm_topk_prob")
    kind, rope, theta = rope_of(cfg)
    max_pos = int(cfg.get("max_position_embeddings", 4096))
    yarn = dict(original_seq_len=max_pos, rope_factor=1.0, beta_fast=32, beta_slow=1, mscale=1.0, max_seq_len=max_pos)
    if kind == "yarn":
        orig = int(rope.get("original_max_position_embeddings", max_pos))
        m, m_all = rope.get("mscale", 1.0), rope.get("mscale_all_dim", 1.0)
        if m != m_all:
            raise _bad(where, f"YaRN mscale {m!r} != mscale_all_dim {m_all!r}")
        yarn = dict(original_seq_len=orig, rope_factor=float(rope.get("factor", 1.0)),
                    beta_fast=rope.get("beta_fast", 32), beta_slow=rope.get("beta_slow", 1), mscale=float(m_all),
                    max_seq_len=max(max_pos, orig + 1))
    elif kind not in ("default", None) or theta is None:
        raise _bad(where, f"rope type {kind!r}")
    kw = dict(vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], inter_dim=cfg["intermediate_size"],
              moe_inter_dim=cfg["moe_intermediate_size"], n_layers=cfg["num_hidden_layers"],
              n_dense_layers=int(cfg.get("first_k_dense_replace", 0)), n_heads=cfg["num_attention_heads"],
              n_routed_experts=cfg["n_routed_experts"], n_shared_experts=int(cfg.get("n_shared_experts") or 0),
              n_activated_experts=cfg["num_experts_per_tok"], n_expert_groups=int(cfg.get("n_group") or 1),
              n_limited_groups=int(cfg.get("topk_group") or 1), score_func=score,
              route_scale=float(cfg.get("routed_scaling_factor", 1.0)), q_lora_rank=int(cfg.get("q_lora_rank") or 0),
              kv_lora_rank=cfg["kv_lora_rank"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
              qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"], rope_theta=float(theta),
              max_batch_size=1, **yarn)
    fields = {f.name for f in dataclasses.fields(model_module.ModelArgs)}
    unknown = sorted(set(kw) - fields)
    if unknown:
        raise FidevalError(f"the reference code's ModelArgs has no field {unknown[0]!r}",
                           hint="model.code must point at DeepSeek-V3's inference/ folder")
    if kw["n_activated_experts"] > kw["n_routed_experts"] or kw["n_routed_experts"] % kw["n_expert_groups"]:
        raise FidevalError(f"{where}: {kw['n_routed_experts']} experts do not route {kw['n_activated_experts']} per token "
                           f"in {kw['n_expert_groups']} groups", hint="fix config.json")
    try:
        return model_module.ModelArgs(**kw)
    except (TypeError, ValueError, AssertionError) as e:
        raise FidevalError(f"{where}: the reference code's ModelArgs rejects it ({e})", hint="fix config.json") from None


def check_world(args, world: int, where: str = "config.json") -> None:
    """What the reference code asserts when it builds at model parallel ``world``, as a one-line error first."""
    if world < 1:
        raise FidevalError(f"model parallel size {world} is not a positive integer", hint="use 1, 2, 4 or 8")
    splits = (("vocab_size", args.vocab_size), ("n_routed_experts", args.n_routed_experts), ("n_heads", args.n_heads),
              ("inter_dim", args.inter_dim), ("n_shared_experts * moe_inter_dim", args.n_shared_experts * args.moe_inter_dim))
    for what, n in splits:
        if n % world:
            raise FidevalError(f"{where}: {what} = {n} does not divide over {world} model-parallel ranks",
                               hint="choose a model-parallel size that divides the vocabulary, the experts and the heads")
