"""DeepSeek-V4.1-Flash's vendor kernels on the run's device.

The vendor's V4.1 code computes with ``kernel_cpu.py`` (Tenstorrent's torch port of its kernels): its tables are
built at import, on the CPU, and its accumulators are made without a device. :func:`on_device` moves the tables to
the run's device and runs each kernel the model calls with its inputs' device as torch's default, so that the same
code runs on a GPU; on a CPU both are what the code does as it stands.
"""

from __future__ import annotations

import functools
import sys

import torch


def on_device(m, device: torch.device, kernels: tuple[str, ...]) -> None:
    """The vendor's kernels (``kernel_cpu.py``, Tenstorrent's torch port) on the run's device: their module's tables
    (the E2M1 grid and rounding midpoints, built at import, on the CPU) are moved to ``device``, and each kernel the
    model calls runs with its inputs' device as torch's default, so that the accumulators it makes without a device
    (``torch.zeros(M, N)``) are made there. On a CPU both are what the code does as it stands."""
    for k in kernels:
        fn = getattr(m, k, None)
        if fn is None:
            continue
        mod = sys.modules.get(fn.__module__)
        for name, v in list(vars(mod).items()) if mod is not None else ():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.device != device:
                setattr(mod, name, v.to(device))
        if getattr(fn, "__fideval_device_scoped__", False):
            continue

        @functools.wraps(fn)
        def scoped(*args, __fn=fn, **kw):
            t = next((x for x in args if isinstance(x, torch.Tensor)), None)
            if t is None or t.device.type == "cpu":
                return __fn(*args, **kw)
            with torch.device(t.device):
                return __fn(*args, **kw)

        scoped.__fideval_device_scoped__ = True
        setattr(m, k, scoped)
