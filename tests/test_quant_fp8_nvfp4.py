"""FP8 block weights, E4M3 activations and NVFP4 against loop-per-block references built on torch's own
float8 casts and ml_dtypes' float4 (independent of our element code), plus gguf-py's UE4M3 table."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from gguf import quants

from fideval.errors import FidevalError
from fideval.quant import act_quant_e4m3, get_format, quant_dequant
from fideval.quant.elements import E4M3, code_table
from fideval.quant.fp8 import fp8_block_decode
from fideval.quant.mx import pack_fp4
from fideval.quant.nvfp4 import decode_compressed_tensors_nvfp4, nvfp4_decode

F8 = torch.float8_e4m3fn


def ceil_pow2(s: float) -> float:
    m, e = math.frexp(s)
    return 2.0 ** (e - 1 if m == 0.5 else e)


def torch_e4m3(v: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.clip(v, -448, 448).astype(np.float32)).to(F8).float().numpy()


def ref_fp8_block(w: np.ndarray, recipe: str, t: int = 128) -> np.ndarray:
    out = np.empty_like(w)
    for i in range(0, w.shape[0], t):
        for j in range(0, w.shape[1], t):
            tile = w[i : i + t, j : j + t]
            amax = np.float32(np.abs(tile).max())
            s = np.float32(amax / np.float32(448)) if amax > 0 else np.float32(1)
            if recipe == "ue8m0" and amax > 0:
                s = np.float32(ceil_pow2(float(s)))
            out[i : i + t, j : j + t] = torch_e4m3(tile / s) * s
    return out


@pytest.mark.parametrize("recipe", ["fp32", "ue8m0"])
@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (64, 16)])
def test_fp8_block_matches_reference(recipe, shape):
    g = np.random.default_rng(shape[0] + shape[1])
    w = (g.standard_normal(shape) * np.exp(g.uniform(-4, 4, (shape[0], 1)))).astype(np.float32)
    w[:128, :128] = 0  # an all-zero tile
    ours = quant_dequant(torch.from_numpy(w), "fp8_block", recipe)
    assert np.array_equal(ours.numpy(), ref_fp8_block(w, recipe))
    e = get_format("fp8_block").encode(torch.from_numpy(w), recipe)
    assert tuple(e.scales.shape) == (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))  # weight_scale_inv
    # DeepSeek's stored form: a float8_e4m3fn weight plus weight_scale_inv
    stored = e.codes.view(F8)
    assert torch.equal(fp8_block_decode(stored, e.scales), ours)
    if recipe == "ue8m0":
        s = e.scales.flatten()
        assert torch.equal(s, torch.exp2(torch.log2(s).round()))  # powers of two


def test_fp8_block_3d_fused_experts_tile_each_expert():
    w = torch.randn(3, 130, 256)
    y = quant_dequant(w, "fp8_block")
    for k in range(3):
        assert torch.equal(y[k], quant_dequant(w[k], "fp8_block"))


def ref_act(x: np.ndarray, scale: str, block: int = 128) -> np.ndarray:
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], block):
            v = x[r, b : b + block]
            amax = max(np.float32(np.abs(v).max()), np.float32(1e-4))
            s = np.float32(np.float32(amax) / np.float32(448))
            if scale == "ue8m0":
                s = np.float32(ceil_pow2(float(s)))
            out[r, b : b + block] = torch_e4m3(v / s) * s
    return out


@pytest.mark.parametrize("scale", ["fp32", "ue8m0"])
def test_act_quant_matches_reference(scale):
    g = np.random.default_rng(7)
    x = (g.standard_normal((5, 320)) * np.exp(g.uniform(-5, 5, (5, 1)))).astype(np.float32)  # 320: partial block
    x[0] = 0  # amax clamp: finite scale, zeros out
    x[1, :128] = 1e-7
    ours = act_quant_e4m3(torch.from_numpy(x), 128, scale).numpy()
    assert np.array_equal(ours, ref_act(x, scale))
    assert np.isfinite(ours).all() and (ours[0] == 0).all()


@pytest.mark.parametrize("scale", ["fp32", "ue8m0"])
def test_act_quant_in_chunks_of_rows_is_one_pass(monkeypatch, scale):
    """Chunks of whole rows (bounded float32 temporaries) give the one-pass result's bits, partial block included."""
    import fideval.quant.activations as act

    x = (torch.randn(7, 3, 320) * torch.exp(torch.randn(7, 3, 1) * 3)).bfloat16()
    one = act_quant_e4m3(x, 128, scale)
    monkeypatch.setattr(act, "CHUNK_ELEMENTS", 2 * 384)  # two padded rows a chunk: 11 chunks, the last of one row
    assert torch.equal(act_quant_e4m3(x, 128, scale), one)
    ref = torch.from_numpy(ref_act(x.float().reshape(-1, 320).numpy(), scale)).reshape(x.shape).bfloat16()
    assert torch.equal(one, ref)


def test_act_quant_keeps_dtype_and_shape():
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16) * 1000
    y = act_quant_e4m3(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    with pytest.raises(FidevalError, match="activation scale 'e8m0'"):
        act_quant_e4m3(x, scale="e8m0")


def ref_nvfp4(x: np.ndarray, recipe: str):
    amax_t = np.float32(np.abs(x).max())
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 16):
            v = x[r, b : b + 16]
            amax_b = np.float32(np.abs(v).max())
            if recipe == "modelopt":
                ts = np.float32(amax_t / np.float32(2688))
                sb = np.float32(np.float32(amax_b / np.float32(6)) / ts)
            else:
                gs = np.float32(np.float32(2688) / amax_t)
                sb = np.float32(np.float32(amax_b / np.float32(6)) * gs)
            sb8 = torch_e4m3(np.array([max(sb, 2.0**-9)], np.float32))[0] if amax_b > 0 else np.float32(1)
            total = np.float32(sb8 * ts) if recipe == "modelopt" else np.float32(sb8 / gs)
            q = np.clip(v / total, -6, 6).astype(np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
            out[r, b : b + 16] = q * total
    return out


@pytest.mark.parametrize("recipe", ["modelopt", "compressed_tensors"])
def test_nvfp4_matches_reference(recipe):
    g = np.random.default_rng(11)
    x = (g.standard_normal((8, 96)) * np.exp(g.uniform(-6, 3, (8, 1)))).astype(np.float32)
    x[2, :16] = 0
    x[3, 16:32] = x[3, 16:32] * 1e-6  # a block whose scale is far below the tensor's (E4M3 subnormal)
    ours = quant_dequant(torch.from_numpy(x), "nvfp4", recipe).numpy()
    assert np.array_equal(ours, ref_nvfp4(x, recipe))


def test_nvfp4_two_stored_conventions_decode_alike():
    x = torch.randn(4, 64)
    x[0, 0] = 2688 * 2.0**-10  # tensor amax -> weight_scale_2 = 2**-10 exactly, so 1/ws2 is exact too
    x = x.clamp(-x[0, 0], x[0, 0])
    e = get_format("nvfp4").encode(x, "modelopt")
    ws2 = e.extra["weight_scale_2"]
    assert ws2.item() == 2.0**-10
    a = nvfp4_decode(e.codes, e.scales, weight_scale_2=ws2)
    b = nvfp4_decode(e.codes, e.scales, weight_global_scale=1.0 / ws2)
    assert torch.equal(a, b) and torch.equal(a, get_format("nvfp4").decode(e))
    with pytest.raises(FidevalError, match="exactly one"):
        nvfp4_decode(e.codes, e.scales)


def test_compressed_tensors_packed_decode():
    x = torch.randn(6, 64)
    e = get_format("nvfp4").encode(x, "compressed_tensors")
    packed = pack_fp4(e.codes)
    y = decode_compressed_tensors_nvfp4(packed, e.scales.view(F8), e.extra["weight_global_scale"])
    assert torch.equal(y, get_format("nvfp4").decode(e))
    with pytest.raises(FidevalError, match="does not match"):
        decode_compressed_tensors_nvfp4(packed[:, :8], e.scales.view(F8), e.extra["weight_global_scale"])


def test_e4m3_scale_table_matches_gguf_ue4m3():
    # gguf-py's NVFP4 decodes its unsigned E4M3 block scales with a factor 1/2 folded in
    c = np.arange(127, dtype=np.uint8)
    assert np.array_equal((quants.NVFP4.ue4m3_to_fp32(c) * 2).astype(np.float32), code_table(E4M3).numpy()[:127])


def test_nvfp4_bad_group_and_zero_tensor():
    with pytest.raises(FidevalError, match="does not divide"):
        quant_dequant(torch.zeros(2, 24), "nvfp4")
    for recipe in ("modelopt", "compressed_tensors"):
        assert torch.equal(quant_dequant(torch.zeros(2, 32), "nvfp4", recipe), torch.zeros(2, 32))
