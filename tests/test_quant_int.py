"""Integer group-wise RTN against a numpy reference (float16 scales, half-to-even rounding)."""

import numpy as np
import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant import get_format, quant_dequant


def ref_int(x: np.ndarray, bits: int, recipe: str, g: int) -> np.ndarray:
    b = x.reshape(-1, g).astype(np.float32)
    if recipe == "sym":
        qmax = 2 ** (bits - 1) - 1
        s = (np.abs(b).max(1, keepdims=True) / np.float32(qmax)).astype(np.float16).astype(np.float32)
        s[s == 0] = 1
        q = np.clip(np.rint(b / s), -qmax - 1, qmax)
        return (q * s).reshape(x.shape)
    top = 2**bits - 1
    mn, mx = b.min(1, keepdims=True), b.max(1, keepdims=True)
    s = ((mx - mn) / np.float32(top)).astype(np.float16).astype(np.float32)
    s[s == 0] = 1
    z = np.clip(np.rint(-mn / s), 0, top)
    q = np.clip(np.rint(b / s) + z, 0, top)
    return ((q - z) * s).reshape(x.shape)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("recipe", ["sym", "asym"])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_matches_numpy_reference(bits, recipe, group):
    g = np.random.default_rng(bits * 1000 + group)
    x = (g.standard_normal((16, 256)) * np.exp(g.uniform(-3, 3, (16, 1)))).astype(np.float32)
    x[0, :group] = 0
    x[1, :group] = 0.3  # constant group
    x[2, :8] = np.arange(8) - 3.5  # ties after scaling
    ours = quant_dequant(torch.from_numpy(x), f"int{bits}", recipe, group).numpy()
    assert np.array_equal(ours, ref_int(x, bits, recipe, group))


def test_codes_in_range_and_error_bound():
    x = torch.randn(8, 128)
    for bits in (4, 8):
        for recipe in ("sym", "asym"):
            fmt = get_format(f"int{bits}")
            e = fmt.encode(x, recipe, 32)
            lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if recipe == "sym" else (0, 2**bits - 1)
            assert int(e.codes.min()) >= lo and int(e.codes.max()) <= hi
            err = (fmt.decode(e) - x).abs().reshape(-1, 32)
            s = e.scales.float().reshape(-1, 1)
            # sym: half a step; asym: the zero point is rounded too, so up to one step at the clipped ends
            bound = 0.5 if recipe == "sym" else 1.0
            assert bool((err <= s * bound * (1 + 1e-3)).all())


def test_bits_per_weight():
    assert get_format("int4").bits_per_weight(128, "sym") == 4 + 16 / 128
    assert get_format("int4").bits_per_weight(32, "asym") == 4 + 20 / 32
    assert get_format("int8").bits_per_weight(64, "sym") == 8 + 16 / 64


def test_bad_group():
    with pytest.raises(FidevalError, match="block of 96 does not divide"):
        quant_dequant(torch.zeros(2, 128), "int4", group=96)
    with pytest.raises(FidevalError, match="group 0 is not allowed"):
        quant_dequant(torch.zeros(2, 128), "int4", group=0)
