"""The routes a transformers run computed: per MoE layer and position, the routed experts' ids (top-k) and weights.

:class:`RouteRecorder` is the ``record`` callback of :func:`fideval.model.execution.hooks.install`: the runner tells it
which rows the next experts call holds (:attr:`RouteRecorder.current`, None for the canary's second pass, whose
routes are the first pass's), and each call's ``top_k_index`` / ``top_k_weights`` -- the arguments transformers'
MoE block hands its experts module, after the family's own router (softmax, sigmoid with correction bias,
group-limited top-k, normalised and scaled or not) -- are kept per row and layer, on the device, as int16 ids and
float16 weights (the file's types, docs/formats-routes.md). :meth:`RouteRecorder.pop` gives one row's routes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fideval.errors import FidevalError

MAX_EXPERT_ID = np.iinfo(np.int16).max


@dataclass(frozen=True)
class Routes:
    """One sequence's routes: ``layers`` (the MoE layers' indices, ascending), ``ids`` int16 ``[n_layers, L, k]``,
    ``weights`` float16 ``[n_layers, L, k]`` (in the order the router gave them)."""

    layers: tuple[int, ...]
    ids: np.ndarray
    weights: np.ndarray
    n_experts: int


class RouteRecorder:
    def __init__(self, n_experts: int) -> None:
        self.n_experts = int(n_experts)  # the routed experts of each MoE layer (the ids' range)
        self.current: tuple[list[int], int] | None = None  # (rows of the micro-batch, positions per row)
        self.rows: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}

    def reset(self) -> None:
        """A new chunk: routes not taken (rows computed only for the composition) are dropped."""
        self.rows.clear()
        self.current = None

    def __call__(self, layer: int, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> None:
        if self.current is None:
            return
        rows, length = self.current
        k = int(top_k_index.shape[-1])
        if top_k_index.numel() != len(rows) * length * k or top_k_weights.shape != top_k_index.shape:
            raise FidevalError(f"layer {layer}: the experts were called with routes of shape {list(top_k_index.shape)} "
                               f"(weights {list(top_k_weights.shape)}) for {len(rows)} x {length} positions",
                               hint="recording routes needs whole layers per micro-batch: run with --mlp-tokens off")
        if top_k_index.numel() and int(top_k_index.max()) > MAX_EXPERT_ID:
            raise FidevalError(f"layer {layer}: expert id {int(top_k_index.max())} does not fit the routes file's int16",
                               hint="routes are recorded for models of at most 32768 routed experts")
        ids = top_k_index.detach().reshape(len(rows), length, k).to(torch.int16)
        w = top_k_weights.detach().reshape(len(rows), length, k).to(torch.float16)
        for r, row in enumerate(rows):
            self.rows.setdefault(row, {})[layer] = (ids[r], w[r])

    def pop(self, row: int) -> Routes:
        """Row ``row``'s routes (every MoE layer), removed from the recorder."""
        got = self.rows.pop(row, None)
        if not got:
            raise FidevalError(f"no routes were recorded for row {row}", hint="the model has no routed experts the runner sees")
        layers = tuple(sorted(got))
        return Routes(layers, np.stack([got[i][0].cpu().numpy() for i in layers]),
                      np.stack([got[i][1].cpu().numpy() for i in layers]), self.n_experts)
