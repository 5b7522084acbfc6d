"""Routed experts, computed bit-for-bit as transformers' ``grouped_mm`` path computes them, with less memory traffic.

Why this exists. transformers' ``grouped_mm_experts_forward`` (the path fideval's adapter selects) spends most of
a DeepSeek-V3 MoE block outside its two grouped GEMMs: measured on an H200 with transformers 5.17
(bench/moe_probe.py, 65,536 tokens, 172 ms per block), 28 ms go to expert-parallel sentinel masks
(``masked_fill_`` over [tokens x top-k, hidden]) that a single-rank run never needs, 17 ms to a mixed-dtype
multiply (bf16 expert outputs times float32 routing weights, written as float32) and 8 ms to un-permuting
that float32 tensor. Here the same values are produced with fewer bytes moved:

* the same sort, gather, ``_grouped_linear`` calls (transformers' own helper, hence the same GEMM kernels)
  and ``self._apply_gate`` as transformers;
* no sentinel masks: this path is used only when no index can be a sentinel (one rank; a model-parallel
  rank keeps transformers' path, whose masks its sentinels need);
* the weighting is applied *after* the un-permute, to the bf16 rows: multiplication is elementwise, so
  ``(y * w_sorted)[inv] == y[inv] * w`` exactly, and the gather moves half the bytes. On CUDA with Triton
  the gather, the cast and the multiply are one kernel (:func:`gather_scale`); elsewhere two torch ops;
* the same ``view(tokens, top_k, hidden).sum(dim=1)`` reduction and final cast, so the sum order is
  torch's own -- on CUDA with Triton fused with the gather and the weighting (:func:`gather_scale_sum`: one read
  of the expert outputs, no [tokens x top-k, hidden] float32 tensor written and read back), adding in the order
  torch's reduction kernel adds (checked bit for bit against torch on the GPU).

The result equals transformers' bit for bit (tests/test_model_experts.py, on CPU in float32 and bfloat16 against
``grouped_mm_experts_forward`` itself; the bench repeats the comparison on the GPU). Modules with biases, a
post-expert norm or no gate are left to transformers.
"""

from __future__ import annotations

import torch

try:  # optional, as for the scorer
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None


def supported(experts: torch.nn.Module) -> bool:
    """Whether :func:`forward` reproduces transformers' grouped_mm path for this experts module."""
    try:
        from transformers.integrations.moe import _grouped_linear  # noqa: F401  (the helper forward uses)
    except ImportError:
        return False
    # has_post_expert_norm is newer than transformers 5.17, which has no post-expert norm at all
    return (getattr(experts, "has_gate", False) is True and getattr(experts, "has_bias", True) is False
            and not getattr(experts, "has_post_expert_norm", False) and hasattr(experts, "gate_up_proj")
            and hasattr(experts, "down_proj") and hasattr(experts, "_apply_gate"))


def forward(experts: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' ``grouped_mm_experts_forward`` for a gated, bias-free experts module on one rank."""
    from transformers.integrations.moe import _grouped_linear

    device = hidden_states.device
    k = top_k_index.size(-1)
    n, h = hidden_states.size(0), hidden_states.size(-1)
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    x = hidden_states[perm // k]
    histc_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
    counts = torch.histc(histc_input, bins=experts.num_experts, min=0, max=experts.num_experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    y = _grouped_linear(x, experts.gate_up_proj, offsets, is_transposed=experts.is_transposed)
    del x
    y = experts._apply_gate(y)
    y = _grouped_linear(y, experts.down_proj, offsets, is_transposed=experts.is_transposed)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.size(0), device=device)
    w = top_k_weights.reshape(-1)
    if _fusable(y, w):  # gather, weight, sum over top-k and cast in one pass: no [tokens x top-k, hidden] float32 tensor
        return gather_scale_sum(y, inv, w, k, hidden_states.dtype)
    weighted = gather_scale(y, inv, w)
    del y
    return weighted.view(n, k, h).sum(dim=1).to(hidden_states.dtype)


def gather_scale(y: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``y[idx] * w[:, None]`` in ``torch.result_type(y, w)``, as torch computes it (each product in float32,
    rounded once to the result type)."""
    out_dtype = torch.promote_types(y.dtype, w.dtype)
    if triton is None or y.device.type != "cuda" or y.dim() != 2 or not y.is_contiguous() or \
            out_dtype not in (torch.float32, torch.bfloat16, torch.float16) or y.dtype == torch.float64:
        return y[idx] * w.unsqueeze(-1)
    rows, width = idx.numel(), y.shape[1]
    out = torch.empty((rows, width), dtype=out_dtype, device=y.device)
    block = 1024
    _gather_scale[(rows, triton.cdiv(width, block))](y, idx, w.contiguous(), out, width, BLOCK=block, num_warps=4)
    return out


def warmup(device: torch.device, dtype: torch.dtype, k: int, width: int) -> None:
    """Compile the Triton kernels :func:`forward` will launch for ``dtype`` expert outputs, top-``k`` routing and
    rows of ``width``, on one-row inputs, so that Triton's just-in-time compile (seconds on a fresh machine, once
    per process and cached on disk after) is paid before the first MoE block rather than inside it. Both
    weight dtypes are compiled: float32 routing weights take the fused kernel, others the gather-and-scale one."""
    if triton is None or torch.device(device).type != "cuda":
        return
    y = torch.zeros((k, width), dtype=dtype, device=device)
    idx = torch.arange(k, device=device)
    for wd in (torch.float32, dtype):
        w = torch.ones(k, dtype=wd, device=device)
        if _fusable(y, w):
            gather_scale_sum(y, idx, w, k, dtype)
        else:
            gather_scale(y, idx, w)
    torch.cuda.synchronize(device)


def _fusable(y: torch.Tensor, w: torch.Tensor) -> bool:
    return (triton is not None and y.device.type == "cuda" and y.dim() == 2 and y.is_contiguous()
            and y.dtype in (torch.float32, torch.bfloat16, torch.float16) and w.dtype == torch.float32)


# torch's CUDA sum over a short, strided dimension (Reduce.cuh, thread_reduce_impl with vt0 = 4): each thread keeps
# four accumulators, element j of the reduced dimension going to accumulator j mod 4 in order, then combines them
# as ((acc0 + acc1) + acc2) + acc3. ORDER 1 reproduces that; ORDER 0 (a plain left-to-right sum) is kept so that
# the GPU bench can show which one torch's bits follow.
SUM_ORDER = 1


def gather_scale_sum(y: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, k: int, out_dtype: torch.dtype,
                     order: int = SUM_ORDER) -> torch.Tensor:
    """``(y[idx] * w[:, None]).view(-1, k, width).sum(dim=1).to(out_dtype)`` for float32 ``w`` on CUDA, bit for
    bit as torch computes it there: each product in float32 (no fused multiply-add), summed in torch's order,
    rounded once to ``out_dtype``. Reads each gathered row once and writes only [tokens, width]."""
    rows, width = idx.numel() // k, y.shape[1]
    out = torch.empty((rows, width), dtype=out_dtype, device=y.device)
    block = 1024
    _gather_scale_sum[(rows, triton.cdiv(width, block))](y, idx, w.contiguous(), out, width, K=k, BLOCK=block,
                                                         ORDER=order, num_warps=4, enable_fp_fusion=False)
    return out


if triton is not None:

    @triton.jit
    def _gather_scale_sum(Y, IDX, W, OUT, width, K: tl.constexpr, BLOCK: tl.constexpr, ORDER: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < width
        acc0 = tl.zeros([BLOCK], tl.float32)
        acc1 = tl.zeros([BLOCK], tl.float32)
        acc2 = tl.zeros([BLOCK], tl.float32)
        acc3 = tl.zeros([BLOCK], tl.float32)
        for j in tl.static_range(K):
            src = tl.load(IDX + r * K + j).to(tl.int64)
            wj = tl.load(W + r * K + j)
            v = tl.load(Y + src * width + c, mask=m, other=0.0).to(tl.float32) * wj
            if ORDER == 0 or j % 4 == 0:
                acc0 = acc0 + v
            elif j % 4 == 1:
                acc1 = acc1 + v
            elif j % 4 == 2:
                acc2 = acc2 + v
            else:
                acc3 = acc3 + v
        if ORDER == 0:
            total = acc0
        else:
            total = ((acc0 + acc1) + acc2) + acc3
        tl.store(OUT + r * width + c, total.to(OUT.dtype.element_ty), mask=m)

    @triton.jit
    def _gather_scale(Y, IDX, W, OUT, width, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < width
        src = tl.load(IDX + r).to(tl.int64)
        w = tl.load(W + r).to(tl.float32)
        v = tl.load(Y + src * width + c, mask=m).to(tl.float32)
        tl.store(OUT + r.to(tl.int64) * width + c, (v * w).to(OUT.dtype.element_ty), mask=m)
