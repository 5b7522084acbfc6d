"""Launch a Triton kernel again through its compiled handle, without the JIT's per-call argument work.

Why: a single scoring call's first kernel cannot start before the host has launched it, and a
``fn[grid](...)`` call in Triton 3.6 spends tens of microseconds of host time binding and specialising its
arguments. On the H200 machine (2026-12-04) one score_rows call took 197-309 us of host time through the
JIT and 127-160 us through this module; the whole call, timed with CUDA events, 855 -> 823 us and 917 -> 843
us in two same-process A/B runs, against 682-738 us when a busy-wait kernel ahead of it hid all host work
(bench/RESULTS.md).

The first launch for each key goes through Triton, which compiles and caches as usual and returns the compiled
kernel; later launches with the same key call that kernel's own runner (``CompiledKernel[grid](*args)``, every
parameter in signature order, constexprs included). The key holds everything Triton specialises a compilation
on, or finer: the kernel, the first argument's device, the launch options and constexprs given (in the order
given), every integer argument's exact value, each tensor's dtype and whether its address is 16-byte aligned,
and the type of every other argument. A cached kernel is therefore never launched on arguments it was not
compiled for; a new stride, vocabulary or alignment costs one ordinary launch.
"""

from __future__ import annotations

import torch

_CACHE: dict = {}
ENABLED = True  # False: every launch through Triton's JIT (for comparisons)


def _spec(x):
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.data_ptr() % 16 == 0)
    if type(x) is int:
        return x
    return (type(x), x) if isinstance(x, (bool, str)) else type(x)


def launch(fn, grid: tuple, *args, **kwargs):
    """``fn[grid](*args, **kwargs)``, through the compiled kernel's runner once Triton has seen the key.
    Returns the compiled kernel."""
    key = (fn, args[0].device if isinstance(args[0], torch.Tensor) else None,
           tuple((k, _spec(v)) if isinstance(v, torch.Tensor) else (k, v) for k, v in kwargs.items()),
           tuple(map(_spec, args)))
    kernel = _CACHE.get(key) if ENABLED else None
    if kernel is None:
        kernel = fn[grid](*args, **kwargs)
        _CACHE[key] = kernel
        return kernel
    tail = [kwargs[p.name] if p.name in kwargs else p.default for p in fn.params[len(args):]]
    kernel[(tuple(grid) + (1, 1))[:3]](*args, *tail)  # the runner takes all three grid sizes
    return kernel


def clear() -> None:
    """Forget the compiled kernels (Triton's own cache keeps them)."""
    _CACHE.clear()
