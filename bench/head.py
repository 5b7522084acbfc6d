"""Bench: the lm head's two arithmetics (fideval.model.execution.head) at DeepSeek-V3's sizes (hidden 7,168, vocabulary
129,280), on the runner's own modules: ``float32`` (float32 GEMM, TF32 off: the runner's numerics) against
``bf16`` (the same bfloat16 operands on the tensor cores, float32 sums), over one micro-batch of tokens.

Run on the GPU machine: ``PYTHONPATH=. python3 bench/head.py [--tokens 16384]``. Prints one table: each mode's
time and TFLOP/s against the GPU's dense bf16 peak, and both modes' max error against a float64 oracle of the
same bfloat16 operands (rows sampled), relative to the sums' magnitude.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fideval.model.execution import head  # noqa: E402
from fideval.timing import accounting  # noqa: E402


def timed(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/head.py needs a GPU (the bf16 head's GEMM is CUDA's)")
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    why = head.unusable(dev, torch.bfloat16, None)
    if why:
        raise SystemExit(f"the bf16 head cannot run here: {why}")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(a.tokens, a.hidden, device=dev, generator=g).bfloat16()
    w = (torch.randn(a.vocab, a.hidden, device=dev, generator=g) * 0.02).bfloat16()
    f32 = torch.nn.Linear(a.hidden, a.vocab, bias=False, device="meta")
    f32.load_state_dict({"weight": w.float()}, assign=True)
    b16 = head.Bf16Head(w)
    xf = x.float()
    flop = 2.0 * a.tokens * a.hidden * a.vocab
    peak = accounting.peak_tflops(accounting.device_name(dev), "bfloat16")
    with torch.no_grad():
        t32 = timed(lambda: f32(xf), a.reps)
        t16 = timed(lambda: b16(x), a.reps)
        rows = torch.randperm(a.tokens, generator=torch.Generator().manual_seed(1))[:64].to(dev)
        oracle = x[rows].double() @ w.double().t()
        scale = float((x[rows].double().abs() @ w.double().abs().t()).max())
        e32 = float((f32(xf[rows]).double() - oracle).abs().max()) / scale
        e16 = float((b16(x[rows]).double() - oracle).abs().max()) / scale
    ceiling = f"{peak:.0f} TFLOP/s bf16 peak" if peak else "-"
    out = [("float32 head (float32 GEMM, TF32 off)", f"{t32 * 1e3:.1f} ms, {flop / t32 / 1e12:.0f} TFLOP/s", ceiling),
           ("bf16 head (bf16 operands, float32 sums)", f"{t16 * 1e3:.1f} ms, {flop / t16 / 1e12:.0f} TFLOP/s", ceiling),
           ("speed-up bf16 / float32", f"{t32 / t16:.1f}x", ""),
           ("max error vs float64 oracle / sum magnitude (64 rows): float32, bf16", f"{e32:.2g}, {e16:.2g}", "float32 summation, ~1e-7")]
    print(f"\nlm head, {torch.cuda.get_device_name()}, {a.tokens:,} tokens x hidden {a.hidden:,} x vocab {a.vocab:,}")
    w0 = max(len(r[0]) for r in out)
    print(f"| {'figure'.ljust(w0)} | measured | ceiling |\n|{'-' * (w0 + 2)}|---|---|")
    for r in out:
        print(f"| {r[0].ljust(w0)} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
