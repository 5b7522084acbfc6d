"""A whole run's accounting: its wall time split into named parts that add up to it, tokens/s, model FLOP
utilisation, and the share of background work (weight loads, store writes) hidden behind compute.

The parts come from the run's :class:`~fideval.timing.timeline.Timeline` (device work and host waits, on the
compute stream's clock) plus ``startup`` (host time before the timeline started: opening the checkpoint,
reading the sequences, checking finished shards). ``other`` is what is left of the wall, reported so that
the parts sum to the wall exactly -- and checked to be small, since a large ``other`` means work nobody timed.
This is the ``profile`` a teacher store's manifest and a score.json record (docs/runner.md,
docs/formats-store.md, docs/formats-records.md).
"""

from __future__ import annotations

from typing import Any

import torch

# dense (no sparsity) tensor-core peak in TFLOP/s by GPU name and compute dtype; float32 is the non-tensor
# rate (TF32 is off for reproducibility). The more specific names first.
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bfloat16": 756.0, "float32": 51.0}),
    ("H100 NVL", {"bfloat16": 835.0, "float32": 60.0}),
    ("H200", {"bfloat16": 989.0, "float32": 67.0}),
    ("H100", {"bfloat16": 989.0, "float32": 67.0}),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", {"bfloat16": 312.0, "float32": 19.5}),
)
ORDER = ("startup", "load_wait", "warmup", "embed", "setup", "attention", "moe", "dense_mlp", "norms", "states", "head",
         "canary", "d2h", "store_write", "read_back", "self_check", "scoring", "cpu_check", "records", "other")


def peak_tflops(device_name: str | None, dtype: str | torch.dtype) -> float | None:
    """The GPU's dense peak for ``dtype`` (``bfloat16`` or ``float32``), None when the GPU is not known."""
    name = str(dtype).removeprefix("torch.")
    for key, peaks in PEAKS:
        if device_name and key in device_name:
            return peaks.get(name)
    return None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def summary(wall_s: float, parts: dict[str, float], *, device: str, tokens: int | None = None,
            model_flops: float | None = None, peak: float | None = None, world: int = 1,
            hidden: dict[str, float] | None = None) -> dict[str, Any]:
    """The run's profile: ``parts`` (seconds, ``other`` added so they sum to ``wall_s``), throughput, utilisation
    of ``world`` GPUs at ``peak`` TFLOP/s each (None when the peak is unknown), ``hidden`` background shares."""
    named = {k: float(v) for k, v in parts.items() if k != "other"}
    other = wall_s - sum(named.values())
    ordered = {k: round(named[k], 6) for k in sorted(named, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))}
    ordered["other"] = round(other, 6)
    tps = tokens / wall_s if tokens and wall_s > 0 else None
    util = model_flops / wall_s / (peak * 1e12 * world) if model_flops and peak and wall_s > 0 else None
    return {"wall_s": round(wall_s, 6), "parts": ordered, "other_fraction": round(other / wall_s, 6) if wall_s > 0 else 0.0,
            "device": device, "tokens": tokens, "tokens_per_s": round(tps, 3) if tps else None,
            "model_flops": model_flops, "peak_tflops": peak, "flop_utilisation": round(util, 6) if util else None,
            "hidden": {k: round(v, 6) for k, v in (hidden or {}).items()} or None}


def hidden_share(work_s: float, waited_s: float) -> float:
    """The part of background work the foreground did not wait for: 1 - waited / worked (1 when nothing ran)."""
    return 1.0 if work_s <= 0 else max(0.0, min(1.0, 1.0 - waited_s / work_s))


def line(p: dict[str, Any]) -> str:
    """One line: tokens/s, utilisation (when known), then each part's share of the wall."""
    bits = []
    if p.get("tokens_per_s"):
        bits.append(f"{p['tokens_per_s']:,.0f} tokens/s")
    if p.get("flop_utilisation") is not None:
        bits.append(f"model FLOP utilisation {p['flop_utilisation']:.1%} of {p['peak_tflops']:g} TFLOP/s")
    wall = p["wall_s"]
    shares = ", ".join(f"{k} {v / wall:.0%}" for k, v in p["parts"].items() if wall > 0 and (v / wall >= 0.005 or k == "other"))
    bits.append(f"{wall:.1f} s: {shares}")
    return "; ".join(bits)
