"""THE table of model families the runner runs, and what it refuses, by ``architectures[0]``.

A family is one transformers model package whose decoder layers the runner builds on their own
(:class:`fideval.model.adapters.Adapter`). A row says only what that model's own ``forward`` does around
its layers, because that is what the runner must redo exactly: which mask each layer type gets, whether
the rotary module is called per layer type, how the embedding is scaled and how the logits are finished.
Adding a row is not enough: every family has a float32 parity test against transformers' own full
forward (``tests/test_model_families.py``), and docs/runner.md's family table is generated from this one
(``python -m fideval.model.families --check``).

What the runner cannot reproduce exactly is refused in one line naming the feature, never run with
wrong numbers: an architecture in :data:`REFUSED`, a layer type no mask rule below covers, or a config
switch in :data:`REFUSED_SETTINGS`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from fideval.quant.module_classes import DISK_RENAMES


@dataclass(frozen=True)
class Family:
    """``package``/``prefix``: transformers.models.<package>.modeling_<package>, classes ``<prefix>DecoderLayer``,
    ``<prefix>RotaryEmbedding``, ``<prefix>RMSNorm``. ``model_type``: the config's, as in the docs table.
    ``sliding_all``: one mask for every layer, sliding when ``config.sliding_window`` is set (Mistral, Mixtral);
    otherwise the mask follows ``config.layer_types``. ``rotary_by_type``: the rotary module is called once per
    layer type (Gemma 3: local and global bases). ``embed``: ``sqrt_hidden`` (Gemma: times sqrt(H) rounded to the
    compute dtype) or ``multiplier`` (Granite: times ``embedding_multiplier``). ``head``: ``softcap`` (Gemma 2/3:
    ``tanh(z / c) * c`` with ``final_logit_softcapping``) or ``divide`` (Granite: ``z / logits_scaling``).
    ``mask_kw``: extra arguments of the model's mask calls. ``halves``: the layer's forward is
    ``x + self_attn(input_layernorm(x))`` then ``x + mlp(post_attention_layernorm(x))``, so the throughput mode
    (fideval.model.execution.throughput) may run the two halves apart; False: whole layers always. ``renames``: (module
    name part, on-disk name part) pairs, as transformers' ``conversion_mapping.py`` renames the family's keys on
    load, tried when the module's own name is not on disk. ``notes``: the docs table's column."""

    model_type: str
    package: str
    prefix: str
    notes: str
    sliding_all: bool = False
    rotary_by_type: bool = False
    embed: str | None = None
    head: str | None = None
    mask_kw: tuple[tuple[str, object], ...] = ()
    halves: bool = True
    renames: tuple[tuple[str, str], ...] = ()


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama", "llama", "Llama", "dense"),
    "MistralForCausalLM": Family("mistral", "mistral", "Mistral", "dense; sliding window on every layer when set",
                                 sliding_all=True),
    "Phi3ForCausalLM": Family("phi3", "phi3", "Phi3", "dense; fused `qkv_proj` and `gate_up_proj`, partial rotary"),
    "Qwen2ForCausalLM": Family("qwen2", "qwen2", "Qwen2", "dense; sliding/full layers per `layer_types`"),
    "Qwen3ForCausalLM": Family("qwen3", "qwen3", "Qwen3", "dense; q/k norms"),
    "Gemma2ForCausalLM": Family("gemma2", "gemma2", "Gemma2", "dense; sliding/full layers, attention and final "
                                "logit soft-capping, scaled embedding, (1 + w) norms", embed="sqrt_hidden", head="softcap",
                                halves=False),
    "Gemma3ForCausalLM": Family("gemma3_text", "gemma3", "Gemma3", "dense; sliding/full layers with their own rotary "
                                "bases, q/k norms, scaled embedding, optional soft-capping", rotary_by_type=True,
                                embed="sqrt_hidden", head="softcap", halves=False),
    "MixtralForCausalLM": Family("mixtral", "mixtral", "Mixtral", "routed experts; Hub layout "
                                 "`block_sparse_moe.experts.<e>.w1/w3/w2` accepted", sliding_all=True),
    "Qwen2MoeForCausalLM": Family("qwen2_moe", "qwen2_moe", "Qwen2Moe", "routed experts + gated shared expert; "
                                  "dense layers per `mlp_only_layers`"),
    "Qwen3MoeForCausalLM": Family("qwen3_moe", "qwen3_moe", "Qwen3Moe", "routed experts; per-expert "
                                  "`mlp.experts.<e>.{gate,up,down}_proj.weight`", sliding_all=True),
    "OlmoeForCausalLM": Family("olmoe", "olmoe", "Olmoe", "routed experts; q/k norms over all heads"),
    "DeepseekV2ForCausalLM": Family("deepseek_v2", "deepseek_v2", "DeepseekV2", "MLA, shared + routed experts, "
                                    "group-limited routing, dense first layers"),
    "DeepseekV3ForCausalLM": Family("deepseek_v3", "deepseek_v3", "DeepseekV3", "MLA, shared + routed experts, "
                                    "sigmoid group-limited routing, dense first layers; router in fp32; MTP layers "
                                    "beyond `num_hidden_layers` ignored; `kimi_k2` configs load as this"),
    "Glm4MoeForCausalLM": Family("glm4_moe", "glm4_moe", "Glm4Moe", "shared + routed experts, sigmoid routing, "
                                 "dense first layers, partial rotary"),
    "Ernie4_5_MoeForCausalLM": Family("ernie4_5_moe", "ernie4_5_moe", "Ernie4_5_Moe", "shared + routed experts, "
                                      "dense first layers, routing statistics bias",
                                      renames=DISK_RENAMES["Ernie4_5_MoeForCausalLM"]),
    "GraniteMoeForCausalLM": Family("granitemoe", "granitemoe", "GraniteMoe", "routed experts; embedding, residual, "
                                    "attention and logit multipliers; its experts sit in `block_sparse_moe` (no `routed_experts` "
                                    "class for quant specs; replicated under model parallel)", embed="multiplier",
                                    head="divide", halves=False,
                                    renames=DISK_RENAMES["GraniteMoeForCausalLM"]),
    "HunYuanMoEV1ForCausalLM": Family("hunyuan_v1_moe", "hunyuan_v1_moe", "HunYuanMoEV1", "shared + routed "
                                      "experts, q/k norms"),
    "Dots1ForCausalLM": Family("dots1", "dots1", "Dots1", "shared + routed experts, dense first layers, "
                               "sliding/full layers"),
    "MiniMaxM2ForCausalLM": Family("minimax_m2", "minimax_m2", "MiniMaxM2", "routed experts, sigmoid routing with "
                                   "correction bias, q/k norms, partial rotary"),
    "Glm4MoeLiteForCausalLM": Family("glm4_moe_lite", "glm4_moe_lite", "Glm4MoeLite", "MLA, shared + routed "
                                     "experts, dense layers per `mlp_layer_types`"),
    "Llama4ForCausalLM": Family("llama4_text", "llama4", "Llama4Text", "chunked/full layers, no-rope layers, "
                                "attention temperature tuning, routed + shared expert, dense layers"),
    "Qwen3NextForCausalLM": Family("qwen3_next", "qwen3_next", "Qwen3Next", "linear-attention (gated delta "
                                   "rule)/full layers, gated attention, routed + gated shared expert, (1 + w) norms"),
    "MiniMaxForCausalLM": Family("minimax", "minimax", "MiniMax", "linear (lightning) attention/full layers, "
                                 "routed experts, alpha/beta residual factors", halves=False),
    "DeepseekV32ForCausalLM": Family("deepseek_v32", "deepseek_v32", "DeepseekV32", "MLA with the DSA indexer "
                                     "(top-k keys), shared + routed experts, dense first layers",
                                     mask_kw=(("allow_is_causal_skip", False),)),
    "GptOssForCausalLM": Family("gpt_oss", "gpt_oss", "GptOss", "fused, transposed, biased experts; sinks; "
                                "sliding/full layers. MXFP4 checkpoints are refused as the teacher"),
}

# architectures[0] transformers has, that the runner refuses, and why (the error names the feature)
REFUSED: dict[str, str] = {
    "DeepseekV4ForCausalLM": "manifold hyper-connections (`hc_mult` residual streams per token, collapsed by an "
                             "`hc_head` before the final norm) and compressed sparse attention; the layer-major runner "
                             "carries one hidden state per token",
    "Llama4ForConditionalGeneration": "a multimodal checkpoint (vision tower, text weights under "
                                      "`language_model`); the runner runs text decoders (`Llama4ForCausalLM`)",
    "Gemma3ForConditionalGeneration": "a multimodal checkpoint (vision tower, text weights under "
                                      "`language_model`); the runner runs text decoders (`Gemma3ForCausalLM`)",
}

# (model_type, config attribute, value that is refused) -> the feature it switches on
REFUSED_SETTINGS: dict[tuple[str, str, object], str] = {
    ("gemma3_text", "use_bidirectional_attention", True): "bidirectional attention",
}

# layer type -> the masking_utils function the models call for it (None: the layer takes no mask from the model)
MASKS: dict[str, str | None] = {
    "full_attention": "create_causal_mask",
    "sliding_attention": "create_sliding_window_causal_mask",
    "chunked_attention": "create_chunked_causal_mask",
    "indexed_attention": "create_causal_mask",
    "deepseek_sparse_attention": "create_causal_mask",  # DeepSeek-V3.2's indexed layers as transformers 5.17 names them
    "linear_attention": None,
}


def supported() -> str:
    return ", ".join(sorted(FAMILIES))


# -- the docs table ----------------------------------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[2] / "docs" / "runner.md"
BEGIN, END = "<!-- families:begin (python -m fideval.model.families) -->", "<!-- families:end -->"


def table() -> str:
    rows = ["| `architectures[0]` | `model_type` | notes |", "|---|---|---|"]
    rows += [f"| `{arch}` | `{f.model_type}` | {f.notes} |" for arch, f in FAMILIES.items()]
    rows += ["", "Refused, with the feature named:", "", "| `architectures[0]` | why |", "|---|---|"]
    rows += [f"| `{arch}` | {why} |" for arch, why in REFUSED.items()]
    return "\n".join(rows)


def render(text: str) -> str:
    """``text`` with the part between the markers replaced by :func:`table`."""
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:a] + "\n" + table() + "\n" + text[b:]


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print(f"{DOC}: the family table is stale; run python -m fideval.model.families")
            return 1
        return 0
    if new != text:
        from fideval.fsio import write_text

        write_text(DOC, new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
