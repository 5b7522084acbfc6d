"""The vendor's ``ModelArgs`` for DeepSeek-V3.2-Exp from the release's HF ``config.json`` (model_type ``deepseek_v32``).

The release ships ``config.json`` in transformers' names; the vendor's ``generate.py`` instead reads
``config_671B_v3.2.json`` in its own (``dim``, ``n_dense_layers``, ``index_topk``...). This is the map, with
everything the vendor's code cannot express refused in one line instead of silently computed otherwise:

* RMSNorm's eps is hard-coded 1e-6 in the vendor's ``RMSNorm``; the router normalises its top-k weights iff
  it scores with sigmoid; experts are SiLU-gated; the head is untied; only YaRN rope scaling (or none).
* YaRN: the vendor switches it on when ``max_seq_len > original_seq_len`` (frequencies *and* the attention
  softmax scale ``mscale``), so ``max_seq_len`` is the release's ``max_position_embeddings`` (163840 > 4096:
  on, as transformers always has it) and, without rope scaling, ``original_seq_len = max_seq_len`` (off).
  The vendor's ``mscale`` is transformers' ``mscale_all_dim``; both must agree with ``mscale`` (else
  transformers scales cos/sin by their ratio, which the vendor cannot).
* ``dtype`` is ``"fp8"`` when the weights are an FP8 release read as released, else the run's float dtype
  goes into ``Linear.dtype`` by the driver; ``scale_fmt`` comes from ``quantization_config.scale_fmt``
  (``"ue8m0"`` in the release): it also shapes the MLA KV-cache and indexer fp8 round trips.
* Constraints of the vendor's kernels: ``act_quant`` takes 128-wide groups, so ``kv_lora_rank`` and
  ``index_head_dim`` are multiples of 128 and ``fp8_index`` takes one scale per key: ``index_head_dim`` is 128.
"""

from __future__ import annotations

import dataclasses

from fideval.errors import FidevalError

_HINT = "the reference code cannot run this config.json as it is; use model.implementation: transformers"


def _get(cfg: dict, key: str, kind=int, default=None):
    v = cfg.get(key, default)
    if v is None:
        raise FidevalError(f"config.json has no {key!r}", hint="a DeepSeek-V3.2-Exp config.json names it")
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise FidevalError(f"config.json {key!r} is {v!r}, not a {kind.__name__}", hint="fix config.json")
    return v


def _rope(cfg: dict) -> tuple[dict, int]:
    """(vendor rope fields, max_seq_len)."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    if scaling:
        params.update(scaling)
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    max_len = _get(cfg, "max_position_embeddings")
    kind = params.get("rope_type", params.get("type", "default"))
    out = {"rope_theta": float(theta)}
    if kind == "default":
        return {**out, "original_seq_len": max_len, "rope_factor": 1.0}, max_len
    if kind != "yarn":
        raise FidevalError(f"config.json rope scaling {kind!r}: the vendor's code applies YaRN only", hint=_HINT)
    mscale, all_dim = params.get("mscale", 1.0), params.get("mscale_all_dim", params.get("mscale", 1.0))
    if float(mscale) != float(all_dim):
        raise FidevalError(f"config.json rope scaling has mscale {mscale} != mscale_all_dim {all_dim}",
                           hint="the vendor's YaRN has one mscale (attention scale only); " + _HINT)
    original = int(params.get("original_max_position_embeddings", 4096))
    out.update(original_seq_len=original, rope_factor=float(params.get("factor", 40)),
               beta_fast=int(params.get("beta_fast", 32)), beta_slow=int(params.get("beta_slow", 1)), mscale=float(all_dim))
    if max_len <= original:
        raise FidevalError(f"config.json max_position_embeddings {max_len} <= original_max_position_embeddings {original}",
                           hint="the vendor applies YaRN only past original_seq_len; " + _HINT)
    return out, max_len


def model_args(model_module, cfg: dict, *, fp8: bool):
    """The vendor's ``ModelArgs`` for ``cfg`` (``fp8``: weights are read as an FP8 release)."""
    if cfg.get("model_type", "deepseek_v32") != "deepseek_v32":
        raise FidevalError(f"config.json model_type {cfg.get('model_type')!r} is not deepseek_v32",
                           hint="the DeepSeek-V3.2-Exp reference code runs DeepSeek-V3.2-Exp checkpoints")
    eps = cfg.get("rms_norm_eps", 1e-6)
    if eps != 1e-6:
        raise FidevalError(f"config.json rms_norm_eps {eps}: the vendor's RMSNorm hard-codes 1e-6", hint=_HINT)
    if cfg.get("hidden_act", "silu") != "silu" or cfg.get("tie_word_embeddings", False) or cfg.get("attention_bias", False):
        raise FidevalError("config.json asks for a non-SiLU MLP, tied embeddings or attention biases, which the "
                           "vendor's code does not have", hint=_HINT)
    score = cfg.get("scoring_func", "sigmoid")
    if score not in ("sigmoid", "softmax"):
        raise FidevalError(f"config.json scoring_func {score!r} is neither sigmoid nor softmax", hint=_HINT)
    if bool(cfg.get("norm_topk_prob", True)) != (score == "sigmoid"):
        raise FidevalError(f"config.json norm_topk_prob {cfg.get('norm_topk_prob')} with {score} scoring: the "
                           "vendor's router normalises its top-k weights exactly when it scores with sigmoid", hint=_HINT)
    n_layers, dense = _get(cfg, "num_hidden_layers"), _get(cfg, "first_k_dense_replace", default=0)
    types = cfg.get("mlp_layer_types")
    if types is not None and list(types) != ["dense"] * min(dense, n_layers) + ["sparse"] * max(0, n_layers - dense):
        raise FidevalError("config.json mlp_layer_types is not first_k_dense_replace dense layers then MoE layers",
                           hint=_HINT)
    if cfg.get("moe_layer_freq", 1) != 1:
        raise FidevalError(f"config.json moe_layer_freq {cfg['moe_layer_freq']}: the vendor's code has every layer "
                           "after the dense ones MoE", hint=_HINT)
    rope, max_len = _rope(cfg)
    qc = cfg.get("quantization_config") or {}
    fields = dict(
        max_seq_len=max_len, dtype="fp8" if fp8 else "bf16", scale_fmt=qc.get("scale_fmt") if isinstance(qc, dict) else None,
        vocab_size=_get(cfg, "vocab_size"), dim=_get(cfg, "hidden_size"), inter_dim=_get(cfg, "intermediate_size"),
        moe_inter_dim=_get(cfg, "moe_intermediate_size"), n_layers=n_layers, n_dense_layers=dense,
        n_heads=_get(cfg, "num_attention_heads"), n_routed_experts=_get(cfg, "n_routed_experts"),
        n_shared_experts=_get(cfg, "n_shared_experts"), n_activated_experts=_get(cfg, "num_experts_per_tok"),
        n_expert_groups=_get(cfg, "n_group", default=1), n_limited_groups=_get(cfg, "topk_group", default=1),
        score_func=score, route_scale=_get(cfg, "routed_scaling_factor", float, 1.0),
        q_lora_rank=_get(cfg, "q_lora_rank"), kv_lora_rank=_get(cfg, "kv_lora_rank"),
        qk_nope_head_dim=_get(cfg, "qk_nope_head_dim"), qk_rope_head_dim=_get(cfg, "qk_rope_head_dim"),
        v_head_dim=_get(cfg, "v_head_dim"), index_n_heads=_get(cfg, "index_n_heads"),
        index_head_dim=_get(cfg, "index_head_dim"), index_topk=_get(cfg, "index_topk"), **rope)
    if fields["scale_fmt"] not in (None, "ue8m0"):
        raise FidevalError(f"config.json quantization_config.scale_fmt {fields['scale_fmt']!r}", hint="supported: 'ue8m0'")
    if fields["q_lora_rank"] <= 0:
        raise FidevalError("config.json q_lora_rank is 0: the V3.2 indexer reads the query's low-rank latent", hint=_HINT)
    if fields["kv_lora_rank"] % 128 or fields["index_head_dim"] != 128:
        raise FidevalError(f"config.json kv_lora_rank {fields['kv_lora_rank']} / index_head_dim {fields['index_head_dim']}: "
                           "the vendor quantizes both in 128-wide groups and scores one scale per key",
                           hint="kv_lora_rank must be a multiple of 128 and index_head_dim 128")
    if fields["qk_rope_head_dim"] % 2 or fields["qk_rope_head_dim"] > fields["index_head_dim"]:
        raise FidevalError(f"config.json qk_rope_head_dim {fields['qk_rope_head_dim']} must be even and at most "
                           "index_head_dim", hint="fix config.json")
    if fp8:
        ins = {"hidden_size": fields["dim"], "q_lora_rank": fields["q_lora_rank"],
               "num_attention_heads*v_head_dim": fields["n_heads"] * fields["v_head_dim"],
               "intermediate_size": fields["inter_dim"], "moe_intermediate_size": fields["moe_inter_dim"]}
        bad = [k for k, v in ins.items() if v % 128]
        if bad:
            raise FidevalError(f"config.json {bad[0]} ({ins[bad[0]]}) is the input of an FP8 linear but not a multiple of 128",
                               hint="the vendor's act_quant quantizes inputs in 128-wide groups")
    if fields["n_activated_experts"] > fields["n_routed_experts"] or fields["n_routed_experts"] % fields["n_expert_groups"]:
        raise FidevalError("config.json num_experts_per_tok / n_group do not fit n_routed_experts", hint="fix config.json")
    known = {f.name for f in dataclasses.fields(model_module.ModelArgs)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise FidevalError(f"the reference code's ModelArgs has no {', '.join(unknown)}",
                           hint="model.code must be DeepSeek-V3.2-Exp's inference/ folder")
    try:
        return model_module.ModelArgs(**fields)
    except Exception as e:  # noqa: BLE001 -- the vendor's dataclass refusing the config is the user's input
        raise FidevalError(f"the reference code's ModelArgs rejects config.json: {type(e).__name__}: {e}", hint=_HINT) from None


def check_world(args, world: int, fp8: bool) -> None:
    """What the vendor's sharding asserts, before anything is built: every split divides by ``world`` (and,
    for FP8 weights, every rank's share of a split dim is whole 128-row scale blocks)."""
    splits = {"vocab_size": args.vocab_size, "n_routed_experts": args.n_routed_experts, "num_attention_heads": args.n_heads,
              "intermediate_size": args.inter_dim, "n_shared_experts*moe_intermediate_size": args.n_shared_experts * args.moe_inter_dim}
    for name, size in splits.items():
        if size % world:
            raise FidevalError(f"config.json {name} ({size}) is not divisible by the model-parallel world size {world}",
                               hint="choose a world size that divides the experts, heads, vocabulary and MLP widths")
    if fp8 and world > 1:
        rows = {"q_b_proj": args.n_heads * (args.qk_nope_head_dim + args.qk_rope_head_dim) // world,
                "kv_b_proj": args.n_heads * (args.qk_nope_head_dim + args.v_head_dim) // world,
                "o_proj inputs": args.n_heads * args.v_head_dim // world, "MLP": args.inter_dim // world,
                "shared experts": args.n_shared_experts * args.moe_inter_dim // world}
        bad = [k for k, v in rows.items() if v % 128]
        if bad:
            raise FidevalError(f"{bad[0]}: each of {world} ranks would hold {rows[bad[0]]} rows, not whole 128x128 FP8 "
                               "scale blocks", hint="choose a smaller model-parallel world size")
