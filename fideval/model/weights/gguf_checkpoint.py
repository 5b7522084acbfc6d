"""A llama.cpp GGUF file as a runner checkpoint: the reference model's Hugging Face tensors, each dequantized
with gguf-py (``gguf.quants.dequantize``) from the memory-mapped file when the runner reads it.

Before any tensor is touched, :class:`GGUFCheckpoint` checks, in this order, what would otherwise make the run
silently wrong or fail late: the architecture (``general.architecture`` against the reference's
``architectures[0]``, :data:`fideval.quant.gguf_names.GGUF_ARCHS`), the metadata llama.cpp computes with
(:func:`fideval.model.weights.gguf_meta.check_gguf_metadata`: routing, norm epsilon, rope), then every GGUF tensor's
place in the reference model (:func:`fideval.quant.gguf_names.plan_sources`, gguf-py's name tables), its
shape after the converter's rewrites are undone, and that gguf-py can dequantize its type. ``fideval validate``
opens the candidate with this class, so it reports all of it; each problem is one line naming the tensor or key
and both values.

Routed experts are served in transformers' fused layout (``mlp.experts.gate_up_proj`` ...), which the runner
reads as a whole or by expert range (``rows``): only the experts asked for are dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fideval.errors import FidevalError
from fideval.model.weights.fp8_release import reference_config
from fideval.model.weights.reading import deliver
from fideval.quant import gguf_names
from fideval.quant.gguf_names import Source


@dataclass(frozen=True)
class GGUFLogical:
    shape: tuple[int, ...]
    dtype: torch.dtype
    parts: tuple[str, ...]  # GGUF tensor names
    source: Source


class GGUFCheckpoint:
    """A llama.cpp GGUF file read as the reference model's Hugging Face float32 tensors, tensor by tensor."""

    release = None

    def __init__(self, gguf_path: str | Path, reference_dir: str | Path):
        from fideval.model.weights.gguf_meta import check_gguf_metadata, gguf_value
        from fideval.quant.gguf_file import _reader

        self.dir = Path(gguf_path)
        self.config_dir = Path(reference_dir)
        self.config_dict = reference_config(self.config_dir)
        self.reader = _reader(self.dir)
        arch = gguf_value(self.reader, "general.architecture")
        hf_arch = (self.config_dict.get("architectures") or [None])[0]
        gguf_names.hf_architecture(arch, hf_arch, self.dir)
        check_gguf_metadata(self.reader, arch, self.config_dict, self.dir)  # what llama.cpp computes, before names
        self.arch = arch
        self._tensors = {t.name: t for t in self.reader.tensors}
        self.types = {t.name: t.tensor_type.name for t in self.reader.tensors}
        expected = self._expected()
        plan = gguf_names.plan_sources(arch, expected, set(self._tensors), self.config_dict, self.dir)
        self.logical: dict[str, GGUFLogical] = {}
        used: set[str] = set()
        for hf, src in plan.items():
            shape = self._shape_of(src)
            if shape != expected[hf]:
                raise FidevalError(f"{self.dir}: GGUF tensor {src.parts[0]!r} (-> {hf}) has shape {list(shape)}, the "
                                   f"reference config implies {list(expected[hf])}",
                                   hint="the GGUF is not a build of the reference model")
            self.logical[hf] = GGUFLogical(shape, torch.float32, src.parts, src)
            used.update(src.parts)
        tied = bool(self.config_dict.get("tie_word_embeddings", False))
        for hf in expected:
            if hf not in self.logical and not (tied and hf == "lm_head.weight"):
                raise FidevalError(f"{self.dir}: no GGUF tensor for {hf} (llama.cpp name {self._wanted(hf)!r})",
                                   hint="the GGUF is incomplete or not a build of the reference model")
        _check_types(self.reader.tensors, used, self.dir)
        n_layers = int(self.config_dict.get("num_hidden_layers") or 0)
        nextn = int(gguf_value(self.reader, f"{arch}.nextn_predict_layers") or 0)
        for name in self._tensors:
            if name in used or gguf_names.IGNORED.match(name):
                continue
            bid = gguf_names.layer_of(name)
            if bid is not None and n_layers <= bid < n_layers + nextn:
                continue  # multi-token-prediction blocks, which the reference's forward does not run either
            raise FidevalError(f"{self.dir}: GGUF tensor {name!r} does not map onto {hf_arch} (no Hugging Face parameter)",
                               hint="the GGUF was converted from another architecture or a newer llama.cpp")

    def _expected(self) -> dict[str, tuple[int, ...]]:
        """The reference model's float tensors and shapes, from a meta-device model of its config."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(self.config_dir))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return {k: tuple(v.shape) for k, v in model.state_dict().items() if v.is_floating_point()}

    def _wanted(self, hf: str) -> str:
        try:
            src = gguf_names.plan_sources(self.arch, {hf: ()}, _Everything(), self.config_dict, self.dir)[hf]
        except (FidevalError, KeyError):
            return "?"
        return "+".join(src.parts)

    def _np_shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(list(self._tensors[name].shape)))

    def _shape_of(self, src: Source) -> tuple[int, ...]:
        s = [self._np_shape(p) for p in src.parts]
        if src.rows is not None:
            start, stop, total = src.rows
            return (stop - start, *s[0][1:]) if s[0][:1] == (total,) else s[0]
        if src.op == "gate_up":
            if any(len(x) != len(s[0]) or x[:1] != s[0][:1] or x[2:] != s[0][2:] for x in s):
                return tuple(s[0])  # reported as a shape mismatch
            return (s[0][0], s[0][1] + s[1][1], *s[0][2:]) if len(s[0]) == 3 else (*s[0][:-1], s[0][-1] + s[1][-1])
        if src.op == "gate_up_interleaved":
            if s[0] != s[1]:
                return tuple(s[0])
            return (s[0][0], s[0][2], 2 * s[0][1]) if len(s[0]) == 3 else (*s[0][:-1], 2 * s[0][-1])
        if src.op == "gate_up_transposed":
            if s[0] != s[1] or len(s[0]) != 3:
                return tuple(s[0])
            return (s[0][0], s[0][2], 2 * s[0][1])
        if src.op == "transpose":
            return (*s[0][:-2], s[0][-1], s[0][-2])
        if src.op == "kv_b":
            k, v = s  # [H, r, nope], [H, v, r]
            if len(k) == 3 and len(v) == 3 and k[0] == v[0] and k[1] == v[2]:
                return (k[0] * (k[2] + v[1]), k[1])
            return tuple(k)
        return s[0]

    def __contains__(self, key: str) -> bool:
        return key in self.logical

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return [k for k in self.logical if k.startswith(prefix)]

    def info(self, key: str) -> GGUFLogical:
        try:
            return self.logical[key]
        except KeyError:
            raise FidevalError(f"{self.dir}: no GGUF tensor maps to {key!r}",
                               hint="the GGUF is incomplete or not a build of the reference model") from None

    def read(self, key: str, rows: tuple[int, int] | None = None, pin: bool = False,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """Dequantize (gguf-py) the GGUF tensor(s) of ``key`` and undo the converter's rewrite; rows ``[lo, hi)``
        of a routed-experts tensor dequantize only those experts."""
        from fideval.quant.gguf_formats import gguf_dequantize

        e = self.info(key)
        lo, hi = rows if rows is not None else (0, e.shape[0])
        if not 0 <= lo <= hi <= e.shape[0]:
            raise FidevalError(f"{self.dir}: tensor {key!r} of shape {list(e.shape)} has no rows {lo}..{hi}",
                               hint="the GGUF does not match the reference config")
        by_expert = rows is not None and gguf_names._EXPERTS.match(key) is not None
        parts = []
        for name in e.parts:
            g = self._tensors[name]
            shape = self._np_shape(name)
            data = g.data
            if by_expert:
                data, shape = data[lo:hi], (hi - lo, *shape[1:])
            try:
                parts.append(gguf_dequantize(data, g.tensor_type, shape))
            except (ValueError, RuntimeError) as err:
                raise FidevalError(f"{self.dir}: GGUF tensor {name!r} ({g.tensor_type.name}) does not decode to shape "
                                   f"{list(shape)} ({str(err)[:80]})", hint="the file is truncated or corrupt") from None
        want = (hi - lo, *e.shape[1:]) if by_expert else e.shape
        t = gguf_names.assemble(e.source, parts, want).float()
        if rows is not None and not by_expert:
            t = t[lo:hi]
        if tuple(t.shape) != ((hi - lo, *e.shape[1:]) if rows is not None else e.shape):
            raise FidevalError(f"{self.dir}: GGUF tensor(s) {list(e.parts)} did not decode to {key} of shape "
                               f"{list(e.shape)}", hint="the GGUF is not a build of the reference model")
        return deliver(t, key, self.dir, pin, out)

    def quantized_classes(self) -> set[str]:
        from fideval.quant.gguf_file import gguf_module_class_of

        return {c for n, ty in self.types.items() if ty not in ("F32", "F16", "BF16", "F64") and (c := gguf_module_class_of(n))}


def _check_types(tensors, used: set[str], where: Path) -> None:
    """One line for the first tensor whose GGML type gguf-py cannot dequantize (Q8_1, Q8_K, integers...): found
    before any run, not when the runner reaches its layer. Each distinct type is tried once on one zero block."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    floats = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16, GGMLQuantizationType.F64)
    ok: dict = {}
    for t in tensors:
        if t.name not in used or t.tensor_type in floats:
            continue
        if t.tensor_type not in ok:
            block, size = GGML_QUANT_SIZES[t.tensor_type]
            try:
                quants.dequantize(np.zeros((1, size), np.uint8), t.tensor_type)
                ok[t.tensor_type] = True
            except (NotImplementedError, ValueError, TypeError):
                ok[t.tensor_type] = False
        if not ok[t.tensor_type]:
            raise FidevalError(f"{where}: GGUF tensor {t.name!r} has type {t.tensor_type.name}, which gguf-py cannot "
                               "dequantize", hint="requantize the tensor to a type llama-quantize writes for weights "
                               "(Q*_0, K-quants, IQ*), or update the gguf package")


class _Everything(set):
    """A ``present`` set holding every name: what the reference tensor would be called in a complete GGUF."""

    def __contains__(self, item) -> bool:
        return True
