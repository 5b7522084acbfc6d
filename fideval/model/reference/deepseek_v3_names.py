"""DeepSeek's Hugging Face release names -> the reference code's module names, with per-rank slicing.

This is what the vendor's ``inference/convert.py`` does to a release before ``generate.py`` loads it
(``model.`` dropped, ``self_attn`` -> ``attn``, ``mlp`` -> ``ffn``, ``weight_scale_inv`` -> ``scale``,
``e_score_correction_bias`` -> ``bias``, the last module name through :data:`MAPPING`; a tensor whose
mapping names a dimension is cut into N equal slices along it; routed experts are not cut but owned whole
by the rank whose range holds them), re-expressed here and applied on load, so no converted copy is
written. ``convert.py`` itself is not imported at run time (it imports tqdm and reads every shard into
memory); tests check :data:`MAPPING` and :func:`to_vendor` against it. DeepSeek-V3.2-Exp's ``convert.py``
uses the same rules (plus its indexer's names, which that driver adds to the mapping it passes).
"""

from __future__ import annotations

import torch

from fideval.errors import FidevalError

# HF module name -> (vendor module name, dimension cut across ranks or None): convert.py's ``mapping``
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
    "scale": ("scale", None),
}
_RENAMES = (("self_attn", "attn"), ("mlp", "ffn"), ("weight_scale_inv", "scale"), ("e_score_correction_bias", "bias"))


def to_vendor(hf_name: str, mapping: dict = MAPPING) -> tuple[str, int | None]:
    """``(vendor name, cut dimension)`` of one release tensor, exactly as convert.py renames it."""
    name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
    for a, b in _RENAMES:
        name = name.replace(a, b)
    key = name.split(".")[-2]
    if key not in mapping:
        raise FidevalError(f"release tensor {hf_name!r} has no counterpart in the reference code (module {key!r})",
                           hint="the checkpoint is not of the family the reference code implements")
    new_key, dim = mapping[key]
    return name.replace(key, new_key), dim


def to_hf(vendor_name: str, mapping: dict = MAPPING) -> str:
    """The release name of one vendor parameter (the inverse of :func:`to_vendor`, checked by it)."""
    inverse = {v: k for k, (v, _) in mapping.items()}
    parts = vendor_name.split(".")
    parts[-2] = inverse.get(parts[-2], parts[-2])
    if parts[-1] == "scale":
        parts[-1] = "weight_scale_inv"
    elif parts[-1] == "bias" and parts[-2] == "gate":
        parts[-1] = "e_score_correction_bias"
    parts = [{"attn": "self_attn", "ffn": "mlp"}.get(p, p) for p in parts]
    name = ".".join(parts)
    hf = name if name.startswith("lm_head.") else f"model.{name}"
    if to_vendor(hf, mapping)[0] != vendor_name:
        raise ValueError(f"no release name maps to {vendor_name!r}")
    return hf


def plan(vendor_name: str, mapping: dict = MAPPING) -> tuple[str, int | None]:
    """``(release name, cut dimension)`` for one vendor parameter: routed experts are never cut (a rank owns
    its experts whole), every other tensor along its mapping's dimension, as convert.py does."""
    hf = to_hf(vendor_name, mapping)
    return hf, None if expert_index(vendor_name) is not None else to_vendor(hf, mapping)[1]


def expert_index(vendor_name: str) -> int | None:
    """The routed expert a tensor belongs to (``...ffn.experts.<e>.w1.weight``), None for every other tensor."""
    if "experts" in vendor_name and "shared_experts" not in vendor_name:
        return int(vendor_name.split(".")[-3])
    return None


def rank_slice(t: torch.Tensor, dim: int | None, rank: int, world: int, name: str) -> torch.Tensor:
    """This rank's slice of a tensor cut along ``dim`` (convert.py: N equal slices, N must divide the size)."""
    if dim is None or world == 1:
        return t
    if t.size(dim) % world:
        raise FidevalError(f"{name}: dimension {dim} of size {t.size(dim)} does not split over {world} ranks",
                           hint="choose a model-parallel size that divides it (the reference code needs equal slices)")
    n = t.size(dim) // world
    return t.narrow(dim, rank * n, n).contiguous()


def rows_of(dim: int | None, size0: int, rank: int, world: int) -> tuple[int, int] | None:
    """The rows to read when the cut is along dimension 0 (so a rank reads only its part), else None."""
    if dim != 0 or world == 1 or size0 % world:
        return None
    n = size0 // world
    return rank * n, (rank + 1) * n
