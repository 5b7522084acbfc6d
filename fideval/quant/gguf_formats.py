"""GGUF (llama.cpp) block formats: our own vectorised torch encoders and decoders, byte-identical to
gguf-py's ``gguf.quants.quantize`` (which mirrors ``ggml-quants.c``), plus import-only decoding of every
type gguf-py can dequantize (K-quants, IQ types) through gguf-py on the CPU.

Why our own encoder: gguf-py is numpy on the CPU; emulating a GGUF candidate on a 600B-parameter model
needs the GPU. Why byte-identical: a GGUF build is defined by ggml's reference quantizer, including its
quirks, which we reproduce deliberately rather than "fix":

* scales are computed in float32 then stored as float16 (``d``, ``m``), but the codes are computed from
  the float32 ``1/d`` -- not from the stored float16;
* Q8_0 rounds half away from zero (C ``roundf``); Q4_x/Q5_x use ``trunc(x + 0.5)`` offsets;
* Q4_0/Q5_0 take the *signed* value of the first largest magnitude and map it to -8 / -16;
* MXFP4 takes its exponent as ``floor(log2f(amax)) - 2`` -- a float32 log2 that rounds the largest floats
  below 2**k up to k, so ggml's MXFP4 can differ from the OCP ``floor`` recipe for amax a few ulps below a
  power of two -- and picks each element by the first minimum of ``|k*d - x|`` over the 16 codes, so ties
  go to the smaller magnitude (not to even). Exponents below 0 (amax < 2**-125) clamp to code 0, where
  gguf-py's uint8 cast would wrap.

All types have 32-element blocks along the last dimension, which must divide by 32.
"""

from __future__ import annotations

import torch

from fideval.errors import FidevalError
from fideval.quant.base import Encoded, Format

QK = 32
# (block bytes, has min, bits per element)
_LAYOUT = {"q8_0": (34, False, 8), "q4_0": (18, False, 4), "q4_1": (20, True, 4),
           "q5_0": (22, False, 5), "q5_1": (24, True, 5), "mxfp4": (17, False, 4)}
MXFP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # E2M1 values doubled


def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float16).reshape(-1, 1).view(torch.uint8)


def _inv(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _roundf(n: torch.Tensor) -> torch.Tensor:
    """C roundf (half away from zero), exactly: floor(a) + floor(2 * frac(a)), with the sign put back."""
    a = n.abs()
    f = torch.floor(a)
    return torch.sign(n) * (f + torch.floor(2 * (a - f)))


def _c_code(v: torch.Tensor, top: int) -> torch.Tensor:
    """ggml's ``MIN(top, (int8_t)(v))`` for ``v`` in [0, top + 1) or not finite. A block whose scale ``d``
    is a float32 subnormal has ``1/d = inf``, so its values become +-inf or NaN (0 * inf); the C cast of
    those (x86 ``cvttss2si``: 0x80000000, low byte 0) gives code 0 for every element. Clamping inf to
    ``top`` instead was the 4-blocks-in-8,494 difference from gguf-py and llama.cpp on subnormal rows."""
    return torch.where(torch.isfinite(v), torch.trunc(v).clamp(0, top), torch.zeros_like(v)).to(torch.uint8)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Element j in the low nibble and element j + 16 in the high nibble of byte j."""
    q = q.to(torch.uint8)
    return (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)


def _pack_high_bits(q: torch.Tensor) -> torch.Tensor:
    """Bit 4 of each of the 32 codes as a little-endian uint32 (4 bytes)."""
    bits = ((q.to(torch.int32) >> 4) & 1).reshape(-1, 4, 8)
    w = 1 << torch.arange(8, device=q.device, dtype=torch.int32)
    return (bits * w).sum(-1).to(torch.uint8)


def _encode_blocks(b: torch.Tensor, kind: str) -> torch.Tensor:
    """float32 blocks ``[n, 32]`` -> raw GGUF bytes ``[n, type_size]``."""
    if kind == "q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        qs = _roundf(b * _inv(d)).to(torch.int8).view(torch.uint8)
        return torch.cat([_f16_bytes(d), qs], -1)
    if kind in ("q4_0", "q5_0"):
        lim = 8 if kind == "q4_0" else 16
        imax = b.abs().argmax(-1, keepdim=True)
        mx = torch.gather(b, -1, imax)
        d = mx / -lim
        q = _c_code(b * _inv(d) + (lim + 0.5), 2 * lim - 1)
        parts = [_f16_bytes(d)] + ([_pack_high_bits(q)] if kind == "q5_0" else []) + [_pack_nibbles(q)]
        return torch.cat(parts, -1)
    if kind in ("q4_1", "q5_1"):
        top = 15 if kind == "q4_1" else 31
        mx, mn = b.amax(-1, keepdim=True), b.amin(-1, keepdim=True)
        d = (mx - mn) / top
        q = _c_code((b - mn) * _inv(d) + 0.5, top)
        parts = [_f16_bytes(d), _f16_bytes(mn)] + ([_pack_high_bits(q)] if kind == "q5_1" else []) + [_pack_nibbles(q)]
        return torch.cat(parts, -1)
    if kind == "mxfp4":
        amax = b.abs().amax(-1, keepdim=True)
        # log2f: float32-rounded log2 (computed in float64, then rounded once), as ggml does.
        lg = torch.log2(amax.double().clamp(min=1e-45)).float()
        e = torch.where(amax > 0, torch.floor(lg) - 2 + 127, torch.zeros_like(lg)).clamp(0, 255).to(torch.uint8)
        d = _e8m0_half(e)
        return torch.cat([e, _pack_nibbles(_mxfp4_best_index(b, d))], -1)
    raise ValueError(kind)  # pragma: no cover


def _mxfp4_best_index(b: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """ggml's ``best_index_mxfp4``: the first index minimising ``|k*d - x|`` over the 16 doubled E2M1
    values, without materialising 16 errors per element.

    Signs: for x >= 0 (and -0) no negative code beats its positive mirror or index 0; for x < 0 the errors
    of the negative codes equal those of the positive codes for |x| exactly (negation is exact), and index 0
    precedes index 8 (-0) on their tie. So j = the best of the 8 magnitudes for |x|, code j or 8 + j.
    Magnitudes: errors grow away from |x|, and neighbours' errors differ from the next ones' by at least d
    (far more than float32 rounding), so only the two grid points around |x| can win; their float32
    errors are computed exactly as ggml does and a tie goes to the lower index (the first minimum)."""
    kpos = torch.tensor(MXFP4_KVALUES[:8], dtype=torch.float32, device=b.device)
    a = b.abs()
    t = a / d  # exact: d is a power of two and t < 32
    lo = torch.zeros(t.shape, dtype=torch.int64, device=t.device)  # index of the largest magnitude <= |x|
    for k in MXFP4_KVALUES[1:8]:
        lo += t >= k
    hi = (lo + 1).clamp(max=7)
    err_lo = (kpos[lo] * d - a).abs()
    err_hi = (kpos[hi] * d - a).abs()
    j = torch.where(err_hi < err_lo, hi, lo)
    return torch.where((b < 0) & (j > 0), j + 8, j).to(torch.uint8)


def _e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """ggml_e8m0_to_fp32_half: 2**(e - 128) from the bits (e < 2 lands in the subnormals)."""
    e32 = e.to(torch.int32)
    bits = torch.where(e32 < 2, 0x00200000 << e32, (e32 - 1) << 23)
    return bits.view(torch.float32)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).float()


def _unpack_nibbles(qs: torch.Tensor) -> torch.Tensor:
    return torch.cat([qs & 0x0F, qs >> 4], -1)


def _unpack_high_bits(qh: torch.Tensor) -> torch.Tensor:
    sh = torch.arange(8, device=qh.device, dtype=torch.int32)
    return ((qh.to(torch.int32).unsqueeze(-1) >> sh) & 1).reshape(-1, 32)


def _decode_blocks(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """raw GGUF bytes ``[n, type_size]`` -> float32 ``[n, 32]`` (the arithmetic of gguf-py's dequantize)."""
    if kind == "q8_0":
        return _f16(raw[:, :2]) * raw[:, 2:].contiguous().view(torch.int8).float()
    if kind == "q4_0":
        return _f16(raw[:, :2]) * (_unpack_nibbles(raw[:, 2:]).float() - 8)
    if kind == "q4_1":
        return _f16(raw[:, :2]) * _unpack_nibbles(raw[:, 4:]).float() + _f16(raw[:, 2:4])
    if kind == "q5_0":
        q = _unpack_nibbles(raw[:, 6:]).to(torch.int32) | (_unpack_high_bits(raw[:, 2:6]) << 4)
        return _f16(raw[:, :2]) * (q.float() - 16)
    if kind == "q5_1":
        q = _unpack_nibbles(raw[:, 8:]).to(torch.int32) | (_unpack_high_bits(raw[:, 4:8]) << 4)
        return _f16(raw[:, :2]) * q.float() + _f16(raw[:, 2:4])
    if kind == "mxfp4":
        k = torch.tensor(MXFP4_KVALUES, dtype=torch.float32, device=raw.device)
        return _e8m0_half(raw[:, :1]) * k[_unpack_nibbles(raw[:, 1:]).long()]
    raise ValueError(kind)  # pragma: no cover


class GGUFFormat(Format):
    recipes = ("ggml",)
    default_recipe = "ggml"
    groups = (QK,)
    default_group = QK

    def __init__(self, kind: str):
        self.kind = kind
        self.name = f"gguf_{kind}"
        self.type_size, _, self.element_bits = _LAYOUT[kind]
        self.description = f"GGUF {kind.upper()}: {self.type_size} bytes per 32 weights"

    def scale_bits(self, recipe=None) -> float:
        return self.type_size * 8 - QK * self.element_bits

    def _encode(self, x2, recipe, group, shape, dtype) -> Encoded:
        raw = _encode_blocks(x2.reshape(-1, QK), self.kind)
        return Encoded(self.name, recipe, group, shape, dtype, raw.reshape(*shape[:-1], -1))

    def decode(self, enc: Encoded) -> torch.Tensor:
        vals = _decode_blocks(enc.codes.reshape(-1, self.type_size), self.kind)
        return vals.reshape(enc.shape).to(enc.dtype)


def gguf_encode(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Raw GGUF bytes ``[..., n/32 * type_size]`` of ``x`` (float) -- what ``gguf.quants.quantize`` returns."""
    return get_gguf(kind).encode(x).codes


def get_gguf(kind: str) -> GGUFFormat:
    fmt = GGUF_FORMATS.get(kind.lower().removeprefix("gguf_"))
    if fmt is None:
        raise FidevalError(f"GGUF type {kind!r} has no torch encoder", hint=f"use one of {', '.join(GGUF_FORMATS)}")
    return fmt


def gguf_dequantize(raw, qtype, shape=None) -> torch.Tensor:
    """Decode raw GGUF tensor bytes of any type gguf-py knows (K-quants, IQ, ...) on the CPU, for
    importing real GGUF candidates. ``qtype``: a ``GGMLQuantizationType`` or its name ("Q4_K").
    ``raw``: uint8 array/tensor ``[..., bytes_per_row]``. Returns float32 (reshaped to ``shape`` if given)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    if isinstance(qtype, str):
        try:
            qtype = GGMLQuantizationType[qtype.upper()]
        except KeyError:
            raise FidevalError(f"unknown GGUF type {qtype!r}", hint="use a GGMLQuantizationType name such as Q4_K") from None
    arr = raw.cpu().numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    try:
        out = quants.dequantize(arr.view(np.uint8), qtype)
    except (NotImplementedError, ValueError) as e:
        raise FidevalError(f"cannot decode GGUF type {qtype.name}: {e}") from None
    out = np.ascontiguousarray(out, dtype=np.float32)
    if not out.flags.writeable:  # F32 tensors come back as a view of the read-only memory map
        out = out.copy()
    t = torch.from_numpy(out)
    return t.reshape(shape) if shape is not None else t


GGUF_FORMATS = {k: GGUFFormat(k) for k in _LAYOUT}
DEFINES = tuple(GGUF_FORMATS.values())  # fideval.quant.base.FORMATS names this module for them
