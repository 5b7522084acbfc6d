"""Quantize-dequantize throughput of every emulated format (ceiling: a plain float32 read+write copy).

Emulating a candidate runs ``weight_transform`` once per tensor as the runner materialises each layer,
so for a 600B-parameter model this is ~1.2e12 elements: the figure that matters is elements per second
against what memory bandwidth allows. The ceiling is ``torch.clone`` of the same float32 tensor (one read
and one write); our formats do several passes (amax, scale, cast, codes, decode), so a few x below it is
expected. Prints one table, one row per format and recipe, after the serving path's activation quant-dequant
(``act_quant_e4m3``, which a candidate's serving path runs on every MoE block's inputs: the Triton kernel on
CUDA and the torch version it replaced). Formats with a weight kernel (MX, fp8_block, nvfp4:
fideval.quant.weight_kernel, what ``quant_dequant`` runs on CUDA) get a second row, ``<format>, torch path``: the
chunked torch path it replaced.
Usage: python bench/quant_throughput.py [--device cuda] [--rows 4096] [--cols 7168] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from fideval.quant import Format, list_formats
from fideval.quant.activations import act_quant_e4m3, act_quant_e4m3_torch


def _time(fn, device: str, repeats: int) -> float:
    fn()  # warm-up (tables, kernels)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    x = torch.randn(a.rows, a.cols, device=a.device, generator=None)
    n = x.numel()
    ceiling = n / _time(lambda: x.clone(), a.device, a.repeats)
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)"
    print("| format | recipe | Gelem/s | ceiling: float32 clone Gelem/s | fraction | device | tensor |")
    print("|---|---|---|---|---|---|---|")
    # the serving path's activations: E4M3 per 1x128 (bf16 in and out, as a bf16 run quantizes them); the kernel
    # on CUDA (fideval.quant.act_kernel, what act_quant_e4m3 runs there) beside the torch version it replaced;
    # the ceiling stays the float32 clone: the same element count, twice the bytes of a bf16 read + write
    xb = x.to(torch.bfloat16)
    for label, fn in (("act_quant_e4m3 (what the runner calls)", act_quant_e4m3),
                      ("act_quant_e4m3, torch version", act_quant_e4m3_torch)):
        for r in ("fp32", "ue8m0"):
            s = _time(lambda: fn(xb, 128, r), a.device, a.repeats)
            print(f"| {label} | {r} | {n / s / 1e9:.3f} | {ceiling / 1e9:.3f} | {n / s / ceiling:.3f} | {dev} | {a.rows}x{a.cols} bf16 |")
    for f in list_formats():
        # a format that overrides Format._qdq_kernel has a weight kernel: also time its torch path (kernel=False)
        paths = [(f.name, True)] + ([(f"{f.name}, torch path", False)] if type(f)._qdq_kernel is not Format._qdq_kernel else [])
        for label, kernel in paths:
            for r in f.recipes:
                s = _time(lambda: f.quant_dequant(x, r, kernel=kernel), a.device, a.repeats)
                print(f"| {label} | {r} | {n / s / 1e9:.3f} | {ceiling / 1e9:.3f} | {n / s / ceiling:.3f} | {dev} | {a.rows}x{a.cols} |")


if __name__ == "__main__":
    main()
