"""The one place that turns the CLI's and the config's device and dtype names into torch objects, for the
teacher, the candidate and the runner, so that ``auto`` and a missing GPU mean the same everywhere."""

from __future__ import annotations

import torch

from fideval.errors import FidevalError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` -> cuda when torch sees a GPU, else cpu; an explicit cuda without one is a one-line error."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise FidevalError(f"--device {device!r} is not a device", hint="use cpu, cuda or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FidevalError("--device cuda was asked for but torch sees no CUDA device", hint="use --device cpu or auto")
    return dev


def resolve_dtype(dtype: str) -> torch.dtype:
    """A layer compute dtype by name: ``float32`` or ``bfloat16`` (the lm head is float32 either way)."""
    if dtype not in DTYPES:
        raise FidevalError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[dtype]
