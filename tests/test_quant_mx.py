"""OCP MX formats: hand-derived vectors from the MX v1.0 spec (see docs/quant.md, "MX test vectors"),
and random blocks against an independent per-block reference (python exponents + ml_dtypes / torch casts)."""

import math
import zlib

import ml_dtypes
import numpy as np
import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant import get_format, quant_dequant
from fideval.quant.mx import decode_gpt_oss_mxfp4, pack_fp4, unpack_fp4


def block(*vals):
    x = torch.zeros(32)
    x[: len(vals)] = torch.tensor(vals, dtype=torch.float32)
    return x.reshape(1, 32)


def enc(x, recipe, name="mxfp4"):
    e = get_format(name).encode(x, recipe)
    return int(e.scales[0, 0]), e.codes[0].tolist(), get_format(name).decode(e)[0]


@pytest.mark.parametrize("recipe", ["floor", "rceil"])
def test_ties_to_even_at_scale_one(recipe):
    # amax 6 -> floor: floor(log2 6) - emax(2) = 0; rceil: 6/6 = 1 -> 2**0. E8M0 code 127.
    x = block(6, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25, -5, -0.0)
    code, codes, y = enc(x, recipe)
    assert code == 127
    assert codes[:9] == [0b0111, 0b0110, 0b0100, 0b0100, 0b0010, 0b0010, 0b0000, 0b1110, 0b1000]
    assert y[:9].tolist() == [6, 4, 2, 2, 1, 1, 0, -4, -0.0]


def test_floor_saturates_where_rceil_moves_the_scale():
    x = block(7.0, 1.0)
    code, codes, y = enc(x, "floor")
    assert (code, y[0].item(), y[1].item()) == (127, 6.0, 1.0)  # 7 clipped to 6
    code, codes, y = enc(x, "rceil")
    assert (code, y[0].item(), y[1].item()) == (128, 8.0, 1.0)  # 7/6 -> scale 2; 3.5 ties to 4 -> 8


def test_amax_at_power_of_two_plus_minus_one_ulp():
    p = 2.0**-10
    below = float(np.nextafter(np.float32(p), np.float32(0)))
    above = float(np.nextafter(np.float32(p), np.float32(1)))
    # exactly 2**-10: both recipes give 2**-12 (code 115) and element 4
    assert enc(block(p), "floor")[0] == 115 and enc(block(p), "floor")[2][0].item() == p
    assert enc(block(p), "rceil")[0] == 115 and enc(block(p), "rceil")[2][0].item() == p
    # one ulp below: floor drops a binade (code 114) and saturates to 6 * 2**-13; rceil keeps 115 and rounds to 4
    c, _, y = enc(block(below), "floor")
    assert c == 114 and y[0].item() == 6 * 2.0**-13
    c, _, y = enc(block(below), "rceil")
    assert c == 115 and y[0].item() == p
    # one ulp above: both 115, element rounds back to 4
    assert enc(block(above), "floor")[0] == 115 and enc(block(above), "rceil")[0] == 115


def test_rceil_boundary_is_exactly_six_times_a_power_of_two():
    for k in (-20, -3, 0, 5):
        six = 6 * 2.0**k
        assert enc(block(six), "rceil")[0] == 127 + k
        assert enc(block(float(np.nextafter(np.float32(six), np.float32(np.inf)))), "rceil")[0] == 128 + k
        assert enc(block(six), "floor")[0] == 127 + k


def test_all_zero_block_and_mixed_blocks():
    x = torch.cat([torch.zeros(1, 32), torch.randn(1, 32)], dim=1)
    for recipe in ("floor", "rceil"):
        e = get_format("mxfp4").encode(x, recipe)
        assert int(e.scales[0, 0]) == 0 and int(e.codes[0, :32].max()) == 0
        assert torch.equal(get_format("mxfp4").decode(e)[0, :32], torch.zeros(32))


def test_mxfp8_e4m3_hand_vector():
    assert enc(block(448.0, 1.0), "floor", "mxfp8_e4m3")[0] == 127
    c, _, y = enc(block(500.0, 1.0), "floor", "mxfp8_e4m3")
    assert c == 127 and y[0].item() == 448.0  # saturated
    c, _, y = enc(block(500.0, 1.0), "rceil", "mxfp8_e4m3")
    assert c == 128 and y[0].item() == 512.0  # 250 rounds to 256 in the [128, 256) binade (step 16)


ELEMS = {"mxfp4": (ml_dtypes.float4_e2m1fn, 6.0, 2), "mxfp6_e2m3": (ml_dtypes.float6_e2m3fn, 7.5, 2),
         "mxfp6_e3m2": (ml_dtypes.float6_e3m2fn, 28.0, 4), "mxfp8_e4m3": (torch.float8_e4m3fn, 448.0, 8),
         "mxfp8_e5m2": (torch.float8_e5m2, 57344.0, 15)}


def reference_mx(x: np.ndarray, name: str, recipe: str) -> np.ndarray:
    """Independent per-block MX quant-dequant: exponents in python from math.frexp, element casts by
    ml_dtypes (FP4/FP6) or torch's float8 dtypes, after clamping to the element max."""
    dt, emax_val, emax = ELEMS[name]
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 32):
            blk = x[r, b : b + 32]
            amax = float(np.abs(blk).max())
            if amax == 0:
                e = -127
            elif recipe == "floor":
                e = math.frexp(amax)[1] - 1 - emax
            else:
                s = float(np.float32(amax) / np.float32(emax_val))
                m, ex = math.frexp(s)
                e = ex - 1 if m == 0.5 else ex
            e = max(-127, min(127, e))
            q = np.clip(blk / np.float32(2.0**e), -emax_val, emax_val).astype(np.float32)
            if isinstance(dt, torch.dtype):
                qv = torch.from_numpy(q).to(dt).float().numpy()
            else:
                qv = q.astype(dt).astype(np.float32)
            out[r, b : b + 32] = qv * np.float32(2.0**e)
    return out


@pytest.mark.parametrize("name", list(ELEMS))
@pytest.mark.parametrize("recipe", ["floor", "rceil"])
def test_random_blocks_match_independent_reference(name, recipe):
    g = np.random.default_rng(zlib.crc32(f"{name}/{recipe}".encode()))
    x = (g.standard_normal((6, 128)) * np.exp(g.uniform(-8, 8, (6, 1)))).astype(np.float32)
    x[0, :32] = 0
    x[1, 5] = 2.0**-3  # exact power of two as amax
    ours = quant_dequant(torch.from_numpy(x), name, recipe).numpy()
    assert np.array_equal(ours, reference_mx(x, name, recipe))


def test_bf16_in_bf16_out_and_3d():
    w = torch.randn(2, 4, 64).to(torch.bfloat16)
    y = quant_dequant(w, "mxfp4", "rceil")
    assert y.dtype == torch.bfloat16 and y.shape == w.shape
    assert torch.equal(y.float(), quant_dequant(w.float(), "mxfp4", "rceil"))  # MXFP4 values fit in bf16


def test_gpt_oss_layout_decode():
    # two codes per byte, low nibble first: 0x21 -> codes [1, 2] -> [0.5, 1.0]; scale code 128 -> x2
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0] = 0x21
    blocks[0, 0, 1] = 0xF7  # [6, -6]
    scales = torch.tensor([[128]], dtype=torch.uint8)
    y = decode_gpt_oss_mxfp4(blocks, scales)
    assert y.shape == (1, 32) and y[0, :4].tolist() == [1.0, 2.0, 12.0, -12.0]
    # and it agrees with our own encoder's state, re-packed
    x = torch.randn(3, 64)
    e = get_format("mxfp4").encode(x, "rceil")
    packed = pack_fp4(e.codes).reshape(3, 2, 16)
    assert torch.equal(unpack_fp4(pack_fp4(e.codes)), e.codes)
    assert torch.equal(decode_gpt_oss_mxfp4(packed, e.scales), get_format("mxfp4").decode(e))
    with pytest.raises(FidevalError, match="do not match"):
        decode_gpt_oss_mxfp4(packed, e.scales[:, :1])


def test_bad_inputs():
    with pytest.raises(FidevalError, match="unknown recipe 'round'"):
        quant_dequant(torch.zeros(1, 32), "mxfp4", recipe="round")
    with pytest.raises(FidevalError, match="group 16 is not allowed"):
        quant_dequant(torch.zeros(1, 32), "mxfp4", group=16)
    with pytest.raises(FidevalError, match="does not divide the last dimension 40"):
        quant_dequant(torch.zeros(1, 40), "mxfp4")
    with pytest.raises(FidevalError, match="unknown quant format 'mxfp3'"):
        quant_dequant(torch.zeros(1, 32), "mxfp3")
    with pytest.raises(FidevalError, match="NaN/Inf"):
        quant_dequant(torch.full((1, 32), float("inf")), "mxfp4")
