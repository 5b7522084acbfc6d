"""The throughput mode (``RunnerOptions.mlp_tokens``): a decoder layer in two halves, attention per
micro-batch, then the MLP over blocks of up to ``mlp_tokens`` tokens that span micro-batches.

Why: with a micro-batch of a few sequences, each of DeepSeek-V3's 256 routed experts sees a handful of
tokens per MoE call, and its GEMMs run far below the GPU's rate; a block of ~64 k tokens gives each
expert ~k·T/E rows (bench/RESULTS.md: 46 % MoE FLOP utilisation on an H200). Blocks are formed in input
order, so their composition -- and the bits -- is the same every run; the canary's micro-batch is always
its own block. ``fideval teacher`` and ``fideval score --config`` take it on a GPU, sized by
fideval.model.sizing (docs/runner.md, "Run settings and accounting").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from fideval.timing.timeline import Timeline

_PHASES = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


class MlpBlocks:
    """Runs the second half of layers over token blocks; ``warming`` is True during the one-off warm-up call."""

    def __init__(self, mlp_tokens: int, device: torch.device, stats: dict, timeline: Timeline | None = None):
        self.mlp_tokens, self.device, self.stats = int(mlp_tokens), device, stats
        self.timeline = timeline if timeline is not None else Timeline(device, on=False)
        self.warmed: set[type] = set()
        self.warming = False

    @staticmethod
    def splits(layer: torch.nn.Module) -> bool:
        """Whether the layer has the four parts its forward is made of (transformers' decoder layers do)."""
        return all(hasattr(layer, a) for a in _PHASES)

    def attention_half(self, layer, x: torch.Tensor, mask, pos: torch.Tensor, pe) -> torch.Tensor:
        """The decoder layer's own first half: x + self_attn(input_layernorm(x)), the norm and the add timed apart."""
        tl = self.timeline
        with tl.part("norms"):
            h = layer.input_layernorm(x)
        with tl.part("attention"):
            a = layer.self_attn(hidden_states=h, attention_mask=mask, position_ids=pos, position_embeddings=pe)[0]
            del h
        with tl.part("norms"):
            return x + a

    def _warm(self, layer, x: torch.Tensor) -> None:
        """The first time a kind of MLP runs in this process, run it once on a few tokens and drop the result:
        CUDA loads kernels lazily and cuBLAS sets itself up on first use (measured on an H200: ~0.4 s inside the
        first DeepSeek-V3 MoE block, for the router GEMM, top-k, the index writes), which is start-up, not MLP
        work. Outputs never depend on it (kernel choice depends on shapes alone; the canary checks the bits).
        Its time is added to ``stats["warmup_s"]``."""
        self.warmed.add(type(layer.mlp))
        with self.timeline.part("warmup"):
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            self.warming = True
            try:
                z = layer.post_attention_layernorm(x.reshape(1, -1, x.shape[-1])[:, :64])
                y = layer.mlp(z)
                del z, y
            finally:
                self.warming = False
            torch.cuda.synchronize(self.device)
        self.stats["warmup_s"] = self.stats.get("warmup_s", 0.0) + time.perf_counter() - t0

    def mlp_half(self, layer, states: list, on_dev: bool, solo: set[int] = frozenset(), canary: int | None = None,
                 at: Callable[[list[int] | None], None] | None = None) -> None:
        """The layer's second half, x + mlp(post_attention_layernorm(x)), in place over ``states`` (one hidden
        state per micro-batch, on the device or pinned on the host), in blocks of up to ``mlp_tokens`` tokens;
        a micro-batch in ``solo`` is a block of its own; ``canary``'s block is the timeline's ``canary`` part.
        ``at(g)``: told the micro-batches of each block before it runs (their rows, in order, are the block's
        tokens: the route recorder's and forcer's rows), ``at(None)`` after the last."""
        j, n, tl = 0, len(states), self.timeline
        if n and self.device.type == "cuda" and type(layer.mlp) not in self.warmed:
            self._warm(layer, states[0] if on_dev else states[0].to(self.device, non_blocking=True))
        while j < n:
            g, tokens = [j], states[j].shape[0] * states[j].shape[1]
            while g[-1] + 1 < n and j not in solo and g[-1] + 1 not in solo and \
                    tokens + states[g[-1] + 1].shape[0] * states[g[-1] + 1].shape[1] <= self.mlp_tokens:
                g.append(g[-1] + 1)
                tokens += states[g[-1]].shape[0] * states[g[-1]].shape[1]
            if at is not None:
                at(g)
            with tl.part("canary", sticky=True) if canary in g else nullcontext():
                self._block(layer, states, g, on_dev)
            j = g[-1] + 1
        if at is not None:
            at(None)

    def _block(self, layer, states: list, g: list[int], on_dev: bool) -> None:
        tl = self.timeline
        with tl.part("states"):  # gathering the block's rows (and host->device moves): not MLP work
            xs = [states[k] if on_dev else states[k].to(self.device, non_blocking=True) for k in g]
            flat = (torch.cat([x.reshape(-1, x.shape[-1]) for x in xs]).unsqueeze(0) if len(xs) > 1
                    else xs[0].reshape(1, -1, xs[0].shape[-1]))
        with tl.part("norms"):  # the layer's own norm and residual add: not MLP work, timed apart
            z = layer.post_attention_layernorm(flat)
        with tl.part("moe" if hasattr(layer.mlp, "experts") else "dense_mlp"):
            y = layer.mlp(z)
            del z
        with tl.part("norms"):
            y = flat + (y[0] if isinstance(y, tuple) else y)
            del flat, xs
        with tl.part("states"):
            off = 0
            for k in g:
                size = states[k].shape[0] * states[k].shape[1]
                part = y[0, off:off + size].view(states[k].shape)
                if on_dev:
                    states[k] = part.clone() if len(g) > 1 else part
                else:
                    states[k].copy_(part)
                off += size
            del y
