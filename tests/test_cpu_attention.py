"""fideval_sdpa (fideval/model/execution/cpu_attention.py): on a CPU in float32, MLA's narrower values padded so the
fused kernel runs. Oracle: transformers' own sdpa_attention_forward on the same tensors."""

from __future__ import annotations

import pytest
import torch

from fideval.model.execution import cpu_attention


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(dq, dv, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    shape = (2, 4, 96)
    q, k = (torch.randn(*shape, dq, generator=g, dtype=torch.float32).to(dtype) for _ in range(2))
    return q, k, torch.randn(*shape, dv, generator=g, dtype=torch.float32).to(dtype)


def test_narrower_values_give_sdpa_within_float32_rounding():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv(48, 32)
    ours, _ = cpu_attention.attention(_Module(), q, k, v, None, scaling=48 ** -0.5)
    want, _ = sdpa_attention_forward(_Module(), q, k, v, None, scaling=48 ** -0.5)
    assert ours.shape == want.shape == (2, 96, 4, 32)
    assert (ours - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dq, dv, dtype", [(48, 48, torch.float32), (48, 32, torch.bfloat16)])
def test_equal_widths_and_bfloat16_are_sdpa_itself(dq, dv, dtype):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv(dq, dv, dtype)
    ours, _ = cpu_attention.attention(_Module(), q, k, v, None)
    want, _ = sdpa_attention_forward(_Module(), q, k, v, None)
    assert torch.equal(ours, want)


def test_chosen_where_the_modeling_code_does_not_test_the_name():
    import importlib

    v3 = importlib.import_module("transformers.models.deepseek_v3.modeling_deepseek_v3")
    v32 = importlib.import_module("transformers.models.deepseek_v32.modeling_deepseek_v32")
    assert cpu_attention.choose(v3) == "fideval_sdpa"
    assert cpu_attention.choose(v32) == "sdpa"  # its sparse indexer builds its own mask for 'sdpa'
