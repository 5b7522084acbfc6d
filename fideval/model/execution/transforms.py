"""A candidate's two hooks applied to a model's modules, one way for every backend: the transformers adapter
(fideval.model.adapters, fideval.model.execution.hooks) and the three vendor-code drivers (fideval.model.reference).

* :func:`transform_weight` -- the quant spec's ``weight_transform(module_class, name, tensor)`` once per tensor as
  a unit is materialised, its result checked to keep the tensor's shape (a transform that reshaped would load
  wrong weights without a word); one that takes ``out=`` writes into the load's own tensor when given one.
* :func:`hook_inputs` -- the quant spec's ``act_transform`` (module class -> fn) on the inputs of a module's
  linears, by each linear's module class (fideval.quant.module_classes), as forward pre-hooks: activations exist
  only while a layer runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import torch


def takes_out(fn: Callable) -> bool:
    """Whether a weight transform takes the ``out=`` keyword (writes its result into a given tensor)."""
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False


def transform_weight(fn: Callable, module_class: str, name: str, tensor: torch.Tensor, *,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """``fn(module_class, name, tensor)`` (into ``out`` when ``fn`` takes it), which must keep the shape: else a
    ValueError naming the tensor (a bug of the transform, not of the user's input)."""
    y = fn(module_class, name, tensor, out=out) if out is not None and takes_out(fn) else fn(module_class, name, tensor)
    if tuple(y.shape) != tuple(tensor.shape):
        raise ValueError(f"weight_transform changed the shape of {name}")
    return y


def hook_inputs(act_transform: dict[str, Callable], class_of: Callable[[str], str | None],
                targets: Iterable[tuple[str, torch.nn.Module]], *, keep_dtype: bool = False) -> int:
    """``act_transform[class_of(name)]`` on the first input of each ``(name, module)`` in ``targets`` (a module
    whose class has no transform is left alone); ``keep_dtype``: the result is cast back to the input's dtype
    (a vendor linear whose transform computes in another). Returns how many modules were hooked."""
    n = 0
    for name, mod in targets:
        fn = act_transform.get(class_of(name)) if act_transform else None
        if fn is None:
            continue
        if keep_dtype:
            mod.register_forward_pre_hook(lambda _m, args, f=fn: (f(args[0]).to(args[0].dtype), *args[1:]))
        else:
            mod.register_forward_pre_hook(lambda _m, args, f=fn: (f(args[0]), *args[1:]))
        n += 1
    return n


def linears(module: torch.nn.Module, kind: type | tuple[type, ...] = torch.nn.Linear) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of every submodule of ``module`` (itself included, as ``""``) that is a ``kind``."""
    return [(n, m) for n, m in module.named_modules() if isinstance(m, kind)]
