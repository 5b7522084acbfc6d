"""The candidate: the reference checkpoint with emulated quantized modules, run through the very same
layer-by-layer path as the teacher, so that the quantization is the only difference between the two.

The quant spec becomes two hooks for the runner: ``weight_transform`` quantizes->dequantizes each listed
weight once, as its layer is materialised (never per token), and on the *serving* path ``act_transform``
quantizes the activations entering those modules to E4M3 per 1x128 as the serving kernels do; the
*weights-only* path leaves activations alone. Bits per weight are counted from the checkpoint's headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fideval.errors import FidevalError

PATHS = ("serving", "weights-only")


@dataclass
class CandidateRun:
    logits: Iterator[tuple]  # (seq_id, float32 [L, V]) in the teacher's order
    info: dict[str, Any]  # what score.json records about the candidate


def teacher_sequences(teacher: Any):
    """The teacher store's own token ids as Sequences: the candidate runs on exactly what the teacher saw."""
    from fideval.windows.layout import Sequences

    ids = list(teacher.seq_ids)
    if not ids:
        raise FidevalError(f"teacher store {teacher.root} holds no sequences", hint="run 'fideval teacher' first")
    rows = [teacher.token_ids(sid) for sid in ids]  # header + tokens only; logits are hashed when scored
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise FidevalError(f"teacher store {teacher.root} mixes sequence lengths {sorted(lengths)}",
                           hint="score one length (windows or cuts) per run")
    domains = [teacher.entry(sid).get("domain", "") for sid in ids]
    return Sequences(ids=ids, domains=domains, tokens=np.stack(rows).astype(np.int32))


def emulated(cfg: Any, name: str, path: str, teacher: Any, device: str) -> CandidateRun:
    """Run candidate ``name`` of ``cfg`` on ``path`` (serving or weights-only) over the teacher's sequences."""
    import torch

    from fideval.model.runner import iter_logits
    from fideval.model_source import locate
    from fideval.quant.inspect import class_shapes
    from fideval.quant.spec import check_spec_classes, compile_spec

    by_name = {c.name: c for c in cfg.candidates}
    if name not in by_name:
        raise FidevalError(f"candidate {name!r} is not in the config", hint=f"one of: {', '.join(by_name) or 'none'}")
    cand = by_name[name]
    if path not in cand.paths:
        raise FidevalError(f"candidate {name!r} has no path {path!r}", hint=f"its paths: {', '.join(cand.paths)}")
    if cand.checkpoint is not None:
        return real(cfg, name, path, teacher, device)
    files = locate(cfg.model.path, cfg.model.revision)
    quant = cand.quant.model_dump(exclude_none=True)
    spec = compile_spec(quant)
    by_class = class_shapes(files.folder)
    check_spec_classes(quant, {c for c in by_class if c is not None})
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.teacher.dtype]
    seqs = teacher_sequences(teacher)
    logits = iter_logits(files.folder, seqs, device=device, dtype=dtype, weight_transform=spec.weight_transform,
                         act_transform=spec.act_transform if path == "serving" else None,
                         micro_batch=cfg.teacher.micro_batch)
    info = {"source": "emulated", "model_id": cfg.model.id, "model_revision": files.revision, "quant": quant,
            "activations": "e4m3 per 1x128" if path == "serving" else "none",
            "bits_per_weight": spec.bits(by_class)}
    return CandidateRun(logits=((sid, x) for sid, x in logits), info=info)



def checkpoint_hooks(ckpt: Any, path: str) -> dict:
    """A real build's serving path: activations entering the module classes the build quantizes go through
    E4M3 per 1x128 (fp32 scales), exactly as an emulated candidate's do; weights-only leaves them alone."""
    if path != "serving":
        return {}
    from fideval.quant.activations import act_quant_e4m3

    def f(x):
        return act_quant_e4m3(x, 128, "fp32")

    return {cls: f for cls in sorted(ckpt.quantized_classes())}


def checkpoint_identity(p) -> dict[str, Any]:
    """SHA-256 of a GGUF file, or a manifest {file: sha256} of a folder's config.json and safetensors files."""
    from pathlib import Path

    from fideval.fsio import sha256_file

    p = Path(p)
    if p.is_file():
        return {"file": p.name, "sha256": sha256_file(p), "bytes": p.stat().st_size}
    files = sorted(f for f in p.iterdir() if f.is_file() and (f.suffix == ".safetensors" or f.name in ("config.json", "model.safetensors.index.json")))
    return {"files": {f.name: sha256_file(f) for f in files}, "bytes": sum(f.stat().st_size for f in files)}


def real(cfg: Any, name: str, path: str, teacher: Any, device: str) -> CandidateRun:
    """Run the real quantized build of candidate ``name`` (``checkpoint:`` a .gguf file or a quantized
    safetensors folder) through the runner: architecture and config from the reference model folder,
    weights decoded from the build layer by layer (``fideval.model.quantized``)."""
    import torch

    from fideval.config import is_hub, resolve_path
    from fideval.model.quantized import open_real
    from fideval.model.runner import iter_logits
    from fideval.model_source import locate

    cand = {c.name: c for c in cfg.candidates}[name]
    files = locate(cfg.model.path, cfg.model.revision)
    src = locate(cand.checkpoint).folder if is_hub(cand.checkpoint) else resolve_path(cand.checkpoint)
    ckpt = open_real(src, files.folder)
    act = checkpoint_hooks(ckpt, path)
    if path == "serving" and not act:
        raise FidevalError(f"candidate {name!r}: checkpoint {src} quantizes no module class, so 'serving' equals 'weights-only'",
                           hint="score it on paths: [weights-only]")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.teacher.dtype]
    seqs = teacher_sequences(teacher)
    logits = iter_logits(files.folder, seqs, device=device, dtype=dtype, act_transform=act or None,
                         micro_batch=cfg.teacher.micro_batch, checkpoint=ckpt)
    if hasattr(ckpt, "bits"):
        bits, kind = ckpt.bits(), f"safetensors ({ckpt.quant_method or 'unquantized'})"
    else:
        from fideval.quant.gguf_file import gguf_bits

        bits, kind = gguf_bits(src), f"gguf ({ckpt.arch})"
    info = {"source": "checkpoint", "model_id": cfg.model.id, "model_revision": files.revision,
            "checkpoint": {"path": str(cand.checkpoint), "kind": kind, **checkpoint_identity(src)},
            "activations": "e4m3 per 1x128" if path == "serving" else "none",
            "quantized_classes": sorted(act) if act else sorted(ckpt.quantized_classes()),
            "bits_per_weight": bits}
    return CandidateRun(logits=((sid, x) for sid, x in logits), info=info)
