"""fideval.model.execution.experts against transformers' own grouped_mm experts path: the same bits, module by module.

The oracle is ``transformers.integrations.moe.grouped_mm_experts_forward`` itself, on the experts modules of the
tiny MoE checkpoints (random routing, repeated experts, experts that receive no token), in float32 and bfloat16.
"""

from __future__ import annotations

import model_fixtures as mf
import pytest
import torch
from transformers.integrations.moe import grouped_mm_experts_forward

from fideval.model.execution import experts


def _experts_module(name: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(mf.configs()[name], dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn_like(p))
    return next(m for n, m in model.named_modules() if n.endswith("mlp.experts"))


@pytest.mark.parametrize("name", ["qwen3_moe", "deepseek_v3", "mixtral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_bits_as_transformers_grouped_mm(name, dtype):
    mod = _experts_module(name, dtype)
    assert experts.supported(mod)
    g = torch.Generator().manual_seed(5)
    n, k, e = 37, 2, mod.num_experts
    h = torch.randn(n, mod.gate_up_proj.shape[-1] if not mod.is_transposed else mod.gate_up_proj.shape[1],
                    generator=g).to(dtype)
    idx = torch.randint(0, e - 1, (n, k), generator=g)  # the last expert gets nothing
    w = torch.rand(n, k, generator=g)  # float32, as the routers return them
    with torch.no_grad():
        want = grouped_mm_experts_forward(mod, h, idx, w)
        got = experts.forward(mod, h, idx, w)
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want)


def test_gather_scale_promotes_like_torch():
    g = torch.Generator().manual_seed(6)
    y = torch.randn(10, 7, generator=g).to(torch.bfloat16)
    idx = torch.randperm(10, generator=g)
    for w in (torch.rand(10, generator=g), torch.rand(10, generator=g).to(torch.bfloat16)):
        got = experts.gather_scale(y, idx, w)
        want = y[idx] * w.unsqueeze(-1)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_biased_experts_are_left_to_transformers():
    mod = _experts_module("gpt_oss", torch.float32)
    assert not experts.supported(mod)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and experts.triton is not None), reason="needs CUDA and triton")
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_gather_scale_kernel_matches_torch_on_the_gpu(wdtype):
    """The fused CUDA kernel: the same bits as ``y[idx] * w[:, None]`` (odd widths, repeated rows)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    y = torch.randn(300, 7168 + 3, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 300, (1000,), device="cuda", generator=g)
    w = torch.rand(1000, device="cuda", generator=g).to(wdtype)
    got = experts.gather_scale(y, idx, w)
    want = y[idx] * w.unsqueeze(-1)
    assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and experts.triton is not None), reason="needs CUDA and triton")
@pytest.mark.parametrize("k", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gather_scale_sum_kernel_matches_torch_on_the_gpu(k, dtype):
    """The fused gather-weight-sum-cast: the same bits as torch's three ops on the GPU, for top-k sizes that
    fill torch's four accumulators partly, exactly and more than once."""
    g = torch.Generator(device="cuda").manual_seed(8 + k)
    n, width = 257, 7168 + 3
    y = torch.randn(n * k, width, device="cuda", generator=g).to(dtype)
    idx = torch.randperm(n * k, device="cuda", generator=g)
    w = torch.rand(n * k, device="cuda", generator=g)
    want = (y[idx] * w.unsqueeze(-1)).view(n, k, width).sum(dim=1).to(dtype)
    got = experts.gather_scale_sum(y, idx, w, k, dtype)
    assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and experts.triton is not None), reason="needs CUDA and triton")
@pytest.mark.parametrize("name", ["qwen3_moe", "deepseek_v3", "mixtral"])
def test_same_bits_as_transformers_grouped_mm_on_the_gpu(name):
    mod = _experts_module(name, torch.bfloat16).cuda()
    g = torch.Generator(device="cuda").manual_seed(5)
    n, k, e = 300, 2, mod.num_experts
    h = torch.randn(n, mod.gate_up_proj.shape[-1] if not mod.is_transposed else mod.gate_up_proj.shape[1],
                    device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, e - 1, (n, k), device="cuda", generator=g)
    w = torch.rand(n, k, device="cuda", generator=g)
    with torch.no_grad():
        want = grouped_mm_experts_forward(mod, h, idx, w)
        got = experts.forward(mod, h, idx, w)
    assert torch.equal(got, want)


def _compiled(kernel) -> int | None:
    """How many compiled variants a Triton JIT function holds (None where this Triton keeps them elsewhere)."""
    caches = getattr(kernel, "device_caches", None)
    if not isinstance(caches, dict):
        return None
    return sum(len(c[0]) for c in caches.values())


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and experts.triton is not None), reason="needs CUDA and triton")
def test_warmup_compiles_what_forward_launches():
    """After warmup no MoE forward compiles: the forward on the same dtype, top-k and width finds its kernel."""
    mod = _experts_module("deepseek_v3", torch.bfloat16).cuda()
    width = mod.down_proj.shape[1] if not mod.is_transposed else mod.down_proj.shape[-1]
    k = 3  # no other test uses it, so nothing compiled it before
    experts.warmup(torch.device("cuda"), torch.bfloat16, k, width)
    before = _compiled(experts._gather_scale_sum)
    if before is None:
        pytest.skip("this Triton does not expose its kernel cache as device_caches")
    g = torch.Generator(device="cuda").manual_seed(6)
    h = torch.randn(200, width, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, mod.num_experts, (200, k), device="cuda", generator=g)
    w = torch.rand(200, k, device="cuda", generator=g)
    with torch.no_grad():
        experts.forward(mod, h, idx, w)
    assert before > 0 and _compiled(experts._gather_scale_sum) == before
