"""Decoding real quantized tensor sets (gpt-oss MXFP4, DeepSeek FP8, compressed-tensors / ModelOpt NVFP4
and FP8) back to float: each stored layout is built from our encoders' state, then decoded by name."""

import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant import get_format
from fideval.quant.checkpoint import decode_fp8_scaled, decode_tensor_set
from fideval.quant.mx import pack_fp4

F8 = torch.float8_e4m3fn


def test_decode_tensor_set_all_conventions():
    g = torch.Generator().manual_seed(0)
    x3 = torch.randn(2, 8, 64, generator=g)
    mx = get_format("mxfp4").encode(x3, "rceil")
    fp8 = get_format("fp8_block").encode(torch.randn(200, 160, generator=g))
    nv_ct = get_format("nvfp4").encode(torch.randn(8, 64, generator=g), "compressed_tensors")
    nv_mo = get_format("nvfp4").encode(torch.randn(8, 64, generator=g), "modelopt")
    w8 = torch.randn(6, 32, generator=g).to(F8)
    ch_scale = torch.rand(6, 1, generator=g) + 0.5
    norm = torch.randn(64, generator=g)
    tensors = {
        "m.experts.gate_up_proj_blocks": pack_fp4(mx.codes).reshape(2, 8, 2, 16),
        "m.experts.gate_up_proj_scales": mx.scales,
        "a.weight": fp8.codes.view(F8), "a.weight_scale_inv": fp8.scales,
        "b.weight_packed": pack_fp4(nv_ct.codes), "b.weight_scale": nv_ct.scales.view(F8),
        "b.weight_global_scale": nv_ct.extra["weight_global_scale"].reshape(1), "b.input_global_scale": torch.ones(1),
        "c.weight": pack_fp4(nv_mo.codes), "c.weight_scale": nv_mo.scales.view(F8),
        "c.weight_scale_2": nv_mo.extra["weight_scale_2"], "c.input_scale": torch.ones(()),
        "d.weight": w8, "d.weight_scale": ch_scale,
        "norm.weight": norm,
    }
    out = decode_tensor_set(tensors)
    assert sorted(out) == ["a.weight", "b.weight", "c.weight", "d.weight", "m.experts.gate_up_proj", "norm.weight"]
    assert torch.equal(out["m.experts.gate_up_proj"], get_format("mxfp4").decode(mx))
    assert torch.equal(out["a.weight"], get_format("fp8_block").decode(fp8))
    assert torch.equal(out["b.weight"], get_format("nvfp4").decode(nv_ct))
    assert torch.equal(out["c.weight"], get_format("nvfp4").decode(nv_mo))
    assert torch.equal(out["d.weight"], w8.float() * ch_scale)
    assert out["norm.weight"] is norm


def test_fp8_scaled_per_tensor_and_block():
    w = torch.randn(256, 128).to(F8)
    assert torch.equal(decode_fp8_scaled(w, torch.tensor(0.5)), w.float() * 0.5)
    s = torch.rand(2, 1) + 0.5  # [ceil(256/128), ceil(128/128)]: one scale per 128x128 block
    assert torch.equal(decode_fp8_scaled(w, s), w.float() * s.repeat_interleave(128, 0))
    per_channel = torch.rand(256, 1) + 0.5
    assert torch.equal(decode_fp8_scaled(w, per_channel), w.float() * per_channel)


def test_incomplete_nvfp4_set_is_one_line_error():
    with pytest.raises(FidevalError, match="b.weight_packed: NVFP4 weight without b.weight_global_scale"):
        decode_tensor_set({"b.weight_packed": torch.zeros(2, 8, dtype=torch.uint8), "b.weight_scale": torch.zeros(2, 1)})
