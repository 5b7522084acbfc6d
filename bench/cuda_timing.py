"""The GPU benches' timers: median seconds of a callable over CUDA events, after warm-ups; and seconds per call
of a callable run back to back for seconds, with the clock and power it ran at."""

from __future__ import annotations

import shutil
import subprocess
import time

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


def sustained(fn, seconds: float = 2.0, batch: int = 10) -> dict:
    """``fn`` called back to back for ``seconds`` (a synchronize every ``batch`` calls): seconds per call, and the
    SM clock (MHz), board power (W) and active clock-throttle reasons that ``nvidia-smi`` samples every 100 ms
    over the last two thirds of the run (None where nvidia-smi is missing). Why: a float64-heavy kernel can
    meet the board's power cap, which then lowers the SM clock; a copy of the same bytes does not."""
    smi = shutil.which("nvidia-smi")
    p = subprocess.Popen([smi, "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
                          "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True) if smi else None
    torch.cuda.synchronize()
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(batch):
            fn()
        k += batch
        torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / k
    out = {"sec": sec, "mhz": None, "watts": None, "throttle": None}
    if p is not None:
        p.terminate()
        rows = [r.split(", ") for r in p.communicate()[0].strip().splitlines() if r.count(",") == 2]
        rows = rows[len(rows) // 3:]
        try:
            out["mhz"] = float(np.median([float(r[0]) for r in rows]))
            out["watts"] = float(np.median([float(r[1]) for r in rows]))
            out["throttle"] = sorted({r[2].strip() for r in rows})
        except (ValueError, IndexError):  # a field this driver does not report ("[N/A]")
            pass
    return out


def clock_note(s: dict) -> str:
    """``sustained``'s clock, power and throttle reasons as a bench note."""
    if s["mhz"] is None:
        return "clocks not sampled (no nvidia-smi)"
    return f"SM {s['mhz']:.0f} MHz, {s['watts']:.0f} W, throttle reasons {'/'.join(s['throttle'])}"
