"""A hidden store's lm head: ``head.safetensors`` (format ``fideval.head`` v1) and the ``head`` block that names it.

A hidden store keeps the final norm's output, not logits; every reader replays the FP32 logits by applying the head
(fideval.store.replay). So the head is part of the reference: the store keeps it exactly as the run used it (after any
weight transform, dequantized: a GGUF Q6_K head as float32, a released bfloat16 head as bfloat16), in one tensor
``weight [V, H]``, and the manifest's meta ``head`` block names it by two digests:

* ``weight_sha256``: SHA-256 of the tensor's content (its little-endian bytes in ``dtype``, row-major). This is the
  head's identity: the same weights give the same digest whatever file or checkpoint they come from, so a head loaded
  from the model folder instead (a store published without its head file) is checked against it;
* ``sha256``: SHA-256 of the file, as for every other file of the store (``fideval verify``).

The block also says how the head is applied: ``lm_head`` (``float32``: float32 GEMM; ``bf16``: bfloat16 operands,
float32 sums, fideval.model.execution.head), ``finish`` (the family's last step on the logits: ``{"op": "softcap",
"value": c}`` for Gemma's ``tanh(z / c) * c``, ``{"op": "divide", "value": s}`` for Granite's ``z / s``, or null),
``source`` (the checkpoint tensor it came from) and ``tied`` (that tensor is the input embedding), and the hidden
states' dtype and size.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.fsio import atomic_open, sha256_file

FILE = "head.safetensors"
FORMAT, VERSION = "fideval.head", "1"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
FINISH_OPS = ("softcap", "divide")
MODES = ("float32", "bf16")
INFO_KEYS = ("lm_head", "finish", "source", "tied", "hidden_dtype", "hidden_size")


def content_sha256(weight: torch.Tensor) -> str:
    """SHA-256 of a tensor's values: its little-endian bytes in its own dtype, row-major (bfloat16 as its 16 bits)."""
    t = weight.detach().to("cpu").contiguous()
    arr = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
    h = hashlib.sha256()
    flat = arr.reshape(-1).view(np.uint8)
    for a in range(0, flat.size, 1 << 26):
        h.update(memoryview(flat[a:a + (1 << 26)]))
    return h.hexdigest()


def stored_form(weight: torch.Tensor) -> torch.Tensor:
    """The head as the store keeps it: bfloat16 when every value is a bfloat16 value (a released head, losslessly),
    else float32 (a dequantized or transformed head)."""
    w = weight.detach().to("cpu")
    if w.dtype == torch.bfloat16:
        return w.contiguous()
    w = w.to(torch.float32)
    b = w.to(torch.bfloat16)
    return b.contiguous() if torch.equal(b.to(torch.float32), w) else w.contiguous()


def check_info(info: dict[str, Any], where: str) -> dict[str, Any]:
    """The head block's application keys checked (one line naming the first problem)."""
    def bad(what: str) -> FidevalError:
        return FidevalError(f"{where}: head block {what}", hint="rebuild or re-download the store")

    missing = [k for k in INFO_KEYS if k not in info]
    if missing:
        raise bad(f"lacks {', '.join(missing)}")
    if info["lm_head"] not in MODES:
        raise bad(f"lm_head {info['lm_head']!r} is not one of {', '.join(MODES)}")
    fin = info["finish"]
    if fin is not None and (not isinstance(fin, dict) or fin.get("op") not in FINISH_OPS
                            or not isinstance(fin.get("value"), (int, float)) or not fin["value"]):
        raise bad(f"finish {fin!r} is not null or {{op: softcap|divide, value: a non-zero number}}")
    if info["hidden_dtype"] not in ("bfloat16", "float16", "float32"):
        raise bad(f"hidden_dtype {info['hidden_dtype']!r} is not bfloat16, float16 or float32")
    if type(info["hidden_size"]) is not int or info["hidden_size"] < 1:
        raise bad(f"hidden_size {info['hidden_size']!r} is not a positive integer")
    return info


def write(root: Path, weight: torch.Tensor, info: dict[str, Any], digest: str | None = None) -> dict[str, Any]:
    """Write ``root/head.safetensors`` atomically (unless a file of the same content is already there: a resumed
    store) and return its ``head`` block. ``digest``: the content digest of ``weight`` in its stored form, when the caller
    has already hashed it (1.85 GB at DeepSeek sizes: not twice)."""
    w = stored_form(weight)
    if w.ndim != 2 or w.shape[1] != info.get("hidden_size"):
        raise FidevalError(f"lm head shape {list(w.shape)} is not [V, {info.get('hidden_size')}]", hint="this is a bug in the runner")
    block = {"format": FORMAT, "version": VERSION, "file": FILE, "weight_sha256": digest or content_sha256(w),
             "dtype": str(w.dtype).removeprefix("torch."), "shape": list(w.shape), **check_info(dict(info), str(root))}
    path = Path(root) / FILE
    same = False
    if path.is_file():
        try:
            same = content_sha256(_read_tensor(path)) == block["weight_sha256"]
        except FidevalError:
            same = False
    if not same and not _link_sibling(path, block["weight_sha256"]):
        _write_file(path, w)
    block["sha256"], block["bytes"] = sha256_file(path), path.stat().st_size
    return block


def _link_sibling(path: Path, digest: str) -> bool:
    """Where another store of the same run (a sibling folder: the workflow's ``teacher/<length>/<domain>/``) already
    holds this head, hard-link its file instead of writing a copy: the run's stores share one head's bytes on disk
    (16 stores of DeepSeek-V3 would otherwise hold 16 x 1.85 GB) and each store stays whole on its own (deleting one
    link leaves the others). Only a file whose content digest is this head's is linked; False: none (or no hard links
    on this filesystem), write the file."""
    import os

    root = path.parent
    seen = set()
    for cand in [*root.parent.glob(f"*/{FILE}"), *root.parent.parent.glob(f"*/*/{FILE}")]:
        if cand.parent == root or cand in seen or not cand.is_file():
            continue
        seen.add(cand)
        try:
            if content_sha256(_read_tensor(cand)) != digest:
                continue
            tmp = path.parent / f".{path.name}.{os.getpid()}.link.tmp"
            tmp.unlink(missing_ok=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.link(cand, tmp)
            os.replace(tmp, path)
            return True
        except (OSError, FidevalError):
            continue
    return False


def _write_file(path: Path, w: torch.Tensor) -> None:
    """An ordinary safetensors file with one tensor ``weight``, its header written with sorted keys: the same head
    gives the same bytes in every run (the safetensors library orders metadata as its hash map does)."""
    arr = (w.view(torch.int16) if w.dtype == torch.bfloat16 else w).numpy()
    data = memoryview(np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False)).reshape(-1).view(np.uint8))
    from fideval.formats.safetensors import sorted_header

    head = sorted_header({"weight": ("BF16" if w.dtype == torch.bfloat16 else "F32", list(w.shape), len(data))},
                         {"format": FORMAT, "version": VERSION})
    with atomic_open(path, "wb") as f:
        f.write(head)
        for a in range(0, len(data), 1 << 24):
            f.write(data[a:a + (1 << 24)])


def _read_tensor(path: Path) -> torch.Tensor:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise FidevalError(f"{path}: not a readable head file ({str(e)[:80]})", hint="re-download the store or give the model") from None
    if set(tensors) != {"weight"}:
        raise FidevalError(f"{path}: holds {sorted(tensors)}, not exactly 'weight'", hint="re-download the store")
    return tensors["weight"]


def check_weight(weight: torch.Tensor, block: dict[str, Any], origin: str) -> torch.Tensor:
    """``weight`` (from the store's file or a model folder) as the block names it, or one line naming both digests."""
    want = DTYPES.get(block.get("dtype", ""))
    if want is None:
        raise FidevalError(f"{origin}: head dtype {block.get('dtype')!r} is not bfloat16 or float32", hint="re-download the store")
    w = weight
    if w.dtype != want:
        cast = w.to(want)
        if not torch.equal(cast.to(w.dtype), w):  # a float32 head is not the store's bfloat16 one (or the reverse)
            raise FidevalError(f"{origin}: lm head is {str(w.dtype).removeprefix('torch.')} with values that are not the "
                               f"store's {block['dtype']} head", hint="give the model the store was computed with")
        w = cast
    if list(w.shape) != list(block.get("shape", [])):
        raise FidevalError(f"{origin}: lm head shape {list(w.shape)} differs from the store's {block.get('shape')}",
                           hint="give the model the store was computed with (hidden size and vocabulary must match)")
    got = content_sha256(w)
    if got != block.get("weight_sha256"):
        raise FidevalError(f"{origin}: lm head {got[:16]}… is not the store's head {str(block.get('weight_sha256'))[:16]}…",
                           hint="give the model (revision and quantization) the store was computed with")
    return w.contiguous()


def load(root: Path, block: dict[str, Any], model_head: torch.Tensor | None = None, origin: str | None = None) -> torch.Tensor:
    """The head weight a hidden store names: from its ``head.safetensors`` when present, else ``model_head`` (read
    from the model folder by the caller, ``origin`` naming it); checked against the block's content digest."""
    path = Path(root) / str(block.get("file", FILE))
    if path.is_file():
        return check_weight(_read_tensor(path), block, str(path))
    if model_head is None:
        raise FidevalError(f"{root}: the hidden store's head file {block.get('file', FILE)} is missing and no model was given "
                           "to take the head from", hint="pass --head-from MODEL (the model the store was computed with), "
                           "or re-download the store with its head file")
    return check_weight(model_head, block, origin or "the given model")
