"""The torch stand-ins for DeepSeek-V3's Triton kernels (fideval.model.reference.deepseek_v3_kernels) against float64
references written here, fideval's own FP8 block dequantization (fideval.quant.fp8, the FP8-release path) and,
on a GPU, the vendor's own Triton kernels (skipped without CUDA)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ref_deepseek_v3 import V3_CODE

from fideval.model.reference import deepseek_v3_kernels as k


def _fp8(shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("fmt", [None, "ue8m0"])
def test_act_quant_matches_a_float64_reference(fmt):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 256, generator=g) * torch.logspace(-3, 2, 256)
    x[0, 0, :128] = 0.0  # an all-zero block: amax clamped to 1e-4
    y, s = k.act_quant(x, 128, fmt)
    assert y.dtype == torch.float8_e4m3fn and s.shape == (3, 5, 2) and s.dtype == torch.float32
    xb = x.double().numpy().reshape(3, 5, 2, 128)
    amax = np.maximum(np.abs(xb).max(-1), 1e-4)
    want_s = (amax / 448.0).astype(np.float32)
    if fmt == "ue8m0":
        want_s = np.exp2(np.ceil(np.log2(want_s.astype(np.float64)))).astype(np.float32)
    np.testing.assert_array_equal(s.numpy(), want_s)
    q = (xb / want_s.astype(np.float64)[..., None]).reshape(x.shape)
    assert np.abs(q).max() <= 448.0 * (1 + 2 ** -20)  # amax / (amax/448 rounded to float32)
    want_y = torch.from_numpy(q).to(torch.float32).to(torch.float8_e4m3fn)
    assert torch.equal(y.view(torch.uint8), want_y.view(torch.uint8))


@pytest.mark.parametrize("shape", [(256, 384), (144, 256), (300, 200)])
def test_weight_dequant_matches_float64_and_fidevals_fp8_release_path(shape):
    from fideval.quant.fp8 import dequant_blocks

    w = _fp8(shape, seed=1)
    s = torch.rand(math.ceil(shape[0] / 128), math.ceil(shape[1] / 128), generator=torch.Generator().manual_seed(2)) + 0.01
    ref = w.double().numpy() * np.repeat(np.repeat(s.double().numpy(), 128, 0), 128, 1)[:shape[0], :shape[1]]
    old = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.bfloat16):
            torch.set_default_dtype(dtype)
            got = k.weight_dequant(w, s)
            assert got.dtype == dtype
            assert torch.equal(got, torch.from_numpy(ref).to(torch.float32).to(dtype))  # exact product, one rounding
            assert torch.equal(got, dequant_blocks(w, s, (128, 128), dtype))
    finally:
        torch.set_default_dtype(old)


def test_fp8_gemm_matches_a_float64_reference():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 7, 384, generator=g)
    a, a_s = k.act_quant(x)
    b = _fp8((200, 384), seed=5)
    b_s = torch.rand(2, 3, generator=g) + 0.05
    got = k.fp8_gemm(a, a_s, b, b_s)
    assert got.shape == (2, 7, 200) and got.dtype == torch.get_default_dtype()
    A = a.double().numpy() * np.repeat(a_s.double().numpy(), 128, -1)
    B = b.double().numpy() * np.repeat(np.repeat(b_s.double().numpy(), 128, 0), 128, 1)[:200]
    ref = A @ B.T
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=0, atol=2e-6 * np.abs(ref).max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the vendor's Triton kernels need a CUDA GPU")
def test_stand_ins_match_the_vendors_triton_kernels_on_a_gpu():
    if not (V3_CODE / "kernel.py").is_file():
        pytest.skip(f"DeepSeek-V3 reference code not found at {V3_CODE}")
    import importlib.util

    spec = importlib.util.spec_from_file_location("v3_vendor_kernel", V3_CODE / "kernel.py")
    vk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vk)
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(4, 64, 512, generator=g) * 3).to(torch.bfloat16).to(dev)
    for fmt in (None, "ue8m0"):
        y1, s1 = vk.act_quant(x, 128, fmt)
        y2, s2 = k.act_quant(x, 128, fmt)
        assert torch.equal(s1, s2) and torch.equal(y1.view(torch.uint8), y2.view(torch.uint8))
    w = _fp8((384, 512), seed=7).to(dev)
    s = (torch.rand(3, 4, generator=g) + 0.01).to(dev)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)
        assert torch.equal(vk.weight_dequant(w, s), k.weight_dequant(w, s))
        a, a_s = vk.act_quant(x.contiguous())
        c1, c2 = vk.fp8_gemm(a, a_s, w, s).float(), k.fp8_gemm(a, a_s, w, s).float()
        torch.testing.assert_close(c1, c2, rtol=2 ** -7, atol=1e-2 * c1.abs().max().item())  # bf16 output
    finally:
        torch.set_default_dtype(old)
