"""The routes a transformers run computed: per MoE layer and position, the routed experts' ids (top-k) and weights.

:class:`RouteRecorder` is the ``record`` callback of :func:`fideval.model.execution.hooks.install`: the runner tells it
which rows the next experts call holds (:attr:`RouteRecorder.current`, None for the canary's second pass, whose
routes are the first pass's), and each call's ``top_k_index`` / ``top_k_weights`` -- the arguments transformers'
MoE block hands its experts module, after the family's own router (softmax, sigmoid with correction bias,
group-limited top-k, normalised and scaled or not) -- are kept per row and layer, on the device, as int16 ids and
the weights in the dtype the experts took them (docs/formats-routes.md). :meth:`RouteRecorder.pop` gives one row's
routes.

:class:`RouteForcer` is the ``force`` callback of the same wrapper (and of the vendor drivers' gate hook): it hands the
experts another run's routes -- the teacher's, read from its routes files (:class:`FileRoutes`) or, in the fused pass,
from the teacher's recorder (:class:`RecordedRoutes`) -- in place of the ones the model's own router chose, so that
the run keeps its own expert arithmetic with the teacher's choice of experts and weights (the route-controlled
decomposition, docs/formats-routes.md). Forced routes are exact: the teacher's own routes forced into the teacher
give its logits bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fideval.errors import FidevalError

MAX_EXPERT_ID = np.iinfo(np.int16).max


@dataclass(frozen=True)
class Routes:
    """One sequence's routes: ``layers`` (the MoE layers' indices, ascending), ``ids`` int16 ``[n_layers, L, k]``,
    ``weights`` ``[n_layers, L, k]`` (a CPU tensor in the dtype the experts took them), in the router's order."""

    layers: tuple[int, ...]
    ids: np.ndarray
    weights: torch.Tensor
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
                               hint="this is a bug in the runner's rows for the experts call")
        if top_k_index.numel() and int(top_k_index.max()) > MAX_EXPERT_ID:
            raise FidevalError(f"layer {layer}: expert id {int(top_k_index.max())} does not fit the routes file's int16",
                               hint="routes are recorded for models of at most 32768 routed experts")
        ids = top_k_index.detach().reshape(len(rows), length, k).to(torch.int16)
        w = top_k_weights.detach().reshape(len(rows), length, k).clone()
        for r, row in enumerate(rows):
            self.rows.setdefault(row, {})[layer] = (ids[r], w[r])

    def pop(self, row: int) -> Routes:
        """Row ``row``'s routes (every MoE layer), removed from the recorder."""
        got = self.rows.pop(row, None)
        if not got:
            raise FidevalError(f"no routes were recorded for row {row}", hint="the model has no routed experts the runner sees")
        layers = tuple(sorted(got))
        return Routes(layers, np.stack([got[i][0].cpu().numpy() for i in layers]),
                      torch.stack([got[i][1].cpu() for i in layers]), self.n_experts)


class RouteForcer:
    """``force(layer, top_k_index, top_k_weights) -> (index, weights)``: the routes of the rows the runner says the
    next experts call holds (:attr:`current`: rows and positions per row; the canary's second pass included, so that
    it repeats the first), from ``source`` (:class:`FileRoutes` or :class:`RecordedRoutes`), on the call's device,
    in its dtypes. The forced weights must have been recorded in the dtype the experts take (else one line)."""

    def __init__(self, source) -> None:
        self.source = source
        self.current: tuple[list[int], int] | None = None
        # the runner's: whether an unannounced experts call is the throughput mode's one-off warm-up on a GPU
        # (fideval.model.execution.throughput: its output is dropped), which takes its own routes
        self.warming: Callable[[], bool] = lambda: False

    def reset(self) -> None:
        self.current = None
        self.source.reset()

    def __call__(self, layer: int, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        if self.current is None and self.warming():
            return top_k_index, top_k_weights
        if self.current is None:
            raise FidevalError(f"layer {layer}: the experts were called outside a micro-batch the runner announced",
                               hint="this is a bug in the runner's rows for the experts call")
        rows, length = self.current
        got = [self.source.lookup(r, layer) for r in rows]
        ids, w = torch.stack([g[0] for g in got]), torch.stack([g[1] for g in got])
        if ids.shape[1] != length or ids.numel() != top_k_index.numel() or ids.shape[-1] != top_k_index.shape[-1]:
            raise FidevalError(f"layer {layer}: the forced routes are {list(ids.shape)} (rows, positions, top-k), the run "
                               f"routes {len(rows)} x {length} positions to top-{int(top_k_index.shape[-1])}",
                               hint="force routes recorded on the same sequences by the same model")
        if w.dtype != top_k_weights.dtype:
            raise FidevalError(f"layer {layer}: the forced route weights are {str(w.dtype).removeprefix('torch.')}, the run's "
                               f"experts take {str(top_k_weights.dtype).removeprefix('torch.')}",
                               hint="record the teacher's routes with the candidate's dtype (teacher.dtype)")
        dev = top_k_index.device
        return (ids.to(dev, non_blocking=True).reshape(top_k_index.shape).to(top_k_index.dtype),
                w.to(dev, non_blocking=True).reshape(top_k_weights.shape))


def setup(options, layers: list[int], n_experts: int | None, top_k: int | None, where) -> tuple:
    """``(recorder or None, forcer or None)`` for a runner with ``options.routes`` / ``options.force_routes`` over a
    model whose MoE layers are ``layers`` (each ``n_experts`` routed experts, ``top_k`` a token); one line for a model
    without routed experts (``where``: its folder) and for forced routes of another model. Both runners ask it."""
    record, source = bool(options.routes), options.force_routes
    for on, what, hint in ((record, "record", "record routes of"), (source is not None, "force", "force routes into")):
        if on and not layers:
            raise FidevalError(f"{where}: the model has no routed experts: there are no routes to {what}",
                               hint=f"{hint} a mixture-of-experts model only")
    if source is not None:
        check_source(source, list(layers), n_experts, top_k)
    return RouteRecorder(n_experts) if record else None, RouteForcer(source) if source is not None else None


def check_source(source, layers: list[int], n_experts: int, top_k: int | None) -> None:
    """One line when the forced routes are another model's: other MoE layers, expert count or top-k."""
    for what, theirs, ours in (("MoE layers", list(source.layers), list(layers)), ("routed experts", source.n_experts, n_experts),
                               ("top-k", source.top_k, top_k)):
        if ours is not None and theirs != ours:
            raise FidevalError(f"the forced routes have {what} {theirs}, this model {ours}",
                               hint="force the routes of a teacher of the same model (fideval teacher --routes)")


class FileRoutes:
    """Forced routes read from a routes folder (fideval.formats.routes) whose files are named by ``seq_ids[row]``
    (their digests checked before the run: fideval.score.route_control); a row's file is read once and kept until
    :meth:`reset` (a new chunk). ``layers``, ``n_experts``, ``top_k``: the index's, checked against the model
    (:func:`check_source`)."""

    def __init__(self, folder, seq_ids: list[str], layers: list[int], n_experts: int, top_k: int) -> None:
        self.folder, self.seq_ids = folder, list(seq_ids)
        self.layers, self.n_experts, self.top_k = list(layers), int(n_experts), int(top_k)
        self.rows: dict[int, tuple[dict[int, int], torch.Tensor, torch.Tensor]] = {}

    def reset(self) -> None:
        self.rows.clear()

    def lookup(self, row: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        from fideval.formats import routes as rf

        if row not in self.rows:
            sid = self.seq_ids[row]
            path = self.folder / f"{sid}.safetensors"
            if not path.is_file():
                raise FidevalError(f"the forced routes lack sequence {sid} ({path} does not exist)",
                                   hint="record the teacher's routes over the same sequences (fideval teacher --routes)")
            r = rf.read_sequence(path)
            if r["version"] < 2:
                raise FidevalError(f"{path}: routes v1 keep their weights rounded to float16, which cannot be forced exactly",
                                   hint="record the teacher's routes again with this fideval (routes v2)")
            dtype = getattr(torch, r["weights_dtype"])
            self.rows[row] = ({x: j for j, x in enumerate(r["layers"])}, torch.from_numpy(r["ids"]),
                              torch.from_numpy(r["weights"]).to(dtype))
        where, ids, w = self.rows[row]
        if layer not in where:
            raise FidevalError(f"the forced routes of {self.seq_ids[row]} have no MoE layer {layer} (they hold "
                               f"{sorted(where)})", hint="force routes recorded by the same model")
        j = where[layer]
        return ids[j], w[j]


class RecordedRoutes:
    """Forced routes taken from another runner's :class:`RouteRecorder` as it records them (the fused pass: the
    teacher's layer runs before the candidates' on the same micro-batches)."""

    def __init__(self, recorder: RouteRecorder, layers: list[int], top_k: int | None) -> None:
        self.recorder, self.layers, self.n_experts, self.top_k = recorder, list(layers), recorder.n_experts, top_k

    def reset(self) -> None:
        pass

    def lookup(self, row: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        got = self.recorder.rows.get(row, {}).get(layer)
        if got is None:
            raise FidevalError(f"row {row}, layer {layer}: the teacher has not routed it yet",
                               hint="this is a bug in the fused pass's order")
        return got
