"""Routes of the vendor's own code (``model.implementation: reference``): recorded and forced at its ``Gate``.

Every vendor MoE (DeepSeek-V3, V3.2-Exp, V4.1-Flash) routes by one call, ``weights, indices = self.gate(x)`` (V4.1:
``self.gate(x, image_mask)``), whose output its experts loop -- or fideval's grouped experts
(:mod:`.grouped_experts`), which call the gate as a module too -- takes as it is. :func:`install` puts one forward
hook on each MoE layer's ``Gate`` module. The hook

* with a :class:`~fideval.model.routes.RouteForcer`, replaces the gate's output by the forced routes, in the gate's
  own dtypes on its device (indices int64; weights as the vendor's gate returns them: ``type_as(x)`` in V3, float32
  in V3.2 and V4.1 -- routes recorded in another dtype are refused by the forcer in one line);
* with a :class:`~fideval.model.routes.RouteRecorder`, hands it the routes the experts then take (the forced ones
  when forced): every expert id, before model parallel's cut (the vendor's ``Gate`` holds the whole router and
  computes the full routing on every rank; each rank's MoE then keeps its own experts' share); rank 0 writes.

What the gate returns is what the docs call the routes (docs/formats-routes.md): V3, V3.2: sigmoid or softmax scores,
group-limited top-k (with the correction bias only at dim 7168, the vendor's rule), weights normalised (sigmoid) and
scaled by ``route_scale``; V4.1: ``sqrt(softplus(logits / gate_temp))`` (``score_func: sqrtsoftplus``), the bias
choosing the experts only, weights normalised (``norm_topk_prob``, + 1e-20) and scaled by ``route_scale``. Every
V4.1 layer routes by its learned gate: the hashing in V4.1 is Engram's n-gram table lookup, not an expert choice,
so nothing else routes (its DSpark/MTP layers, which would route by their own gates, are not built).

Which layers have a gate, their experts and top-k come from the driver's ``routing()`` (:class:`Routing`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fideval.errors import FidevalError


@dataclass(frozen=True)
class Routing:
    """A driver's MoE layers: ``layers`` (ascending; dense layers left out), ``n_experts`` routed experts and
    ``top_k`` per token in each, and the vendor's ``gate`` class (the module whose output is the routes)."""

    layers: tuple[int, ...]
    n_experts: int
    top_k: int
    gate: type


def routing(driver) -> Routing:
    """``driver.routing()``; one line for a driver that does not say where its routes are."""
    fn = getattr(driver, "routing", None)
    if not callable(fn):
        raise FidevalError(f"the reference driver {type(driver).__name__} does not say where its MoE routes are",
                           hint="record or force routes with model.implementation: transformers")
    return fn()


def setup(driver, options, where: str) -> tuple[Routing, object, object]:
    """``(routing, recorder or None, forcer or None)`` for a reference runner with ``options.routes`` /
    ``options.force_routes``; the transformers runner's refusals, each in one line (``where``: the model folder). The
    reference runner has no throughput mode (its MoE blocks run whole, per micro-batch): nothing to refuse there."""
    from fideval.model import routes

    r = routing(driver)
    return (r, *routes.setup(options, list(r.layers), r.n_experts, r.top_k, where))


def install(block: torch.nn.Module, layer: int, gate: type, record: Callable | None = None,
            force: Callable | None = None) -> torch.utils.hooks.RemovableHandle:
    """The routes hook on the one ``gate`` module of ``block`` (layer ``layer``, an MoE layer); returns its handle.
    ``force(layer, indices, weights) -> (indices, weights)``, then ``record(layer, indices, weights)``."""
    gates = [m for m in block.modules() if isinstance(m, gate)]
    if len(gates) != 1:
        raise FidevalError(f"layer {layer}: {len(gates)} {gate.__name__} modules, an MoE layer has one",
                           hint="this is a bug in the reference driver's routing()")

    def hook(module, args, out):
        weights, indices = out
        if force is not None:
            indices, weights = force(layer, indices, weights)
        if record is not None:
            record(layer, indices, weights)
        return weights, indices

    return gates[0].register_forward_hook(hook)
