"""Model parallel over N ranks with torch.distributed (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK).

What is split and what is replicated (first version):
* routed experts: rank r owns experts [r*E/N, (r+1)*E/N) of every MoE layer, as DeepSeek's reference
  ``inference/model.py`` does; each rank adds only its experts' contributions and the N partial sums
  are added by one float32 ``all_reduce`` (NCCL on GPUs, gloo on CPU). Only these experts are read
  from disk on a rank, so the per-rank weight memory of a MoE layer drops by ~N.
* lm head: rank r computes vocabulary rows [r*V/N, (r+1)*V/N) and the logits are ``all_gather``-ed.
* attention, shared experts, dense MLPs, norms, router, embedding: replicated (every rank computes
  them; they are a small share of a DeepSeek-V3 layer). Head-parallel attention is left for later.

Summation order: with N = 1 a token's routed output is the sum over its top-k experts in transformers'
order; with N > 1 it is the sum over ranks of per-rank sums (other ranks' experts enter a rank's sum as
exact zeros), so the float32 reassociation changes the result by at most (k-1)·u·Σ|terms| (u = 2^-24)
per element per MoE layer, and the change propagates through later layers. Everything else is bitwise
the same computation on every rank (NCCL and gloo all_reduce give identical results on all ranks, so
the replicated hidden states never diverge). See docs/runner.md for the measured differences.
"""

from __future__ import annotations

import os

import numpy as np
import torch


def init_from_env(device: torch.device) -> tuple[int, int, object]:
    """Join the torchrun group if WORLD_SIZE > 1; returns (rank, world, group)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, None
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), dist.group.WORLD


def vocab_bounds(world: int, vocab: int) -> list[tuple[int, int]]:
    """The lm head's split: rank r computes vocabulary rows [lo, hi) of the r-th of N near-equal parts."""
    bounds = np.linspace(0, vocab, world + 1).round().astype(int) if world > 1 else np.array([0, vocab])
    return [(int(bounds[r]), int(bounds[r + 1])) for r in range(len(bounds) - 1)]


def gather_vocab(part: torch.Tensor, bounds: list[tuple[int, int]], group) -> torch.Tensor:
    """Every rank's logits over its vocabulary rows, joined into the full [..., V] on every rank."""
    import torch.distributed as dist

    width = max(b - a for a, b in bounds)
    pad = torch.zeros((*part.shape[:-1], width), dtype=part.dtype, device=part.device)
    pad[..., :part.shape[-1]] = part
    bufs = [torch.empty_like(pad) for _ in bounds]
    dist.all_gather(bufs, pad.contiguous(), group=group)
    return torch.cat([b[..., :hi - lo] for b, (lo, hi) in zip(bufs, bounds)], dim=-1)
