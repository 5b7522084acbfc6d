"""Weight quantize-dequantize (:meth:`fideval.quant.base.Format.quant_dequant`) of the MX formats, ``fp8_block`` and
``nvfp4`` as one Triton kernel per tensor on CUDA (NVFP4: two, an amax pass first): the torch path's bits, one read and
one write of the weights (NVFP4: two reads).

Why. A candidate's emulated weights are made as each layer loads on the GPU. The torch path is a dozen elementwise
passes over float32 copies per 2**24-element chunk plus a ``check_finite`` host sync per chunk: measured on an H100,
5.5-6.9 Gelem/s, so 1.7 s for one DeepSeek-V3 MoE layer's 11.3 G expert elements, not hidden behind compute.

How. Every step is the torch path's own float32 operation, in its order (the style of
:mod:`fideval.quant.act_kernel`): exponents from the bits (``floor_log2``, ``ceil_pow2_exponent``), powers of two
built from the bits (``pow2``, subnormals included, so a product that lands below 2**-126 rounds as torch's does),
divisions correctly rounded (``div_rn``, with libdevice's flush-to-zero off: Triton's default flushes subnormal
operands, and a block of float32 subnormals would get another scale), the element cast rounded half to even by the
1.5 x 2^23 addition (exact: the scaled value is below 16) with the sign bit put back (-0 stays -0), and the final
conversion to bf16/fp16 rounded to nearest even as torch's ``.to()``. The torch path divides by a tensor, never a
Python scalar, which torch's CUDA kernel turns into a multiplication by the reciprocal (on an H100, a last-bit
difference for 33-65 % of random quotients by 6, 7.5, 28, 448 or 57344).
tests/test_quant_weight_kernel.py checks the bits against the torch path on the GPU and, on the CPU, under
``TRITON_INTERPRET=1``.

NaN/Inf. The torch path raises per chunk (a host sync each time). Here every program counts its non-finite elements
into one device counter (an atomic only where it found some), read once per tensor after the launch: the same
one-line :class:`FidevalError`, with ``out`` possibly written (as the torch path leaves earlier chunks written).

NVFP4. Its tensor scale is per matrix (``[E, out, in]``: one per expert), so a first kernel takes each matrix's amax
(an integer ``atomic_max`` of the float32 bits of ``|x|``, exact), :func:`fideval.quant.nvfp4.tensor_scale` turns the ``[M]``
amaxes into ``weight_scale_2`` / ``weight_global_scale`` (the torch path's own function: its bits by construction,
with no host sync), and the second kernel does the blocks of 16 with them.

Layouts: any strides of ``x`` and ``out`` over ``[M, R, C]`` (a transposed ``out`` view is written through, slowly);
an ``out`` that shares memory with ``x`` without being the same view, dtypes other than bf16/fp16/float32 and grids
past CUDA's limits are left to the torch path (:func:`as_3d` returns None, the caller falls back).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fideval.quant.elements import E4M3, ElementFormat, nonfinite_error

try:  # optional: the CPU machine and CI may lack it; quant_dequant then runs its torch path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None

NV_BLOCKS_PER_PROGRAM = 64  # NVFP4: 64 blocks of 16, the same 1,024 elements a program (not yet timed on a GPU)
MX_BLOCKS_PER_PROGRAM = 32  # 1,024 elements a program: 419 Gelem/s in bf16 on an H100 where 8 (act_kernel's shape) gave 271
ROUNDER = 12582912.0  # 1.5 x 2^23: adding and subtracting it rounds a float32 below 2^22 to an integer, half to even
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GRID_MAX = (2**31 - 1, 65535, 65535)


def usable(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether a kernel can take ``x`` -> ``out``: Triton present, CUDA, a float dtype it reads, elements to do, and
    ``out`` either ``x`` itself or memory of its own (a partly overlapping view needs the torch path's chunk order)."""
    if triton is None or not x.is_cuda or x.dtype not in DTYPES or x.numel() == 0 or x.dim() == 0:
        return False
    same = out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
    return same or out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def as_3d(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as a ``[M, R, C]`` view (a vector is one row; leading dims flattened where strides allow), or None."""
    if t.dim() <= 3:
        return t[(None,) * (3 - t.dim())]
    try:
        return t.view(-1, *t.shape[-2:])
    except RuntimeError:
        return None


def _launch_views(x: torch.Tensor, out: torch.Tensor, grid_of: Callable) -> tuple | None:
    """``x`` and ``out`` as ``[M, R, C]`` views and the launch grid ``grid_of(M, R, C)``; None where a layout or the grid
    is past what the kernels take (the torch path runs)."""
    x3, o3 = as_3d(x), as_3d(out)
    if x3 is None or o3 is None:
        return None
    grid = grid_of(*x3.shape)
    if any(g > lim for g, lim in zip(grid, GRID_MAX)):
        return None
    return x3, o3, grid


def _finish(counter: torch.Tensor, name: str) -> None:
    """The one host sync per tensor: :func:`fideval.quant.elements.check_finite`'s error if any value was NaN/Inf."""
    n = int(counter.item())
    if n:
        raise nonfinite_error(f"format {name}", n)


def mx_qdq(x: torch.Tensor, out: torch.Tensor, elem: ElementFormat, recipe: str, name: str) -> bool:
    """MX quantize-dequantize of ``x`` into ``out`` (blocks of 32 along the last dim); False where the layout is not
    handled (nothing written then). Arguments are checked by the caller (``Format._prepare``)."""
    v = _launch_views(x, out, lambda m, r, c: (m * r, triton.cdiv(c // 32, MX_BLOCKS_PER_PROGRAM)))
    if v is None:
        return False
    x3, o3, grid = v
    r, c = x3.shape[1:]
    counter = torch.zeros(1, dtype=torch.int64, device=x.device)
    _mx_qdq[grid](
        x3,
        o3,
        counter,
        r,
        c,
        *x3.stride(),
        *o3.stride(),
        ELEM_MAX=elem.max,
        EMAX=elem.emax,
        EMIN=elem.emin,
        MBITS=elem.mbits,
        FLOOR=recipe == "floor",
        GROUP=MX_BLOCKS_PER_PROGRAM,
        num_warps=4,
        enable_reflect_ftz=False,
    )
    _finish(counter, name)
    return True


def fp8_block_qdq(x: torch.Tensor, out: torch.Tensor, recipe: str, tile: int, name: str) -> bool:
    """``fp8_block`` quantize-dequantize of ``x`` into ``out`` (``tile`` x ``tile`` over the last two dims, edge tiles
    partial); False where the layout or tile is not handled (nothing written then)."""
    if tile & (tile - 1) or not 16 <= tile <= 128:
        return False
    v = _launch_views(x, out, lambda m, r, c: (triton.cdiv(r, tile), triton.cdiv(c, tile), m))
    if v is None:
        return False
    x3, o3, grid = v
    r, c = x3.shape[1:]
    counter = torch.zeros(1, dtype=torch.int64, device=x.device)
    _fp8_qdq[grid](
        x3, o3, counter, r, c, *x3.stride(), *o3.stride(), T=tile, UE8M0=recipe == "ue8m0", num_warps=8, enable_reflect_ftz=False
    )
    _finish(counter, name)
    return True


def nvfp4_qdq(x: torch.Tensor, out: torch.Tensor, recipe: str, name: str, tensor_scale: Callable) -> bool:
    """NVFP4 quantize-dequantize of ``x`` into ``out`` (blocks of 16 along the last dim, one tensor scale per matrix of
    the last two dims); False where the layout is not handled (nothing written then). ``tensor_scale(amax, recipe)``:
    :func:`fideval.quant.nvfp4.tensor_scale`, passed in (this module imports no format module)."""
    v = _launch_views(x, out, lambda m, r, c: (m * r, triton.cdiv(c // 16, NV_BLOCKS_PER_PROGRAM)))
    if v is None:
        return False
    x3, o3, grid = v
    m, r, c = x3.shape
    amax_bits = torch.zeros(m, dtype=torch.int32, device=x.device)
    _nvfp4_amax[grid](x3, amax_bits, r, c, *x3.stride(), GROUP=NV_BLOCKS_PER_PROGRAM, num_warps=4)
    # the torch path's own function: its bits by construction (a NaN's bits sort above inf: NaN, then raised)
    ts = tensor_scale(amax_bits.view(torch.float32), recipe)
    counter = torch.zeros(1, dtype=torch.int64, device=x.device)
    _nvfp4_qdq[grid](
        x3,
        o3,
        ts,
        counter,
        r,
        c,
        *x3.stride(),
        *o3.stride(),
        MODELOPT=recipe == "modelopt",
        GROUP=NV_BLOCKS_PER_PROGRAM,
        num_warps=4,
        enable_reflect_ftz=False,
    )
    _finish(counter, name)
    return True


if triton is not None:
    _ROUNDER, _E4M3_MAX = tl.constexpr(ROUNDER), tl.constexpr(E4M3.max)  # jit sees constexprs
    _E4M3_MIN_SUB = tl.constexpr(2.0**-9)  # nvfp4.E4M3_MIN_SUB

    @triton.jit
    def _pow2(k):
        """elements.pow2: 2**k as float32 from the bits, subnormals (k < -126) included."""
        normal = (tl.maximum(k + 127, 1) << 23).to(tl.float32, bitcast=True)
        sub = (tl.full(k.shape, 1, tl.int32) << tl.minimum(tl.maximum(k + 149, 0), 22)).to(tl.float32, bitcast=True)
        return tl.where(k >= -126, normal, sub)

    @triton.jit
    def _cast(v, ELEM_MAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr):
        """elements.cast: saturate, e = max(floor(log2 a), emin) from the exponent field (a float32 subnormal gives
        -127, clamped like torch's -149), a * 2^(mbits - e) (exact, below 16) rounded half to even, scaled back, the
        sign bit of v put back (not -r, which Triton forms as 0 - r: +0)."""
        a = tl.minimum(tl.abs(v), ELEM_MAX)
        e = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 127, EMIN)
        up = ((127 + MBITS - e) << 23).to(tl.float32, bitcast=True)
        down = ((127 - MBITS + e) << 23).to(tl.float32, bitcast=True)
        r = ((a * up + _ROUNDER) - _ROUNDER) * down  # >= +0: its sign bit is clear
        sign = (v.to(tl.int32, bitcast=True) >> 31) << 31  # the sign bit alone (an arithmetic shift)
        return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)

    @triton.jit
    def _count_nonfinite(x, cnt_ptr):
        """Add the number of NaN/Inf in ``x`` to the counter; an atomic only where there are some."""
        bad = tl.sum(tl.sum(((x.to(tl.int32, bitcast=True) & 0x7FFFFFFF) >= 0x7F800000).to(tl.int32), axis=1), axis=0)
        tl.atomic_add(cnt_ptr, bad.to(tl.int64), mask=bad > 0)

    @triton.jit
    def _mx_qdq(
        x_ptr,
        out_ptr,
        cnt_ptr,
        R,
        C,
        sxm,
        sxr,
        sxc,
        som,
        sor,
        soc,
        ELEM_MAX: tl.constexpr,
        EMAX: tl.constexpr,
        EMIN: tl.constexpr,
        MBITS: tl.constexpr,
        FLOOR: tl.constexpr,
        GROUP: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        m, row = pid // R, pid % R
        cols = tl.program_id(1).to(tl.int64) * GROUP * 32 + tl.arange(0, GROUP)[:, None] * 32 + tl.arange(0, 32)[None, :]
        mask = cols < C  # C is a multiple of 32: whole blocks in or out
        x = tl.load(x_ptr + m * sxm + row * sxr + cols * sxc, mask=mask, other=0.0).to(tl.float32)
        _count_nonfinite(x, cnt_ptr)
        amax = tl.max(tl.abs(x), axis=1)
        if FLOOR:  # mx_scale_exponent "floor": floor_log2(amax) - emax (subnormal amax: its mantissa's leading bit)
            bits = amax.to(tl.int32, bitcast=True)
            lead = ((((bits & 0x007FFFFF) | 1).to(tl.float32).to(tl.int32, bitcast=True)) >> 23) - 127
            fl = tl.where((bits >> 23) > 0, (bits >> 23) - 127, lead - 149)
            e = tl.where(amax > 0, fl - EMAX, -127)
        else:  # "rceil": amax / elem.max correctly rounded, then the exponent of its power-of-two ceiling
            s = tl.math.div_rn(amax, tl.full(amax.shape, ELEM_MAX, tl.float32)).to(tl.int32, bitcast=True)
            e = tl.where(s == 0, -127, (((s + 0x007FFFFF) & 0x7F800000) >> 23) - 127)
        e = tl.minimum(tl.maximum(e, -127), 127)
        q = _cast(x * _pow2(-e)[:, None], ELEM_MAX, EMIN, MBITS)
        y = q * _pow2(e)[:, None]
        if out_ptr.dtype.element_ty != tl.float32:  # to bf16/fp16: round to nearest even, as torch's .to()
            y = y.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(out_ptr + m * som + row * sor + cols * soc, y, mask=mask)

    @triton.jit
    def _fp8_qdq(x_ptr, out_ptr, cnt_ptr, R, C, sxm, sxr, sxc, som, sor, soc, T: tl.constexpr, UE8M0: tl.constexpr):
        m = tl.program_id(2).to(tl.int64)
        rows = tl.program_id(0).to(tl.int64) * T + tl.arange(0, T)[:, None]
        cols = tl.program_id(1).to(tl.int64) * T + tl.arange(0, T)[None, :]
        mask = (rows < R) & (cols < C)  # a partial edge tile: its amax over the elements that exist
        x = tl.load(x_ptr + m * sxm + rows * sxr + cols * sxc, mask=mask, other=0.0).to(tl.float32)
        _count_nonfinite(x, cnt_ptr)
        amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        s = tl.math.div_rn(amax, _E4M3_MAX)  # fp8_scale: amax / 448, or its power-of-two ceiling (from the bits)
        if UE8M0:
            sb = s.to(tl.int32, bitcast=True)
            s = _pow2(tl.where(sb == 0, -127, (((sb + 0x007FFFFF) & 0x7F800000) >> 23) - 127))
        s = tl.where(amax > 0, s, 1.0)
        q = tl.math.div_rn(x, tl.full(x.shape, 1.0, tl.float32) * s)
        q = _cast(tl.minimum(tl.maximum(q, -_E4M3_MAX), _E4M3_MAX), _E4M3_MAX, -6, 3)
        y = q * s
        if out_ptr.dtype.element_ty != tl.float32:
            y = y.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(out_ptr + m * som + rows * sor + cols * soc, y, mask=mask)

    @triton.jit
    def _nvfp4_amax(x_ptr, amax_ptr, R, C, sxm, sxr, sxc, GROUP: tl.constexpr):
        """Each matrix's max |x| as float32 bits: integer order is float order for non-negative floats."""
        pid = tl.program_id(0).to(tl.int64)
        m, row = pid // R, pid % R
        cols = tl.program_id(1).to(tl.int64) * GROUP * 16 + tl.arange(0, GROUP * 16)
        x = tl.load(x_ptr + m * sxm + row * sxr + cols * sxc, mask=cols < C, other=0.0).to(tl.float32)
        a = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=0)
        tl.atomic_max(amax_ptr + m, a, mask=a > 0)

    @triton.jit
    def _nvfp4_qdq(
        x_ptr, out_ptr, ts_ptr, cnt_ptr, R, C, sxm, sxr, sxc, som, sor, soc, MODELOPT: tl.constexpr, GROUP: tl.constexpr
    ):
        pid = tl.program_id(0).to(tl.int64)
        m, row = pid // R, pid % R
        cols = tl.program_id(1).to(tl.int64) * GROUP * 16 + tl.arange(0, GROUP)[:, None] * 16 + tl.arange(0, 16)[None, :]
        mask = cols < C  # C is a multiple of 16: whole blocks in or out
        x = tl.load(x_ptr + m * sxm + row * sxr + cols * sxc, mask=mask, other=0.0).to(tl.float32)
        _count_nonfinite(x, cnt_ptr)
        amax = tl.max(tl.abs(x), axis=1)
        t = tl.full(amax.shape, 1.0, tl.float32) * tl.load(ts_ptr + m)  # weight_scale_2 or weight_global_scale
        sb = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32))
        sb = tl.math.div_rn(sb, t) if MODELOPT else sb * t
        sb = _cast(tl.minimum(tl.maximum(sb, _E4M3_MIN_SUB), _E4M3_MAX), _E4M3_MAX, -6, 3)
        sb = tl.where(amax > 0, sb, 1.0)
        total = sb * t if MODELOPT else tl.math.div_rn(sb, t)
        q = tl.math.div_rn(x, tl.full(x.shape, 1.0, tl.float32) * total[:, None])
        # E2M1; _cast saturates at 6 (the torch path's clamp) and keeps the sign (-0 too). A NaN stays NaN as in the
        # torch path: 0 / 0 where weight_global_scale overflowed to inf (a matrix amax below 2688 / FLT_MAX ~ 7.9e-36)
        q = tl.where(q == q, _cast(q, 6.0, 0, 1), q)
        y = q * total[:, None]
        if out_ptr.dtype.element_ty != tl.float32:
            y = y.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(out_ptr + m * som + row * sor + cols * soc, y, mask=mask)
