"""DeepSeek-V3.2-Exp's Hugging Face release names <-> its reference code's module names, and the per-rank slice.

The vendor's ``inference/convert.py`` turns the HF release into ``model{rank}-mp{N}.safetensors``: strip
``model.``, ``self_attn`` -> ``attn``, ``mlp`` -> ``ffn``, ``weight_scale_inv`` -> ``scale``,
``e_score_correction_bias`` -> ``bias``, then rename the module before the last component by its ``mapping``
(``q_b_proj`` -> ``wq_b`` split on dim 0, ``o_proj`` -> ``wo`` split on dim 1...), keep only this rank's routed
experts, and narrow the split dims to this rank's share. Here the same rules run the other way, on load: the
driver asks for each parameter of a vendor ``Block`` and gets the HF key to read and the dim to slice, so no
converted copy is written. :func:`to_vendor` re-states convert.py's forward direction (tests check it against
the vendor's own ``mapping``, and that :func:`to_hf` inverts it on every key of transformers' model).

Self-contained on purpose (the V3 driver has its own ``names.py``; the two can merge: V3.2 adds only the
indexer's ``wq_b``/``wk``/``k_norm``/``weights_proj``, which convert.py keeps unsplit and unrenamed).
"""

from __future__ import annotations

from fideval.errors import FidevalError

# HF module name -> (vendor module name, split dim); convert.py's ``mapping`` for what V3.2 releases hold
MAPPING: dict[str, tuple[str, int | None]] = {
    "embed_tokens": ("embed", 0),
    "input_layernorm": ("attn_norm", None),
    "post_attention_layernorm": ("ffn_norm", None),
    "q_proj": ("wq", 0),
    "q_a_proj": ("wq_a", None),
    "q_a_layernorm": ("q_norm", None),
    "q_b_proj": ("wq_b", 0),
    "kv_a_proj_with_mqa": ("wkv_a", None),
    "kv_a_layernorm": ("kv_norm", None),
    "kv_b_proj": ("wkv_b", 0),
    "o_proj": ("wo", 1),
    "gate": ("gate", None),
    "gate_proj": ("w1", 0),
    "down_proj": ("w2", 1),
    "up_proj": ("w3", 0),
    "norm": ("norm", None),
    "lm_head": ("head", 0),
    "wq_b": ("wq_b", None),
    "wk": ("wk", None),
    "k_norm": ("k_norm", None),
    "weights_proj": ("weights_proj", None),
}
_LEAF = {"weight_scale_inv": "scale", "e_score_correction_bias": "bias"}
_LEAF_BACK = {"scale": "weight_scale_inv", "weight": "weight", "bias": "bias"}


def to_vendor(hf: str) -> tuple[str, int | None]:
    """convert.py's rename of one HF key: (vendor key, split dim or None). Routed experts are never split
    (a rank keeps whole experts); an unknown module is a one-line error as convert.py's assert is."""
    name = hf.removeprefix("model.")
    parts = name.split(".")
    parts = ["attn" if p == "self_attn" else "ffn" if p == "mlp" else p for p in parts]
    parts[-1] = _LEAF.get(parts[-1], parts[-1])
    key = parts[-2] if len(parts) > 1 else parts[0]
    if key not in MAPPING:
        raise FidevalError(f"checkpoint tensor {hf!r}: module {key!r} is not in DeepSeek-V3.2's convert.py mapping",
                           hint="the checkpoint is not a DeepSeek-V3.2-Exp release")
    new, dim = MAPPING[key]
    parts[-2 if len(parts) > 1 else 0] = new
    if "experts" in parts and "shared_experts" not in parts:
        dim = None
    return ".".join(parts), dim


def to_hf(vendor: str) -> tuple[str, int | None]:
    """The HF key a vendor parameter is read from, and the dim its rank's share is narrowed on."""
    parts = vendor.split(".")
    top = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight", "head.weight": "lm_head.weight"}
    if vendor in top:
        return top[vendor], MAPPING[top[vendor].split(".")[-2]][1]
    if len(parts) < 4 or parts[0] != "layers" or parts[-1] not in _LEAF_BACK:
        raise KeyError(vendor)
    mod = parts[-2]
    where = parts[2:-2]  # e.g. ["attn"], ["attn", "indexer"], ["ffn", "experts", "3"], ["ffn", "shared_experts"]
    if where and where[-1] == "indexer" or (mod == "gate" and where == ["ffn"]):
        hf_mod = mod
    else:
        back = {v[0]: k for k, v in MAPPING.items() if k not in ("wq_b", "wk", "k_norm", "weights_proj", "gate")}
        if mod not in back:
            raise KeyError(vendor)
        hf_mod = back[mod]
    leaf = "e_score_correction_bias" if (mod == "gate" and parts[-1] == "bias") else _LEAF_BACK[parts[-1]]
    where = ["self_attn" if p == "attn" else "mlp" if p == "ffn" else p for p in where]
    hf = ".".join(["model", "layers", parts[1], *where, hf_mod, leaf])
    return hf, to_vendor(hf)[1]


def share(size: int, dim_name: str, world: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) of a dim of ``size`` that ``rank`` of ``world`` holds (convert.py's ``narrow``)."""
    if size % world:
        raise FidevalError(f"{dim_name} ({size}) is not divisible by the model-parallel world size {world}",
                           hint="choose a world size that divides it (the vendor's convert.py asserts the same)")
    part = size // world
    return rank * part, (rank + 1) * part
