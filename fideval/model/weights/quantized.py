"""Real quantized builds as runner checkpoints: a quantized safetensors folder or a GGUF file, presented
to the runner under the reference model's Hugging Face tensor names, decoded to float32 one tensor at a
time as each layer is materialised.

Why a second checkpoint class instead of converting the build to bf16 first: a converted copy of a
DeepSeek-class build is 1.3 TB of disk and one more artefact whose provenance must be trusted. Decoding
per layer means the numbers the runner computes with are, bit for bit, those the build's own decoder
(``fideval.quant.checkpoint.decode_tensor_set``, gguf-py) produces, and nothing is written.

Both classes implement what :class:`fideval.model.adapters.Adapter` and the runner use of
:class:`~fideval.model.weights.checkpoint.Checkpoint`: ``dir``, ``config_dict``, ``config_dir``, ``in``,
``info(key)`` (shape and dtype *after* decoding) and ``read(key, rows=, pin=, out=)``. The architecture
and config always come from the reference model's ``config.json`` (``config_dir``): the build must be
the same network, and shape checks against it name the offending tensor. The reference may be an FP8 release
(:mod:`fideval.model.weights.fp8_release`): only its config is used here; a reference quantized any other way is refused.

* :class:`QuantizedCheckpoint` -- safetensors folders: compressed-tensors NVFP4 (``weight_packed``,
  ``weight_scale``, ``weight_global_scale``) and FP8 (``weight`` + ``weight_scale``), ModelOpt NVFP4/FP8,
  DeepSeek FP8 (``weight_scale_inv``), gpt-oss MXFP4 (``*_blocks`` / ``*_scales``). Headers are parsed by
  :class:`Checkpoint` (bounded); a logical tensor is planned from the headers alone, so its shape is
  known before any byte is read. gpt-oss stores experts ``[E, out, in]`` as blocks, transformers holds
  them transposed (``[E, in, out]``), so decoded gpt-oss expert tensors are transposed back.
* :class:`~fideval.model.weights.gguf_checkpoint.GGUFCheckpoint` -- a llama.cpp GGUF file, in its own module: names
  mapped with gguf-py's tables, the converter's rewrites (Q/K permutation, stacked and fused experts, DeepSeek's
  kv_b split) undone in :mod:`fideval.quant.gguf_names`, metadata checked by :mod:`fideval.model.weights.gguf_meta`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from fideval.errors import FidevalError
from fideval.model.weights.checkpoint import Checkpoint, TensorInfo
from fideval.model.weights.fp8_release import reference_config
from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint
from fideval.model.weights.reading import deliver

# quantization_config.quant_method values we decode, and compressed-tensors' formats among them
QUANT_METHODS = ("compressed-tensors", "fp8", "mxfp4", "modelopt")
CT_FORMATS = ("nvfp4-pack-quantized", "float-quantized", "naive-quantized")
_DROP = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale")
_GPT_OSS_EXPERTS = re.compile(r"mlp\.experts\.(gate_up_proj|down_proj)$")


def check_quantization_config(qc, where: Path) -> str | None:
    """The build's ``quant_method`` (None for an unquantized folder); an unknown method or
    compressed-tensors format is a one-line error (decoding it as something else would be silently wrong)."""
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise FidevalError(f"{where}: quantization_config is not a JSON object", hint="fix config.json")
    method = qc.get("quant_method")
    if method not in QUANT_METHODS:
        raise FidevalError(f"{where}: quantization_config quant_method {method!r} is not supported",
                           hint=f"supported: {', '.join(QUANT_METHODS)}")
    if method == "compressed-tensors":
        fmts = {qc.get("format")} | {g.get("format") for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)}
        bad = sorted(str(f) for f in fmts - {None} if f not in CT_FORMATS)
        if bad:
            raise FidevalError(f"{where}: compressed-tensors format {bad[0]!r} is not supported",
                               hint=f"supported: {', '.join(CT_FORMATS)}")
    return method


@dataclass(frozen=True)
class Logical:
    """One tensor as the model sees it: decoded shape/dtype, the stored tensors it comes from, its kind."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    parts: tuple[str, ...]
    kind: str  # plain | mxfp4 | nvfp4 | nvfp4_modelopt | fp8_block | fp8_scaled
    transpose: bool = False


def plan(raw: dict[str, TensorInfo], where: Path, transpose_experts: bool = False) -> dict[str, Logical]:
    """Group stored tensors into logical ones from the headers alone, by the same name rules as
    :func:`fideval.quant.checkpoint.decode_tensor_set` (which then does the decoding)."""
    out: dict[str, Logical] = {}
    used: set[str] = set()

    def need(name: str, keys: list[str]) -> None:
        miss = [k for k in keys if k not in raw]
        if miss:
            raise FidevalError(f"{where}: quantized tensor {name!r} has no {miss[0]!r}", hint="the checkpoint is incomplete")

    for name, info in raw.items():
        shape = info.shape
        if name.endswith("_blocks") and name[:-7] + "_scales" in raw:
            base = name[:-7]
            if len(shape) < 2:
                raise FidevalError(f"{where}: MXFP4 tensor {name!r} has shape {list(shape)}", hint="expected [..., G, 16]")
            dec = (*shape[:-2], shape[-2] * shape[-1] * 2)
            tr = transpose_experts and len(dec) == 3 and bool(_GPT_OSS_EXPERTS.search(base))
            out[base] = Logical((*dec[:-2], dec[-1], dec[-2]) if tr else dec, torch.float32, (name, base + "_scales"), "mxfp4", tr)
            used |= {name, base + "_scales"}
        elif name.endswith(".weight_packed"):
            base = name[: -len("_packed")]
            need(name, [base + "_scale", base + "_global_scale"])
            out[base] = Logical((*shape[:-1], shape[-1] * 2), torch.float32, (name, base + "_scale", base + "_global_scale"), "nvfp4")
            used |= {name, base + "_scale", base + "_global_scale"}
        elif name.endswith(".weight") and name + "_scale_inv" in raw:
            out[name] = Logical(shape, torch.float32, (name, name + "_scale_inv"), "fp8_block")
            used |= {name, name + "_scale_inv"}
        elif name.endswith(".weight") and info.dtype == torch.uint8 and name + "_scale_2" in raw:
            need(name, [name + "_scale"])
            out[name] = Logical((*shape[:-1], shape[-1] * 2), torch.float32, (name, name + "_scale", name + "_scale_2"), "nvfp4_modelopt")
            used |= {name, name + "_scale", name + "_scale_2"}
        elif name.endswith(".weight") and info.dtype == getattr(torch, "float8_e4m3fn", None) and name + "_scale" in raw:
            out[name] = Logical(shape, torch.float32, (name, name + "_scale"), "fp8_scaled")
            used |= {name, name + "_scale"}
    for name, info in raw.items():
        if name in used or name in out or name.endswith(_DROP):
            continue
        if name.endswith(".weight") and (info.dtype == torch.uint8 or not info.dtype.is_floating_point or info.dtype.itemsize == 1):
            raise FidevalError(f"{where}: tensor {name!r} is stored as {info.dtype} without the scales of a known format",
                               hint="supported: MXFP4 blocks/scales, NVFP4 (compressed-tensors, ModelOpt), FP8 with weight_scale(_inv)")
        out[name] = Logical(info.shape, info.dtype, (name,), "plain")
    return out


class QuantizedCheckpoint:
    """A quantized safetensors folder read as the reference model's float tensors, one tensor at a time."""

    release = None  # reads give floats (the reference may be an FP8 release: its config, not its tensors, is used)

    def __init__(self, weights_dir: str | Path, reference_dir: str | Path):
        self.raw = Checkpoint(weights_dir)
        self.dir = self.raw.dir
        self.config_dir = Path(reference_dir)
        ref = reference_config(self.config_dir)
        self.quant_method = check_quantization_config(self.raw.config_dict.get("quantization_config"), self.dir / "config.json")
        mine = (self.raw.config_dict.get("architectures") or [None])[0]
        theirs = (ref.get("architectures") or [None])[0]
        if mine is not None and mine != theirs:
            raise FidevalError(f"{self.dir / 'config.json'}: architecture {mine!r} differs from the reference's {theirs!r}",
                               hint="the candidate must be a quantized build of the reference model")
        self.config_dict = ref
        self.logical = plan(self.raw.tensors, self.dir, transpose_experts=theirs == "GptOssForCausalLM")

    def __contains__(self, key: str) -> bool:
        return key in self.logical

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return [k for k in self.logical if k.startswith(prefix)]

    def info(self, key: str) -> Logical:
        try:
            return self.logical[key]
        except KeyError:
            raise FidevalError(f"{self.dir}: tensor {key!r} is missing from the quantized checkpoint",
                               hint="the build is incomplete or not of the reference's architecture") from None

    def read(self, key: str, rows: tuple[int, int] | None = None, pin: bool = False,
             out: torch.Tensor | None = None) -> torch.Tensor:
        e = self.info(key)
        if e.kind == "plain":
            return self.raw.read(e.parts[0], rows=rows, pin=pin, out=out)
        from fideval.quant.checkpoint import decode_tensor_set

        # experts fused along dim 0 in every stored part: read only rows [lo, hi) of each
        split = rows is not None and len(e.shape) >= 3 and all(self.raw.info(p).shape[:1] == e.shape[:1] for p in e.parts)
        try:
            dec = decode_tensor_set({p: self.raw.read(p, rows=rows if split else None) for p in e.parts})
        except FidevalError as err:
            raise FidevalError(f"{self.dir}: tensor {key!r}: {err.message}", hint=err.hint or "the checkpoint is corrupt") from None
        t = dec.get(key)
        if t is None or len(dec) != 1:
            raise FidevalError(f"{self.dir}: tensor {key!r} did not decode as {e.kind} (got {sorted(dec)})",
                               hint="the checkpoint is corrupt")
        if e.transpose:
            t = t.transpose(-1, -2)
        want = e.shape
        if rows is not None:
            lo, hi = rows
            if not 0 <= lo <= hi <= e.shape[0]:
                raise FidevalError(f"{self.dir}: tensor {key!r} of shape {list(e.shape)} has no rows {lo}..{hi}",
                                   hint="the checkpoint does not match config.json")
            t = t if split else t[lo:hi]
            want = (hi - lo, *e.shape[1:])
        if tuple(t.shape) != tuple(want):
            raise FidevalError(f"{self.dir}: tensor {key!r} decoded to shape {list(t.shape)}, its headers imply {list(want)}",
                               hint="the checkpoint is corrupt")
        return deliver(t, key, self.dir, pin, out)

    def bits(self) -> dict:
        """Stored bits per weight per module class (scales included) and for the whole build."""
        from fideval.quant.spec import MODULE_CLASSES, module_class_of

        per: dict[str, dict] = {}
        tot_n = tot_b = 0
        for name, e in self.logical.items():
            cls = module_class_of(name)
            cls = cls if cls in MODULE_CLASSES else "other"
            n = math.prod(e.shape)
            b = sum(self.raw.info(p).nbytes for p in e.parts) * 8
            row = per.setdefault(cls, {"format": set(), "tensors": 0, "params": 0, "bits": 0})
            row["format"].add(e.kind if e.kind != "plain" else str(e.dtype).removeprefix("torch."))
            row["tensors"] += 1
            row["params"] += n
            row["bits"] += b
            tot_n, tot_b = tot_n + n, tot_b + b
        for row in per.values():
            row["format"] = "+".join(sorted(row["format"]))
            row["bpw"] = row["bits"] / row["params"] if row["params"] else 0.0
        return {"per_class": per, "total": {"params": tot_n, "bits": float(tot_b), "bpw": tot_b / tot_n if tot_n else 0.0}}

    def quantized_classes(self) -> set[str]:
        from fideval.quant.spec import MODULE_CLASSES, module_class_of

        return {c for n, e in self.logical.items() if e.kind != "plain" and (c := module_class_of(n)) in MODULE_CLASSES}


def open_real(path: str | Path, reference_dir: str | Path):
    """The checkpoint object for a real build: a ``.gguf`` file or a (quantized) safetensors folder."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".gguf":
        return GGUFCheckpoint(p, reference_dir)
    if p.is_dir():
        return QuantizedCheckpoint(p, reference_dir)
    if not p.exists():
        raise FidevalError(f"candidate checkpoint {p} not found", hint="give a .gguf file or a safetensors folder")
    raise FidevalError(f"candidate checkpoint {p}: neither a .gguf file nor a folder", hint="give a .gguf file or a safetensors folder")

