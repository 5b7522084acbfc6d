"""The reference model as the runner will see it, from its config.json (and safetensors headers when the
weights are local): :class:`Probe`. Nothing is read but headers; the layers are built on the meta device,
exactly as :class:`fideval.model.runner.Runner` builds them before it reads a byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fideval.errors import FidevalError
from fideval.validate.findings import Findings

if TYPE_CHECKING:
    from fideval.config import Config



@dataclass
class Probe:
    """What validate knows of the reference model. ``folder`` is None when it could not be looked at (a Hub
    model not in the local cache, a folder already reported missing); everything else is then empty."""

    folder: Path | None = None
    config: dict | None = None  # config.json
    adapter: Any = None  # fideval.model.adapters.Adapter, when the runner accepts the model
    experts: dict[int, int] = field(default_factory=dict)  # MoE layer -> routed experts
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # name -> (class, shape it is quantized as)
    classes: set[str] | None = None  # module classes a quant spec may name (the candidate stage's rule)

    @property
    def vocab_size(self) -> int | None:
        if self.adapter is not None:
            return self.adapter.vocab_size
        v = (self.config or {}).get("vocab_size")
        return int(v) if isinstance(v, int) and v > 0 else None


def model_folder(cfg: Config, found: Findings) -> Path | None:
    """The local folder holding the reference's config.json: ``model.path``, or for ``hf://ORG/NAME`` its
    snapshot in the local Hub cache (a note, not a problem, when it is not there: the stage fetches it)."""
    from fideval.config import is_hub, resolve_path
    from fideval.model_source import cached

    path, revision = cfg.model.path, cfg.model.revision
    if is_hub(path):
        files = cached(path, revision)
        if files is None:
            found.notes.append(f"model {path}@{revision or 'main'} is not in the local Hub cache: its architecture, module "
                               "classes, tokenizer and vocabulary are checked once a stage has fetched it")
            return None
        return files.folder
    folder = resolve_path(path)
    return folder if (folder / "config.json").is_file() else None  # else check_files has said so


def _read_config(p: Path) -> dict:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise FidevalError(f"{p} is not valid JSON ({type(e).__name__})", hint="fix or re-download config.json") from None
    if not isinstance(data, dict):
        raise FidevalError(f"{p} is not a JSON object", hint="fix or re-download config.json")
    return data


def probe(cfg: Config, found: Findings) -> Probe:
    """The runner's adapter and meta layers for the config's model; a refusal is a problem on 'model.path'."""
    from fideval.model.adapters import Adapter

    folder = model_folder(cfg, found)
    if folder is None:
        return Probe()
    out = Probe(folder)
    try:
        out.config = _read_config(folder / "config.json")
    except FidevalError as e:
        found.add("model.path", e)
        return out
    try:
        out.adapter = Adapter.from_config(out.config, folder, folder / "config.json")
        _meta_layers(out)
        out.classes = _classes(out)
    except FidevalError as e:
        if getattr(cfg.model, "implementation", "transformers") != "reference":
            found.add("model.path", e)
            return out
        # the vendor's code is the model (a family transformers lacks, DeepSeek-V4.1): validate.reference checks
        # it; the classes a spec may name come from the weights' names, as the candidate stage takes them
        out.adapter, out.experts, out.tensors = None, {}, {}
        if _weights_here(folder):
            from fideval.quant.inspect import class_shapes, classes_present

            out.classes = classes_present(class_shapes(folder))
    return out


def _meta_layers(p: Probe) -> None:
    """Routed experts per layer and every tensor a quant spec would touch, in the shape ``weight_transform``
    is given it (input dim last: transformers' transposed expert tensors are turned back, as
    :meth:`Adapter.transform` does), from meta layers built as the runner builds them."""
    import torch

    from fideval.quant.module_classes import quantized_class

    a = p.adapter
    for i in range(a.n_layers):
        layer = a.meta_layer(i, torch.bfloat16)
        n = a.n_routed_experts(layer)
        if n:
            p.experts[i] = n
        transposed = bool(getattr(getattr(getattr(layer, "mlp", None), "experts", None), "is_transposed", False))
        for name, t in layer.state_dict(keep_vars=True).items():
            full = f"model.layers.{i}.{name}"
            cls = quantized_class(full, t.shape, t.is_floating_point())
            if cls is not None:
                shape = tuple(t.shape)
                if cls == "routed_experts" and transposed:
                    shape = (*shape[:-2], shape[-1], shape[-2])
                p.tensors[full] = (cls, shape)
    p.tensors["lm_head.weight"] = ("lm_head", (a.vocab_size, int(a.config.hidden_size)))


def _weights_here(folder: Path) -> bool:
    """True when every safetensors file of the checkpoint is in ``folder`` (a Hub snapshot may be partial)."""
    from fideval.model.weights.checkpoint import INDEX, SINGLE

    index = folder / INDEX
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return all((folder / s).is_file() for s in shards)
    return (folder / SINGLE).is_file()


def _classes(p: Probe) -> set[str]:
    """The module classes a spec may name. With the weights at hand, the candidate stage's own rule on the
    safetensors headers (:func:`fideval.quant.inspect.classes_present`); from config.json alone, the classes of
    the meta layers' tensors (and the lm head unless it is tied to the embedding, as on disk)."""
    from fideval.quant.module_classes import module_class_of

    if _weights_here(p.folder):
        from fideval.quant.inspect import class_shapes, classes_present

        return classes_present(class_shapes(p.folder))
    import torch

    a = p.adapter
    out = {c for i in range(a.n_layers) for name in a.meta_layer(i, torch.bfloat16).state_dict()
           if (c := module_class_of(f"model.layers.{i}.{name}")) is not None}
    if not getattr(a.config, "tie_word_embeddings", False):
        out.add("lm_head")
    return out


def check_parallel(cfg: Config, p: Probe, found: Findings) -> None:
    """teacher.model_parallel N must split every MoE layer's routed experts evenly (the runner's
    :func:`~fideval.model.adapters.expert_range`); the lm head's vocabulary split takes any N."""
    from fideval.model.adapters import expert_range

    n = cfg.teacher.model_parallel
    for count in sorted(set(p.experts.values())):
        try:
            expert_range(0, n, count)
        except FidevalError as e:
            found.add("teacher.model_parallel", e)
            return


def check_head(cfg: Config, found: Findings) -> None:
    """``teacher.lm_head: bf16`` where the teacher would refuse it (fideval.model.execution.head), in its words: the reference
    code, layers that are not bfloat16, a CPU device (``auto`` is decided on the machine that runs the teacher)."""
    from fideval.model.device import resolve_dtype
    from fideval.model.execution import head

    if cfg.teacher.lm_head != "bf16":
        return
    msg = head.setting_refusal(getattr(cfg.model, "implementation", "transformers"),
                               "cpu" if cfg.teacher.device == "cpu" else "cuda", resolve_dtype(cfg.teacher.dtype))
    if msg:
        found.add("teacher.lm_head", msg, head.HINT)


def check_fused(cfg: Config, found: Findings) -> None:
    """``teacher.fused`` where ``fideval fused`` would refuse it (fideval.score.fused.refusal): the reference code,
    model parallel, no emulated candidate."""
    if not cfg.teacher.fused:
        return
    from fideval.score.fused import refusal

    why = refusal(cfg)
    if why:
        found.add("teacher.fused", why, "set teacher.fused: false to run the teacher and each candidate separately")
