"""What the runner adds to transformers' modules: activation transforms on the inputs of quantized
linears (and of the routed experts' projections), the model-parallel expert wrapper, and the canary.

Weight transforms need no hook: :meth:`~fideval.model.adapters.Adapter.materialize` applies them once, as
a layer's tensors are filled in. Activations exist only while a layer runs, so they are transformed by
forward pre-hooks, by module class (:mod:`fideval.quant.module_classes`), on full parameter names
(:mod:`fideval.model.execution.transforms`, the vendor drivers' way too).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch

from fideval.model.execution import determinism
from fideval.model.execution import experts as experts_path
from fideval.model.execution.transforms import hook_inputs, linears
from fideval.quant.module_classes import MODULE_CLASSES, module_class_of


def check_act_transform(act_transform: dict | None) -> dict:
    """A copy of ``act_transform`` (module class -> fn); a key that is not a module class is a ValueError."""
    act = dict(act_transform or {})
    bad = sorted(set(act) - set(MODULE_CLASSES))
    if bad:
        raise ValueError(f"act_transform keys {bad} are not module classes {MODULE_CLASSES}")
    return act


def install(layer: torch.nn.Module, i: int, act_transform: dict[str, Callable], ex: tuple[int, int] | None,
            world: int, group, lean: bool, record: Callable | None = None, force: Callable | None = None) -> None:
    """Layer ``i``: act_transform on inputs of attention / shared / dense linears, and the routed experts'
    wrapper (the transform on their inputs and inside them, this rank's experts [lo, hi) only, the sum
    over ranks; ``lean``: fideval.model.execution.experts' forward where it supports the module).
    ``record(i, top_k_index, top_k_weights)``: the routes as the model computed them (every expert id, before
    this rank's cut), once per experts call (fideval.model.routes.RouteRecorder). ``force(i, top_k_index,
    top_k_weights) -> (index, weights)``: the routes the experts take instead (fideval.model.routes.RouteForcer;
    recorded after forcing, so a forced run's record is what its experts took)."""
    hook_inputs(act_transform, lambda name: module_class_of(f"model.layers.{i}.{name}.weight"), linears(layer))
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    if experts is None:
        return
    # The wrappers reach the module through a weak reference: a closure kept on the module that held the module
    # itself (or a bound method of it) would be a reference cycle, which keeps the experts' weights -- 22.5 GB a
    # DeepSeek-V3 layer in bf16 -- alive after the runner drops the layer, until a full garbage collection.
    ref, cls, layer_index = weakref.ref(experts), type(experts), i
    fn = act_transform.get("routed_experts")
    # one rank, grouped_mm selected, a gated bias-free module: the same bits with less traffic (experts.py)
    lean = lean and experts_path.supported(experts)
    if lean:
        def original(h, i, w):
            return experts_path.forward(ref(), h, i, w)
    elif fn is not None:
        # the down projection's input exists only inside the experts' forward: transformers' grouped_mm
        # path (and experts.py) computes it in ``_apply_gate``, so we wrap that and call the grouped_mm path.
        from transformers.integrations.moe import grouped_mm_experts_forward

        def original(h, i, w):
            return grouped_mm_experts_forward(ref(), h, i, w)
    else:
        def original(h, i, w):
            return cls.forward(ref(), h, i, w)
    if fn is not None:
        gate = cls._apply_gate
        experts._apply_gate = lambda x: fn(gate(ref(), x))

    def forward(hidden, top_k_index, top_k_weights):
        if force is not None:
            top_k_index, top_k_weights = force(layer_index, top_k_index, top_k_weights)
        if record is not None:
            record(layer_index, top_k_index, top_k_weights)
        if ex is not None:
            lo, hi = ex
            inside = (top_k_index >= lo) & (top_k_index < hi)
            top_k_index = torch.where(inside, top_k_index - lo, torch.full_like(top_k_index, hi - lo))
        if fn is not None:  # row-wise transform: same as transforming each expert's gathered copy
            hidden = fn(hidden)
        out = original(hidden, top_k_index, top_k_weights)
        if world > 1:
            import torch.distributed as dist

            part = out.to(torch.float32)
            dist.all_reduce(part, group=group)
            out = part.to(out.dtype)
        return out

    experts.forward = forward


def warm_experts(config, device: torch.device, dtype: torch.dtype, stats: dict) -> None:
    """On CUDA, compile fideval.model.execution.experts' Triton kernels before the first MoE block, so that no block pays
    a just-in-time compile; the wall time is ``stats["warmup_s"]`` (part of the run's ``wall_s``)."""
    k = getattr(config, "num_experts_per_tok", None)
    if not (k and device.type == "cuda"):
        return
    t0 = time.perf_counter()
    experts_path.warmup(device, dtype, int(k), int(config.hidden_size))
    stats["warmup_s"] = stats.get("warmup_s", 0.0) + time.perf_counter() - t0


def canary_pair(verdict: dict) -> str:
    """A :class:`Canary` verdict's two digests, shortened, for a one-line message (``digest_*``; stores written before
    2026-12-08 have ``sha256_*``)."""
    a, b = (str(verdict.get(f"digest_{k}") or verdict.get(f"sha256_{k}") or "")[-12:] for k in ("start", "end"))
    return f"{a} vs {b}"


class Canary:
    """The run's first micro-batch computed again as its last; the first sequence's logits must be
    bit-identical both times (a GPU whose kernels drift, or a composition-dependent path, shows here).

    The runner yields the first pass (:meth:`first`) and withholds the second (:meth:`last`);
    :attr:`verdict` is ``{"row", "digest", "digest_start", "digest_end", "identical"}`` once the second has run
    (``digest``: the function, :data:`fideval.model.execution.determinism.DIGEST`)."""

    def __init__(self, rows: list[int]):
        self.rows = rows
        self.start: str | None = None
        self.verdict: dict | None = None

    def first(self, row: int, logits: torch.Tensor) -> None:
        if self.rows and self.start is None and row == self.rows[0]:
            self.start = determinism.digest(logits)

    def last(self, row: int, logits: torch.Tensor) -> None:
        """The second pass; with no first pass to compare (a resumed run that skipped it and had no stored
        digest) the verdict stays None: unchecked, not failed."""
        if row == self.rows[0] and self.start is not None:
            end = determinism.digest(logits)
            self.verdict = {"row": row, "digest": determinism.DIGEST, "digest_start": self.start, "digest_end": end,
                            "identical": self.start == end}
