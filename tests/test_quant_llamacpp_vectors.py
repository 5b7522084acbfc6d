"""Our GGUF encoders against llama.cpp's own reference quantizers, byte for byte.

The oracle is ``tests/data/llamacpp/quant_vectors.npz``, written once by ``tools/llamacpp/quant_vectors.py``
from llama.cpp's ``ggml-quants.c`` (built as ggml-base is: gcc -O2, no -march): 24 rows of 512 float32
values (zeros, constants, one-signed rows, huge, float16-subnormal scales, float32-subnormal inputs,
outliers, ties, heavy tails), an importance matrix, and llama.cpp's bytes per type, without and with it."""

from pathlib import Path

import numpy as np
import pytest
import torch

from fideval.quant.gguf_formats import gguf_encode

VECTORS = Path(__file__).parent / "data" / "llamacpp" / "quant_vectors.npz"


@pytest.fixture(scope="module")
def vec():
    with np.load(VECTORS) as d:
        return {k: d[k] for k in d.files}


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_legacy_types_match_llama_cpp(vec, kind):
    ours = gguf_encode(torch.from_numpy(vec["x"]), kind).numpy()
    ref = vec[kind]
    assert ours.shape == ref.shape
    bad = np.argwhere(ours != ref)
    assert bad.size == 0, f"{kind}: {len(bad)} bytes differ, first at {bad[:3].tolist()}"


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q5_0", "q5_1"])
def test_legacy_types_with_an_imatrix_match_llama_cpp(vec, kind):
    """quantize_row_q*_impl's weighted searches (fideval.quant.gguf_legacy_imatrix), what llama-quantize writes for
    these types with --imatrix; the constant row's Q5_1 block was a tie that `nmax / (max - min)` rounded twice broke."""
    from fideval.quant.gguf_legacy_imatrix import encode_legacy_imatrix

    ours = encode_legacy_imatrix(torch.from_numpy(vec["x"]), kind, torch.from_numpy(vec["imatrix"])).numpy()
    ref = vec[f"{kind}.imatrix"]
    assert not np.array_equal(ref, vec[kind])  # the imatrix changes llama.cpp's bytes
    bad = np.argwhere(ours != ref)
    assert bad.size == 0, f"{kind}: {len(bad)} bytes differ, first at {bad[:3].tolist()}"


def test_subnormal_scale_blocks_encode_to_code_zero(vec):
    # row 13 is float32-subnormal: d = max/-8 is subnormal, 1/d = inf, and ggml's int8 cast of inf/NaN is 0
    x = torch.from_numpy(vec["x"][13:14, :32].copy())
    raw = gguf_encode(x, "q4_0")
    assert raw[0, 2:].tolist() == [0] * 16 and raw[0, 2:].tolist() == vec["q4_0"][13, 2:18].tolist()


KTYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"]


@pytest.mark.parametrize("imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("kind", KTYPES)
def test_k_and_i_quants_match_llama_cpp(vec, kind, imatrix):
    from fideval.quant.gguf_ktypes import gguf_k_encode

    qw = torch.from_numpy(vec["imatrix"]) if imatrix else None
    ours = gguf_k_encode(torch.from_numpy(vec["x"]), kind, qw).numpy()
    ref = vec[f"{kind}.imatrix" if imatrix else kind]
    assert ours.shape == ref.shape
    bad = np.argwhere(ours != ref)
    assert bad.size == 0, f"{kind}: {len(bad)} of {ref.size} bytes differ, first at {bad[:3].tolist()}"
    # and the imatrix changes the bytes (the vectors would not test it otherwise)
    other = vec[kind if imatrix else f"{kind}.imatrix"]
    assert (other != ref).mean() > 0.05


@pytest.mark.parametrize("kind", KTYPES)
def test_k_and_i_decoders_match_gguf_py(vec, kind):
    import warnings

    from gguf import GGMLQuantizationType as T
    from gguf import quants

    from fideval.quant import get_format

    fmt = get_format(f"gguf_{kind}")
    g = np.random.default_rng(4)
    rand = g.integers(0, 256, (64, fmt.type_size), dtype=np.uint8)
    rand[:, :2] = np.frombuffer(np.float16(g.standard_normal(64)).tobytes(), np.uint8).reshape(64, 2)
    for raw in (vec[kind].reshape(-1, fmt.type_size), vec[f"{kind}.imatrix"].reshape(-1, fmt.type_size), rand):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # inf - inf in the huge rows: NaN on both sides
            want = quants.dequantize(raw, T[kind.upper()])
        from fideval.quant.gguf_ktypes import decode_blocks

        got = decode_blocks(torch.from_numpy(raw), kind).numpy()
        assert np.array_equal(got.reshape(want.shape), want, equal_nan=True)
    # quant_dequant through the registry is llama.cpp's bytes decoded
    x = torch.from_numpy(vec["x"])
    y = fmt.quant_dequant(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = quants.dequantize(vec[kind], T[kind.upper()])
    assert np.array_equal(y.numpy(), want, equal_nan=True)


def test_k_quant_spec_and_bits():
    from fideval.quant import compile_spec, get_format

    assert get_format("gguf_q4_k").bits_per_weight() == 4.5
    assert get_format("gguf_q6_k").bits_per_weight() == 6.5625
    assert get_format("gguf_iq4_xs").bits_per_weight() == 4.25
    assert get_format("gguf_q2_k").bits_per_weight() == 2.625
    spec = compile_spec("routed_experts=gguf_q4_k,attention=gguf_q6_k")
    w = torch.randn(2, 8, 512, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    from fideval.quant.gguf_ktypes import gguf_k_encode

    y = spec.weight_transform("routed_experts", "mlp.experts.gate_up_proj", w)
    assert y.dtype == torch.bfloat16 and y.shape == w.shape
    raw = gguf_k_encode(w, "q4_k")  # per row, whatever the leading dims
    assert raw.shape == (2, 8, 288)
    assert torch.equal(raw[1, 3], gguf_k_encode(w[1, 3:4], "q4_k")[0])
    bits = spec.bits({"routed_experts": [(2, 8, 512)]})["per_class"]["routed_experts"]
    assert bits["bpw"] == 4.5


def test_k_quant_bad_inputs_are_one_line_errors():
    from fideval.errors import FidevalError
    from fideval.quant import quant_dequant
    from fideval.quant.gguf_ktypes import gguf_k_encode

    with pytest.raises(FidevalError, match="block of 256 does not divide the last dimension 96"):
        quant_dequant(torch.zeros(2, 96), "gguf_q4_k")
    with pytest.raises(FidevalError, match="group 32 is not allowed"):
        quant_dequant(torch.zeros(2, 256), "gguf_q5_k", group=32)
    with pytest.raises(FidevalError, match=r"importance matrix has 256 values for a \[2, 512\] tensor \(needs 512\)"):
        gguf_k_encode(torch.zeros(2, 512), "q4_k", torch.ones(256))
    with pytest.raises(FidevalError, match="negative or non-finite"):
        gguf_k_encode(torch.zeros(2, 256), "iq4_xs", -torch.ones(256))
    with pytest.raises(FidevalError, match="NaN/Inf"):
        gguf_k_encode(torch.full((1, 256), float("inf")), "q6_k")
    with pytest.raises(FidevalError, match="no K-quant encoder"):
        gguf_k_encode(torch.zeros(1, 256), "iq2_xxs")
