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


def test_subnormal_scale_blocks_encode_to_code_zero(vec):
    # row 13 is float32-subnormal: d = max/-8 is subnormal, 1/d = inf, and ggml's int8 cast of inf/NaN is 0
    x = torch.from_numpy(vec["x"][13:14, :32].copy())
    raw = gguf_encode(x, "q4_0")
    assert raw[0, 2:].tolist() == [0] * 16 and raw[0, 2:].tolist() == vec["q4_0"][13, 2:18].tolist()
