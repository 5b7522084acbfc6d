"""The GPU benches' one timer: median seconds of a callable over CUDA events, after warm-ups."""

from __future__ import annotations

import numpy as np
import torch


def timed(fn, reps: int = 5, warmups: int = 2) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after ``warmups`` untimed ones (CUDA events)."""
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return float(np.median(times))
