"""llama.cpp importance-matrix files (``llama-imatrix`` output), read as ``llama-quantize --imatrix`` reads them.

Two layouts exist, and llama.cpp tells them apart the same way (a GGUF header, else legacy):

* GGUF (current): per tensor ``<name>.in_sum2`` (float32 ``[n_expert, n_per_row]``, sums of squared
  activations) and ``<name>.counts`` (float32 ``[n_expert]``, tokens seen); the weight is
  ``in_sum2 / count`` per expert, and 1 for an expert that saw no token (``count`` rounded with lround).
* legacy ``imatrix.dat``: int32 entry count, then per entry int32 name length, the name, int32 ``ncall``,
  int32 ``nval`` and ``nval`` float32 values, optionally followed by the chunk count and the dataset name;
  the weight is ``value / ncall`` (the value itself when ``ncall`` is 0).

:meth:`Imatrix.for_tensor` gives the ``quant_weights`` of one GGUF tensor: ``[n_per_row]`` for a matrix,
``[n_expert, n_per_row]`` for stacked experts (expert e's rows use slice e, as llama-quantize does). A
missing entry or one of another size is a one-line error, never a silent quantization without weights.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fideval.errors import FidevalError

_FIX = "give the imatrix file llama-imatrix wrote for this model"


@dataclass
class Imatrix:
    path: str
    entries: dict[str, np.ndarray]  # name -> float32 [n_expert * n_per_row], normalised as llama-quantize does
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    legacy: bool = False

    def for_tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The weights of GGUF tensor ``name`` of numpy ``shape`` (``[out, in]`` or ``[E, out, in]``)."""
        e = self.entries.get(name)
        if e is None:
            some = ", ".join(sorted(self.entries)[:3])
            raise FidevalError(f"{self.path}: the importance matrix has no entry for tensor {name!r} "
                               f"({len(self.entries)} entries, e.g. {some})", hint=_FIX)
        n_per_row = int(shape[-1])
        n_expert = int(shape[0]) if len(shape) == 3 else 1
        if len(shape) == 3 and e.size % n_per_row == 0 and e.size != n_per_row * n_expert:
            raise FidevalError(f"{self.path}: imatrix entry {name!r} holds {e.size // n_per_row} experts, the tensor "
                               f"{n_expert} (a model-parallel rank's share cannot be matched to its imatrix slice)",
                               hint="run an imatrix candidate with teacher.model_parallel 1")
        if e.size != n_per_row * n_expert:
            raise FidevalError(f"{self.path}: imatrix entry {name!r} has {e.size} values, tensor {list(shape)} needs "
                               f"{n_per_row * n_expert} ({n_expert} x {n_per_row})", hint=_FIX)
        return e.reshape(n_expert, n_per_row) if len(shape) == 3 else e


def read_imatrix(path: str | Path) -> Imatrix:
    """Read an imatrix file (GGUF or legacy), one-line errors for anything malformed."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise FidevalError(f"imatrix file {p} not found", hint="check the path") from None
    except OSError as e:
        raise FidevalError(f"cannot read {p} ({e.strerror})", hint="check the path and its permissions") from None
    if data[:4] == b"GGUF":
        return _read_gguf(p)
    return _read_legacy(p, data)


def _read_legacy(p: Path, data: bytes) -> Imatrix:
    off = 0

    def take(fmt: str):
        nonlocal off
        size = struct.calcsize(fmt)
        if off + size > len(data):
            raise FidevalError(f"{p}: truncated legacy imatrix file (needs byte {off + size}, has {len(data)})", hint=_FIX)
        v = struct.unpack_from(fmt, data, off)
        off += size
        return v

    (n,) = take("<i")
    if n < 1 or n * 12 > len(data):
        raise FidevalError(f"{p}: not an imatrix file (GGUF or legacy): it claims {n} entries", hint=_FIX)
    entries = {}
    for _ in range(n):
        (ln,) = take("<i")
        if ln < 1 or ln > 4096:
            raise FidevalError(f"{p}: not an imatrix file: entry name length {ln}", hint=_FIX)
        name = bytes(take(f"<{ln}s")[0]).decode("utf-8", "replace")
        ncall, nval = take("<ii")
        if nval < 1:
            raise FidevalError(f"{p}: imatrix entry {name!r} has {nval} values", hint=_FIX)
        if off + 4 * nval > len(data):
            raise FidevalError(f"{p}: truncated legacy imatrix file (entry {name!r})", hint=_FIX)
        sums = np.frombuffer(data, "<f4", nval, off).astype(np.float32)
        off += 4 * nval
        entries[name] = sums / np.float32(ncall) if ncall > 0 else sums.copy()
    chunks, datasets = 0, []
    if off + 4 <= len(data):
        (chunks,) = take("<i")
        if off + 4 <= len(data):
            (ln,) = take("<i")
            if 0 < ln <= len(data) - off:
                datasets.append(bytes(take(f"<{ln}s")[0]).decode("utf-8", "replace"))
    return _checked(Imatrix(str(p), entries, datasets, chunks, legacy=True))


def _read_gguf(p: Path) -> Imatrix:
    from fideval.quant.gguf_file import _reader

    r = _reader(p)
    sums, counts = {}, {}
    for t in r.tensors:
        for suffix, into in ((".in_sum2", sums), (".counts", counts)):
            if t.name.endswith(suffix):
                if t.tensor_type.name != "F32":
                    raise FidevalError(f"{p}: imatrix tensor {t.name!r} is {t.tensor_type.name}, not F32", hint=_FIX)
                into[t.name[: -len(suffix)]] = np.asarray(t.data, np.float32).reshape(-1)
    if not sums and not counts:
        raise FidevalError(f"{p}: a GGUF file without imatrix tensors (*.in_sum2, *.counts)", hint=_FIX)
    entries = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            raise FidevalError(f"{p}: imatrix entry {name!r} has sums without counts or counts without sums", hint=_FIX)
        s, c = sums[name], np.floor(counts[name].astype(np.float64) + 0.5).astype(np.int64)  # lround, counts >= 0
        if c.size == 0 or s.size % c.size:
            raise FidevalError(f"{p}: imatrix entry {name!r}: {s.size} sums for {c.size} counts", hint=_FIX)
        per = s.reshape(c.size, -1)
        cf = c.astype(np.float32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            entries[name] = np.where(cf > 0, per / np.where(cf > 0, cf, 1), np.float32(1)).astype(np.float32).reshape(-1)
    f = r.fields
    datasets = [bytes(f["imatrix.datasets"].parts[i]).decode() for i in f["imatrix.datasets"].data] if "imatrix.datasets" in f else []
    chunks = int(f["imatrix.chunk_count"].parts[-1][0]) if "imatrix.chunk_count" in f else 0
    if "imatrix.chunk_size" not in f or "imatrix.chunk_count" not in f or "imatrix.datasets" not in f:
        raise FidevalError(f"{p}: imatrix metadata missing (imatrix.datasets, chunk_count, chunk_size)",
                           hint="llama-quantize refuses it too; recompute it with a current llama-imatrix")
    return _checked(Imatrix(str(p), entries, datasets, chunks))


def _checked(im: Imatrix) -> Imatrix:
    for name, e in im.entries.items():
        if not np.isfinite(e).all():
            raise FidevalError(f"{im.path}: imatrix entry {name!r} has non-finite values",
                               hint="llama-quantize refuses it too; recompute it with llama-imatrix")
    return im


# Hugging Face model_type -> llama.cpp architecture name (gguf.MODEL_ARCH_NAMES), for the tensor-name map
GGUF_ARCH_OF = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen2_moe": "qwen2moe",
                "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2",
                "gpt_oss": "gpt-oss", "glm4_moe": "glm4moe"}


class ImatrixLookup:
    """``(hf_name, shape) -> float32 tensor`` of importance weights for one parameter the runner quantizes:
    the Hugging Face name is mapped to llama.cpp's with gguf-py's own table (``gguf.get_tensor_name_map``);
    fused experts ``mlp.experts.gate_up_proj`` take the ``ffn_gate_exps`` entry (gate and up read the same
    activations, so llama-imatrix records the same weights for both)."""

    def __init__(self, imatrix: Imatrix, model_type: str, n_layers: int):
        import gguf

        name = GGUF_ARCH_OF.get(str(model_type))
        arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == name), None)
        if arch is None:
            raise FidevalError(f"{imatrix.path}: no llama.cpp tensor names for model type {model_type!r}",
                               hint=f"an imatrix can be used for: {', '.join(sorted(GGUF_ARCH_OF))}")
        self.imatrix, self.names = imatrix, gguf.get_tensor_name_map(arch, n_layers)

    def gguf_name(self, hf_name: str) -> str:
        base = _PER_EXPERT.sub(r".mlp.experts.\1_proj", hf_name.removesuffix(".weight"))  # a release's per-expert name
        kind = base.rsplit(".", 1)[-1]
        if ".mlp.experts." in base and kind in ("gate_up_proj", "gate_proj", "up_proj"):
            g = self.names.get_name(base.rsplit(".", 1)[0] + ".down_proj")
            if g is not None:
                return g.replace("ffn_down_exps", "ffn_up_exps" if kind == "up_proj" else "ffn_gate_exps") + ".weight"
        g = self.names.get_name(base)
        if g is None:
            raise FidevalError(f"{self.imatrix.path}: no llama.cpp name for {hf_name} (to find its importance weights)",
                               hint="quantize this module class without the imatrix")
        return g + ".weight"

    def __call__(self, hf_name: str, shape: tuple[int, ...]):
        import torch

        return torch.from_numpy(self.imatrix.for_tensor(self.gguf_name(hf_name), shape).copy())

    def check(self, hf_name: str, shape: tuple[int, ...], n_experts: int) -> None:
        """What ``__call__`` will need at run time, from a checkpoint tensor's name and shape (a release's
        per-expert ``[out, in]`` tensor needs the whole stacked entry, ``n_experts`` x ``in``)."""
        if _PER_EXPERT.search(hf_name.removesuffix(".weight")):
            shape = (n_experts, *shape)
        self.imatrix.for_tensor(self.gguf_name(hf_name), shape)


_PER_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj$")
