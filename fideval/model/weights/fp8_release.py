"""FP8 releases read as released: the teacher's weights straight from an FP8 checkpoint, dequantized on the
runner's device as each layer is materialised.

The models people evaluate ship in FP8 (DeepSeek-V3/V3.1/R1, Kimi-K2, Qwen3-FP8): ``X.weight`` stored as
F8_E4M3 and ``X.weight_scale_inv`` float32 ``[ceil(out/b0), ceil(in/b1)]`` (edge blocks may be partial:
DeepSeek's ``kv_a_proj_with_mqa`` has 576 rows), ``config.json`` ``quantization_config: {"quant_method": "fp8",
"fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}`` (V3.1 adds ``"scale_fmt":
"ue8m0"``: the float32 scales are powers of two). Norms, routers, embeddings and the lm head stay bf16.

Why not convert to bf16 first (DeepSeek's ``fp8_cast_bf16.py``): the release is half the bytes, which is
what disk and PCIe carry at DeepSeek scale, and a converted copy is one more artefact to trust. So the fp8
bytes and their scales travel to the device as they are (:class:`Packed`), and
:func:`fideval.quant.fp8.dequant_blocks` computes DeepSeek's ``weight_dequant`` there: ``fp8.to(float32) *
scale`` per block, one rounding to the compute dtype (float32 runs keep the float32 product).

Before any compute (:func:`check`): every fp8 tensor has its ``_scale_inv`` and every scale its fp8 weight, a
scale's shape is exactly ``[ceil(out/b0), ceil(in/b1)]`` for the config's ``weight_block_size``, and every
scale is finite and > 0 (and an exact power of two under ``scale_fmt: ue8m0``). Scales are small (~164 MB for
all of DeepSeek-V3), so all of them are read up front. :func:`detect` refuses what it cannot read: a
``quant_method`` other than ``fp8``, another ``fmt``, a static activation scheme, a malformed block size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from fideval.errors import FidevalError
from fideval.formats import nesting
from fideval.quant.fp8 import dequant_blocks

SUFFIX = "_scale_inv"
FP8 = torch.float8_e4m3fn
_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_HINT_CFG = "fix quantization_config, or convert the checkpoint to bf16 safetensors"


@dataclass(frozen=True)
class Release:
    """How an FP8 release stores its weights (from ``quantization_config``)."""

    block: tuple[int, int]
    ue8m0: bool = False

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        b0, b1 = self.block
        return (*shape[:-2], math.ceil(shape[-2] / b0), math.ceil(shape[-1] / b1))

    def describe(self, dtype: torch.dtype, device: torch.device | str) -> str:
        b0, b1 = self.block
        scales = f"{b0}x{b1} block scales" + (" (UE8M0)" if self.ue8m0 else "")
        return f"as released: FP8 E4M3, {scales}, dequantized to {_name(dtype)} on {torch.device(device).type}"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def detect(cfg: dict, where: Path) -> Release | None:
    """The release format ``config.json`` declares (None: an unquantized checkpoint); a one-line error naming
    ``where`` and the key for anything this reader would otherwise misread."""
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise FidevalError(f"{where}: quantization_config is not a JSON object", hint="fix config.json")
    method = qc.get("quant_method")
    if method != "fp8":
        raise FidevalError(f"{where}: quantization_config.quant_method {method!r} cannot be read as released weights "
                           "(only 'fp8' block-scaled releases can)",
                           hint="a teacher or reference must be unquantized or an FP8 release; score other builds as a "
                                "candidate's checkpoint: against the unquantized reference")
    checks = (("fmt", "e4m3", ("e4m3",)), ("activation_scheme", "dynamic", ("dynamic",)),
              ("scale_fmt", None, (None, "float", "ue8m0")))
    for key, default, allowed in checks:
        value = qc.get(key, default)
        if value not in allowed:
            raise FidevalError(f"{where}: quantization_config.{key} {value!r} is not supported",
                               hint=f"supported: {', '.join(repr(a) for a in allowed if a is not None)}")
    bs = qc.get("weight_block_size")
    if not (isinstance(bs, list) and len(bs) == 2 and all(type(b) is int and b > 0 for b in bs)):
        raise FidevalError(f"{where}: quantization_config.weight_block_size {bs!r} is not two positive integers",
                           hint="FP8 releases give [128, 128]; per-tensor FP8 scales are not read as released weights")
    return Release((bs[0], bs[1]), qc.get("scale_fmt") == "ue8m0")


def check(ckpt, release: Release) -> int:
    """Check every fp8 tensor and scale of ``ckpt`` (a :class:`~fideval.model.weights.checkpoint.Checkpoint`) before any
    compute, from the headers and then the scales' values; returns how many scales were read."""
    tensors = ckpt.tensors
    scales: list[str] = []
    for name, info in sorted(tensors.items()):
        where = f"{info.file}: tensor {name!r}"
        if name.endswith(SUFFIX):
            base = tensors.get(name[:-len(SUFFIX)])
            if base is None or base.dtype != FP8:
                what = "which is missing" if base is None else f"which is stored as {_name(base.dtype)}"
                raise FidevalError(f"{where} scales {name[:-len(SUFFIX)]!r}, {what}", hint="the checkpoint is corrupt; re-download it")
            if info.dtype != torch.float32:
                raise FidevalError(f"{where} is stored as {_name(info.dtype)}, FP8 releases store float32 scales",
                                   hint="re-download the checkpoint")
            want = release.scale_shape(base.shape)
            if tuple(info.shape) != want:
                raise FidevalError(f"{where} has shape {list(info.shape)}; weight_block_size {list(release.block)} on its "
                                   f"{list(base.shape)} weight implies {list(want)}",
                                   hint="the scales do not tile the weight in blocks of weight_block_size: fix config.json or re-download")
            scales.append(name)
        elif info.dtype in _FLOAT8:
            if info.dtype != FP8:
                raise FidevalError(f"{where} is stored as {_name(info.dtype)}, quantization_config.fmt says e4m3",
                                   hint=_HINT_CFG)
            if len(info.shape) not in (2, 3):
                raise FidevalError(f"{where} is an FP8 tensor of shape {list(info.shape)}, block scales need a matrix",
                                   hint="re-download the checkpoint")
            if name + SUFFIX not in tensors:
                raise FidevalError(f"{where} is stored as FP8 but has no {name + SUFFIX!r}",
                                   hint="the checkpoint is incomplete; re-download it")
    _check_values(ckpt, release, scales)
    return len(scales)


def _check_values(ckpt, release: Release, names: list[str]) -> None:
    """Every scale read and checked, one file per task on the reader pool; a failure names the first bad tensor."""
    from fideval.model.weights.reading import reader_pool

    by_file: dict[Path, list[tuple[str, object]]] = {}
    for n in names:
        info = ckpt.info(n)
        by_file.setdefault(info.file, []).append((n, info))
    for bad in reader_pool().map(lambda item: _scan(*item, release), by_file.items()):
        if bad is not None:
            name, x = bad
            rule = "finite and > 0" if not math.isfinite(x) or x <= 0 else "powers of two under scale_fmt ue8m0"
            raise FidevalError(f"{ckpt.info(name).file}: tensor {name!r} holds a scale {x!r} (scales must be {rule})",
                               hint="the checkpoint is corrupt; re-download it")


def _scan(file: Path, entries: list, release: Release) -> tuple[str, float] | None:
    """One file's scales into one float32 buffer, in file order; tensors stored back to back (safetensors writes
    tensors grouped by dtype, so a release's float32 scales usually are) are read with one ``pread``."""
    import os

    entries = sorted(entries, key=lambda e: e[1].start)
    buf = torch.empty(sum(e[1].nbytes for e in entries) // 4, dtype=torch.float32)
    view = memoryview(buf.numpy()).cast("B")
    runs: list[list[int]] = []  # [file offset, buffer offset, bytes]
    off = 0
    for _, info in entries:
        if runs and runs[-1][0] + runs[-1][2] == info.start:
            runs[-1][2] += info.nbytes
        else:
            runs.append([info.start, off, info.nbytes])
        off += info.nbytes
    fd = os.open(file, os.O_RDONLY)
    try:
        for start, at, n in runs:
            got = 0
            while got < n:
                k = os.preadv(fd, [view[at + got:at + n]], start + got)
                if k <= 0:
                    raise FidevalError(f"{file}: unexpected end of file reading scales", hint="re-download the checkpoint")
                got += k
    finally:
        os.close(fd)
    bad = ~torch.isfinite(buf) | (buf <= 0)
    if release.ue8m0:
        bad |= torch.frexp(buf).mantissa.abs() != 0.5
    if not bool(bad.any()):
        return None
    first = int(bad.nonzero()[0, 0])
    off = 0
    for name, info in entries:
        off += info.nbytes // 4
        if first < off:
            return name, float(buf[first])
    return None


@dataclass
class Packed:
    """An fp8 weight and its block scales on their way to the device, dequantized there.

    ``parts`` are the row counts of the tensors stacked along dim -2, each with its own scale rows (a fused
    experts ``gate_up_proj`` stacks gate and up: I rows each, which need not be a multiple of the block);
    ``skip`` leading rows were read only to complete the first block of a row range."""

    data: torch.Tensor
    scale: torch.Tensor
    parts: tuple[int, ...]
    skip: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.data.shape[:-2], self.data.shape[-2] - self.skip, self.data.shape[-1])

    def to(self, device, non_blocking: bool = False) -> Packed:
        return Packed(self.data.to(device, non_blocking=non_blocking), self.scale.to(device, non_blocking=non_blocking),
                      self.parts, self.skip)

    def dequantize(self, release: Release, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(self.data.shape, dtype=dtype, device=self.data.device)
        r = s = 0
        for n in self.parts:
            k = math.ceil(n / release.block[0])
            dequant_blocks(self.data[..., r:r + n, :], self.scale[..., s:s + k, :], release.block, dtype, out=out[..., r:r + n, :])
            r, s = r + n, s + k
        return out[..., self.skip:, :] if self.skip else out


def read_packed(ckpt, key: str, release: Release, rows: tuple[int, int] | None = None, pin: bool = False) -> Packed:
    """``key`` and its scales as stored (rows ``[lo, hi)`` of dim 0: experts of a 3-D tensor, else matrix rows,
    widened to whole blocks)."""
    info = ckpt.info(key)
    skey = key + SUFFIX
    if rows is None or len(info.shape) == 3:
        return Packed(ckpt.read(key, rows=rows, pin=pin), ckpt.read(skey, rows=rows, pin=pin), (info.shape[-2],))
    b0 = release.block[0]
    lo, hi = rows
    a = lo // b0 * b0
    return Packed(ckpt.read(key, rows=(a, hi), pin=pin), ckpt.read(skey, rows=(lo // b0, math.ceil(hi / b0)), pin=pin),
                  (hi - a,), skip=lo - a)


def describe(ckpt, release: Release | None, dtype: torch.dtype, device) -> str:
    """What the runner computes with, for provenance: an FP8 release's format and where it was dequantized, a
    plain checkpoint's stored float dtype(s) (by bytes, largest first), or the real build's decoder."""
    if release is not None:
        return release.describe(dtype, device)
    tensors = getattr(ckpt, "tensors", None)
    if tensors is None:
        return f"decoded on read by {type(ckpt).__name__} ({Path(ckpt.dir).name})"
    by: dict[str, int] = {}
    for info in tensors.values():
        if info.dtype.is_floating_point:
            by[_name(info.dtype)] = by.get(_name(info.dtype), 0) + info.nbytes
    return "as released: " + " + ".join(sorted(by, key=lambda d: -by[d]))


def reference_config(reference_dir: Path) -> dict:
    """The reference model's config.json (a real build's config is its reference's), read and checked: an FP8
    release is a reference; another quantization is refused."""
    p = Path(reference_dir) / "config.json"
    try:
        cfg = nesting.loads(p.read_text())
    except FileNotFoundError:
        raise FidevalError(f"{p} not found", hint="model.path must be the reference checkpoint folder") from None
    except (OSError, ValueError) as e:
        raise FidevalError(f"{p} is not valid JSON ({type(e).__name__})", hint="fix or re-download config.json") from None
    if not isinstance(cfg, dict):
        raise FidevalError(f"{p} is not a JSON object", hint="fix or re-download config.json")
    detect(cfg, p)  # an FP8 release is a reference (its config is the model's); another quantization is refused
    return cfg
