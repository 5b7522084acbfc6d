"""The throughput mode (``RunnerOptions.mlp_tokens``): a decoder layer in two halves, attention per
micro-batch, then the MLP over blocks of up to ``mlp_tokens`` tokens that span micro-batches.

Why: with a micro-batch of a few sequences, each of DeepSeek-V3's 256 routed experts sees a handful of
tokens per MoE call, and its GEMMs run far below the GPU's rate; a block of ~64 k tokens gives each
expert ~k·T/E rows (bench/RESULTS.md: 46 % MoE FLOP utilisation on an H200). Blocks are formed in input
order, so their composition -- and the bits -- is the same every run; the canary's micro-batch is always
its own block. Today only ``bench/runner.py`` and tests set it; ``fideval teacher`` runs whole layers per
micro-batch (docs/runner.md).
"""

from __future__ import annotations

import time

import torch

from fideval.model.profile import timed

_PHASES = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


class MlpBlocks:
    """Runs the second half of layers over token blocks; ``warming`` is True during the one-off warm-up call."""

    def __init__(self, mlp_tokens: int, device: torch.device, stats: dict, profile: bool):
        self.mlp_tokens, self.device, self.stats, self.profile = int(mlp_tokens), device, stats, profile
        self.warmed: set[type] = set()
        self.warming = False

    @staticmethod
    def splits(layer: torch.nn.Module) -> bool:
        """Whether the layer has the four parts its forward is made of (transformers' decoder layers do)."""
        return all(hasattr(layer, a) for a in _PHASES)

    @staticmethod
    def attention_half(layer, x: torch.Tensor, mask, pos: torch.Tensor, pe) -> torch.Tensor:
        """The decoder layer's own first half: x + self_attn(input_layernorm(x))."""
        a = layer.self_attn(hidden_states=layer.input_layernorm(x), attention_mask=mask, position_ids=pos,
                            position_embeddings=pe)[0]
        return x + a

    def _timed(self, key: str):
        return timed(self.profile, self.stats, key, self.device)

    def _warm(self, layer, x: torch.Tensor) -> None:
        """The first time a kind of MLP runs in this process, run it once on a few tokens and drop the result:
        CUDA loads kernels lazily and cuBLAS sets itself up on first use (measured on an H200: ~0.4 s inside the
        first DeepSeek-V3 MoE block, for the router GEMM, top-k, the index writes), which is start-up, not MLP
        work. Outputs never depend on it (kernel choice depends on shapes alone; the canary checks the bits).
        Its time is added to ``stats["warmup_s"]``."""
        self.warmed.add(type(layer.mlp))
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

    def mlp_half(self, layer, states: list, on_dev: bool, solo: set[int] = frozenset()) -> None:
        """The layer's second half, x + mlp(post_attention_layernorm(x)), in place over ``states`` (one hidden
        state per micro-batch, on the device or pinned on the host), in blocks of up to ``mlp_tokens`` tokens;
        a micro-batch in ``solo`` is a block of its own."""
        j, n = 0, len(states)
        if n and self.device.type == "cuda" and type(layer.mlp) not in self.warmed:
            self._warm(layer, states[0] if on_dev else states[0].to(self.device, non_blocking=True))
        while j < n:
            g, tokens = [j], states[j].shape[0] * states[j].shape[1]
            while g[-1] + 1 < n and j not in solo and g[-1] + 1 not in solo and \
                    tokens + states[g[-1] + 1].shape[0] * states[g[-1] + 1].shape[1] <= self.mlp_tokens:
                g.append(g[-1] + 1)
                tokens += states[g[-1]].shape[0] * states[g[-1]].shape[1]
            xs = [states[k] if on_dev else states[k].to(self.device, non_blocking=True) for k in g]
            flat = (torch.cat([x.reshape(-1, x.shape[-1]) for x in xs]).unsqueeze(0) if len(xs) > 1
                    else xs[0].reshape(1, -1, xs[0].shape[-1]))
            with self._timed("norm_s"):  # the layer's own norm and residual add: not MLP work, timed apart
                z = layer.post_attention_layernorm(flat)
            with self._timed("moe_s" if hasattr(layer.mlp, "experts") else "mlp_s"):
                y = layer.mlp(z)
            del z
            with self._timed("norm_s"):
                y = flat + (y[0] if isinstance(y, tuple) else y)
            del flat, xs
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
            j = g[-1] + 1
