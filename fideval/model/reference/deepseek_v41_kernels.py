"""DeepSeek-V4.1-Flash's vendor kernels on the run's device.

The vendor's V4.1 code computes with ``kernel_cpu.py`` (Tenstorrent's torch port of its kernels): its tables are
built at import, on the CPU, and its accumulators are made without a device. :func:`on_device` moves the tables to
the run's device and runs each kernel the model calls with its inputs' device as torch's default, so that the same
code runs on a GPU; on a CPU both are what the code does as it stands.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
import types

import torch


def on_device(m, device: torch.device, kernels: tuple[str, ...]) -> None:
    """The vendor's kernels (``kernel_cpu.py``, Tenstorrent's torch port) on their inputs' device: a kernel called
    with CUDA inputs runs as a copy of its module whose tables (the E2M1 grid and rounding midpoints, built at import,
    on the CPU) live on that device (:func:`_module_on`), with that device as torch's default, so that the
    accumulators it makes without a device (``torch.zeros(M, N)``) are made there; with CPU inputs, the module as it
    stands. The module itself is never changed: a CPU caller in the same process (a test's weight writer, a CPU
    driver) still gets its CPU tables (moving them in place broke exactly that, on an H100 on 2026-12-07)."""
    for k in kernels:
        fn = getattr(m, k, None)
        if fn is None or getattr(fn, "__fideval_device_scoped__", False):
            continue
        mod = sys.modules.get(fn.__module__)

        @functools.wraps(fn)
        def scoped(*args, __fn=fn, __mod=mod, **kw):
            t = next((x for x in args if isinstance(x, torch.Tensor)), None)
            if t is None or t.device.type == "cpu" or __mod is None:
                return __fn(*args, **kw)
            with torch.device(t.device):
                return getattr(_module_on(__mod, t.device), __fn.__name__)(*args, **kw)

        scoped.__fideval_device_scoped__ = True
        setattr(m, k, scoped)


_COPIES: dict[tuple[str, str], types.ModuleType] = {}
_LOCK = threading.Lock()


def _module_on(mod: types.ModuleType, device: torch.device) -> types.ModuleType:
    """A second instance of the kernel module ``mod`` (executed from its own file), its tensor tables on ``device``."""
    key = (mod.__name__, str(device))
    with _LOCK:
        if key not in _COPIES:
            spec = importlib.util.spec_from_file_location(f"{mod.__name__}__on_{device.type}_{device.index}", mod.__file__)
            copy = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(copy)
            for name, v in list(vars(copy).items()):
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    setattr(copy, name, v.to(device))
            _COPIES[key] = copy
        return _COPIES[key]
