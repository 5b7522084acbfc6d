"""Element formats of the low-precision families (FP8 E4M3/E5M2, FP6 E2M3/E3M2, FP4 E2M1) and the E8M0
power-of-two scale, as exact float32 arithmetic that runs on any torch device.

Why not ``tensor.to(torch.float8_e4m3fn)``: it exists only for FP8, its overflow behaviour differs between
devices and versions (NaN on some, saturation on others), and FP4/FP6 have no torch dtype to cast through.
Every cast here is round-to-nearest, ties-to-even, saturating to +-max (what every MX/NVFP4/FP8 producer we
emulate does after clamping). The arithmetic is exact: the input is split into binade and quantum using the
*bits* (the exponent field), the quotient by a power of two is exact, and ``torch.round`` is ties-to-even.
The tables are checked against ``ml_dtypes`` and torch's float8 dtypes in ``tests/test_quant_elements.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fideval.errors import FidevalError


@dataclass(frozen=True)
class ElementFormat:
    """A sign + ``ebits`` exponent + ``mbits`` mantissa float without infinities in its finite range."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max: float  # largest finite magnitude (saturation target)

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade (subnormals share its quantum)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value's binade: the OCP MX spec's ``emax_elem``."""
        return floor_log2_int(self.max)


def floor_log2_int(v: float) -> int:
    return math.frexp(v)[1] - 1


E4M3 = ElementFormat("e4m3", 4, 3, 7, 448.0)  # OCP "fn": no inf, S.1111.111 is NaN
E5M2 = ElementFormat("e5m2", 5, 2, 15, 57344.0)  # IEEE-like: exponent 31 is inf/NaN
E2M3 = ElementFormat("e2m3", 2, 3, 1, 7.5)
E3M2 = ElementFormat("e3m2", 3, 2, 3, 28.0)
E2M1 = ElementFormat("e2m1", 2, 1, 1, 6.0)
ELEMENTS = {f.name: f for f in (E4M3, E5M2, E2M3, E3M2, E2M1)}
# the smallest block amax a dynamic E4M3 activation scale is taken from (DeepSeek-V3 act_quant's clamp): an
# all-zero block gets a finite scale. Here, not in activations.py, so its Triton kernel (act_kernel.py) reads the
# same constant without importing the module that dispatches to it
AMAX_FLOOR = 1e-4


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2**e as float32, exactly, for integer e in [-149, 127], built from the bits (subnormals included)."""
    e = e.to(torch.int32)
    normal = ((e + 127).clamp(min=1) << 23).view(torch.float32)
    sub = (torch.ones_like(e) << (e + 149).clamp(0, 22)).view(torch.float32)
    return torch.where(e >= -126, normal, sub)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(|a|)) for finite a != 0 as int32, from the float32 bits (exact, subnormals included).

    Never ``torch.log2(a).floor()``: log2 of a float rounds, so the largest float below 2**k gives k.
    Normals: the exponent field minus 127. Subnormals: the mantissa (an integer < 2**23) converted to
    float32 is exact, and its exponent field gives the position of its leading bit. (a == 0 gives -149.)"""
    bits = a.float().contiguous().view(torch.int32) & 0x7FFFFFFF
    field = bits >> 23
    lead = (((bits & 0x007FFFFF) | 1).float().view(torch.int32) >> 23) - 127  # floor(log2(mantissa))
    return torch.where(field > 0, field - 127, lead - 149).to(torch.int32)


def cast(x: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Round float32 ``x`` to the nearest ``fmt`` value (ties to even), saturating at +-fmt.max.

    Returns float32 holding exactly representable values; the sign of zero is kept."""
    x = x.float()
    a = x.abs().clamp(max=fmt.max)
    e = floor_log2(a).clamp(min=fmt.emin)  # a == 0 gives -149 -> clamped to emin, harmless
    y = torch.round(a * pow2(fmt.mbits - e)) * pow2(e - fmt.mbits)
    return torch.copysign(y, x)


def to_codes(y: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Bit codes (uint8, low ``fmt.bits`` bits) of float32 values already on the ``fmt`` grid."""
    a = y.abs()
    sign = torch.signbit(y).to(torch.int32)
    e = floor_log2(a)
    sub = a < 2.0**fmt.emin
    exp_field = torch.where(sub, 0, e + fmt.bias)
    man_sub = a * 2.0 ** (fmt.mbits - fmt.emin)
    man_norm = (a * pow2(-e.clamp(min=fmt.emin)) - 1.0) * 2.0**fmt.mbits
    man = torch.where(sub, man_sub, man_norm).to(torch.int32)
    code = (sign << (fmt.ebits + fmt.mbits)) | (exp_field << fmt.mbits) | man
    return code.to(torch.uint8)


def code_table(fmt: ElementFormat) -> torch.Tensor:
    """float32 value of every code 0 .. 2**bits - 1 (NaN/inf where the format has them)."""
    vals = []
    for c in range(1 << fmt.bits):
        s = -1.0 if c >> (fmt.ebits + fmt.mbits) else 1.0
        ef = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
        m = c & ((1 << fmt.mbits) - 1)
        if ef == 0:
            v = m * 2.0 ** (fmt.emin - fmt.mbits)
        else:
            v = (1.0 + m / 2.0**fmt.mbits) * 2.0 ** (ef - fmt.bias)
        if fmt is E4M3 and ef == 15 and m == 7:
            v = float("nan")
        elif fmt is E5M2 and ef == 31:
            v = float("inf") if m == 0 else float("nan")
        vals.append(s * v)
    return torch.tensor(vals, dtype=torch.float32)


_TABLES: dict[tuple[str, str], torch.Tensor] = {}


def from_codes(codes: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """float32 values of uint8 codes (table lookup on the codes' device)."""
    key = (fmt.name, str(codes.device))
    if key not in _TABLES:
        _TABLES[key] = code_table(fmt).to(codes.device)
    return _TABLES[key][codes.long()]


# ---- E8M0: the MX shared scale, 2**(code - 127); code 255 is NaN --------------------------------------

E8M0_BIAS = 127


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 2**(code-127) for uint8 E8M0 codes; code 255 -> NaN."""
    c = codes.to(torch.int32)
    v = pow2(c - E8M0_BIAS)
    return torch.where(c == 255, torch.full_like(v, float("nan")), v)


def e8m0_encode(exponent: torch.Tensor) -> torch.Tensor:
    """uint8 codes of 2**exponent; exponents are clamped to the finite range [-127, 127]."""
    return (exponent.to(torch.int32).clamp(-127, 127) + E8M0_BIAS).to(torch.uint8)


def ceil_pow2_exponent(s: torch.Tensor) -> torch.Tensor:
    """Exponent of the smallest power of two >= s (s >= 0, finite), from the float32 bits: add the mantissa
    mask and keep the exponent field. This is exactly the round-up the gpt-oss MXFP4 producer and NVIDIA's
    ``cvt.rp.satfinite.ue8m0`` perform. s == 0 gives -127 (E8M0 code 0); subnormal s gives -126."""
    bits = s.float().contiguous().view(torch.int32)
    field = ((bits + 0x007FFFFF) & 0x7F800000) >> 23
    return torch.where(bits == 0, torch.full_like(field, -127), field - 127)


def check_finite(x: torch.Tensor, what: str) -> None:
    """One-line error for NaN/Inf input: every scale recipe would silently turn a block into NaN."""
    if not bool(torch.isfinite(x).all()):
        raise nonfinite_error(what, int((~torch.isfinite(x)).sum()))


def nonfinite_error(what: str, n: int) -> FidevalError:
    """The one-line error for ``n`` NaN/Inf values met by ``what`` (the torch path's check and the kernels' counter)."""
    return FidevalError(f"{what}: {n} NaN/Inf value(s) in the tensor to quantize", hint="check the checkpoint")
