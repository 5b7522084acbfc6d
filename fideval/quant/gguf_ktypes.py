"""The GGUF K-quant and i-quant formats (``gguf_q2_k`` ... ``gguf_q6_k``, ``gguf_iq4_nl``, ``gguf_iq4_xs``):
encoders byte-identical to llama.cpp (:mod:`fideval.quant.gguf_kquants`, :mod:`fideval.quant.gguf_iquants`),
decoders with ggml's dequantize arithmetic (bit-identical to gguf-py's ``quants.dequantize``), both in torch
so a candidate is emulated on the GPU.

The importance matrix: ``llama-quantize --imatrix`` passes one weight per input column of each tensor
(``quant_weights``), which changes the search of every type here. :func:`gguf_k_encode` and
:func:`gguf_k_quant_dequant` take it as ``imatrix`` (a float tensor as long as the last dimension); the quant
spec's formats quantize without one, as ``llama-quantize`` does when no ``--imatrix`` is given.
"""

from __future__ import annotations

import torch

from fideval.errors import FidevalError
from fideval.quant.base import Encoded, Format
from fideval.quant.gguf_iquants import KVALUES_IQ4NL, encode_iq4_nl, encode_iq4_xs
from fideval.quant.gguf_kquants import encode_q2_k, encode_q3_k, encode_q4_k, encode_q5_k, encode_q6_k

# kind -> (encoder, block elements, block bytes)
K_TYPES = {
    "q2_k": (encode_q2_k, 256, 84), "q3_k": (encode_q3_k, 256, 110), "q4_k": (encode_q4_k, 256, 144),
    "q5_k": (encode_q5_k, 256, 176), "q6_k": (encode_q6_k, 256, 210),
    "iq4_nl": (encode_iq4_nl, 32, 18), "iq4_xs": (encode_iq4_xs, 256, 136),
}


def _f16(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).float()


def _k4_scales(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = q.to(torch.int32)
    sc = torch.cat([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], -1)
    m = torch.cat([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], -1)
    return sc.float(), m.float()


def _unpack_2bit(qs: torch.Tensor) -> torch.Tensor:
    """[B, 64] -> [B, 256] codes 0..3 (inverse of the K-quants' 2-bit packing)."""
    q = qs.to(torch.int32).reshape(-1, 2, 1, 32) >> (2 * torch.arange(4, device=qs.device)).reshape(1, 1, 4, 1)
    return (q & 3).reshape(-1, 256)


def _nibbles_k(qs: torch.Tensor) -> torch.Tensor:
    """[B, 128] -> [B, 256]: each 32 bytes hold 64 elements, low nibbles first."""
    q = qs.to(torch.int32).reshape(-1, 4, 1, 32)
    return torch.cat([q & 0xF, q >> 4], 2).reshape(-1, 256)


def _nibbles_16(qs: torch.Tensor) -> torch.Tensor:
    """[B, 16k] -> [B, 32k]: each 16 bytes hold 32 elements, low nibbles first."""
    q = qs.to(torch.int32).reshape(qs.shape[0], -1, 1, 16)
    return torch.cat([q & 0xF, q >> 4], 2).reshape(qs.shape[0], -1)


def decode_blocks(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """Raw blocks ``[B, type_size]`` -> float32 ``[B, block]``, with ggml's dequantize arithmetic."""
    B = raw.shape[0]
    if kind in ("q4_k", "q5_k"):
        d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])
        sc, m = _k4_scales(raw[:, 4:16])
        if kind == "q4_k":
            q = _nibbles_k(raw[:, 16:144])
        else:
            qh = raw[:, 16:48].to(torch.int32)
            hi = (qh[:, None, :] >> torch.arange(8, device=raw.device)[None, :, None]) & 1  # [B, 8 sub-blocks, 32]
            q = _nibbles_k(raw[:, 48:176]) + 16 * hi.reshape(B, 256)
        dl, ml = (d * sc)[..., None], (dmin * m)[..., None]
        return (dl * q.reshape(B, 8, 32).float() - ml).reshape(B, 256)
    if kind == "q6_k":
        ql, qh = raw[:, :128].to(torch.int32).reshape(B, 2, 64), raw[:, 128:192].to(torch.int32).reshape(B, 2, 1, 32)
        lo = torch.cat([ql & 0xF, ql >> 4], -1).reshape(B, 2, 4, 32)  # elements 0-31, 32-63, 64-95, 96-127
        hi = (qh >> (2 * torch.arange(4, device=raw.device)).reshape(1, 1, 4, 1)) & 3
        q = (lo | (hi << 4)) - 32
        sc = raw[:, 192:208].contiguous().view(torch.int8).float()
        d = _f16(raw[:, 208:210])
        return ((d * sc)[..., None] * q.reshape(B, 16, 16).float()).reshape(B, 256)
    if kind == "q2_k":
        sc = raw[:, :16].to(torch.int32)
        d, dmin = _f16(raw[:, 80:82]), _f16(raw[:, 82:84])
        dl, ml = (d * (sc & 0xF).float())[..., None], (dmin * (sc >> 4).float())[..., None]
        return (dl * _unpack_2bit(raw[:, 16:80]).reshape(B, 16, 16).float() - ml).reshape(B, 256)
    if kind == "q3_k":
        hm = raw[:, :32].to(torch.int32)
        high = (hm[:, None, :] >> torch.arange(8, device=raw.device)[None, :, None]) & 1  # [B, 8, 32]
        q = _unpack_2bit(raw[:, 32:96]) - 4 * (1 - high.reshape(B, 256))
        s = raw[:, 96:108].to(torch.int32)
        lo = torch.cat([s[:, :8] & 0xF, s[:, :8] >> 4], -1)
        hi = (s[:, 8:12][:, None, :] >> (2 * torch.arange(4, device=raw.device))[None, :, None]) & 3  # [B, j/4, j%4]
        ls = (lo | (hi.reshape(B, 16) << 4)) - 32
        dl = (_f16(raw[:, 108:110]) * ls.float())[..., None]
        return (dl * q.reshape(B, 16, 16).float()).reshape(B, 256)
    kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=raw.device)
    if kind == "iq4_nl":
        return _f16(raw[:, :2]) * kv[_nibbles_16(raw[:, 2:18]).long()]
    if kind == "iq4_xs":
        sh = raw[:, 2].to(torch.int32) | (raw[:, 3].to(torch.int32) << 8)
        sl = raw[:, 4:8].to(torch.int32)
        lo = torch.stack([sl & 0xF, sl >> 4], -1).reshape(B, 8)
        hi = (sh[:, None] >> (2 * torch.arange(8, device=raw.device))) & 3
        dl = (_f16(raw[:, :2]) * ((lo | (hi << 4)) - 32).float())[..., None]
        return (dl * kv[_nibbles_16(raw[:, 8:136]).long()].reshape(B, 8, 32)).reshape(B, 256)
    raise ValueError(kind)  # pragma: no cover


def _check_imatrix(imatrix, shape: tuple[int, ...], name: str) -> torch.Tensor | None:
    """One weight per input column: ``[in]`` for any tensor, or ``[E, in]`` for stacked experts ``[E, out, in]``
    (expert e's rows use row e, as llama-quantize slices a stacked tensor's imatrix). Returned as ``[E or 1, in]``."""
    if imatrix is None:
        return None
    im = torch.as_tensor(imatrix).float()
    cols, experts = shape[-1], (shape[0] if len(shape) == 3 else 1)
    if im.numel() == cols:
        im = im.reshape(1, cols)
    elif len(shape) == 3 and im.numel() == experts * cols:
        im = im.reshape(experts, cols)
    else:
        want = f"{cols}" + (f" or {experts} x {cols}" if len(shape) == 3 else "")
        raise FidevalError(f"{name}: importance matrix has {im.numel()} values for a {list(shape)} tensor (needs {want})",
                           hint="give the imatrix entry of this tensor (one weight per input column)")
    if not torch.isfinite(im).all() or (im < 0).any():
        raise FidevalError(f"{name}: importance matrix has negative or non-finite values",
                           hint="recompute it with llama-imatrix")
    return im


class GGUFKFormat(Format):
    recipes = ("ggml",)
    default_recipe = "ggml"

    def __init__(self, kind: str):
        self.kind = kind
        self.name = f"gguf_{kind}"
        self.encoder, self.block, self.type_size = K_TYPES[kind]
        self.groups = (self.block,)
        self.default_group = self.block
        self.element_bits = 0  # all bits are counted per block, scales included
        self.description = f"GGUF {kind.upper()}: {self.type_size} bytes per {self.block} weights (llama.cpp's quantizer)"

    def scale_bits(self, recipe=None) -> float:
        return self.type_size * 8

    def _encode(self, x2, recipe, group, shape, dtype, imatrix: torch.Tensor | None = None) -> Encoded:
        qw = None
        if imatrix is not None:  # [E or 1, cols]: each expert's rows get its own row of weights
            im = imatrix.to(x2.device)
            qw = im.repeat_interleave(x2.shape[0] // im.shape[0], 0).reshape(-1, self.block)
        raw = self.encoder(x2.reshape(-1, self.block).contiguous(), qw)
        return Encoded(self.name, recipe, group, shape, dtype, raw.reshape(*shape[:-1], -1))

    def decode(self, enc: Encoded) -> torch.Tensor:
        vals = decode_blocks(enc.codes.reshape(-1, self.type_size), self.kind)
        return vals.reshape(enc.shape).to(enc.dtype)


K_FORMATS = {k: GGUFKFormat(k) for k in K_TYPES}
DEFINES = tuple(K_FORMATS.values())  # fideval.quant.base.FORMATS names this module for them


def get_k_format(kind: str) -> GGUFKFormat:
    fmt = K_FORMATS.get(kind.lower().removeprefix("gguf_"))
    if fmt is None:
        raise FidevalError(f"GGUF type {kind!r} has no K-quant encoder", hint=f"use one of {', '.join(K_FORMATS)}")
    return fmt


@torch.no_grad()
def gguf_k_encode(x: torch.Tensor, kind: str, imatrix: torch.Tensor | None = None) -> torch.Tensor:
    """Raw GGUF bytes ``[..., n/block * type_size]`` of ``x`` -- what llama.cpp's ``quantize_<kind>`` writes
    (``imatrix``: one weight per column, ``[in]``, or per expert and column, ``[E, in]``, for ``x`` of
    ``[E, out, in]``; what :meth:`fideval.quant.imatrix.Imatrix.for_tensor` returns)."""
    from fideval.quant.elements import check_finite

    fmt = get_k_format(kind)
    r, g, shape = fmt._prepare(x, None, None)
    check_finite(x, f"format {fmt.name}")
    return fmt._encode(x.float().reshape(-1, shape[-1]), r, g, shape, x.dtype,
                       imatrix=_check_imatrix(imatrix, shape, fmt.name)).codes


@torch.no_grad()
def gguf_k_quant_dequant(x: torch.Tensor, kind: str, imatrix: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize with llama.cpp's quantizer (with ``imatrix`` when given), then dequantize; same shape and dtype."""
    fmt = get_k_format(kind)
    if imatrix is None:
        return fmt.quant_dequant(x)
    im = _check_imatrix(imatrix, tuple(x.shape), fmt.name)
    mats = x.reshape(-1, x.shape[-2] if x.dim() >= 2 else 1, x.shape[-1])
    out = torch.empty(mats.shape, dtype=x.dtype, device=x.device)
    step = max(1, (1 << 22) // x.shape[-1])  # rows per piece: a few million weights of search temporaries
    for e in range(mats.shape[0]):  # stacked experts: expert e's rows use its own weights, as llama-quantize does
        w = im[e if im.shape[0] > 1 else 0]
        for i in range(0, mats.shape[1], step):
            piece = mats[e, i:i + step]
            enc = Encoded(fmt.name, "ggml", fmt.block, tuple(piece.shape), x.dtype, gguf_k_encode(piece, kind, w))
            out[e, i:i + step] = fmt.decode(enc)
    return out.reshape(x.shape)
