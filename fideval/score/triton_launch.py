"""Launch a Triton kernel again through its compiled handle, without the JIT's per-call argument work.

Why: a single scoring call's first kernel cannot start before the host has launched it, and a
``fn[grid](...)`` call in Triton 3.6 spends tens of microseconds of host time binding and specialising its
arguments. On the H200 machine (2026-12-04, three A/B rounds in one process) a score_rows call took 200-218 us
of host time through the JIT and 110-119 us through this module (256-286 against 144-172 us right after a
synchronize, when the host is slowest), and a single call, timed with CUDA events, 809-867 against 747-752 us;
its two kernels alone take ~665 us (bench/RESULTS.md).

The first launch for each key goes through Triton, which compiles and caches as usual and returns the compiled
kernel; later launches with the same key call that kernel's launcher as its runner does
(``CompiledKernel.run``, every parameter in signature order, constexprs included, their order worked out
once). The key holds everything Triton specialises a compilation on, or finer: the kernel, the current device,
the launch options and constexprs given (in the order given), every integer argument's exact value, each
tensor's dtype and whether its address is 16-byte aligned, and the type of every other argument. A cached
kernel is therefore never launched on arguments it was not compiled for; a new stride, vocabulary or alignment
costs one ordinary launch.
"""

from __future__ import annotations

import torch
from triton import knobs
from triton.runtime import driver

_CACHE: dict = {}
ENABLED = True  # False: every launch through Triton's JIT (for comparisons)


def _spec(x):
    t = type(x)
    if t is int:
        return x
    if t is torch.Tensor or isinstance(x, torch.Tensor):
        return (x.dtype, not x.data_ptr() & 15)
    return (t, x) if t is bool or t is str else t


def launch(fn, grid: tuple, *args, **kwargs):
    """``fn[grid](*args, **kwargs)``, through the compiled kernel's launcher once Triton has seen the key.
    ``kwargs``: constexprs and launch options (``num_warps``...), never tensors. Returns the compiled kernel.

    With a launch hook set (a profiler such as Proton), every launch goes through Triton's own runner."""
    if knobs.runtime.interpret:  # TRITON_INTERPRET: no driver, no compiled kernel to keep
        return fn[grid](*args, **kwargs)
    dev = driver.active.get_current_device()  # Triton compiles and loads a kernel per current device
    key = (fn, dev, tuple(kwargs.items()), *map(_spec, args))
    hit = _CACHE.get(key) if ENABLED else None
    if hit is None:
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise TypeError("triton_launch.launch: pass tensors positionally, not as keywords")
        kernel = fn[grid](*args, **kwargs)
        if kernel is not None:
            tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in fn.params[len(args):])
            _CACHE[key] = (kernel, tail)
        return kernel
    kernel, tail = hit
    g = (tuple(grid) + (1, 1))[:3]
    if knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls:  # 3.6: hook chains
        kernel[g](*args, *tail)
    else:  # what the runner does, less its (empty) hook chains: the launcher on the current stream
        kernel.run(g[0], g[1], g[2], driver.active.get_current_stream(dev), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *tail)
    return kernel


def clear() -> None:
    """Forget the compiled kernels (Triton's own cache keeps them)."""
    _CACHE.clear()
