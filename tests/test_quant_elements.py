"""Element casts and code tables against independent implementations: ml_dtypes' float4/6/8 types and
torch's float8 dtypes. Every representable value, every tie, saturation, the sign of zero."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant.elements import (
    E2M1,
    E2M3,
    E3M2,
    E4M3,
    E5M2,
    cast,
    ceil_pow2_exponent,
    check_finite,
    code_table,
    e8m0_decode,
    e8m0_encode,
    floor_log2,
    from_codes,
    pow2,
    to_codes,
)

ML = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FORMATS = [E2M1, E2M3, E3M2, E4M3, E5M2]


def ml_table(fmt):
    return np.arange(1 << fmt.bits, dtype=np.uint8).view(ML[fmt.name]).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_code_table_matches_ml_dtypes(fmt):
    ours = code_table(fmt).numpy()
    ref = ml_table(fmt)
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(ours[ok], ref[ok])
    assert np.array_equal(np.signbit(ours[ok]), np.signbit(ref[ok]))  # -0 codes too
    assert float(np.nanmax(np.where(np.isinf(ref), np.nan, ref))) == fmt.max


@pytest.mark.parametrize("dt,fmt", [(torch.float8_e4m3fn, E4M3), (torch.float8_e5m2, E5M2)])
def test_code_table_matches_torch_float8(dt, fmt):
    ref = torch.arange(256, dtype=torch.uint8).view(dt).float()
    ours = code_table(fmt)
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    assert torch.equal(ours.nan_to_num(0, 1e30, -1e30), ref.nan_to_num(0, 1e30, -1e30))


def finite_grid(fmt):
    t = code_table(fmt)
    return t[torch.isfinite(t)]


def probe_values(fmt):
    """Every representable value, every midpoint between neighbours (a tie), one float32 ulp either side
    of each midpoint, and random values over the whole range."""
    g = torch.unique(finite_grid(fmt).abs())  # sorted, includes 0
    mids = (g[:-1] + g[1:]) / 2  # exact in float32 (neighbours differ by a power of two times an integer)
    up = torch.nextafter(mids, torch.full_like(mids, math.inf))
    dn = torch.nextafter(mids, torch.zeros_like(mids))
    rnd = torch.rand(4000, generator=torch.Generator().manual_seed(0)) * fmt.max
    rnd_small = torch.rand(1000, generator=torch.Generator().manual_seed(1)) * 2.0**fmt.emin
    pos = torch.cat([g, mids, up, dn, rnd, rnd_small])
    return torch.cat([pos, -pos])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_cast_matches_ml_dtypes_including_ties(fmt):
    x = probe_values(fmt)
    ours = cast(x, fmt).numpy()
    ref = x.numpy().astype(ML[fmt.name]).astype(np.float32)
    assert np.array_equal(ours, ref)
    assert np.array_equal(np.signbit(ours), np.signbit(ref))


@pytest.mark.parametrize("dt,fmt", [(torch.float8_e4m3fn, E4M3), (torch.float8_e5m2, E5M2)])
def test_cast_matches_torch_float8(dt, fmt):
    x = probe_values(fmt)
    assert torch.equal(cast(x, fmt), x.to(dt).float())


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_saturation(fmt):
    big = torch.tensor([fmt.max * 1.01, fmt.max * 1000, 3e38, -fmt.max * 1.5, -3e38])
    assert cast(big, fmt).tolist() == [fmt.max, fmt.max, fmt.max, -fmt.max, -fmt.max]
    if fmt is E2M1:  # ml_dtypes saturates the formats that have no inf/NaN
        assert np.array_equal(cast(big, fmt).numpy(), big.numpy().astype(ML["e2m1"]).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_codes_round_trip_and_match_ml_dtypes_bits(fmt):
    x = probe_values(fmt)
    y = cast(x, fmt)
    codes = to_codes(y, fmt)
    assert torch.equal(from_codes(codes, fmt), y)
    ref_codes = x.numpy().astype(ML[fmt.name]).view(np.uint8)
    assert np.array_equal(codes.numpy(), ref_codes)


def test_bf16_input_is_cast_like_its_float32_value():
    x = torch.randn(2000, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16) * 3
    for fmt in FORMATS:
        assert torch.equal(cast(x, fmt), cast(x.float(), fmt))


def test_pow2_is_exact_including_subnormals():
    e = torch.arange(-149, 128)
    assert pow2(e).tolist() == [math.ldexp(1.0, int(k)) for k in e]


def test_floor_log2_from_bits_where_log2_rounds_up():
    # The largest float32 below 2**k: log2 of it rounds to k in float32, the bits say k - 1.
    k = torch.arange(-100, 100, dtype=torch.float32)
    below = torch.nextafter(torch.exp2(k), torch.zeros_like(k))
    assert torch.equal(floor_log2(below), (k - 1).to(torch.int32))
    assert torch.equal(floor_log2(torch.exp2(k)), k.to(torch.int32))
    naive = np.floor(np.log2(below.numpy()))
    assert (naive != (k - 1).numpy()).any()  # why we never use log2: it is wrong here
    sub = torch.tensor([1e-45, 2.0**-140, 2.0**-127 * 1.5])
    assert floor_log2(sub).tolist() == [-149, -140, -127]


def test_e8m0_decode_matches_torch_and_ml_dtypes():
    codes = torch.arange(256, dtype=torch.uint8)
    ours = e8m0_decode(codes)
    ref_ml = codes.numpy().view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(ours.numpy(), ref_ml, equal_nan=True)
    if hasattr(torch, "float8_e8m0fnu"):
        assert torch.equal(ours.nan_to_num(7.0), codes.view(torch.float8_e8m0fnu).float().nan_to_num(7.0))
    assert torch.equal(e8m0_encode(torch.tensor([-200, -127, 0, 127, 300])), torch.tensor([0, 0, 127, 254, 254], dtype=torch.uint8))


def test_ceil_pow2_exponent_against_exact_python():
    g = torch.Generator().manual_seed(3)
    x = torch.cat([
        torch.exp2(torch.randint(-140, 120, (3000,), generator=g).float()) * (1 + torch.rand(3000, generator=g)),
        torch.exp2(torch.arange(-120, 120).float()),
        torch.nextafter(torch.exp2(torch.arange(-120, 120).float()), torch.tensor(math.inf)),
        torch.nextafter(torch.exp2(torch.arange(-120, 120).float()), torch.tensor(0.0)),
    ])
    ours = ceil_pow2_exponent(x).tolist()
    for v, e in zip(x.tolist(), ours):
        m, ex = math.frexp(v)  # v = m * 2**ex, m in [0.5, 1)
        want = ex - 1 if m == 0.5 else ex
        want = max(want, -126)  # subnormals round up to the smallest normal, as the bit trick does
        assert e == want, v
    assert ceil_pow2_exponent(torch.tensor([0.0])).tolist() == [-127]


def test_nan_inf_is_one_line_error():
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(FidevalError) as ei:
            check_finite(torch.tensor([1.0, bad]), "format mxfp4")
        assert "\n" not in str(ei.value) and "NaN/Inf" in str(ei.value)
