"""DeepSeek-V3.2-Exp's Hugging Face release names <-> its reference code's module names: :mod:`.deepseek_v3_names` (the V3
rules, which are convert.py's) with V3.2's ``mapping``.

V3.2-Exp's ``inference/convert.py`` is V3's with four more entries, the DSA indexer's ``wq_b``, ``wk``,
``k_norm`` and ``weights_proj``, kept unrenamed and unsplit (:data:`MAPPING` equals the vendor's table, tested).
One vendor name is then the image of two release modules: ``self_attn.q_b_proj`` -> ``attn.wq_b`` (cut on dim 0)
and ``self_attn.indexer.wq_b`` -> ``attn.indexer.wq_b`` (whole), so the way back takes V3's map outside the
indexer and V3.2's inside it. Routed experts are never cut (a rank owns its experts whole), as in V3.
"""

from __future__ import annotations

from fideval.errors import FidevalError
from fideval.model.reference import deepseek_v3_names

INDEXER = {"wq_b": ("wq_b", None), "wk": ("wk", None), "k_norm": ("k_norm", None), "weights_proj": ("weights_proj", None)}
# HF module name -> (vendor module name, split dim): V3.2-Exp's convert.py ``mapping``
MAPPING: dict[str, tuple[str, int | None]] = {**deepseek_v3_names.MAPPING, **INDEXER}


def to_vendor(hf: str) -> tuple[str, int | None]:
    """convert.py's rename of one HF key: (vendor key, split dim or None; routed experts None); an unknown
    module is a one-line error, as convert.py's assert is."""
    vendor, dim = deepseek_v3_names.to_vendor(hf, MAPPING)
    return vendor, None if deepseek_v3_names.expert_index(vendor) is not None else dim


def to_hf(vendor: str) -> tuple[str, int | None]:
    """The HF key a vendor parameter is read from, and the dim its rank's share is narrowed on (KeyError for a
    name no release tensor maps to)."""
    inside = vendor.split(".")[-3:-2] == ["indexer"]
    try:
        hf = deepseek_v3_names.to_hf(vendor, MAPPING if inside else deepseek_v3_names.MAPPING)
        hf_key = hf.split(".")[-2]
        if inside != (hf_key in INDEXER):  # the indexer's own names live there only
            raise ValueError(vendor)
        return hf, to_vendor(hf)[1]
    except (FidevalError, ValueError):
        raise KeyError(vendor) from None
