"""Which GGUF tensors make each of the reference model's Hugging Face tensors, and how: llama.cpp's converter
(``convert_hf_to_gguf.py``) read backwards.

Names come from gguf-py's own tables, the ones the converter writes with: ``gguf.get_tensor_name_map(arch,
n_layers)`` maps each parameter name of the reference model (built on the meta device from its config) to its
llama.cpp name, and ``gguf.TENSOR_NAMES`` gives the few names that have no Hugging Face counterpart of their own.
What the converter does besides renaming is undone here, as :class:`Source` ops:

* ``permute``: llama (and Mixtral, which it converts as llama) Q and K rows are permuted for llama.cpp's rope
  (``LlamaModel.permute``: pairs of a head's halves interleaved); undone per head, K with the KV head count.
* ``gate_up``: routed experts are stored stacked, one 3-D tensor per projection (``ffn_gate_exps`` [E, I, H] ...),
  where transformers holds ``mlp.experts.gate_up_proj`` [E, 2I, H] = per expert ``cat(gate, up)``; a GGUF written
  with ``--fuse-gate-up-exps`` holds that concatenation already (``ffn_gate_up_exps``).
* ``gate_up_interleaved`` / ``transpose``: gpt-oss keeps its experts transposed ([E, H, 2I], gate and up
  interleaved column by column; ``down_proj`` [E, I, H]); the converter de-interleaves and transposes them.
* ``gate_up_transposed``: Llama4 keeps experts as ``gate_up_proj`` [E, H, 2I] and ``down_proj`` [E, I, H]; the
  converter transposes them (and splits gate/up): concatenated and transposed back.
* ``rows``: ``--fuse-qkv`` writes ``attn_qkv`` = cat(q, k, v) (after the permutation): each is its rows.
* ``minus_one``: Gemma2/Gemma3 norm weights are stored as ``weight + 1`` (their RMSNorm scales by ``1 + weight``);
  the one op that computes: ``g - 1`` in float32, exact wherever ``g`` >= 0.5 (Sterbenz), i.e. a reference weight
  >= -0.5; below, rounded by at most half an ulp of 1 (6e-8), far under the stored value's own rounding.
* ``kv_b``: DeepSeek MLA's ``kv_b_proj`` [H * (nope + v), r] is written either whole (``attn_kv_b``, older
  converters) or, since llama.cpp's MLA absorption, split per head into ``attn_k_b`` [H, r, nope] (transposed)
  and ``attn_v_b`` [H, v, r]; both layouts are read.

Every other op moves whole rows or elements and computes nothing, so a dequantized GGUF tensor's values arrive
unchanged. Tied embeddings (gemma2, gemma3: no ``output.weight``) are left to the runner's tying.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fideval.errors import FidevalError

# llama.cpp architecture -> the Hugging Face architectures its converter writes it from (and the runner runs)
GGUF_ARCHS: dict[str, tuple[str, ...]] = {
    "llama": ("LlamaForCausalLM", "MixtralForCausalLM", "MistralForCausalLM"),
    "phi3": ("Phi3ForCausalLM",),
    "gemma2": ("Gemma2ForCausalLM",),
    "gemma3": ("Gemma3ForCausalLM",),
    "granitemoe": ("GraniteMoeForCausalLM",),
    "llama4": ("Llama4ForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "qwen2moe": ("Qwen2MoeForCausalLM",),
    "qwen3moe": ("Qwen3MoeForCausalLM",),
    "deepseek2": ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeLiteForCausalLM"),
    "glm4moe": ("Glm4MoeForCausalLM",),
    "olmoe": ("OlmoeForCausalLM",),
    "dots1": ("Dots1ForCausalLM",),
    "ernie4_5-moe": ("Ernie4_5_MoeForCausalLM",),
    "minimax-m2": ("MiniMaxM2ForCausalLM",),
    "gpt-oss": ("GptOssForCausalLM",),
}
_PERMUTED = {"llama", "granitemoe"}  # LlamaModel.undo_permute (GraniteModel inherits it): Q/K rows permuted
_INTERLEAVED = {"gpt-oss"}  # experts stored [E, H, 2I], gate/up interleaved (GptOssModel.modify_tensors)
# experts held [E, H, 2I] / [E, I, H] by transformers, transposed (and gate/up split) by the converter
# (Llama4Model.modify_tensors)
_TRANSPOSED = {"llama4"}
# Gemma's RMSNorm scales by (1 + weight); the converter stores weight + 1 (Gemma2Model/Gemma3Model.modify_tensors)
_NORM_PLUS_ONE = {"gemma2", "gemma3"}
# GraniteMoe's experts are one fused ``input_linear`` on disk, which gguf-py's table does not name: the converter
# splits it into ffn_gate_exps / ffn_up_exps (GraniteMoeModel.modify_tensors)
_SPLIT_INPUT_LINEAR = {"granitemoe"}
# tensors llama.cpp adds that are no parameter of the Hugging Face model (rope frequency factors are in config.json)
IGNORED = re.compile(r"^(rope_freqs|rope_factors_long|rope_factors_short)\.weight$")
_EXPERTS = re.compile(r"(?P<prefix>model\.layers\.(?P<bid>\d+)\..*experts)\.(?P<which>gate_up_proj|down_proj)(?P<bias>_bias)?$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Source:
    """One Hugging Face tensor as made from GGUF tensors ``parts`` (file names) by ``op``."""

    parts: tuple[str, ...]
    op: str = "plain"  # plain | permute | gate_up | gate_up_interleaved | transpose | kv_b | minus_one | gate_up_transposed
    heads: int = 0  # permute: the head count (KV heads for K) the converter permuted with
    rows: tuple[int, int, int] | None = None  # (start, stop, total): rows [start, stop) of a fused part (attn_qkv)


def hf_architecture(arch: str | None, hf_arch: str | None, where: Path) -> None:
    """One-line error unless ``arch`` (the GGUF's) is what llama.cpp writes for the reference's ``hf_arch``."""
    if arch not in GGUF_ARCHS:
        raise FidevalError(f"{where}: GGUF architecture {arch!r} is not supported",
                           hint=f"supported: {', '.join(sorted(GGUF_ARCHS))}")
    if hf_arch not in GGUF_ARCHS[arch]:
        raise FidevalError(f"{where}: GGUF architecture {arch!r} is not a build of the reference's {hf_arch!r}",
                           hint=f"llama.cpp writes {arch!r} for {', '.join(GGUF_ARCHS[arch])}; model.path must be the "
                                "model the GGUF was converted from")


def _tensor_map(arch: str, n_layers: int, where: Path):
    import gguf

    enum = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if enum is None:
        raise FidevalError(f"{where}: the installed gguf package ({_gguf_version()}) has no name table for GGUF architecture "
                           f"{arch!r}", hint="update the gguf package (pip install -U gguf)")
    return gguf.get_tensor_name_map(enum, n_layers)


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:  # pragma: no cover - gguf imported from a source tree
        return "unknown version"


def _template(tensor: str, bid: int) -> str:
    import gguf

    return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[tensor]].format(bid=bid)


def plan_sources(arch: str, expected: dict[str, tuple[int, ...]], present: set[str], config: dict,
                 where: Path) -> dict[str, Source]:
    """For each reference tensor (``expected``: name -> shape) found in the GGUF (``present``: its tensor names),
    where it comes from. A reference tensor without GGUF tensors is left out (the caller names it)."""
    from fideval.quant.module_classes import DISK_RENAMES

    tm = _tensor_map(arch, int(config.get("num_hidden_layers") or 0), where)
    renames = DISK_RENAMES.get((config.get("architectures") or [None])[0], ())

    def gguf_name(base: str, bias: bool) -> str | None:
        g = tm.get_name(base)
        for mine, theirs in renames:  # the on-disk name the converter saw (transformers' conversion_mapping)
            for seen in (base + ".", base + (".bias" if bias else ".weight")):
                if g is None and mine in seen:
                    g = tm.get_name(re.sub(r"\.(weight|bias)$", "", seen.replace(mine, theirs).rstrip(".")))
        if g is None:
            return None
        for cand in (g + (".bias" if bias else ".weight"), g):
            if cand in present:
                return cand
        return g + (".bias" if bias else ".weight")

    out: dict[str, Source] = {}
    for hf, shape in expected.items():
        m = _EXPERTS.match(hf)
        if m:
            src = _experts(m, arch, gguf_name, present)
        else:
            base, bias = hf, False
            for suffix in (".weight", ".bias", "_bias"):
                if hf.endswith(suffix):
                    base, bias = hf[: -len(suffix)], suffix != ".weight"
                    break
            name = gguf_name(base, bias)
            src = Source((name,)) if name is not None else None
            if src is not None and name not in present and name.split(".")[-2].endswith("attn_kv_b"):
                bid = int(_LAYER.match(hf).group(1))
                split = (_template("ATTN_K_B", bid) + ".weight", _template("ATTN_V_B", bid) + ".weight")
                if all(p in present for p in split):
                    src = Source(split, "kv_b")
            elif src is not None and name not in present and re.search(r"\.attn_[qkv]\.(weight|bias)$", name):
                src = _fused_qkv(hf, name, expected, present) or src
            if src is not None and arch in _PERMUTED and re.search(r"\.attn_[qk]\.(weight|bias)$", name or ""):
                heads = config.get("num_attention_heads")
                kv = config.get("num_key_value_heads") or heads
                src = Source(src.parts, "permute", int(kv if ".attn_k." in name else heads), src.rows)
        if src is None and hf == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # no output tensor of its own (gemma2's name table has none): the runner ties it
        if src is not None and arch in _NORM_PLUS_ONE and hf.endswith("norm.weight"):
            src = Source(src.parts, "minus_one")
        if src is None:
            raise FidevalError(f"{where}: gguf-py has no {arch!r} name for the reference tensor {hf}",
                               hint="update the gguf package, or the architecture is not one llama.cpp converts this way")
        if all(p in present for p in src.parts):
            out[hf] = src
    return out


def _fused_qkv(hf: str, name: str, expected: dict, present: set[str]) -> Source | None:
    """Q, K or V as rows of ``attn_qkv`` (the converter's ``--fuse-qkv``: ``cat([q, k, v])`` after the Q/K
    permutation), sized by the reference's own q/k/v shapes."""
    bid = int(_LAYER.match(hf).group(1))
    suffix = "." + name.rsplit(".", 1)[1]
    fused = _template("ATTN_QKV", bid) + suffix
    proj = re.sub(r"\.[qkv]_proj\.(weight|bias)$", "", hf)
    sizes = [expected.get(f"{proj}.{p}_proj{suffix}", (None,))[0] for p in "qkv"]
    if fused not in present or None in sizes:
        return None
    i = "qkv".index(name.rsplit(".", 2)[-2][-1])
    start = sum(sizes[:i])
    return Source((fused,), rows=(start, start + sizes[i], sum(sizes)))


def _experts(m: re.Match, arch: str, gguf_name, present: set[str]) -> Source | None:
    prefix, bid, bias = m["prefix"], int(m["bid"]), bool(m["bias"])
    if m["which"] == "down_proj":
        name = gguf_name(prefix + ".down_proj", bias)
        if name is None:
            return None
        return Source((name,), "transpose" if arch in _INTERLEAVED | _TRANSPOSED and not bias else "plain")
    gate, up = gguf_name(prefix + ".gate_proj", bias), gguf_name(prefix + ".up_proj", bias)
    if gate is None and up is None and arch in _SPLIT_INPUT_LINEAR:  # granitemoe's input_linear, split by the converter
        gate, up = (_template(t, bid) + (".bias" if bias else ".weight") for t in ("FFN_GATE_EXP", "FFN_UP_EXP"))
    if gate is None or up is None:
        return None
    fused = _template("FFN_GATE_UP_EXP", bid) + (".bias" if bias else ".weight")
    if arch in _INTERLEAVED:
        return Source((gate, up), "gate_up_interleaved")
    if arch in _TRANSPOSED:
        return Source((gate, up), "gate_up_transposed")
    if fused in present and gate not in present:
        return Source((fused,))
    return Source((gate, up), "gate_up")


def assemble(src: Source, parts: list, shape: tuple[int, ...]):
    """The Hugging Face tensor (torch, float32, ``shape``) from its dequantized GGUF ``parts`` (numpy order)."""
    import torch

    if src.rows is not None:
        parts = [parts[0][src.rows[0]:src.rows[1]]]
    if src.op == "plain":
        t = parts[0]
    elif src.op == "permute":
        # inverse of LlamaModel.permute: w.reshape(h, 2, d/h/2, ...).swapaxes(1, 2)
        w = parts[0]
        t = w.reshape(src.heads, w.shape[0] // src.heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    elif src.op == "gate_up":
        t = torch.cat(parts, dim=1 if parts[0].dim() == 3 else -1)
    elif src.op == "gate_up_interleaved":
        gate, up = parts
        t = torch.stack((gate, up), dim=2 if gate.dim() == 3 else -1).flatten(1, 2 if gate.dim() == 3 else -1)
        if gate.dim() == 3:
            t = t.transpose(-1, -2)
    elif src.op == "gate_up_transposed":  # [E, I, H] x 2 -> [E, H, 2I]
        t = torch.cat(parts, dim=1).transpose(-1, -2)
    elif src.op == "minus_one":
        t = parts[0] - 1.0
    elif src.op == "transpose":
        t = parts[0].transpose(-1, -2)
    elif src.op == "kv_b":
        k_b, v_b = parts  # [H, r, nope], [H, v, r]
        t = torch.cat((k_b.transpose(1, 2), v_b), dim=1).reshape(-1, k_b.shape[1])
    else:  # pragma: no cover - ops are this module's own
        raise AssertionError(src.op)
    return t.reshape(shape) if t.numel() == _numel(shape) and tuple(t.shape) != tuple(shape) else t


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def layer_of(name: str) -> int | None:
    """Block index of a llama.cpp tensor name (``blk.<i>.``), None for the embedding, output and norms."""
    m = re.match(r"^blk\.(\d+)\.", name)
    return int(m.group(1)) if m else None
