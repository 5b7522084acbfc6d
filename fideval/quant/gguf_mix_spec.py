"""A llama-quantize named mix (``gguf_mix: Q4_K_M``) as an emulated candidate: every weight of the reference model,
embedding and lm head included, quantized and dequantized with the GGML type llama-quantize would give it, in the
layout llama.cpp's converter writes.

Why the whole model is planned first: llama-quantize's rule (:mod:`fideval.quant.gguf_mixes`) is a walk over every
tensor of the GGUF -- its ``attn_v`` counter, the ``ffn_down`` layer numbers and the tied-embedding test see them
all -- so the types can only be chosen once the GGUF the converter would write is known. That GGUF is derived, not
read: gguf-py's name table (:func:`fideval.quant.gguf_names.plan_sources`, the table the converter writes with)
gives each Hugging Face tensor its llama.cpp name(s) and rewrite, and :func:`to_gguf` applies the rewrite forwards
(the inverse of :func:`fideval.quant.gguf_names.assemble`, which maps the quantized parts back). Quantization runs
along the GGUF row (``ne[0]``), so rewrites that move whole rows (the llama Q/K permutation, experts split per
projection) do not change a value, while DeepSeek's ``kv_b_proj`` -- transposed into ``attn_k_b`` [H, r, nope]
(rows of ``qk_nope_head_dim``) and ``attn_v_b`` [H, v, r] -- and gpt-oss's transposed experts do: they are
quantized in llama.cpp's layout and mapped back.

What the walk sees of the model is what the converter writes (``general.architecture``, ``block_count``,
``expert_count``, head counts; ``head_count_kv`` 1 for DeepSeek's MLA), derived here from config.json. The default
converter is assumed: no ``--fuse-qkv`` / ``--fuse-gate-up-exps``; a tied model has no ``output.weight``, so its
``token_embd`` is treated as the output (Q6_K) and the lm head computes with it. Tensors llama-quantize leaves alone
(norms, routers, biases) stay as the reference has them. The input is the reference's weights as the runner holds
them: the same as llama-quantize on an F32 conversion (or on a lossless one, e.g. BF16 of a bf16 model).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from fideval.errors import FidevalError
from fideval.formats import nesting
from fideval.quant import gguf_names
from fideval.quant.gguf_mixes import MIXES, MixModel, allows_quantization, mix_types
from fideval.quant.module_classes import MODULE_CLASSES, module_class_of

EMBED = "model.embed_tokens.weight"
_FLOATS = {"F32": None, "F16": torch.float16, "BF16": torch.bfloat16}
_IMATRIX_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")  # llama.cpp's weighted searches, emulated
_IMATRIX_LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")  # the same, fideval.quant.gguf_legacy_imatrix
# Q8_0, MXFP4 and the float types never read llama-quantize's quant_weights


def mix_name(spec: Any) -> str | None:
    """The ``gguf_mix`` of a quant spec (config dict ``{gguf_mix: Q4_K_M}`` or the CLI's ``gguf_mix=Q4_K_M``), else None."""
    if isinstance(spec, str):
        items = [p.strip() for p in spec.split(",") if p.strip()]
        mixes = [p.split("=", 1)[1].strip() for p in items if p.split("=", 1)[0].strip() == "gguf_mix" and "=" in p]
        if mixes and len(items) > 1:
            raise FidevalError("quant spec: gguf_mix decides every tensor's type; it takes no module classes beside it",
                               hint="write gguf_mix=Q4_K_M alone")
        return mixes[0] if mixes else None
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump(exclude_none=True)
    if isinstance(spec, dict) and spec.get("gguf_mix") is not None:
        if len([k for k, v in spec.items() if v is not None]) > 1:
            raise FidevalError("quant spec: gguf_mix decides every tensor's type; it takes no module classes beside it",
                               hint="give either gguf_mix or per-class formats")
        return str(spec["gguf_mix"])
    return None


def reference_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """The runner's floating tensors and shapes (transformers' fused layout), from a meta-device model of the config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if v.is_floating_point()}


class _Converted(set):
    """The GGUF names llama.cpp's default converter writes: all of gguf-py's, less the fused alternatives it writes
    only when asked (``attn_qkv``, ``ffn_gate_up_exps``) and the whole ``attn_kv_b`` it now splits."""

    def __contains__(self, item) -> bool:
        return not re.search(r"\.(attn_qkv|ffn_gate_up_exps|attn_kv_b)(\.|$)", item)


def to_gguf(src: gguf_names.Source, t: torch.Tensor, config: dict) -> list[torch.Tensor]:
    """The GGUF tensor(s) (numpy order, row = last dim) llama.cpp's converter writes for the Hugging Face tensor ``t``:
    the forward of :func:`fideval.quant.gguf_names.assemble`."""
    if src.op == "plain":
        return [t]
    if src.op == "permute":  # LlamaModel.permute (src.heads: the KV head count for K)
        return [t.reshape(src.heads, 2, t.shape[0] // src.heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)]
    if src.op == "gate_up":
        dim = 1 if t.dim() == 3 else -1
        return list(t.split(t.shape[dim] // 2, dim=dim))
    if src.op == "gate_up_interleaved":
        x = t.transpose(-1, -2) if t.dim() == 3 else t
        return [x[:, 0::2], x[:, 1::2]] if t.dim() == 3 else [x[..., 0::2], x[..., 1::2]]
    if src.op == "transpose":
        return [t.transpose(-1, -2)]
    if src.op == "kv_b":
        heads, nope = int(config["num_attention_heads"]), int(config["qk_nope_head_dim"])
        x = t.reshape(heads, -1, t.shape[-1])
        return [x[:, :nope].transpose(1, 2), x[:, nope:]]
    raise FidevalError(f"gguf mix: the converter rewrite {src.op!r} is not emulated", hint="use the default converter layout")


def _has_layer(model_dir: Path, i: int) -> bool:
    """Whether the checkpoint's headers hold tensors of layer ``i`` (GLM's MTP block past ``num_hidden_layers``)."""
    from fideval.formats.safetensors import folder_shapes

    return any(k.startswith(f"model.layers.{i}.") for k in folder_shapes(model_dir))


# GGUF candidates these families have (gguf_names.py), whose converter rewrites the mix's plan does not mirror yet
_NOT_EMULATED = {
    "Phi3ForCausalLM": "its fused attn_qkv and ffn_up are quantized as stored",
    "Gemma2ForCausalLM": "the converter stores norms + 1",
    "Gemma3ForCausalLM": "the converter stores norms + 1",
    "Llama4ForCausalLM": "the converter transposes and splits the experts",
}


def mix_model(arch: str, config: dict, nextn: int = 0) -> MixModel:
    """What llama-quantize reads from the GGUF's metadata, as the converter writes it from ``config`` (``block_count``
    counts GLM-4.5's ``nextn`` MTP blocks even when the checkpoint has none to write)."""
    n_expert = int(config.get("n_routed_experts") or config.get("num_experts") or config.get("num_local_experts")
                   or config.get("moe_num_experts") or 0)
    heads = int(config.get("num_attention_heads") or 1)
    kv = 1 if arch == "deepseek2" else int(config.get("num_key_value_heads") or heads)
    return MixModel(arch=arch, n_layer=int(config["num_hidden_layers"]) + nextn, n_expert=n_expert, n_head=heads,
                    n_head_kv=kv)


def storage_bits(ggml_type: str, numel: int) -> float:
    """Bits llama.cpp stores ``numel`` weights of ``ggml_type`` in (block scales included)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]]
    return numel / block * size * 8


class MixSpec:
    """The runner's hooks for a ``gguf_mix`` candidate (the interface of :class:`fideval.quant.spec.CompiledSpec`).

    ``plan``: Hugging Face name -> (Source, [(gguf name, ne, type)]); ``types``: GGUF name -> type."""

    def __init__(self, mix: str, model_dir: str | Path, imatrix: Any = None, *, act_scale: str = "fp32", act_block: int = 128):
        key = str(mix).upper()
        if key not in MIXES:
            raise FidevalError(f"unknown gguf mix {mix!r}", hint=f"use one of {', '.join(MIXES)}")
        self.mix, self.imatrix, self.act_scale, self.act_block = key, imatrix, act_scale, act_block
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise FidevalError(f"gguf mix: {model_dir} has no config.json",
                               hint="give the reference model's folder (config.json + *.safetensors)")
        self.config = nesting.load_file(model_dir / "config.json", "fix or re-download config.json")
        hf_arch = (self.config.get("architectures") or [None])[0]
        arch = next((a for a, hf in gguf_names.GGUF_ARCHS.items() if hf_arch in hf), None)
        if arch is None:
            raise FidevalError(f"gguf mix: llama.cpp's converter writes no architecture fideval reads for {hf_arch!r}",
                               hint=f"supported: {', '.join(sorted(h for v in gguf_names.GGUF_ARCHS.values() for h in v))}")
        if hf_arch in _NOT_EMULATED:
            raise FidevalError(f"gguf mix: the emulation of llama.cpp's {hf_arch} layout is not built "
                               f"({_NOT_EMULATED[hf_arch]})", hint="score llama-quantize's own file as a checkpoint: candidate")
        nextn = int(self.config.get("num_nextn_predict_layers") or 0) if arch == "glm4moe" else 0
        if nextn and _has_layer(model_dir, int(self.config["num_hidden_layers"])):
            raise FidevalError("gguf mix: the converter writes GLM's MTP blocks, which the reference model does not load "
                               "(they count in llama-quantize's walk)", hint="not emulated; score the real GGUF instead")
        self.arch, self.tied = arch, bool(self.config.get("tie_word_embeddings", False))
        self.shapes = reference_shapes(model_dir)
        expected = {k: v for k, v in self.shapes.items() if not (self.tied and k == "lm_head.weight")}
        sources = gguf_names.plan_sources(arch, expected, _Converted(), self.config, model_dir)
        parts: dict[str, tuple[int, ...]] = {}
        for hf, src in sources.items():
            for name, m in zip(src.parts, to_gguf(src, torch.empty(expected[hf], device="meta"), self.config)):
                parts[name] = tuple(reversed(m.shape))
        self.model = mix_model(arch, self.config, nextn)
        self.types = mix_types(key, self.model, [(n, ne, "F32") for n, ne in parts.items()], has_imatrix=imatrix is not None)
        self.plan = {hf: (src, [(p, parts[p], self.types[p]) for p in src.parts]) for hf, src in sources.items()}
        if imatrix is not None:
            self._check_imatrix()

    def _check_imatrix(self) -> None:
        """Every tensor the mix quantizes with a weighted search has an entry of its size (llama-imatrix records no
        ``token_embd`` -- a lookup, not a matmul -- and llama-quantize then quantizes it without one)."""
        for _hf, (_src, parts) in self.plan.items():
            for name, ne, t in parts:
                if t in _IMATRIX_TYPES + _IMATRIX_LEGACY and allows_quantization(name, ne, self.arch) \
                        and name != "token_embd.weight":
                    self.imatrix.for_tensor(name, tuple(reversed(ne)))

    def classes(self) -> set[str]:
        """The module classes holding a tensor the mix quantizes (the serving path's activation hooks)."""
        out = set()
        for hf, (_src, parts) in self.plan.items():
            cls = "lm_head" if hf == EMBED and self.tied else module_class_of(hf)
            if cls in MODULE_CLASSES and any(allows_quantization(n, ne, self.arch) for n, ne, _ in parts):
                out.add(cls)
        return out | ({"lm_head"} if self.tied else set())

    def weight_transform(self, module_class: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Quantize-dequantize one tensor as llama-quantize would (the runner passes the embedding as ``embedding``,
        a tied lm head as ``lm_head.weight``: both are ``token_embd``); identity for what the mix leaves alone.
        The runner shows every weight as [..., out, in]: gpt-oss's experts, stored [E, in, out], arrive transposed
        (``Adapter.transform``), so they are turned back to the stored layout the plan's rewrites start from."""
        key = EMBED if self.tied and name == "lm_head.weight" else name
        entry = self.plan.get(key)
        if entry is None or not tensor.is_floating_point():
            return tensor
        src = entry[0]
        if module_class == "routed_experts" and src.op in ("gate_up_interleaved", "transpose"):
            return self._apply(key, name, tensor.transpose(-1, -2)).transpose(-1, -2)
        return self._apply(key, name, tensor)

    def _apply(self, key: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        src, parts = self.plan[key]
        whole = tuple(tensor.shape) == tuple(self.shapes[key])
        # a model-parallel rank's share: experts [lo, hi) or lm head rows quantize alone (rows are independent), but
        # the Q/K permutation and the kv_b split need the whole tensor, and an expert's imatrix slice its offset
        if not whole and (src.op in ("permute", "kv_b") or (self.imatrix is not None and tensor.dim() == 3)):
            raise FidevalError(f"gguf mix: {name} arrives as a slice {list(tensor.shape)} of {list(self.shapes[key])}",
                               hint="run a gguf_mix candidate with teacher.model_parallel 1")
        x = tensor.float()
        out = [self._qdq(p, name, ne, t) for p, (name, ne, t) in zip(to_gguf(src, x, self.config), parts)]
        return gguf_names.assemble(src, out, tuple(x.shape)).reshape(x.shape).to(tensor.dtype)

    def _qdq(self, x: torch.Tensor, name: str, ne: tuple[int, ...], t: str) -> torch.Tensor:
        x = x.contiguous()
        if not allows_quantization(name, ne, self.arch) or t == "F32":
            return x
        if t in _FLOATS:
            return x.to(_FLOATS[t]).float()
        from fideval.quant.base import get_format
        from fideval.quant.gguf_ktypes import gguf_k_quant_dequant

        if self.imatrix is not None and t in _IMATRIX_TYPES + _IMATRIX_LEGACY and name != "token_embd.weight":
            w = torch.from_numpy(self.imatrix.for_tensor(name, tuple(reversed(ne))).copy())
            if t in _IMATRIX_LEGACY:
                from fideval.quant.gguf_legacy_imatrix import legacy_imatrix_quant_dequant

                return legacy_imatrix_quant_dequant(x, t.lower(), w)
            return gguf_k_quant_dequant(x, t.lower(), w)
        return get_format(f"gguf_{t.lower()}").quant_dequant(x, None, None)

    @property
    def act_transform(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        from fideval.quant.activations import act_quant_e4m3

        def f(x: torch.Tensor) -> torch.Tensor:
            return act_quant_e4m3(x, self.act_block, self.act_scale)

        return {cls: f for cls in sorted(self.classes())}

    def bits(self, shapes: Any = None, base_bits: float = 16.0, stored: Any = None) -> dict[str, Any]:
        """Bits per weight per module class (``embedding`` for the token embedding) and for the whole model, from the
        plan: each quantized GGUF tensor at its type's storage (block scales included), the rest at ``base_bits``;
        ``types`` counts the GGUF tensors of each type in the class. ``shapes``/``stored`` are not needed (the plan
        holds every tensor) and accepted for the CompiledSpec interface."""
        from fideval.quant.spec import bits_table

        types: dict[str, dict[str, int]] = {}

        def entries() -> Iterator[tuple[str, dict[str, Any], int, float]]:
            for hf, shape in self.shapes.items():
                if self.tied and hf == "lm_head.weight":
                    continue
                key = "embedding" if hf == EMBED else (module_class_of(hf) or "other")
                n = math.prod(shape)
                parts = self.plan[hf][1] if hf in self.plan else []
                quantized = [(name, ne, t) for name, ne, t in parts if allows_quantization(name, ne, self.arch)]
                counts = types.setdefault(key, {})
                for _, _, t in quantized:
                    counts[t] = counts.get(t, 0) + 1
                b = sum(storage_bits(t, math.prod(ne)) for _, ne, t in quantized) if quantized else n * base_bits
                yield key, {"format": self.mix, "recipe": None, "group": None}, n, b

        table = bits_table(entries())
        for key, row in table["per_class"].items():
            row["types"] = types[key]
            row["recipe"] = ", ".join(f"{t} x{c}" for t, c in sorted(row["types"].items())) or None
            row["format"] = row["format"] if row["types"] else None
        return table
