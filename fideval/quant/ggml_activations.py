"""ggml's activation quantization: what llama.cpp's CPU backend does to a matmul's input rows before a quantized dot.

``ggml_compute_forward_mul_mat`` converts every row of ``src1`` (the activations, float32) to the weight type's
``vec_dot_type`` with that type's ``from_float`` (``ggml/src/ggml-cpu/ggml-cpu.c``, ``type_traits_cpu``), then the
dot product multiplies integer codes and scales. So the numbers a quantized linear sees are the activations
quantized and dequantized with:

* **Q8_0** (legacy Q4_0/Q5_0/Q8_0, MXFP4, IQ4_NL weights): blocks of 32, ``d = amax/127`` stored as float16; codes
  ``x * id`` rounded; the dot uses ``fp16(d) * code``.
* **Q8_1** (Q4_1/Q5_1): the same codes and scale, plus ``s = fp16(d * sum(codes))`` (``d`` the float32 scale), which
  the dot multiplies with the weight block's minimum.
* **Q8_K** (K-quants, IQ4_XS): blocks of 256, float32 ``d``: ``iscale = -127/max`` where ``max`` is the first element of
  largest magnitude *with its sign*, codes ``min(127, nearest_int(iscale * x))`` (ties to even), ``d = 1/iscale``;
  int16 sums of each 16 codes (``bsums``).

Two builds of Q8_0/Q8_1 exist on the CPU (``variant``): ``"x86"`` -- ``ggml-cpu/arch/x86/quants.c`` on any AVX/AVX2/
AVX-512 machine (a native build's), ``id = 127/amax``, ``_mm256_round_ps`` (ties to even), a product that is not finite
(amax a float32 subnormal: ``127/amax`` overflows) saturating to code -128 -- and ``"ref"`` -- the scalar
``quantize_row_q8_{0,1}_ref`` (a build without SIMD), ``id = 1/d``, ``roundf`` (ties away from zero), a non-finite
product converted to code 0 (x86 ``cvttss2si``'s 0x80000000, low byte). ARM NEON uses ``id = 1/d`` with ties to even
(``vcvtnq``), not emulated. Q8_K is the reference on every CPU. The dequantized values of the two variants differ only
on exact ties and in the last bit of ``x * id``; a block whose float16 scale overflows (amax > 127 * 65504) dequantizes
to inf/NaN as in ggml.

All arithmetic is float32 and elementwise, so the codes and scales equal ggml's bit for bit (tested against
``tools/llamacpp/act_vectors.py``'s dump of llama.cpp's own functions, ``tests/data/llamacpp/act_vectors.npz``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fideval.errors import FidevalError

# the CPU backend's vec_dot_type of each weight type (ggml-cpu.c type_traits_cpu, llama.cpp of llama-cpp-python 0.3.36):
# what the activations entering a matmul with such a weight are converted to. F32 weights take the float32 rows as
# they are; F16 and BF16 weights round the activations to F16 / BF16.
VEC_DOT_TYPE = {
    "F32": "F32", "F16": "F16", "BF16": "BF16",
    "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "MXFP4": "Q8_0", "NVFP4": "Q8_0", "IQ4_NL": "Q8_0",
    "Q1_0": "Q8_0", "Q2_0": "Q8_0",
    "Q4_1": "Q8_1", "Q5_1": "Q8_1", "Q8_1": "Q8_1",
    "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
    "IQ4_XS": "Q8_K", "IQ2_XXS": "Q8_K", "IQ2_XS": "Q8_K", "IQ2_S": "Q8_K", "IQ3_XXS": "Q8_K", "IQ3_S": "Q8_K",
    "IQ1_S": "Q8_K", "IQ1_M": "Q8_K", "TQ1_0": "Q8_K", "TQ2_0": "Q8_K",
}
BLOCK = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}
VARIANTS = ("x86", "ref")


def act_type(weight_type: str) -> str:
    """The activation type ggml's CPU backend computes a ``weight_type`` matmul with (:data:`VEC_DOT_TYPE`)."""
    t = str(weight_type).upper()
    if t not in VEC_DOT_TYPE:
        raise FidevalError(f"ggml weight type {weight_type!r} has no known CPU activation type",
                           hint=f"known: {', '.join(VEC_DOT_TYPE)}")
    return VEC_DOT_TYPE[t]


def _blocks(x: torch.Tensor, block: int, kind: str) -> torch.Tensor:
    if x.shape[-1] % block:
        raise FidevalError(f"ggml {kind} activations: a row of {x.shape[-1]} is not a multiple of {block}",
                           hint="llama.cpp quantizes only rows whose length is a multiple of the block")
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _div(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor:
    """``a / b`` correctly rounded in float32, as C's ``/``: both operands as tensors of one shape (torch may compute a
    division by or of a Python scalar as a multiplication by a reciprocal, two roundings)."""
    ref = a if isinstance(a, torch.Tensor) else b
    a = a if isinstance(a, torch.Tensor) else torch.full_like(ref, a)
    b = b if isinstance(b, torch.Tensor) else torch.full_like(ref, b)
    return torch.div(a, b)


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``, exactly: ``trunc`` plus one where the (exact) fraction is at least one half."""
    t = torch.trunc(v)
    return t + torch.sign(v) * ((v - t).abs() >= 0.5)


def _q8_codes(x: torch.Tensor, kind: str, variant: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q8_0/Q8_1 blocks of ``x``: (float32 scale d, int8 codes, the sum Q8_1's ``s`` is taken of)."""
    if variant not in VARIANTS:
        raise FidevalError(f"ggml activation variant {variant!r} is not known", hint=f"use {', '.join(VARIANTS)}")
    b = _blocks(x, 32, kind)
    amax = b.abs().amax(-1, keepdim=True)
    d = _div(amax, 127.0)
    zero = torch.zeros((), dtype=torch.float32)
    if variant == "x86":
        idv = torch.where(amax != 0, _div(127.0, amax), zero)
        v = torch.round(b * idv)  # _mm256_round_ps(_MM_ROUND_NEAREST): ties to even
        finite = torch.isfinite(v)
        q = torch.where(finite, v.clamp(-128, 127), torch.full((), -128.0))  # cvtps_epi32(inf/NaN) = INT_MIN, packs saturate
        # s: hsum of the int32 conversions (INT_MIN where not finite), wrapping as int32 does
        raw = torch.where(finite, v, torch.full((), -2.0**31)).to(torch.int64).sum(-1)
        total = (raw + 2**31) % 2**32 - 2**31
    else:
        idv = torch.where(d != 0, _div(1.0, d), zero)
        v = _round_half_away(b * idv)
        q = torch.where(torch.isfinite(v), v.clamp(-128, 127), zero)  # (int8_t) of cvttss2si's 0x80000000
        total = q.to(torch.int64).sum(-1)  # the stored codes
    return d.squeeze(-1), q.to(torch.int8), total


def q8_0_encode(x: torch.Tensor, variant: str = "x86") -> tuple[torch.Tensor, torch.Tensor]:
    """``(d float16 [..., n/32], codes int8 [..., n/32, 32])`` as ``quantize_row_q8_0`` writes them."""
    d, q, _ = _q8_codes(x, "Q8_0", variant)
    return d.to(torch.float16), q


def q8_1_encode(x: torch.Tensor, variant: str = "x86") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d float16, s float16, codes int8)`` as ``quantize_row_q8_1`` writes them (``s = fp16(d * sum(codes))``)."""
    d, q, total = _q8_codes(x, "Q8_1", variant)
    s = d * total.float()  # (float) sum * the float32 d
    return d.to(torch.float16), s.to(torch.float16), q


def q8_K_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d float32 [..., n/256], codes int8 [..., n/256, 256], bsums int16 [..., n/256, 16])`` as
    ``quantize_row_q8_K_ref`` writes them (the CPU backend's Q8_K on every architecture)."""
    b = _blocks(x, 256, "Q8_K")
    idx = b.abs().argmax(-1, keepdim=True)  # the first of the largest magnitudes (C's strict '>')
    mx = b.gather(-1, idx)
    amax = mx.abs()
    iscale = torch.where(amax != 0, _div(-127.0, torch.where(amax != 0, mx, torch.ones_like(mx))), torch.zeros_like(mx))
    v = torch.round(iscale * b)  # nearest_int: the float add of 1.5 * 2**23, ties to even
    v = torch.where(torch.isfinite(v), v.clamp(max=127), torch.zeros_like(v))  # nearest_int(inf/NaN)'s low byte is 0
    q = v.to(torch.int8)
    bsums = q.reshape(*q.shape[:-1], 16, 16).to(torch.int32).sum(-1).to(torch.int16)
    d = torch.where(amax != 0, _div(1.0, iscale), torch.zeros_like(iscale)).squeeze(-1)
    return d, q, bsums


def quant_dequant(x: torch.Tensor, kind: str, variant: str = "x86") -> torch.Tensor:
    """``x`` (rows along the last dim) as a ggml dot product sees it after conversion to activation type ``kind``
    (``Q8_0``, ``Q8_1``, ``Q8_K``, ``F16``, ``BF16`` or ``F32``): float32 arithmetic, the result in ``x``'s dtype.
    Q8_0 and Q8_1 give ``fp16(d) * code`` (Q8_1's ``s`` enters the dot only through a Q4_1/Q5_1 weight's minimum:
    ``m * s`` where this gives ``m * fp16(d) * sum(codes)``, a float16 rounding apart), Q8_K ``d * code``."""
    kind = str(kind).upper()
    if kind == "F32":
        return x
    if kind in ("F16", "BF16"):
        dt = torch.float16 if kind == "F16" else torch.bfloat16
        return x.float().to(dt).to(x.dtype)
    if kind in ("Q8_0", "Q8_1"):
        d, q, _ = _q8_codes(x, kind, variant)
        y = d.to(torch.float16).float().unsqueeze(-1) * q.float()
    elif kind == "Q8_K":
        d, q, _ = q8_K_encode(x)
        y = d.unsqueeze(-1) * q.float()
    else:
        raise FidevalError(f"ggml activation type {kind!r} is not known", hint="use Q8_0, Q8_1, Q8_K, F16, BF16 or F32")
    return y.reshape(x.shape).to(x.dtype)


def for_weight_type(weight_type: str, variant: str = "x86") -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The activation transform ggml's CPU backend applies to the input of a ``weight_type`` matmul; None for F32."""
    kind = act_type(weight_type)
    if kind == "F32":
        return None

    def f(x: torch.Tensor) -> torch.Tensor:
        return quant_dequant(x, kind, variant)

    f.ggml_act_type = kind  # type: ignore[attr-defined]
    return f
