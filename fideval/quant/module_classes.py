"""THE mapping from parameter names to module classes -- routed experts, shared experts, attention, dense
MLP, lm head -- for every caller: the quant spec and ``fideval quant inspect`` (which tensors a spec names
and how many bits they cost), the real builds (which classes a build quantizes), and the runner's weight
and activation hooks (which tensors and linears a transform touches). One rule, so that what is counted
is what is quantized.

Names are full Hugging Face keys (``model.layers.3.mlp.experts.gate_up_proj``). A key is classified by the
module it sits in, so the same rule serves the two spellings a parameter has: on disk (per-expert
``mlp.experts.7.gate_proj.weight``, as on the Hub) and in transformers' modules (fused
``mlp.experts.gate_up_proj``). Mixtral's Hub layout (``block_sparse_moe.experts.<e>.w1``) is not
``mlp.``, so on disk its experts read as no class, while the runner, which sees transformers' ``mlp.``
names, quantizes them; kept as it is (changing it would change printed bits), see docs/runner.md.

A release stored in its reference code's own module names (DeepSeek-V4.1-Flash: ``layers.3.ffn.experts.0.w1.weight``,
``layers.3.attn.wq_a.weight``, ``head.weight``; no ``model.`` prefix, which every transformers key has) is
classified by :func:`vendor_module_class`, the rule that driver's hooks use.

A class says where a tensor belongs, not that it is quantized: :func:`quantized_class` adds the second
condition (a floating matrix, never a norm, bias or router).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MODULE_CLASSES = ("routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head")
# architectures[0] -> (module name part, on-disk name part) pairs: how transformers' conversion_mapping.py renames
# the family's keys on load (fideval.model.families' ``renames``; gguf-py's tables see the on-disk names)
DISK_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "Ernie4_5_MoeForCausalLM": (("mlp.gate.moe_statics.", "mlp.moe_statics."),),
    "GraniteMoeForCausalLM": (("block_sparse_moe.experts.gate_up_proj", "block_sparse_moe.input_linear.weight"),
                              ("block_sparse_moe.experts.down_proj", "block_sparse_moe.output_linear.weight"),
                              ("block_sparse_moe.router.weight", "block_sparse_moe.router.layer.weight")),
}
_ROUTER = re.compile(r"\.mlp\.(gate|router|shared_expert_gate)\.|\.mlp\.gate\.e_score_correction_bias$")


def module_class_of(name: str) -> str | None:
    """Module class of a full parameter name (HF naming), or None for what is never quantized here
    (embeddings, norms outside attention, routers).

    ``mlp.experts.`` -> routed_experts; ``mlp.shared_experts.`` / ``mlp.shared_expert.`` -> shared_experts;
    ``self_attn.`` -> attention; other ``mlp.`` (a dense layer's MLP) -> dense_mlp; ``lm_head`` -> lm_head.
    The router (``mlp.gate.``, ``mlp.router.``, ``mlp.shared_expert_gate.``) -> None."""
    if name.startswith("lm_head.") or name == "lm_head":
        return "lm_head"
    if name.startswith(("layers.", "head.")):  # the reference code's own names (module docstring)
        return vendor_module_class(name)
    if ".self_attn." in name:
        return "attention"
    if ".mlp." not in name:
        return None
    if _ROUTER.search(name):
        return None
    if ".mlp.experts." in name:
        return "routed_experts"
    if ".mlp.shared_experts." in name or ".mlp.shared_expert." in name:
        return "shared_experts"
    return "dense_mlp"


def vendor_module_class(vendor_name: str) -> str | None:
    """The module class of a parameter under the reference code's own names (DeepSeek-V4.1-Flash's release):
    ``ffn.experts.`` routed, ``ffn.shared_experts.`` shared, ``attn.`` attention (compressor and indexer
    included), ``head.`` lm_head. V4.1 has no dense MLP layers; embeddings, norms, routers, hyper-connection
    mixes and Engram are never quantized."""
    if vendor_name.startswith("head."):
        return "lm_head"
    if ".ffn.experts." in vendor_name:
        return "routed_experts"
    if ".ffn.shared_experts." in vendor_name:
        return "shared_experts"
    if ".attn." in vendor_name:
        return "attention"
    return None


def is_quantized_tensor(name: str, shape: Iterable[int], floating: bool = True) -> bool:
    """Rank >= 2 floating tensors are quantized; norms and biases never are (gpt-oss's fused expert
    biases ``gate_up_proj_bias`` are rank 2, hence the name test)."""
    return floating and len(tuple(shape)) >= 2 and not name.endswith("bias")


def quantized_class(name: str, shape: Iterable[int], floating: bool = True) -> str | None:
    """The class of a tensor a quant spec may quantize, or None (no class, or a norm, bias or router)."""
    cls = module_class_of(name)
    return cls if cls is not None and is_quantized_tensor(name, shape, floating) else None
