"""The format interface: chunked quant_dequant equals one-shot encode/decode for every format and recipe,
fused [E, out, in] tensors are quantized matrix by matrix, and dtype/shape are preserved."""

import pytest
import torch

import fideval.quant.base as base
from fideval.errors import FidevalError
from fideval.quant import get_format, list_formats

CASES = [(f.name, r) for f in list_formats() for r in f.recipes]


@pytest.mark.parametrize("name,recipe", CASES)
def test_chunked_equals_one_shot_and_per_matrix(monkeypatch, name, recipe):
    fmt = get_format(name)
    g = torch.Generator().manual_seed(len(name) * 31 + len(recipe))
    x = torch.randn(2, 300, 256, generator=g) * torch.exp(torch.randn(2, 300, 1, generator=g) * 2)
    x[1] *= 30  # experts with very different ranges: tensor-level scales must be per matrix
    one_shot = fmt.decode(fmt.encode(x, recipe))
    monkeypatch.setattr(base, "CHUNK_ELEMENTS", 1)  # 128-row chunks: 128, 128, 44
    chunked = fmt.quant_dequant(x, recipe)
    assert torch.equal(chunked, one_shot)
    for k in range(2):
        assert torch.equal(chunked[k], fmt.quant_dequant(x[k], recipe))


@pytest.mark.parametrize("name,recipe", CASES)
def test_in_place_equals_a_fresh_result_through_any_strides(monkeypatch, name, recipe):
    """out=x (the runner's own tensor) gives the fresh result's bits, also through a transposed view (gpt-oss's
    experts are [E, in, out] on disk and shown to the format as [E, out, in]), chunk by chunk and per matrix."""
    fmt = get_format(name)
    g = torch.Generator().manual_seed(len(name) * 7 + len(recipe))
    x = (torch.randn(2, 300, 256, generator=g) * torch.exp(torch.randn(2, 300, 1, generator=g) * 2)).bfloat16()
    x[1] *= 30
    monkeypatch.setattr(base, "CHUNK_ELEMENTS", 1)  # several chunks per matrix: each is read before it is written
    fresh = fmt.quant_dequant(x, recipe)
    own = x.clone()
    assert fmt.quant_dequant(own, recipe, out=own) is own and torch.equal(own, fresh)
    stored = x.transpose(-1, -2).contiguous()  # the on-disk layout of a transposed module
    view = stored.transpose(-1, -2)
    fmt.quant_dequant(view, recipe, out=view)
    assert torch.equal(stored.transpose(-1, -2), fresh)
    vec = x[0, 0].clone()
    assert torch.equal(fmt.quant_dequant(vec, recipe, out=vec), fmt.quant_dequant(x[0, 0], recipe))
    with pytest.raises(ValueError, match="does not match"):
        fmt.quant_dequant(x, recipe, out=x.float())


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "fp8_block", "int4", "gguf_q4_1"])
def test_dtype_and_shape_kept(name):
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(4, 128).to(dt)
        y = get_format(name).quant_dequant(x)
        assert y.dtype == dt and y.shape == x.shape


def test_non_float_input_is_rejected():
    with pytest.raises(FidevalError, match="cannot quantize a torch.int64 tensor"):
        get_format("mxfp4").quant_dequant(torch.zeros(2, 32, dtype=torch.long))
