"""A GGUF's model metadata against the reference config: what llama.cpp will compute, before any run.

llama.cpp builds the model from the GGUF's key/values, not from the reference's config.json. A converter
that guessed wrong writes a build of *another model* whose weights still fit every shape check: the
documented case is llama.cpp's converter falling back to softmax expert routing when a DeepSeek-V3 config
lacks ``scoring_func`` (and llama.cpp itself reads a ``deepseek2`` GGUF without ``expert_gating_func`` as
softmax), a build further from the reference than Q4_0 is. So every key that changes the computed
function is compared with the reference config, with llama.cpp's default where the key is absent:
layer count, routing (gating function where llama.cpp reads it, expert count, top-k, shared experts, group routing, top-k
normalisation (a key, or fixed in llama.cpp's graph: qwen3moe yes, qwen2moe and olmoe no) and scale, leading
dense layers), norm epsilon, attention heads, sliding window, and rope (base,
rotated dimensions, scaling type, factor, original context; for ``deepseek2``, whose llama.cpp graph rotates
interleaved pairs, a reference with ``rope_interleave: false``). Key names come from gguf-py (``gguf.Keys``).
A disagreement is one line naming both values; :class:`fideval.model.weights.gguf_checkpoint.GGUFCheckpoint` runs this
first, so ``fideval validate`` reports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError

# reference scoring function by model type when config.json does not say (transformers' modelling code)
_DEFAULT_SCORING = {"deepseek_v3": "sigmoid", "deepseek_v2": "softmax", "glm4_moe": "sigmoid", "glm4_moe_lite": "sigmoid",
                    "dots1": "sigmoid", "minimax_m2": "sigmoid"}
# llama.cpp's value when a GGUF lacks the gating key (src/models/<arch>.cpp): deepseek2 softmax for DeepSeek V2/V2.5
# compatibility (sigmoid for GLM-4.7-Lite's shape, see _default_gating), glm4moe sigmoid; dots1 and minimax-m2 keep
# "none", on which llama.cpp's MoE graph aborts. Only these architectures read the key: qwen2moe, qwen3moe, llama
# (Mixtral), olmoe, ernie4_5-moe and gpt-oss hard-code their routing, so for them it changes nothing and is not compared.
_GGUF_DEFAULT_GATING = {"deepseek2": "softmax", "glm4moe": "sigmoid", "dots1": "none (llama.cpp aborts)",
                        "minimax-m2": "none (llama.cpp aborts)"}
# llama.cpp's graph normalises the top-k routing weights or not, fixed per architecture (src/models/<arch>.cpp,
# build_moe_ffn's norm_w), where the reference config makes it a setting (norm_topk_prob)
_DEFAULT_WINDOW = {"gemma2": 4096}  # llama.cpp's sliding window when the key is absent (gemma2.cpp), else none
_FIXED_NORM = {"qwen2moe": False, "qwen3moe": True, "olmoe": False}
_GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def gguf_value(reader, key: str) -> Any:
    """The scalar (int, float, bool, str) of a GGUF key, or None when absent."""
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    if part.dtype == np.uint8 and len(f.types) == 1 and f.types[0].name == "STRING":
        return bytes(part).decode("utf-8", "replace")
    v = part[0].item() if len(part) else None
    return v


def _default_gating(reader, arch: str) -> str | None:
    """What llama.cpp's graph uses for a GGUF without ``expert_gating_func`` (deepseek2.cpp's GLM-4.7-Lite case:
    47 or 48 layers and a 154,880-token vocabulary are sigmoid)."""
    if arch == "deepseek2":
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else gguf_value(reader, "deepseek2.vocab_size")
        if gguf_value(reader, "deepseek2.block_count") in (47, 48) and vocab == 154880:
            return "sigmoid"
    return _GGUF_DEFAULT_GATING.get(arch)


def _cfg(config: dict, *keys: str) -> Any:
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    return None


def _rope(config: dict) -> dict:
    """rope_theta, type ('none' for default), factor and original context from either config layout (Gemma3's
    per-layer-type ``rope_parameters``: the full-attention layers', which llama.cpp's ``rope.freq_base`` holds)."""
    rp = config.get("rope_parameters") or {}
    rp = rp.get("full_attention", rp)
    rs = config.get("rope_scaling") or {}
    theta = _cfg(config, "rope_theta") if config.get("rope_theta") is not None else rp.get("rope_theta")
    kind = rs.get("rope_type") or rs.get("type") or rp.get("rope_type") or "default"
    src = rs if rs else rp
    return {"theta": theta, "type": "none" if kind == "default" else kind, "factor": src.get("factor"),
            "orig": src.get("original_max_position_embeddings")}


def _rotary_dims(config: dict) -> int | None:
    """How many dimensions of a head the reference rotates: DeepSeek's ``qk_rope_head_dim``, else the head size
    times ``partial_rotary_factor`` (top level or in ``rope_parameters``)."""
    if config.get("qk_rope_head_dim") is not None:
        return int(config["qk_rope_head_dim"])
    heads = config.get("num_attention_heads")
    head = config.get("head_dim") or (config["hidden_size"] // heads if heads and config.get("hidden_size") else None)
    factor = config.get("partial_rotary_factor") or (config.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0
    return int(head * factor) if head else None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return bool(np.float32(a) == np.float32(b))  # GGUF stores float32
    return a == b


def check_gguf_metadata(reader, arch: str, config: dict, where: str | Path) -> None:
    """One-line error for the first GGUF key whose value (or llama.cpp's default) contradicts the reference."""
    from gguf import Keys

    def key(template: str) -> str:
        return template.format(arch=arch)

    def disagree(k: str, gv: Any, absent: bool, ck: str, rv: Any, hint: str | None = None) -> None:
        gv, rv = (str(np.float32(v)) if isinstance(v, float) else v for v in (gv, rv))
        shown = f"{gv} (absent: llama.cpp's default)" if absent else f"{gv}"
        raise FidevalError(f"{where}: GGUF {k} = {shown} but the reference config's {ck} = {rv}: the build computes "
                           f"another model", hint=hint or "reconvert the GGUF from the reference model")

    def compare(template: str, config_keys: tuple[str, ...], default: Any = None, hint: str | None = None) -> None:
        k = key(template)
        gv = gguf_value(reader, k)
        absent = gv is None
        if absent:
            gv = default
        ck = next((c for c in config_keys if config.get(c) is not None), None)
        if gv is None or ck is None:
            return
        rv = config[ck]
        if isinstance(rv, bool) or isinstance(gv, bool):
            gv, rv = bool(gv), bool(rv)
        if not _same(gv, rv):
            disagree(k, gv, absent, ck, rv, hint)

    experts = _cfg(config, "n_routed_experts", "num_experts", "num_local_experts")
    if experts and arch in _GGUF_DEFAULT_GATING:
        k = key(Keys.LLM.EXPERT_GATING_FUNC)
        raw = gguf_value(reader, k)
        gating = _GATING.get(raw, str(raw)) if raw is not None else _default_gating(reader, arch)
        ref = config.get("scoring_func") or _DEFAULT_SCORING.get(str(config.get("model_type")))
        if gating is not None and ref is not None and gating != ref:
            disagree(k, gating, raw is None, "scoring_func",
                     ref if config.get("scoring_func") else f"{ref} ({config.get('model_type')}'s default)",
                     "reconvert with the reference's scoring_func in config.json (llama.cpp's converter falls back "
                     "to softmax when it is missing)")
    if experts:
        compare(Keys.LLM.EXPERT_COUNT, ("n_routed_experts", "num_experts", "num_local_experts"))
        compare(Keys.LLM.EXPERT_USED_COUNT, ("num_experts_per_tok",))
        compare(Keys.LLM.EXPERT_SHARED_COUNT, ("n_shared_experts",))
        compare(Keys.LLM.EXPERT_GROUP_COUNT, ("n_group",))
        compare(Keys.LLM.EXPERT_GROUP_USED_COUNT, ("topk_group",))
        compare(Keys.LLM.EXPERT_WEIGHTS_NORM, ("norm_topk_prob",))
        compare(Keys.LLM.EXPERT_WEIGHTS_SCALE, ("routed_scaling_factor",))
        compare(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, ("first_k_dense_replace",))
    norm = config.get("norm_topk_prob")
    if experts and arch in _FIXED_NORM and norm is not None and bool(norm) != _FIXED_NORM[arch]:
        disagree(f"{arch} top-k weights normalised", f"{_FIXED_NORM[arch]} (fixed in llama.cpp's graph)", False,
                 "norm_topk_prob", bool(norm))
    k = key(Keys.LLM.BLOCK_COUNT)
    gv, layers = gguf_value(reader, k), config.get("num_hidden_layers")
    nextn = gguf_value(reader, key(Keys.LLM.NEXTN_PREDICT_LAYERS)) or 0  # glm4moe counts its MTP blocks too
    if gv is not None and layers is not None and gv != int(layers) + nextn:
        disagree(k, gv, False, "num_hidden_layers" + (f" + {nextn} MTP" if nextn else ""), int(layers) + nextn)
    compare(Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",))
    compare(Keys.Attention.HEAD_COUNT, ("num_attention_heads",))
    types = config.get("layer_types")
    used = config.get("use_sliding_window") is not False and (types is None or "sliding_attention" in types)
    window = config.get("sliding_window") if used else None  # Qwen's and Dots1's configs carry a window no layer uses
    k = key(Keys.Attention.SLIDING_WINDOW)
    gv = gguf_value(reader, k)
    used_w = gv if gv is not None else _DEFAULT_WINDOW.get(arch)  # absent: whole context, but gemma2's 4096
    if window and arch != "phi3" and (used_w is None or int(used_w) != int(window)):  # phi3: _family_checks
        disagree(k, used_w if used_w is not None else "none", gv is None, "sliding_window", window)
    if arch == "deepseek2" and config.get("rope_interleave") is False:
        disagree("deepseek2 rope", "interleaved pairs (llama.cpp's rope type NORM)", False, "rope_interleave", False)
    k = key(Keys.Rope.DIMENSION_COUNT)
    gv, rot = gguf_value(reader, k), _rotary_dims(config)
    if gv is not None and rot is not None and gv != rot:
        disagree(k, gv, False, "rotary dimensions", rot)
    _family_checks(reader, arch, config, key, disagree, compare)
    rope = _rope(config)
    k = key(Keys.Rope.FREQ_BASE)
    gv = gguf_value(reader, k)
    if rope["theta"] is not None and not _same(gv if gv is not None else 10000.0, float(rope["theta"])):
        disagree(k, gv if gv is not None else 10000.0, gv is None, "rope_theta", rope["theta"])
    if arch == "phi3" and rope["type"] == "longrope":
        disagree(f"{arch} rope", "longrope factors chosen once by llama.cpp's context size", False, "rope type",
                 "longrope (factors chosen per sequence length)", "llama.cpp applies rope_factors_long or _short for "
                 "the whole run by its n_ctx; transformers switches by each sequence's length: not the same model")
    k = key(Keys.Rope.SCALING_TYPE)
    gtype = gguf_value(reader, k)
    if (gtype or "none") != rope["type"]:
        disagree(k, gtype or "none", gtype is None, "rope type", rope["type"])
    if rope["type"] != "none":
        for template, name in ((Keys.Rope.SCALING_FACTOR, "factor"), (Keys.Rope.SCALING_ORIG_CTX_LEN, "orig")):
            gv, rv = gguf_value(reader, key(template)), rope[name]
            if gv is not None and rv is not None and not _same(gv, float(rv) if name == "factor" else int(rv)):
                disagree(key(template), gv, False, f"rope {'factor' if name == 'factor' else 'original_max_position_embeddings'}", rv)


# llama.cpp's sliding-window layer period when the GGUF has no pattern key (load_swa_pattern's default per graph):
# layer i slides when i % n < n - 1
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6}
_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales Q by 1/sqrt(n_embd / n_head) for these, else 1/sqrt(head)


def _family_checks(reader, arch: str, config: dict, key, disagree, compare) -> None:
    """What one architecture's llama.cpp graph fixes or reads beyond the common keys: Gemma's softcapping, query
    scale, sliding-layer pattern and local rope base; GraniteMoe's four multipliers; Phi3's disabled window;
    Llama4's chunk size, no-rope layers, attention temperature and q/k norm (fixed in llama4.cpp)."""
    from gguf import Keys

    if arch in ("gemma2", "gemma3"):
        defaults = {"gemma2": (50.0, 30.0), "gemma3": (None, None)}[arch]  # llama_hparams / gemma3.cpp's 0 = off
        for template, ck, default in ((Keys.LLM.ATTN_LOGIT_SOFTCAPPING, "attn_logit_softcapping", defaults[0]),
                                      (Keys.LLM.FINAL_LOGIT_SOFTCAPPING, "final_logit_softcapping", defaults[1])):
            rv = config.get(ck)
            if arch == "gemma3" and ck == "attn_logit_softcapping":
                if rv is not None:
                    disagree(f"{arch} attention softcapping", "none (llama.cpp's gemma3 graph has none)", False, ck, rv)
                continue
            gv = gguf_value(reader, key(template))
            absent = gv is None
            gv = (default if absent else gv) or None  # 0: off
            if (gv is None) != (rv is None) or (rv is not None and not _same(float(gv), float(rv))):
                disagree(key(template), gv if gv is not None else "none", absent, ck, rv)
        heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
        head = gguf_value(reader, key(Keys.Attention.KEY_LENGTH)) or (hidden // heads if heads and hidden else None)
        layers = gguf_value(reader, key(Keys.LLM.BLOCK_COUNT))
        scalar = hidden // heads if layers == _27B_LAYERS[arch] and heads and hidden else head
        rv = config.get("query_pre_attn_scalar")
        if rv is not None and scalar is not None and not _same(float(scalar), float(rv)):
            disagree(f"{arch} query scale", f"1/sqrt({scalar}) (llama.cpp's graph for {layers} layers)", False,
                     "query_pre_attn_scalar", rv)
        types = config.get("layer_types")
        window = gguf_value(reader, key(Keys.Attention.SLIDING_WINDOW))
        if types and (window or arch == "gemma2"):
            f = reader.fields.get(key(Keys.Attention.SLIDING_WINDOW_PATTERN))
            pat = f.contents() if f is not None else _SWA_PERIOD[arch]
            slides = [bool(pat[i]) for i in range(len(types))] if isinstance(pat, list) else \
                [i % int(pat) < int(pat) - 1 for i in range(len(types))]
            ref = [t == "sliding_attention" for t in types]
            if slides != ref:
                disagree(f"{arch} sliding layers", [i for i, x in enumerate(slides) if x], f is None,
                         "layer_types' sliding layers", [i for i, x in enumerate(ref) if x])
        local = ((config.get("rope_parameters") or {}).get("sliding_attention") or {}).get("rope_theta")
        local = local if local is not None else config.get("rope_local_base_freq")
        k = key(Keys.Rope.FREQ_BASE_SWA)
        gv = gguf_value(reader, k)
        if arch == "gemma3" and window and local is not None and not _same(gv if gv is not None else 10000.0, float(local)):
            disagree(k, gv if gv is not None else 10000.0, gv is None, "sliding layers' rope_theta", local)
    if arch == "granitemoe":
        heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
        attn_default = 1.0 / float(np.sqrt(hidden // heads)) if heads and hidden else None
        compare(Keys.LLM.EMBEDDING_SCALE, ("embedding_multiplier",), 1.0)  # absent: 0, i.e. no scaling
        compare(Keys.LLM.RESIDUAL_SCALE, ("residual_multiplier",), 1.0)
        compare(Keys.Attention.SCALE, ("attention_multiplier",), attn_default)  # absent: 1/sqrt(head size)
        compare(Keys.LLM.LOGIT_SCALE, ("logits_scaling",), "none, which llama.cpp refuses to load")
    if arch == "llama4":  # llama4.cpp: without sliding_window = 0, chunked attention with fixed settings
        compare(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, ("interleave_moe_layer_step",))
        window = gguf_value(reader, key(Keys.Attention.SLIDING_WINDOW))
        chunked = window != 0 or window is None
        n = int(config.get("num_hidden_layers") or 0)
        step = 4 if chunked else n
        fixed = {"attention_chunk_size": 8192 if chunked else None,
                 "no_rope_layers": [int(step > 0 and (i + 1) % step != 0) for i in range(n)],
                 "use_qk_norm": _cfg(config, "num_local_experts") != 128}
        if chunked:
            fixed.update(attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1)
        for ck, gv in fixed.items():
            rv = config.get(ck)
            if ck in config and (bool(rv) != bool(gv) if isinstance(gv, bool) else not (
                    rv == gv or (isinstance(gv, float) and rv is not None and _same(float(rv), gv)))):
                disagree(f"{arch} {ck}", f"{gv} (fixed in llama.cpp's graph)", False, ck, rv)
    if arch == "phi3" and config.get("sliding_window") and config.get("use_sliding_window") is not False:
        disagree(f"{arch} sliding window", "none (llama.cpp's phi3 graph disables it)", False, "sliding_window",
                 config["sliding_window"], "llama.cpp attends to the whole context for phi3 (its SWA is disabled); "
                 "the build computes another model past the window")
