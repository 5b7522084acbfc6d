"""The torch stand-ins for DeepSeek-V3.2-Exp's GPU kernels against float64 numpy/scipy references, and on CUDA
against the vendor's own tilelang kernels and the fast_hadamard_transform extension."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch

from fideval.model.reference import deepseek_v32_kernels as K

VENDOR = Path(__file__).resolve().parents[2] / "shared" / "reference-code" / "deepseek-v3.2-exp"
GRID = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64).numpy()
CODES = np.arange(256)
_OK = np.isfinite(GRID)
GRID, CODES = GRID[_OK], CODES[_OK]


def _to_e4m3(v: np.ndarray) -> np.ndarray:
    """Round float64 values (|v| <= 448) to the nearest E4M3 value, ties to the even code (float64 search)."""
    order = np.argsort(GRID, kind="stable")
    g, c = GRID[order], CODES[order]
    g, first = np.unique(g, return_index=True)  # +0/-0 -> one zero
    c = c[first]
    i = np.clip(np.searchsorted(g, v), 1, len(g) - 1)
    lo, hi = g[i - 1], g[i]
    pick_hi = (v - lo > hi - v) | ((v - lo == hi - v) & (c[i] % 2 == 0))
    return np.where(pick_hi, hi, lo)


def _ref_act_quant(x: np.ndarray, ue8m0: bool):
    g = x.reshape(-1, x.shape[-1] // 128, 128).astype(np.float64)
    amax = np.maximum(np.abs(g).max(-1), 1e-4).astype(np.float32)
    prod = (amax * np.float32(1 / 448)).astype(np.float32)  # the kernel's float32 product
    if ue8m0:
        m, e = np.frexp(prod.astype(np.float64))  # prod = m * 2^e, m in [0.5, 1)
        s = np.ldexp(1.0, np.where(m == 0.5, e - 1, e))  # smallest power of two >= prod
    else:
        s = prod.astype(np.float64)
    q = (g.astype(np.float32) / s[..., None].astype(np.float32)).astype(np.float64)  # float32 division, as the kernel
    return _to_e4m3(np.clip(q, -448, 448)).reshape(x.shape), s.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_act_quant_matches_float64_reference(scale_fmt, dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 5, 256, generator=g) * torch.logspace(-6, 3, 256)[torch.randperm(256, generator=g)]).to(dtype)
    x[0, 0, :128] = 0  # an all-zero group: amax floors at 1e-4
    x[1, 1, 5] = 448.0 * 8  # an exact power-of-two multiple of 448
    y, s = K.act_quant(x.contiguous(), 128, scale_fmt)
    assert y.dtype == torch.float8_e4m3fn and y.shape == x.shape
    assert s.dtype == torch.float32 and s.shape == (3, 5, 2)
    ry, rs = _ref_act_quant(x.float().numpy(), scale_fmt is not None)
    np.testing.assert_array_equal(s.numpy().astype(np.float64), rs)
    np.testing.assert_array_equal(y.to(torch.float64).numpy(), ry)
    if scale_fmt is not None:
        assert np.all(np.frexp(s.numpy())[0] == 0.5)  # powers of two
    assert float(s[0, 0, 0]) == pytest.approx(1e-4 / 448 if scale_fmt is None else 2.0 ** -22, rel=1e-6)


def test_fp8_gemm_matches_float64_reference():
    g = torch.Generator().manual_seed(2)
    m, n, k = 7, 200, 384  # N not a multiple of 128: the last block-row of scales is partial
    a, a_s = K.act_quant(torch.randn(m, k, generator=g).to(torch.bfloat16), 128, "ue8m0")
    b = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    b_s = torch.rand(2, 3, generator=g) * 1e-2 + 1e-3
    ref = np.zeros((m, n))
    A, B = a.to(torch.float64).numpy(), b.to(torch.float64).numpy()
    for j in range(3):
        sa = a_s.double().numpy()[:, j:j + 1]
        sb = np.repeat(b_s.double().numpy()[:, j], 128)[:n][None, :]
        ref += (A[:, j * 128:(j + 1) * 128] * sa) @ (B[:, j * 128:(j + 1) * 128].T) * sb
    out32 = K.fp8_gemm(a, a_s, b, b_s)
    assert out32.dtype == torch.get_default_dtype() == torch.float32
    np.testing.assert_allclose(out32.double().numpy(), ref, rtol=2e-6, atol=2e-6 * np.abs(ref).max())
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        out16 = K.fp8_gemm(a, a_s, b, b_s)
    finally:
        torch.set_default_dtype(prev)
    assert out16.dtype == torch.bfloat16  # the vendor allocates its output in the default dtype
    assert torch.equal(out16, out32.to(torch.bfloat16))


def test_fp8_index_matches_float64_reference():
    g = torch.Generator().manual_seed(3)
    b, m, h, n, d = 2, 5, 4, 9, 128
    q, q_scale = K.act_quant(torch.randn(b, m, h, d, generator=g).to(torch.bfloat16), 128, "ue8m0")
    k, k_scale = K.act_quant(torch.randn(b, n, d, generator=g).to(torch.bfloat16), 128, "ue8m0")
    w = torch.randn(b, m, h, 1, generator=g) * q_scale  # the indexer's weights: per-head gate x q scale
    out = K.fp8_index(q, w, k, k_scale)  # k_scale [b, n, 1], as the vendor passes its cache
    assert out.shape == (b, m, n) and out.dtype == torch.float32
    Q, Kd = q.double().numpy(), k.double().numpy()
    logits = np.maximum(np.einsum("bmhd,bnd->bmnh", Q, Kd), 0)
    ref = (logits * w.double().numpy()[:, :, None, :, 0]).sum(-1) * k_scale.double().numpy()[:, None, :, 0]
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("dim", [128, 96, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hadamard_transform_matches_scipy(dim, dtype):
    x = torch.randn(2, 3, dim, generator=torch.Generator().manual_seed(4)).to(dtype)
    out = K.hadamard_transform(x, scale=dim ** -0.5)
    assert out.dtype == dtype and out.shape == x.shape
    width = 1 << max(0, (dim - 1).bit_length())
    xp = np.zeros((6, width))
    xp[:, :dim] = x.double().numpy().reshape(6, dim)
    ref = (xp @ scipy.linalg.hadamard(width).T.astype(np.float64))[:, :dim] * dim ** -0.5
    tol = 1e-6 if dtype == torch.float32 else 8e-3
    np.testing.assert_allclose(out.double().numpy().reshape(6, dim), ref, rtol=tol, atol=tol * np.abs(ref).max())
    if dim == 128 and dtype == torch.float32:  # orthogonal: the indexer's dot products survive the rotation
        y = K.hadamard_transform(K.hadamard_transform(x, dim ** -0.5), dim ** -0.5)
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-6)


def _vendor_kernel():
    if not torch.cuda.is_available():
        pytest.skip("the vendor's tilelang kernels need a CUDA GPU")
    if importlib.util.find_spec("tilelang") is None:
        pytest.skip("tilelang is not installed")
    if not (VENDOR / "kernel.py").is_file():
        pytest.skip(f"vendor code not found at {VENDOR}")
    spec = importlib.util.spec_from_file_location("dsv32_vendor_kernel", VENDOR / "kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_cuda_act_quant_and_gemm_match_vendor_tilelang(scale_fmt):
    vk = _vendor_kernel()
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 512, generator=g) * 3).to(torch.bfloat16).cuda()
    y, s = vk.act_quant(x, 128, scale_fmt)
    y2, s2 = K.act_quant(x, 128, scale_fmt)
    assert torch.equal(s, s2) and torch.equal(y.view(torch.uint8), y2.view(torch.uint8))
    b = (torch.randn(256, 512, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).cuda()
    b_s = (torch.rand(2, 4, generator=g) * 1e-2 + 1e-3).cuda()  # one scale per 128x128 block
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        c, c2 = vk.fp8_gemm(y, s, b, b_s), K.fp8_gemm(y, s, b, b_s)
    finally:
        torch.set_default_dtype(prev)
    torch.testing.assert_close(c.float(), c2.float(), rtol=8e-3, atol=1e-2)  # accumulation order: ~1 bf16 ulp


def test_cuda_fp8_index_matches_vendor_tilelang():
    vk = _vendor_kernel()
    g = torch.Generator().manual_seed(6)
    q, qs = K.act_quant(torch.randn(1, 16, 64, 128, generator=g).to(torch.bfloat16).cuda(), 128, "ue8m0")
    k, ks = K.act_quant(torch.randn(1, 512, 128, generator=g).to(torch.bfloat16).cuda(), 128, "ue8m0")
    w = (torch.randn(1, 16, 64, 1, generator=g).cuda() * qs).contiguous()
    torch.testing.assert_close(vk.fp8_index(q, w, k, ks.contiguous()), K.fp8_index(q, w, k, ks), rtol=1e-5, atol=1e-5)


def test_cuda_hadamard_matches_fast_hadamard_transform():
    if not torch.cuda.is_available() or importlib.util.find_spec("fast_hadamard_transform") is None:
        pytest.skip("fast_hadamard_transform (CUDA extension) is not installed")
    from fast_hadamard_transform import hadamard_transform

    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).cuda()
    torch.testing.assert_close(hadamard_transform(x, scale=128 ** -0.5).float(),
                               K.hadamard_transform(x, 128 ** -0.5).float(), rtol=8e-3, atol=8e-3)
