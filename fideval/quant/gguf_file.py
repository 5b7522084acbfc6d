"""Read a real GGUF file (a llama.cpp build): its tensors decoded to float32, and its bits per weight per
module class, with the same module classes as :func:`fideval.quant.spec.module_class_of`.

Only gguf-py (``gguf.GGUFReader``, memory-mapped) is used, imported inside the functions so this module
stays importable on the GPU machine. Shapes are returned in numpy/torch order (GGUF lists dims innermost
first). Mapping GGUF names back to Hugging Face names is architecture-specific and left to the loader;
:func:`gguf_module_class_of` needs only llama.cpp's tensor-name vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fideval.errors import FidevalError

_NEVER = {"attn_norm", "ffn_norm", "ffn_gate_inp", "ffn_gate_inp_shexp", "exp_probs_b", "post_attention_norm",
          "post_ffw_norm", "layer_output_norm"}


def gguf_module_class_of(name: str) -> str | None:
    """Module class of a llama.cpp tensor name: ``output.weight`` -> lm_head; ``blk.N.attn_*`` -> attention
    (but ``attn_norm``, the input norm, -> None); ``*_exps`` -> routed_experts; ``*_shexp`` ->
    shared_experts; ``ffn_gate/up/down`` -> dense_mlp; routers, norms and embeddings -> None."""
    if name == "output.weight":
        return "lm_head"
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "blk":
        return None
    kind = parts[2]
    if kind in _NEVER:
        return None
    if kind.startswith("attn_"):
        return "attention"
    if kind.endswith("_exps"):
        return "routed_experts"
    if kind.endswith("_shexp"):
        return "shared_experts"
    if kind in ("ffn_gate", "ffn_up", "ffn_down"):
        return "dense_mlp"
    return None


_FIX = "the file is truncated or not GGUF; re-download it"
# Smallest possible encodings: a key/value pair (u64 key length, u32 type, one byte of value) and a
# tensor info (u64 name length, u32 n_dims, u32 type, u64 offset).
_MIN_KV, _MIN_TENSOR, _HEAD = 13, 24, 24


def check_gguf_header(path: str | Path) -> None:
    """Refuse a GGUF whose header cannot be true before gguf-py reads it: magic, version, and tensor/KV
    counts that could not fit in the file (a hostile count of 10^12 must cost nothing)."""
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as f:
            head = f.read(_HEAD)
    except FileNotFoundError:
        raise FidevalError(f"GGUF file {path} not found", hint="check the path") from None
    except OSError as e:
        raise FidevalError(f"cannot read {path} ({e.strerror})", hint="check the path and its permissions") from None
    if len(head) < _HEAD or head[:4] != b"GGUF":
        raise FidevalError(f"{path}: not a readable GGUF file (no 'GGUF' magic)", hint="give a .gguf file written by llama.cpp")
    order = "little" if int.from_bytes(head[4:8], "little") in (2, 3) else "big"
    version = int.from_bytes(head[4:8], order)
    if version not in (2, 3):
        raise FidevalError(f"{path}: GGUF version {int.from_bytes(head[4:8], 'little')} is not supported (2 or 3)",
                           hint="convert it with a current llama.cpp")
    n_tensors, n_kv = int.from_bytes(head[8:16], order), int.from_bytes(head[16:24], order)
    if _HEAD + n_kv * _MIN_KV + n_tensors * _MIN_TENSOR > size:
        raise FidevalError(f"{path}: header claims {n_tensors} tensors and {n_kv} metadata keys, more than "
                           f"{size} bytes can hold", hint=_FIX)
    _check_array_nesting(path, order, n_kv, size)


# bytes of each fixed-size GGUF metadata value type (gguf.GGUFValueType): u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _check_array_nesting(path: str | Path, order: str, n_kv: int, size: int) -> None:
    """Refuse metadata arrays of arrays nested deeper than MAX_DEPTH before gguf-py reads them: its reader recurses
    once per level and fails with ``RecursionError`` near 1,000 (12 bytes a level: a 12 kB file does it). The walk
    is iterative and reads only the metadata section; where the file stops making sense (an unknown value type, a
    length past its end) it stops, and gguf-py's own reading reports the file."""
    import mmap
    import struct

    from fideval.formats.nesting import MAX_DEPTH

    u32, u64 = struct.Struct("<I" if order == "little" else ">I"), struct.Struct("<Q" if order == "little" else ">Q")
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            off = _HEAD
            for _ in range(n_kv):
                if off + 8 > size:
                    return
                klen = u64.unpack_from(m, off)[0]
                key_at, off = off + 8, off + 8 + klen
                if off + 4 > size:
                    return
                frames = [[u32.unpack_from(m, off)[0], 1]]  # [value type, values left] per open array (and the value)
                off += 4
                while frames:
                    top = frames[-1]
                    kind, left = top
                    if left == 0:
                        frames.pop()
                    elif kind in _FIXED:
                        off += _FIXED[kind] * left
                        top[1] = 0
                    elif kind == _STRING:
                        if off + 8 > size:
                            return
                        off += 8 + u64.unpack_from(m, off)[0]
                        top[1] -= 1
                    elif kind == _ARRAY:
                        if off + 12 > size:
                            return
                        top[1] -= 1
                        frames.append([u32.unpack_from(m, off)[0], u64.unpack_from(m, off + 4)[0]])
                        off += 12
                        if len(frames) - 1 > MAX_DEPTH:
                            name = bytes(m[key_at:key_at + min(klen, 80)]).decode("utf-8", "replace")
                            raise FidevalError(f"{path}: metadata key {name!r} nests arrays deeper than {MAX_DEPTH} "
                                               "levels", hint="no llama.cpp file does; the file is damaged or not "
                                               "from llama.cpp: re-download it")
                    else:
                        return
                    if off > size:
                        return
    except (OSError, ValueError):  # an unreadable or empty file: gguf-py's own reading says so
        return


def _reader(path: str | Path):
    try:
        from gguf import GGUFReader
    except ImportError:  # pragma: no cover - gguf is a dependency on the workflow machine
        raise FidevalError("reading GGUF files needs the gguf package", hint="pip install gguf") from None
    check_gguf_header(path)
    try:
        return GGUFReader(str(path))
    except FileNotFoundError:
        raise FidevalError(f"GGUF file {path} not found", hint="check the path") from None
    except ValueError as e:
        if "GGMLQuantizationType" in str(e):  # a type id this gguf-py does not know
            raise FidevalError(f"{path}: a tensor has an unknown GGML type ({str(e)[:80]})",
                               hint="a newer llama.cpp type: update the gguf package (or requantize to a known type)") from None
        raise FidevalError(f"{path}: not a readable GGUF file (ValueError: {str(e)[:120]})", hint=_FIX) from None
    except Exception as e:  # gguf-py raises ValueError/AssertionError/struct.error on malformed files
        raise FidevalError(f"{path}: not a readable GGUF file ({type(e).__name__}: {str(e)[:120]})", hint=_FIX) from None


def gguf_architecture(path: str | Path) -> str | None:
    """``general.architecture`` of a GGUF file (e.g. "qwen3moe", "deepseek2"), or None."""
    f = _reader(path).fields.get("general.architecture")
    return bytes(f.parts[-1]).decode("utf-8") if f is not None else None


def gguf_tensor_info(path: str | Path) -> list[dict[str, Any]]:
    """[{name, type, shape (numpy order), elements, bits}] for every tensor, without decoding anything."""
    from gguf import GGML_QUANT_SIZES

    out = []
    for t in _reader(path).tensors:
        block, size = GGML_QUANT_SIZES[t.tensor_type]
        n = int(t.n_elements)
        out.append({"name": t.name, "type": t.tensor_type.name, "shape": tuple(int(d) for d in reversed(t.shape)),
                    "elements": n, "bits": n // block * size * 8})
    return out


def iter_gguf_tensors(path: str | Path, names: set[str] | None = None) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Yield (name, GGML type name, float32 tensor in numpy order) for each tensor (or those in ``names``),
    decoded with gguf-py on the CPU (every type it knows: K-quants, IQ, MXFP4...)."""
    from fideval.quant.gguf_formats import gguf_dequantize

    for t in _reader(path).tensors:
        if names is not None and t.name not in names:
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        yield t.name, t.tensor_type.name, gguf_dequantize(t.data, t.tensor_type, shape)


def gguf_bits(path: str | Path) -> dict[str, Any]:
    """Bits per weight of a real GGUF file per module class and overall, in the shape of
    :meth:`fideval.quant.spec.CompiledSpec.bits` (``format`` lists the GGML types found in the class)."""
    per: dict[str, Any] = {}
    tot_n = tot_b = 0
    for info in gguf_tensor_info(path):
        cls = gguf_module_class_of(info["name"]) or "other"
        row = per.setdefault(cls, {"format": set(), "recipe": None, "group": None, "tensors": 0, "params": 0, "bits": 0.0})
        row["format"].add(info["type"])
        row["tensors"] += 1
        row["params"] += info["elements"]
        row["bits"] += info["bits"]
        tot_n += info["elements"]
        tot_b += info["bits"]
    for row in per.values():
        row["format"] = "+".join(sorted(row["format"]))
        row["bpw"] = row["bits"] / row["params"] if row["params"] else 0.0
    return {"per_class": per, "total": {"params": tot_n, "bits": float(tot_b), "bpw": tot_b / tot_n if tot_n else 0.0}}
