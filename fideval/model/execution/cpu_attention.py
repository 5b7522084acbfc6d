"""Attention as transformers' ``sdpa`` computes it, with one CPU difference: where the values are narrower than the
queries and keys (multi-head latent attention: DeepSeek-V2/V3, Kimi -- q/k 192 wide, v 128 at full size), torch's
CPU ``scaled_dot_product_attention`` has no fused kernel for the shapes and takes its math path, which materialises
every L x L score matrix; with the values zero-padded to the queries' width the fused flash kernel runs (blocks,
online softmax, float32 sums), and the padded columns of the output, zero, are dropped. Measured on this CPU for one
head group at L = 2,048 (q/k 48, v 32, the demo model's): math path 350-475 ms a call, padded flash 85-150 ms.

Float32 only: the result is the same attention to float32 rounding (7.7e-7 largest difference on that call), not the
same bits as the math path (in bfloat16 the math path rounds the scores to bfloat16 where the fused kernel keeps
float32 sums, 0.10 apart at a logit of 6 on the fp8 DeepSeek-V3 fixture: a bfloat16 run keeps transformers' path):
every model the runner computes on a CPU takes the one path (teacher, candidates, noise floor, fused pass), so their
comparisons are unaffected; transformers' own forward (the oracles in the tests) keeps its ``sdpa``.
On a GPU, and where the widths agree, it is transformers' ``sdpa`` call unchanged (the GPU's SDPA backends are chosen
by :meth:`fideval.model.runner.Runner._attn_backends`).

Registered once as ``fideval_sdpa`` in transformers' attention and mask interfaces (its masks are sdpa's), and
chosen by :func:`choose` where the adapter would choose ``sdpa`` -- except for a family whose modeling code tests the
implementation's name (``"sdpa"``: DeepSeek-V3.2's sparse indexer builds its own mask for it, and a few others),
which keeps ``sdpa`` itself.
"""

from __future__ import annotations

import functools

import torch

NAME = "fideval_sdpa"
_registered: bool | None = False  # None: this transformers cannot register it


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dq, dv = query.shape[-1], value.shape[-1]
    if query.device.type != "cpu" or dv >= dq or query.dtype != torch.float32:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out, weights = sdpa_attention_forward(module, query, key, torch.nn.functional.pad(value, (0, dq - dv)),
                                          attention_mask, **kwargs)
    return out[..., :dv], weights


def choose(modeling) -> str:
    """The name to give ``config._attn_implementation`` for a model (its transformers ``modeling`` module) that
    supports ``sdpa``: ``fideval_sdpa``, or ``sdpa`` where the modeling code branches on that name."""
    return "sdpa" if _names_sdpa(modeling.__name__) else implementation()


@functools.cache
def _names_sdpa(module_name: str) -> bool:
    """Whether a modeling module's source tests the name ``"sdpa"`` (read once a process, not once a runner)."""
    import importlib
    import inspect

    src = inspect.getsource(importlib.import_module(module_name))
    return '"sdpa"' in src or "'sdpa'" in src


def implementation() -> str:
    """``fideval_sdpa``, registered on first use; ``sdpa`` itself where the installed transformers has no registry
    for attention or mask functions (older releases)."""
    global _registered
    if _registered is None:
        return "sdpa"
    if not _registered:
        try:
            from transformers import AttentionInterface
            from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

            AttentionInterface.register(NAME, attention)
            ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
        except (ImportError, AttributeError):
            _registered = None
            return "sdpa"
        _registered = True
    return NAME
