"""ggml's activation quantization (fideval.quant.ggml_activations) against llama.cpp's own functions.

The oracle is ``tests/data/llamacpp/act_vectors.npz``, written once by ``tools/llamacpp/act_vectors.py``: the raw block
bytes of llama.cpp's ``quantize_row_q8_0/q8_1/q8_K`` (the CPU backend's x86 build and the scalar reference) on 29 rows
of 512. The bytes are parsed here with numpy's structured dtypes (ggml-common.h's block layouts) and dequantized in
numpy, independently of the module under test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant import ggml_activations as ga

DATA = np.load(Path(__file__).parent / "data" / "llamacpp" / "act_vectors.npz")
X = torch.from_numpy(DATA["x"])
LAYOUT = {"q8_0": np.dtype([("d", "<f2"), ("qs", "i1", 32)]),
          "q8_1": np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)]),
          "q8_K": np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])}


def blocks(variant: str, kind: str) -> np.ndarray:
    raw = DATA[f"{variant}.{kind}"]
    return np.ascontiguousarray(raw).view(LAYOUT[kind]).reshape(raw.shape[0], -1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal floats, signed zeros told apart, any NaN equal to any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a.astype(np.float32))
    return bool((nan == np.isnan(b.astype(np.float32))).all() and
                (a[~nan].view(np.uint8 if a.itemsize == 1 else f"u{a.itemsize}") ==
                 b[~nan].view(np.uint8 if b.itemsize == 1 else f"u{b.itemsize}")).all())


@pytest.mark.parametrize("variant", ["x86", "ref"])
def test_q8_0_bytes(variant):
    want = blocks(variant, "q8_0")
    d, q = ga.q8_0_encode(X, variant)
    assert same_bits(d.numpy(), want["d"])
    assert np.array_equal(q.numpy(), want["qs"])


@pytest.mark.parametrize("variant", ["x86", "ref"])
def test_q8_1_bytes(variant):
    want = blocks(variant, "q8_1")
    d, s, q = ga.q8_1_encode(X, variant)
    assert same_bits(d.numpy(), want["d"])
    assert same_bits(s.numpy(), want["s"])
    assert np.array_equal(q.numpy(), want["qs"])


def test_q8_K_bytes():
    for variant in ("x86", "ref"):  # the CPU backend's Q8_K is the reference on x86 too: the same bytes
        want = blocks(variant, "q8_K")
        d, q, bsums = ga.q8_K_encode(X)
        assert same_bits(d.numpy(), want["d"])
        assert np.array_equal(q.numpy(), want["qs"])
        assert np.array_equal(bsums.numpy(), want["bsums"])


@pytest.mark.parametrize("variant,kind", [("x86", "q8_0"), ("ref", "q8_0"), ("x86", "q8_1"), ("ref", "q8_1"),
                                          ("x86", "q8_K"), ("ref", "q8_K")])
def test_dequantized_values(variant, kind):
    """What the dot product multiplies: scale (float16 widened, or float32) times code, in float32."""
    b = blocks(variant, kind)
    with np.errstate(invalid="ignore"):  # an overflowed (inf) scale times code 0 is NaN, in ggml too
        want = (b["d"].astype(np.float32)[..., None] * b["qs"].astype(np.float32)).reshape(X.shape)
    got = ga.quant_dequant(X, kind.upper(), variant).numpy()
    assert got.dtype == np.float32
    assert same_bits(got, want)


def test_vectors_cover_the_edges():
    """The rows reach the branches they are there for, seen in llama.cpp's own output (not the module's)."""
    x86, ref = blocks("x86", "q8_0"), blocks("ref", "q8_0")
    differ = {int(r) for r in np.nonzero((x86["qs"] != ref["qs"]).any(axis=1))[0]}
    assert len(differ) >= 3  # ties (even vs away from zero) and float32-subnormal rows (-128 vs 0)
    assert np.isinf(x86["d"].astype(np.float32)).any()  # a float16 scale that overflows
    assert (x86["qs"] == -128).any() and (ref["d"] == 0).any()
    k = blocks("ref", "q8_K")
    assert (k["d"] > 0).any() and (k["d"] < 0).any()  # the signed extreme decides the sign of d
    tie_row = int(np.nonzero((DATA["x"] == 127.0).sum(axis=1) == 16)[0][0])
    assert tie_row in differ


def test_ties_hand_derived():
    """A block whose amax is 127 has scale exactly 1: k + 1/2 rounds to even on x86, away from zero in the reference."""
    x = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5] + [0.0] * 25)
    assert ga.q8_0_encode(x, "x86")[1][0, :7].tolist() == [127, 0, 2, 2, 0, -2, -2]
    assert ga.q8_0_encode(x, "ref")[1][0, :7].tolist() == [127, 1, 2, 3, -1, -2, -3]
    k = torch.zeros(256)
    k[0], k[1], k[2] = -127.0, 0.5, 1.5  # Q8_K: iscale = -127/max = 1 exactly, ties to even
    d, q, bs = ga.q8_K_encode(k)
    assert d.item() == 1.0 and q[0, :3].tolist() == [-127, 0, 2] and bs[0, 0].item() == -125


def test_types_and_errors():
    assert ga.act_type("q4_k") == "Q8_K" and ga.act_type("IQ4_NL") == "Q8_0" and ga.act_type("Q5_1") == "Q8_1"
    assert ga.for_weight_type("F32") is None
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert ga.for_weight_type("F16")(x).dtype == torch.bfloat16
    assert torch.equal(ga.quant_dequant(x.float(), "F16"), x.float().half().float())
    with pytest.raises(FidevalError, match="not a multiple of 256"):
        ga.quant_dequant(torch.randn(2, 96), "Q8_K")
    with pytest.raises(FidevalError, match="no known CPU activation type"):
        ga.act_type("Q9_9")
    with pytest.raises(FidevalError, match="variant"):
        ga.quant_dequant(torch.randn(32), "Q8_0", "neon")
