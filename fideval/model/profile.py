"""Time per part of a run (attention, MoE, dense MLP, norms), on when ``RunnerOptions.profile`` is set.

On a GPU a region is timed with a pair of CUDA events (recorded, never waited on, so profiling does not
serialise the stream); :func:`fold_events` synchronises once at the end and turns them into seconds.
On a CPU, wall time around the region is exact enough. Off, :func:`timed` is a null context.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch


class _Timer:
    """Adds a region's time to ``stats[key]``: CUDA events on a GPU (summed by :func:`fold_events`)."""

    def __init__(self, stats: dict, key: str, device: torch.device):
        self.stats, self.key, self.cuda = stats, key, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
            self.stats.setdefault("_events", []).append((self.key, self.a, self.b))
        else:
            self.stats[self.key] = self.stats.get(self.key, 0.0) + time.perf_counter() - self.t0
        return False


def timed(on: bool, stats: dict, key: str, device: torch.device):
    """A context that adds its region's time to ``stats[key]`` when ``on``."""
    return _Timer(stats, key, device) if on else nullcontext()


def fold_events(stats: dict, device: torch.device) -> dict:
    """Fold recorded CUDA events into seconds per region (synchronizes); ``moe_s_each``: every MoE block's
    milliseconds in run order (layer by layer), to see whether blocks slow down while a layer loads;
    ``attn_s_each``: the same for every micro-batch's attention."""
    events = stats.pop("_events", [])
    if events:
        torch.cuda.synchronize(device)
    for key, a, b in events:
        ms = a.elapsed_time(b)
        stats[key] = stats.get(key, 0.0) + ms / 1000
        if key in ("moe_s", "attn_s"):
            stats.setdefault(key + "_each", []).append(round(ms, 2))
    return stats
