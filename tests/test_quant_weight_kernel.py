"""The weight quant-dequant kernels (fideval.quant.weight_kernel) give the torch path's bits for every MX format and
recipe, for fp8_block and for nvfp4 (both recipes): on the GPU through ``quant_dequant`` (bf16 included, fused
[E, out, in] tensors, in place and through a transposed ``out``), and on the CPU under Triton's interpreter. The
interpreter's own float32 -> bfloat16 conversion truncates: MX results (at most 4 significant bits) convert exactly,
so MX is checked in bfloat16 there too, while fp8_block's ``fp32`` recipe (q * s has up to 28 bits) and nvfp4 (E2M1 x
E4M3 x a float32 tensor scale) are checked in bfloat16 on the GPU only; a test pins that caveat (the interpreted bf16
result is the truncation of the float32 one), so it is noticed when Triton fixes it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant import get_format

MX = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2")
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def mx_inputs(dtype: torch.dtype, device: str, rows: int = 8, cols: tuple[int, ...] = (32, 64, 7168)):
    """Rows of wildly different ranges, an all-zero block, -0.0 (and a block of them), values that land in element
    subnormals, blocks whose amax has mantissa >= 1.5 (floor saturates), amax at and next to elem.max * 2**k (the
    rceil boundary) and powers of two, float32 subnormals (scale exponent clamped at -127) and near-overflow values."""
    g = torch.Generator().manual_seed(5)
    for c in cols:
        x = torch.randn(rows, c, generator=g) * torch.exp(torch.randn(rows, 1, generator=g) * 4)
        x[0, :32] = 0
        x[1, 3] = -0.0
        x[1, -32:] = torch.tensor([0.0, -0.0]).repeat(16)
        x[2, :32] = torch.randn(32, generator=g) * 1e-3
        x[2, 0] = 1.0  # the rest are element subnormals or zeros
        x[3, :32] = torch.randn(32, generator=g)
        x[3, 0] = -1.75 * 2.0**5  # mantissa 1.75: saturates under floor
        x[3, 1] = 1.99 * 2.0**-9
        k = torch.arange(32, dtype=torch.float32) - 16
        p2 = torch.exp2(k)
        x[4, :32] = p2 * torch.where(k % 2 == 0, 1.0, 1.0 - 2.0**-24)  # powers of two and the float below
        x[5, :32] = torch.randn(32, generator=g).clamp(-1, 1)
        x[5, 0] = 6.0 * 2.0**-3  # amax = elem.max * 2**k for E2M1 (and next to it below)
        x[6, :32] = torch.randn(32, generator=g).clamp(-1, 1)
        x[6, 0] = torch.nextafter(torch.tensor(448.0 * 2.0**-8), torch.tensor(1e9))
        if dtype == torch.float32:
            x[7, :32] = torch.randn(32, generator=g) * 1e-40  # float32 subnormals
            if c >= 64:
                x[7, 32:64] = torch.randn(32, generator=g).clamp(-3, 3) * 1e38
        x = x.clamp(-6e4, 6e4) if dtype == torch.float16 else x  # finite in float16
        yield x.to(dtype).to(device)


def fp8_inputs(dtype: torch.dtype, device: str):
    """Partial edge tiles both ways, experts of different ranges, an all-zero tile, a tile of tiny values, a vector."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 200, 130, generator=g) * torch.exp(torch.randn(2, 200, 1, generator=g) * 3)
    x[1] *= 30
    x[0, :128, :128] = 0
    x[0, 128:, :128] *= 1e-6
    x[1, 0, 0] = -0.0
    yield x.clamp(-6e4, 6e4).to(dtype).to(device)
    yield (torch.randn(130, generator=g) * 5).to(dtype).to(device)


def nvfp4_inputs(dtype: torch.dtype, device: str):
    """[E, out, in] with experts of very different ranges (one per-expert tensor scale each), an all-zero block (with
    -0.0 in it), an all-zero expert (tensor amax 0), blocks far below their expert's amax (E4M3 subnormal block scales,
    and ones clamped at 2**-9), E2M1 subnormals (0.5), -0.0, in float32 an expert whose tensor scale and outputs are
    float32 subnormals; a [2, 4, 1040] tensor (a second, partial program per row), a 4-D tensor and a vector."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 8, 64, generator=g) * torch.exp(torch.randn(4, 8, 1, generator=g) * 2)
    x *= torch.tensor([1.0, 300.0, 0.0, 1e-3]).reshape(4, 1, 1)  # expert 2: all zero
    x[0, 0, :16] = torch.tensor([0.0, -0.0]).repeat(8)
    x[0, 1, 3] = -0.0
    amax = float(x[0].abs().max())
    x[0, 2, :16] = torch.randn(16, generator=g).clamp(-1, 1) * amax * 1e-5  # E4M3-subnormal block scale
    x[0, 2, 16:32] = torch.randn(16, generator=g).clamp(-1, 1) * amax * 1e-7  # block scale clamped at 2**-9
    x[0, 3, :16] = torch.tensor([6.0, 0.25, 0.5, 0.75, -0.25, 1.25, 1.75, 2.5, -3.5, 5.0, 0.1, -0.3, 0.0, 4.4, 2.9, 1.0])
    if dtype == torch.float32:
        x[3] = torch.randn(8, 64, generator=g).clamp(-1, 1) * 3e-35  # weight_scale_2 ~1e-38: subnormal
        x[3, 0, :16] *= 1e-5  # an E4M3-subnormal block scale times a subnormal one
    yield x.clamp(-6e4, 6e4).to(dtype).to(device)
    big = torch.randn(2, 4, 1040, generator=g) * torch.exp(torch.randn(2, 4, 1, generator=g) * 2)
    yield big.to(dtype).to(device)
    yield (torch.randn(2, 2, 4, 32, generator=g) * torch.tensor([1.0, 50.0]).reshape(2, 1, 1, 1)).to(dtype).to(device)
    yield (torch.randn(48, generator=g) * 5).to(dtype).to(device)


_INTERPRETED = """
import sys
import torch
from fideval.errors import FidevalError
from fideval.quant import get_format, weight_kernel as wk
from fideval.quant.nvfp4 import tensor_scale
sys.path.insert(0, sys.argv[1])
from test_quant_weight_kernel import BITS, MX, fp8_inputs, mx_inputs, nvfp4_inputs
bad = []
def same(a, b, what):
    if not torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype])):
        bad.append((what, str(a.dtype), tuple(a.shape), float((a.float() - b.float()).abs().max())))
for name in MX:
    f = get_format(name)
    for r in f.recipes:
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            for x in mx_inputs(dt, "cpu", cols=(32, 64, 448)):  # 448: 7168 / 16, a partial program
                out = torch.empty_like(x)
                assert wk.mx_qdq(x, out, f.elem, r, name)
                same(out, f.quant_dequant(x, r), (name, r))
        x = next(mx_inputs(torch.float32, "cpu", cols=(64,))).reshape(2, 4, 64)  # [E, out, in], in place, transposed out
        ref = f.quant_dequant(x, r)
        own = x.clone()
        assert wk.mx_qdq(own, own, f.elem, r, name)
        same(own, ref, (name, r, "in place"))
        stored = torch.empty(2, 64, 4)
        assert wk.mx_qdq(x, stored.transpose(1, 2), f.elem, r, name)
        same(stored.transpose(1, 2), ref, (name, r, "transposed out"))
f = get_format("fp8_block")
for r in f.recipes:
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for x in fp8_inputs(dt, "cpu"):
            out = torch.empty_like(x)
            assert wk.fp8_block_qdq(x, out, r, 128, "fp8_block")
            if dt == torch.bfloat16 and r == "fp32":  # the caveat: interpreted bf16 = float32 result truncated
                y32 = torch.empty_like(x, dtype=torch.float32)
                assert wk.fp8_block_qdq(x.float(), y32, r, 128, "fp8_block")
                same(out, (y32.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16), ("fp8", r, "truncates"))
                assert not torch.equal(out, y32.bfloat16()), "the interpreter now rounds bf16: check it in the loop above"
            else:
                same(out, f.quant_dequant(x, r), ("fp8_block", r))
    x = next(fp8_inputs(torch.float32, "cpu"))
    own = x.clone()
    assert wk.fp8_block_qdq(own, own, r, 128, "fp8_block")
    same(own, f.quant_dequant(x, r), ("fp8_block", r, "in place"))
f = get_format("nvfp4")
for r in f.recipes:
    for dt in (torch.float32, torch.float16):  # bf16: on the GPU only (the interpreter truncates; see the docstring)
        for x in [*mx_inputs(dt, "cpu", cols=(32, 448)), *nvfp4_inputs(dt, "cpu")]:
            out = torch.empty_like(x)
            assert wk.nvfp4_qdq(x, out, r, "nvfp4", tensor_scale)
            same(out, f.quant_dequant(x, r), ("nvfp4", r))
    x = next(nvfp4_inputs(torch.float32, "cpu"))
    ref = f.quant_dequant(x, r)
    own = x.clone()
    assert wk.nvfp4_qdq(own, own, r, "nvfp4", tensor_scale)
    same(own, ref, ("nvfp4", r, "in place"))
    stored = torch.empty(x.shape[0], x.shape[2], x.shape[1])
    assert wk.nvfp4_qdq(x, stored.transpose(1, 2), r, "nvfp4", tensor_scale)
    same(stored.transpose(1, 2), ref, ("nvfp4", r, "transposed out"))
x = torch.randn(2, 32) * 1e-37  # compressed_tensors: weight_global_scale overflows to inf; the torch path gives NaN
x[0, :16] = 0  # for zeros (0 / 0): the kernel too, the other values equal
out = torch.empty_like(x)
assert wk.nvfp4_qdq(x, out, "compressed_tensors", "nvfp4", tensor_scale)
ref = f.quant_dequant(x, "compressed_tensors")
nan = ref.isnan()
if not (nan.any() and torch.equal(nan, out.isnan()) and torch.equal(out[~nan].view(torch.int32), ref[~nan].view(torch.int32))):
    bad.append(("nvfp4 tiny amax", out, ref))
kernels = {"mxfp4": lambda x, n: wk.mx_qdq(x, torch.empty_like(x), get_format(n).elem, "floor", n),
           "fp8_block": lambda x, n: wk.fp8_block_qdq(x, torch.empty_like(x), "fp32", 128, n),
           "nvfp4": lambda x, n: wk.nvfp4_qdq(x, torch.empty_like(x), "compressed_tensors", n, tensor_scale)}
for name, kernel in kernels.items():  # NaN/Inf: check_finite's own one-line error
    f = get_format(name)
    x = torch.randn(4, 256)
    x[1, 7], x[2, 100], x[3, 255] = float("nan"), float("inf"), -float("inf")
    msgs = []
    for run in (lambda: f.quant_dequant(x), lambda: kernel(x, name)):
        try:
            run()
        except FidevalError as e:
            msgs.append(str(e))
    if len(msgs) != 2 or msgs[0] != msgs[1] or "3 NaN/Inf" not in msgs[0]:
        bad.append(("nan", name, msgs))
print(bad)
sys.exit(1 if bad else 0)
"""


def test_kernels_under_triton_interpreter_give_the_torch_bits():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run(
        [sys.executable, "-c", _INTERPRETED, os.path.dirname(__file__)], env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]


def test_cpu_tensors_and_unhandled_layouts_take_the_torch_path():
    from fideval.quant import weight_kernel as wk

    x = torch.randn(4, 64)
    assert not wk.usable(x, x)  # CPU: the torch path
    assert wk.as_3d(torch.randn(2, 3, 4, 64).transpose(0, 1)) is None  # no [M, R, C] view: the torch path
    assert wk.as_3d(torch.randn(64)).shape == (1, 1, 64)
    assert not get_format("mxfp4")._qdq_kernel(x, "floor", 32, torch.empty_like(x))
    assert not get_format("nvfp4")._qdq_kernel(x, "modelopt", 16, torch.empty_like(x))
    assert not get_format("nvfp4")._qdq_kernel(x, "modelopt", 32, torch.empty_like(x))  # not NVFP4's block
    with pytest.raises(FidevalError, match="1 NaN/Inf value"):
        x[0, 0] = float("nan")
        get_format("mxfp4").quant_dequant(x)


@pytest.mark.parametrize("recipe", ["modelopt", "compressed_tensors"])
def test_nvfp4_tensor_scale_against_numpy_float32(recipe):
    """The per-matrix tensor scale that the torch path and the kernel share (fideval.quant.nvfp4.tensor_scale) against
    numpy float32: modelopt's weight_scale_2 = amax / 2688 correctly rounded; compressed_tensors' weight_global_scale
    = 2688 / amax as torch computes a Python float over a tensor, the reciprocal then the product; 1 for amax 0."""
    import numpy as np

    from fideval.quant.nvfp4 import tensor_scale

    amax = torch.tensor([0.0, 1e-40, 3e-35, 2.0**-100, 1.0, 5.5, 448.0 * 6, 12345.678, 3e38])
    got = tensor_scale(amax, recipe).numpy()
    a = amax.numpy().astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        if recipe == "modelopt":
            want = np.where(a == 0, np.float32(1), a / np.float32(2688))
        else:
            want = np.where(a == 0, np.float32(1), (np.float32(1) / a) * np.float32(2688))
    assert np.array_equal(got.view(np.int32), want.astype(np.float32).view(np.int32)), (got, want)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _gpu_cases():
    return [(n, r) for n in (*MX, "fp8_block", "nvfp4") for r in get_format(n).recipes]


def _inputs(name: str, dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    if name == "nvfp4":
        return [*mx_inputs(dtype, device), *nvfp4_inputs(dtype, device)]
    return list(mx_inputs(dtype, device) if name in MX else fp8_inputs(dtype, device))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("name,recipe", _gpu_cases())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kernel_on_the_gpu_gives_the_torch_bits(name, recipe, dtype):
    f = get_format(name)
    g = torch.Generator().manual_seed(3)
    inputs = _inputs(name, dtype, "cuda")
    big = torch.randn(3, 512, 7168, generator=g) * torch.exp(torch.randn(3, 512, 1, generator=g) * 2)
    inputs.append(big.to(dtype).cuda())  # [E, out, in]
    for x in inputs:
        out = torch.empty_like(x)
        assert f._qdq_kernel(x, recipe, f.default_group, out)  # the kernel ran (not the fallback)
        ref = f.quant_dequant(x, recipe, kernel=False)
        assert torch.equal(out.view(BITS[dtype]), ref.view(BITS[dtype])), (x.shape, float((out.float() - ref.float()).abs().max()))
        assert torch.equal(f.quant_dequant(x, recipe).view(BITS[dtype]), ref.view(BITS[dtype]))
    x = inputs[-1]
    ref = f.quant_dequant(x, recipe, kernel=False)
    own = x.clone()
    assert f.quant_dequant(own, recipe, out=own) is own and torch.equal(own, ref)
    stored = x.transpose(-1, -2).contiguous()  # gpt-oss's on-disk [E, in, out], shown to the format as [E, out, in]
    view = stored.transpose(-1, -2)
    f.quant_dequant(view, recipe, out=view)
    assert torch.equal(stored.transpose(-1, -2), ref)
    x = x.clone()
    x[1, 5, 9] = float("nan")
    with pytest.raises(FidevalError, match=f"format {name}: 1 NaN/Inf value"):
        f.quant_dequant(x, recipe)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("name", ["mxfp4", "mxfp8_e4m3", "fp8_block", "nvfp4", "int4", "int8"])
def test_the_torch_path_on_cuda_gives_the_cpu_bits(name):
    """Every scale a format computes by dividing divides by a tensor: torch's CUDA kernel multiplies by the reciprocal
    of a Python scalar divisor, which put CUDA an ulp away from the CPU (and the producers) in a third to two thirds of
    quotients; the kernels' oracle is the torch path, so the torch path must be the CPU's on CUDA too."""
    f = get_format(name)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 2048, generator=g) * torch.exp(torch.randn(64, 1, generator=g) * 3)
    for recipe in f.recipes:
        cpu = f.quant_dequant(x, recipe, kernel=False)
        gpu = f.quant_dequant(x.cuda(), recipe, kernel=False).cpu()
        assert torch.equal(cpu.view(torch.int32), gpu.view(torch.int32)), (recipe, float((cpu - gpu).abs().max()))
