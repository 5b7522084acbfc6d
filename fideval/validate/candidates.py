"""Each candidate as the candidate stage will build it.

* An emulated build (``quant:``): each module class's ``{format, recipe, group}`` through the stage's own
  builder (:func:`fideval.quant.spec.resolve_spec`, then :func:`compile_spec` on the whole spec), the class
  against the classes the model has (:func:`check_spec_classes`), and the format's block against the last
  dimension of every tensor it would quantize (what ``weight_transform`` would refuse mid-run).
* A real build (``checkpoint:``): opened by the classes that will decode it (:func:`open_real`:
  ``QuantizedCheckpoint``'s quantization_config, architecture and tensor plan from the safetensors headers;
  ``GGUFCheckpoint``'s architecture, name map and shapes from the GGUF header), and each of its paths
  (:func:`fideval.score.hooks_of.serving_hooks`: 'serving' needs a quantized class, 'llamacpp' a GGUF whose
  tensors' activation formats the runner's hooks can tell apart, :mod:`fideval.quant.ggml_path`).
* 'llamacpp' on a candidate that is not a whole GGUF build (per-class formats) is refused in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fideval.errors import FidevalError
from fideval.validate.findings import Findings
from fideval.validate.model import Probe

if TYPE_CHECKING:
    from fideval.config import Config



def check(cfg: Config, probe: Probe, found: Findings) -> None:
    from fideval.score.hooks_of import llamacpp_refusal

    for cand in cfg.candidates:
        if cand.quant is not None and cand.quant.gguf_mix is not None:
            _mix(cand, cand.quant.gguf_mix, probe, found, cfg.teacher.model_parallel)
        elif cand.quant is not None:
            try:
                llamacpp_refusal(cand, "llamacpp" if "llamacpp" in cand.paths else "")
            except FidevalError as e:
                found.add(f"candidates.{cand.name}.paths", e)
            _emulated(cand, probe, found)
        else:
            _real(cand, probe, found)


def _rejected_part(m: dict) -> str:
    """Which of format / recipe / group the builder refused (to name the key; the message is the builder's)."""
    from fideval.quant.base import get_format

    try:
        fmt = get_format(m["format"])
    except FidevalError:
        return "format"
    try:
        fmt.resolve_recipe(m.get("recipe"))
    except FidevalError:
        return "recipe"
    return "group"


def _emulated(cand: Any, probe: Probe, found: Findings) -> None:
    from fideval.quant.base import get_format
    from fideval.quant.spec import check_spec_classes, compile_spec, resolve_spec

    quant = cand.quant.model_dump(exclude_none=True)  # what the candidate stage compiles
    base = f"candidates.{cand.name}.quant"
    resolved = {}
    for cls, m in quant.items():
        try:
            resolved[cls] = resolve_spec({cls: m})[cls]
        except FidevalError as e:
            found.add(f"{base}.{cls}.{_rejected_part(m)}", e)
    from fideval.config import resolve_path

    lookup = None
    if cand.imatrix is not None and probe.folder is not None and resolve_path(cand.imatrix).exists():  # else check_files names it
        from fideval.score.hooks_of import imatrix_lookup

        try:
            lookup, _ = imatrix_lookup(cand, probe.folder)  # the file, read as the candidate stage reads it
        except FidevalError as e:
            found.add(f"candidates.{cand.name}.imatrix", e)
            return
    if len(resolved) == len(quant):
        try:
            compile_spec(quant, imatrix=lookup)  # the whole spec, as the stage builds it
        except FidevalError as e:
            found.add(base, e)
            return
    if lookup is not None:
        cfg_ = probe.config or {}
        n_exp = int(cfg_.get("n_routed_experts") or cfg_.get("num_experts") or cfg_.get("num_local_experts") or 0)
        for name, (c, shape) in probe.tensors.items():
            if c in resolved:
                try:
                    lookup.check(name, shape, n_exp)
                except FidevalError as e:
                    found.add(f"candidates.{cand.name}.imatrix", e)
                    return
    if probe.classes is None:
        return
    for cls, spec in resolved.items():
        try:
            check_spec_classes({cls: quant[cls]}, probe.classes)
        except FidevalError as e:
            found.add(f"{base}.{cls}", e)
            continue
        fmt = get_format(spec.format)
        for name, (c, shape) in probe.tensors.items():
            if c != cls:
                continue
            try:
                fmt.check_divides(shape, spec.group)
            except FidevalError as e:
                part = "group" if "group" in quant[cls] else "format"
                found.add(f"{base}.{cls}.{part}", FidevalError(f"{name}: {e.message}", hint=e.hint))
                break


def _mix(cand: Any, mix: str, probe: Probe, found: Findings, model_parallel: int = 1) -> None:
    """A ``gguf_mix`` candidate as the stage builds it (:class:`fideval.quant.gguf_mix_spec.MixSpec`): the mix name,
    the whole model's GGUF plan, and an imatrix entry of the right size for every tensor it quantizes with one (and
    no imatrix on an MoE split over ranks: a rank's experts cannot be matched to their imatrix rows)."""
    from fideval.config import resolve_path
    from fideval.quant.gguf_mix_spec import MixSpec
    from fideval.quant.gguf_mixes import MIXES
    from fideval.score.hooks_of import read_candidate_imatrix

    key = f"candidates.{cand.name}.quant.gguf_mix"
    if str(mix).upper() not in MIXES:
        found.add(key, FidevalError(f"unknown gguf mix {mix!r}", hint=f"use one of {', '.join(MIXES)}"))
        return
    im = None
    if cand.imatrix is not None and resolve_path(cand.imatrix).exists():  # else check_files names it
        try:
            im, _ = read_candidate_imatrix(cand)
        except FidevalError as e:
            found.add(f"candidates.{cand.name}.imatrix", e)
            return
    if probe.folder is None:
        return
    try:
        spec = MixSpec(mix, probe.folder)
    except FidevalError as e:
        found.add(key, e)
        return
    if "llamacpp" in cand.paths:  # every tensor's activation format, as the candidate stage hooks them
        from fideval.quant import ggml_path

        try:
            ggml_path.for_mix(spec)
        except FidevalError as e:
            found.add(f"candidates.{cand.name}.paths", e)
    if im is not None:
        try:
            spec = MixSpec(mix, probe.folder, im)
        except FidevalError as e:
            found.add(f"candidates.{cand.name}.imatrix", e)
            return
        if model_parallel > 1 and spec.model.n_expert:
            found.add(f"candidates.{cand.name}.imatrix", FidevalError(
                f"an imatrix on a model whose experts are split over {model_parallel} ranks: a rank's experts cannot be "
                "matched to their imatrix rows", hint="run an imatrix candidate with teacher.model_parallel 1"))


def _real(cand: Any, probe: Probe, found: Findings) -> None:
    from fideval.config import is_hub, resolve_path
    from fideval.model.weights.quantized import open_real
    from fideval.model_source import cached
    from fideval.score.hooks_of import serving_hooks

    key = f"candidates.{cand.name}.checkpoint"
    if is_hub(cand.checkpoint):
        files = cached(cand.checkpoint)
        if files is None:
            found.notes.append(f"candidate {cand.name}: {cand.checkpoint} is not in the local Hub cache: "
                               "it is checked once the candidate stage has fetched it")
            return
        src = files.folder
    else:
        src = resolve_path(cand.checkpoint)
        if not src.exists():
            return  # check_files has named it
    if probe.folder is None:
        found.notes.append(f"candidate {cand.name}: its build is checked against the reference once the reference is local")
        return
    if probe.adapter is None:
        return  # the reference itself is refused ('model.path'); a build of it would only repeat that
    try:
        ckpt = open_real(src, probe.folder)
    except FidevalError as e:
        found.add(key, e)
        return
    for path in cand.paths:
        try:
            serving_hooks(cand, ckpt, src, path)
        except FidevalError as e:
            found.add(f"candidates.{cand.name}.paths", e)
