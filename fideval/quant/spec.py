"""Compile a quant spec (which format each module class gets) into the runner's hooks, and count bits.

A spec maps module classes -- ``routed_experts``, ``shared_experts``, ``attention``, ``dense_mlp``,
``lm_head`` -- to ``{format, recipe, group}``. It arrives as the config's pydantic ``QuantSpec``, a plain
dict (the GPU machine has no pydantic), or a compact string for the CLI:
``"routed_experts=mxfp4:rceil,attention=fp8_block,dense_mlp=int4:asym/64"`` (``format[:recipe][/group]``).

:func:`module_class_of` (from :mod:`fideval.quant.module_classes`, re-exported here) is THE mapping from
parameter names to module classes; the runner and ``fideval quant inspect`` both use it, so what is counted
is what is quantized.

What gets quantized: floating tensors of rank >= 2 in a listed class (linear weights ``[out, in]`` and fused
expert tensors ``[E, out, in]``, blocked along the last, input dim). Norms, biases and routers stay as
they are. Quantize-dequantize happens once per tensor, as the runner materialises the layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fideval.errors import FidevalError
from fideval.quant.module_classes import MODULE_CLASSES, is_quantized_tensor, module_class_of

__all__ = ["MODULE_CLASSES", "CompiledSpec", "ModuleSpec", "check_spec_classes", "compile_spec", "is_quantized_tensor",
           "module_class_of", "parse_spec", "resolve_spec"]


@dataclass(frozen=True)
class ModuleSpec:
    format: str
    recipe: str
    group: int


def _as_plain(spec: Any) -> dict[str, dict[str, Any]]:
    if spec is None:
        return {}
    if isinstance(spec, str):
        return parse_spec(spec)
    if hasattr(spec, "model_dump"):  # the config's pydantic QuantSpec
        spec = spec.model_dump()
    if not isinstance(spec, Mapping):
        raise FidevalError(f"quant spec must be a mapping of module class to format, got {type(spec).__name__}")
    out = {}
    for k, v in spec.items():
        if v is None:
            continue
        if hasattr(v, "model_dump"):
            v = v.model_dump()
        if isinstance(v, str):
            v = {"format": v}
        out[k] = dict(v)
    return out


def parse_spec(text: str) -> dict[str, dict[str, Any]]:
    """``"routed_experts=mxfp4:rceil,attention=fp8_block,dense_mlp=int4:asym/64"`` -> plain dict."""
    out: dict[str, dict[str, Any]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise FidevalError(f"quant spec item {part!r} has no '='", hint="write class=format[:recipe][/group]")
        cls, rhs = (s.strip() for s in part.split("=", 1))
        group = None
        if "/" in rhs:
            rhs, g = rhs.rsplit("/", 1)
            if not g.isdigit():
                raise FidevalError(f"quant spec item {part!r}: group {g!r} is not a positive integer")
            group = int(g)
        fmt, _, recipe = rhs.partition(":")
        if cls in out:
            raise FidevalError(f"quant spec names {cls!r} twice")
        out[cls] = {"format": fmt.strip(), "recipe": recipe.strip() or None, "group": group}
    if not out:
        raise FidevalError("quant spec is empty", hint="e.g. routed_experts=mxfp4:rceil,attention=fp8_block")
    return out


def resolve_spec(spec: Any) -> dict[str, ModuleSpec]:
    """Validate a spec (unknown classes, formats, recipes, groups -> one-line errors) and fill defaults."""
    from fideval.quant.base import get_format

    resolved = {}
    for cls, m in _as_plain(spec).items():
        if cls not in MODULE_CLASSES:
            raise FidevalError(f"quant spec: unknown module class {cls!r}", hint=f"use {', '.join(MODULE_CLASSES)}")
        unknown = set(m) - {"format", "recipe", "group"}
        if unknown or "format" not in m:
            raise FidevalError(f"quant spec {cls}: expected keys format, recipe, group", hint=f"got {sorted(m)}")
        fmt = get_format(m["format"])
        resolved[cls] = ModuleSpec(fmt.name, fmt.resolve_recipe(m.get("recipe")), fmt.resolve_group(m.get("group")))
    return resolved


def check_spec_classes(spec: Any, present: Iterable[str]) -> None:
    """One-line error when the spec quantizes module classes the architecture does not have
    (e.g. ``shared_experts`` on Qwen3-MoE without shared experts): it would silently measure nothing."""
    missing = sorted(set(resolve_spec(spec)) - set(present))
    if missing:
        raise FidevalError(
            f"quant spec names module class(es) {', '.join(missing)} that this model does not have",
            hint=f"the model has: {', '.join(sorted(set(present))) or 'none'}",
        )


class CompiledSpec:
    """The runner's hooks for one candidate: ``weight_transform`` and (serving path) ``act_transform``."""

    def __init__(self, spec: Any, *, act_scale: str = "fp32", act_block: int = 128,
                 imatrix: Callable[[str, tuple[int, ...]], torch.Tensor] | None = None):
        self.modules = resolve_spec(spec)
        self.act_scale, self.act_block = act_scale, act_block
        # importance weights per parameter (fideval.quant.imatrix.ImatrixLookup) for the gguf K/I formats
        self.imatrix = imatrix
        if imatrix is not None:  # the formats llama.cpp quantizes with importance weights (Q8_0, MXFP4 ignore them)
            from fideval.quant.gguf_ktypes import K_FORMATS
            from fideval.quant.gguf_legacy_imatrix import NMAX

            k_names = {f.name for f in K_FORMATS.values()} | {f"gguf_{k}" for k in NMAX}
            other = sorted(c for c, m in self.modules.items() if m.format not in k_names)
            if other:
                raise FidevalError(f"an imatrix is given but {', '.join(other)} use(s) a format without importance "
                                   "weights here", hint=f"use {', '.join(sorted(k_names))} or drop the imatrix")

    @property
    def is_identity(self) -> bool:
        return not self.modules

    def weight_transform(self, module_class: str, name: str, tensor: torch.Tensor,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        """Quantize-dequantize one materialised tensor; identity (the same object) when not quantized.

        ``out`` (``tensor`` itself allowed): where the result goes; the runner passes the tensor it owns, so a
        fused expert tensor is quantized in place, with no second copy of it on the device."""
        m = self.modules.get(module_class)
        if m is None or not is_quantized_tensor(name, tensor.shape, tensor.is_floating_point()):
            return tensor if out is None or out is tensor else out.copy_(tensor)
        from fideval.quant.base import get_format

        try:
            if self.imatrix is not None:
                from fideval.quant.gguf_ktypes import gguf_k_quant_dequant
                from fideval.quant.gguf_legacy_imatrix import NMAX, legacy_imatrix_quant_dequant

                w = self.imatrix(name, tuple(tensor.shape))
                kind = m.format.removeprefix("gguf_")
                y = (legacy_imatrix_quant_dequant(tensor, kind, w) if kind in NMAX
                     else gguf_k_quant_dequant(tensor, m.format, w))
                return y if out is None else out.copy_(y)
            return get_format(m.format).quant_dequant(tensor, m.recipe, m.group, out=out)
        except FidevalError as e:
            raise FidevalError(f"{name} ({module_class}): {e.message}", hint=e.hint) from None

    @property
    def act_transform(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """E4M3 per-1x128 activation quant-dequant for every quantized module class (serving path)."""
        from fideval.quant.activations import act_quant_e4m3

        def f(x: torch.Tensor) -> torch.Tensor:
            return act_quant_e4m3(x, self.act_block, self.act_scale)

        return {cls: f for cls in self.modules}

    def bits(self, shapes: Mapping[str | None, Iterable[tuple[int, ...]]], base_bits: float = 16.0,
             stored: Mapping[str, float] | None = None) -> dict[str, Any]:
        """Bits per weight per module class and for the whole model.

        ``shapes``: {module class (or None/"other" for the rest): [tensor shapes] or {tensor name: shape}}. Quantized tensors
        (rank >= 2 in a listed class) count their exact storage, scales included; everything else counts
        ``base_bits`` per element (16 for a bf16 checkpoint), or its ``stored`` bits when named there (an FP8
        release's fp8 weights: 8 per element plus their block scales)."""
        from fideval.quant.base import get_format

        def entries() -> Iterable[tuple[str, dict[str, Any], int, float]]:
            for cls, shape_list in shapes.items():
                key = cls if cls in MODULE_CLASSES else "other"
                m = self.modules.get(key)
                fields = {"format": m.format if m else None, "recipe": m.recipe if m else None,
                          "group": m.group if m else None}
                named = shape_list.items() if isinstance(shape_list, Mapping) else (("", s) for s in shape_list)
                for name, shape in named:
                    shape = tuple(int(d) for d in shape)
                    n = math.prod(shape)
                    if m is not None and is_quantized_tensor(name, shape):
                        b = get_format(m.format).storage_bits(shape, m.group, m.recipe)
                    elif stored is not None and name in stored:
                        b = stored[name]
                    else:
                        b = n * base_bits
                    yield key, fields, n, b

        return bits_table(entries())


def bits_table(entries: Iterable[tuple[str, dict[str, Any], int, float]]) -> dict[str, Any]:
    """The bits table of ``(module class, the class's fields, parameters, stored bits)`` per tensor: per class its
    fields (from its first tensor), tensors, params, bits and bits per weight, and the model's total."""
    per_class: dict[str, Any] = {}
    tot_n = tot_bits = 0.0
    for key, fields, n, b in entries:
        row = per_class.setdefault(key, {**fields, "tensors": 0, "params": 0, "bits": 0.0})
        row["tensors"] += 1
        row["params"] += n
        row["bits"] += b
        tot_n += n
        tot_bits += b
    for row in per_class.values():
        row["bpw"] = row["bits"] / row["params"] if row["params"] else 0.0
    return {"per_class": per_class, "total": {"params": int(tot_n), "bits": tot_bits,
                                              "bpw": tot_bits / tot_n if tot_n else 0.0}}


def compile_spec(spec: Any, **kw: Any) -> CompiledSpec:
    """Build the hooks for ``spec`` (QuantSpec, plain dict, compact string, or None for identity)."""
    return CompiledSpec(spec, **kw)
