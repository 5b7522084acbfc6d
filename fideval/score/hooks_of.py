"""What a config candidate becomes before anything runs: the runner's hooks (``weight_transform``, ``act_transform``,
a real build's ``checkpoint``) for one path, and score.json's ``candidate_info`` (fideval.score.candidate runs them).

An *emulated* build is the reference checkpoint with its quant spec (per-class formats or a llama-quantize mix,
with an importance matrix where llama.cpp takes one); a *real* build is a GGUF file or a quantized safetensors
folder decoded layer by layer. On the *serving* path the activations entering quantized modules are rounded to
E4M3 per 1x128; on *llamacpp* each quantized linear's input as ggml does for the tensor's type
(:mod:`fideval.quant.ggml_path`); *weights-only* leaves them alone. ``fideval validate`` asks the same functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fideval.errors import FidevalError
from fideval.formats import nesting

if TYPE_CHECKING:
    from fideval.config import Candidate as CandidateConfig
    from fideval.config import Config
    from fideval.model_source import ModelFiles


def describe(cfg: Config, cand: CandidateConfig, path: str, files: ModelFiles) -> tuple[dict[str, Any], dict[str, Any]]:
    """The runner's hooks for candidate ``cand`` on ``path`` and score.json's ``candidate_info`` (without the run
    settings, which join it once the runner is built)."""
    hooks, info = (_real if cand.checkpoint is not None else _emulated)(cand, path, files)
    from fideval.quant.ggml_path import DESCRIPTION

    acts = {"serving": "e4m3 per 1x128", "llamacpp": DESCRIPTION}.get(path, "none")
    return hooks, {"model_id": cfg.model.id, "model_revision": files.revision, "activations": acts, **info}


def _emulated(cand: Any, path: str, files: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The runner's hooks and score.json's info for the reference checkpoint with ``cand``'s quant spec."""
    from fideval.quant.gguf_mix_spec import MixSpec, mix_name
    from fideval.quant.inspect import class_shapes, classes_present, release_bits
    from fideval.quant.spec import check_spec_classes, compile_spec

    quant = cand.quant.model_dump(exclude_none=True)
    mix = mix_name(quant)
    if mix is not None:  # llama-quantize's named mix: every weight, the embedding included (fideval.quant.gguf_mix_spec)
        im, im_info = read_candidate_imatrix(cand)
        spec = MixSpec(mix, files.folder, im)
        act, ggml = spec.act_transform if path == "serving" else None, None
        if path == "llamacpp":  # ggml's activation rounding by the plan's types (fideval.quant.ggml_path)
            from fideval.quant import ggml_path

            table = ggml_path.for_mix(spec)
            act, ggml = ggml_path.act_transform(table) or None, ggml_path.summary(table)
        hooks = {"weight_transform": spec.weight_transform, "act_transform": act}
        info = {"source": "emulated", "quant": quant, "bits_per_weight": spec.bits()}
        return hooks, {**info, **({"imatrix": im_info} if im_info else {}), **({"ggml_activations": ggml} if ggml else {})}
    llamacpp_refusal(cand, path)
    im, im_info = imatrix_lookup(cand, files.folder)
    spec = compile_spec(quant, imatrix=im)
    by_class = class_shapes(files.folder)
    check_spec_classes(quant, classes_present(by_class))
    hooks = {"weight_transform": spec.weight_transform, "act_transform": spec.act_transform if path == "serving" else None}
    info = {"source": "emulated", "quant": quant, "bits_per_weight": spec.bits(by_class, stored=release_bits(files.folder))}
    return hooks, {**info, **({"imatrix": im_info} if im_info else {})}


def read_candidate_imatrix(cand: Any) -> tuple[Any, dict[str, Any] | None]:
    """The candidate's ``imatrix`` file (an :class:`fideval.quant.imatrix.Imatrix`, by llama.cpp names) and what
    score.json records of it; (None, None) without one."""
    if getattr(cand, "imatrix", None) is None:
        return None, None
    from fideval.config import resolve_path
    from fideval.fsio import sha256_file
    from fideval.quant.imatrix import read_imatrix

    path = resolve_path(cand.imatrix)
    im = read_imatrix(path)
    return im, {"path": str(cand.imatrix), "sha256": sha256_file(path), "entries": len(im.entries),
                "datasets": im.datasets, "chunks": im.chunk_count, "legacy": im.legacy}


def imatrix_lookup(cand: Any, model_dir: Any) -> tuple[Any, dict[str, Any] | None]:
    """The candidate's ``imatrix`` file as the spec's per-parameter lookup, and what score.json records of it."""
    im, info = read_candidate_imatrix(cand)
    if im is None:
        return None, None
    from fideval.quant.imatrix import ImatrixLookup

    cfg = nesting.load_file(Path(model_dir) / "config.json", "fix or re-download config.json")
    return ImatrixLookup(im, cfg.get("model_type"), int(cfg.get("num_hidden_layers") or 0)), info


def llamacpp_refusal(cand: Any, path: str, ckpt: Any = None) -> None:
    """One-line error for path 'llamacpp' on a candidate that is not a whole GGUF build (a real .gguf ``checkpoint``, or
    ``quant: {gguf_mix: ...}``): only a GGUF says which GGML type, hence which activation format, each tensor has."""
    if path != "llamacpp":
        return
    if ckpt is not None:
        from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint

        if isinstance(ckpt, GGUFCheckpoint):
            return
    if ckpt is None and cand.quant is not None and getattr(cand.quant, "gguf_mix", None) is not None:
        return
    raise FidevalError(f"candidate {cand.name!r}: path 'llamacpp' needs a GGUF candidate (a .gguf checkpoint or quant: "
                       "{gguf_mix: ...}): only a GGUF gives every tensor the GGML type its activations follow",
                       hint="score this candidate on serving or weights-only")


def checkpoint_hooks(ckpt: Any, path: str) -> dict:
    """A real build's serving path: activations entering the module classes the build quantizes go through
    E4M3 per 1x128 (fp32 scales), exactly as an emulated candidate's do; weights-only leaves them alone."""
    if path != "serving":
        return {}
    from fideval.quant.activations import act_quant_e4m3

    def f(x):
        return act_quant_e4m3(x, 128, "fp32")

    return {cls: f for cls in sorted(ckpt.quantized_classes())}


def serving_hooks(cand: Any, ckpt: Any, src: Any, path: str) -> dict:
    """:func:`checkpoint_hooks`, refusing a serving path on a build that quantizes no module class (it would
    only repeat weights-only). ``fideval validate`` asks this of every path a real build is scored on."""
    if path == "llamacpp":
        llamacpp_refusal(cand, path, ckpt)
        from fideval.quant import ggml_path

        return ggml_path.act_transform(ggml_path.for_checkpoint(ckpt))
    act = checkpoint_hooks(ckpt, path)
    if path == "serving" and not act:
        raise FidevalError(f"candidate {cand.name!r}: checkpoint {src} quantizes no module class, so 'serving' equals 'weights-only'",
                           hint="score it on paths: [weights-only]")
    return act


def checkpoint_identity(p) -> dict[str, Any]:
    """SHA-256 of a GGUF file, or a manifest {file: sha256} of a folder's config.json and safetensors files."""
    from fideval.fsio import sha256_file

    p = Path(p)
    if p.is_file():
        return {"file": p.name, "sha256": sha256_file(p), "bytes": p.stat().st_size}
    keep = ("config.json", "model.safetensors.index.json")
    files = sorted(f for f in p.iterdir() if f.is_file() and (f.suffix == ".safetensors" or f.name in keep))
    return {"files": {f.name: sha256_file(f) for f in files}, "bytes": sum(f.stat().st_size for f in files)}


def _real(cand: Any, path: str, files: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The runner's hooks and score.json's info for the real quantized build ``cand.checkpoint`` (a .gguf
    file or a quantized safetensors folder): architecture and config from the reference model folder,
    weights decoded from the build layer by layer (``fideval.model.weights.quantized``)."""
    from fideval.config import is_hub, resolve_path
    from fideval.model.weights.quantized import open_real
    from fideval.model_source import locate

    src = locate(cand.checkpoint).folder if is_hub(cand.checkpoint) else resolve_path(cand.checkpoint)
    ckpt = open_real(src, files.folder)
    act = serving_hooks(cand, ckpt, src, path)
    if hasattr(ckpt, "bits"):
        bits, kind = ckpt.bits(), f"safetensors ({ckpt.quant_method or 'unquantized'})"
    else:
        from fideval.quant.gguf_file import gguf_bits

        bits, kind = gguf_bits(src), f"gguf ({ckpt.arch})"
    info = {"source": "checkpoint", "checkpoint": {"path": str(cand.checkpoint), "kind": kind, **checkpoint_identity(src)},
            "quantized_classes": sorted(act) if act and path == "serving" else sorted(ckpt.quantized_classes()),
            "bits_per_weight": bits}
    if path == "llamacpp":
        from fideval.quant import ggml_path

        info["ggml_activations"] = ggml_path.summary(ggml_path.for_checkpoint(ckpt))
    return {"act_transform": act or None, "checkpoint": ckpt}, info
