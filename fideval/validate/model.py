"""The reference model as the runner will see it, from its config.json (and safetensors headers when the
weights are local): :class:`Probe`. Nothing is read but headers; the layers are built on the meta device,
exactly as :class:`fideval.model.runner.Runner` builds them before it reads a byte.
"""

from __future__ import annotations

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
    from fideval.formats import nesting

    try:
        data = nesting.loads(p.read_text())
    except nesting.TooDeep as e:  # before transformers' own json.load meets it (a RecursionError there)
        raise FidevalError(f"{p} is {e}", hint="fix or re-download config.json") from None
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


def _index_shards(folder: Path) -> tuple[Path, list[str]] | None:
    """``model.safetensors.index.json`` of ``folder`` and the shard files its weight_map names (sorted), None without
    an index; an unreadable index (or one nested deeper than any index is) raises the checkpoint reader's line."""
    from fideval.formats import nesting
    from fideval.model.weights.checkpoint import INDEX

    index = folder / INDEX
    if not index.is_file():
        return None
    try:
        weight_map = nesting.loads(index.read_text())["weight_map"]
        return index, sorted({str(v) for v in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise FidevalError(f"{index} has no valid weight_map", hint="re-download the checkpoint") from None


def _missing_shards(folder: Path, shards: list[str]) -> list[str]:
    """The shards that are not files of ``folder`` itself (the checkpoint reader's rule: missing or outside it)."""
    inside = folder.resolve()
    return [s for s in shards if (folder / s).resolve().parent != inside or not (folder / s).is_file()]


def _weights_here(folder: Path) -> bool:
    """True when every safetensors file of the checkpoint is in ``folder`` (a Hub snapshot may be partial)."""
    from fideval.model.weights.checkpoint import SINGLE

    try:
        found = _index_shards(folder)
    except FidevalError:
        return False
    if found is not None:
        return not _missing_shards(folder, found[1])
    return (folder / SINGLE).is_file()


def check_shards(cfg: Config, p: Probe, found: Findings) -> None:
    """A local reference checkpoint's ``model.safetensors.index.json`` names only shards that are in its folder (what
    the teacher's checkpoint reader refuses when it opens the folder). A Hub snapshot may lack shards: the stage
    fetches them."""
    from fideval.config import is_hub

    if p.folder is None or p.config is None or is_hub(cfg.model.path):
        return
    try:
        index = _index_shards(p.folder)
    except FidevalError as e:
        found.add("model.path", e)
        return
    if index is None:
        return
    path, shards = index
    missing = _missing_shards(p.folder, shards)
    if missing:
        found.add("model.path", f"{path} names shard {missing[0]!r}, which is missing or outside the folder "
                  f"({len(missing)} of {len(shards)} shards)", hint="download every shard listed in the index")


def max_positions(p: Probe) -> tuple[int, str] | None:
    """The positions the model is built for, and where that number comes from: config.json's (or its
    ``text_config``'s) ``max_position_embeddings``, times the rope scaling factor where a linear, dynamic or YaRN
    scaling extends it past the original length (as serving engines derive it; DeepSeek-V3's 163,840 already is)."""
    cfg = p.config or {}
    if "max_position_embeddings" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    v = cfg.get("max_position_embeddings", getattr(getattr(p.adapter, "config", None), "max_position_embeddings", None))
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        return None
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) in ("linear", "dynamic", "yarn"):
        factor, orig = rope.get("factor"), rope.get("original_max_position_embeddings") or v
        if isinstance(factor, (int, float)) and isinstance(orig, (int, float)) and factor > 1 and orig * factor > v:
            return int(orig * factor), "config.json max_position_embeddings with its rope scaling factor"
    return v, "config.json max_position_embeddings"


def check_positions(cfg: Config, p: Probe, found: Findings) -> None:
    """Each length the teacher runs (``teacher.lengths``) fits the model's positions: a window or cut longer than
    ``max_position_embeddings`` would be computed past what the model was built for (rope tables, learned
    positions), or fail mid-run."""
    found_limit = max_positions(p)
    if found_limit is None:
        return
    limit, source = found_limit
    w = cfg.windows
    for length, tokens, key in (("windows", w.window_tokens, "windows.window_tokens"), ("cuts", w.cut_tokens, "windows.cut_tokens")):
        if length in cfg.teacher.lengths and tokens > limit:
            found.add(key, f"{length} of {tokens:,} tokens are longer than the model's {limit:,} positions "
                      f"({source})",
                      hint=f"lower {key} to {limit} or less, or leave '{length}' out of teacher.lengths")


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
