"""Bench: the reference-code backend (DeepSeek's own ``inference/model.py``, layer by layer) against the
transformers backend, on one GPU, in the same run, on the same checkpoint and tokens.

Run on the GPU machine: ``PYTHONPATH=. python3 bench/reference.py`` (``--small`` for a CPU smoke run in seconds).
The checkpoint is bench/evaluation.py's: DeepSeek-V3's real layer shapes (hidden 7,168, 128 heads, 256 experts
of 2,048, top-8 in 8 groups, vocabulary 129,280) in the real FP8 release layout (E4M3 + 128x128 float32
``weight_scale_inv``, per-expert tensors), 1 dense + 2 MoE layers, random values; its ``inference/`` is a link to
DeepSeek's code (``--code``, default ``../shared/reference-code/deepseek-v3``). Both backends run N = 1, bfloat16,
the same micro-batches, no throughput mode (the reference code has none), the logits consumed on the device,
after one warm-up run of each (imports, kernel compilation, page cache).

Figures: tokens/s of each backend (whole runs, weight loading included, as the teacher would see it), the MoE
FLOP utilisation of each (routed + shared experts and router FLOPs from fideval.model.flops over the time of the
``moe`` part, against the GPU's dense bf16 peak), their time per part, and how far apart their logits are (mean
KLD of reference vs transformers, nats; the vendor's bf16 router rounds differently, docs/runner.md).
Prints one table: figure | measured | ceiling.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import evaluation as ev  # noqa: E402  (bench/evaluation.py: the checkpoint writer and the table)

CODE = ROOT.parent / "shared" / "reference-code" / "deepseek-v3"


def run_backend(ckpt: Path, implementation: str, toks: np.ndarray, device: str, dtype: torch.dtype,
                micro_batch: int) -> dict:
    """One whole run over ``toks``: wall time, the runner's parts, the last sequence's logits (for the KLD)."""
    from fideval.model.runner import RunnerOptions, make_runner

    extra = {"implementation": "reference", "trust_remote_code": True} if implementation == "reference" else {}
    opts = RunnerOptions(device=device, dtype=dtype, micro_batch=micro_batch, profile=True, mlp_tokens=None, **extra)
    t_build = time.perf_counter()
    runner = make_runner(ckpt, opts)
    startup = time.perf_counter() - t_build
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    kept, checksum = {}, 0.0
    for row, logits in runner.run(toks, canary=False):
        checksum += float(logits[-1, 0])  # consumed on the device (one scalar per sequence leaves it)
        if row >= len(toks) - 2:
            kept[row] = logits[-64:].double().cpu()
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    stats = runner.finish_profile()
    return {"wall_s": wall, "startup_s": startup, "parts": stats.get("parts", {}), "logits": kept, "tokens": toks.size,
            "load_s": stats["load_s"], "wait_s": stats["wait_s"]}


def mean_kld(a: dict, b: dict) -> float:
    vals = []
    for row in a:
        la, lb = a[row].log_softmax(-1), b[row].log_softmax(-1)
        vals.append((la.exp() * (la - lb)).sum(-1).mean().item())
    return float(np.mean(vals))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized smoke run (seconds)")
    ap.add_argument("--dir", default="/tmp/fideval-reference-bench")
    ap.add_argument("--code", default=str(CODE), help="DeepSeek-V3's inference/ folder")
    ap.add_argument("--seqs", type=int, default=16, help="sequences per run")
    ap.add_argument("--length", type=int, default=2048, help="tokens per sequence")
    ap.add_argument("--micro-batch", type=int, default=4)
    a = ap.parse_args()
    s = dict(ev.SMALL) if a.small else dict(ev.V3)
    device = "cpu" if a.small or not torch.cuda.is_available() else "cuda"
    n, L, mb = (2, 16, 1) if a.small else (a.seqs, a.length, a.micro_batch)
    dtype = torch.bfloat16
    work = Path(a.dir)
    ckpt = work / ("ckpt-small" if a.small else "ckpt")
    if not (ckpt / "model.safetensors.index.json").is_file():
        ev.write_checkpoint(ckpt, s)
    link = ckpt / "inference"
    if not link.exists():
        link.symlink_to(Path(a.code).resolve(), target_is_directory=True)
    toks = np.random.default_rng(0).integers(0, s["vocab"], size=(n, L)).astype(np.int32)

    from fideval.model.flops import flops_per_token

    per_tok = flops_per_token(ev.hf_config(s, s["layers"]), L)
    for impl in ("transformers", "reference"):  # imports, kernels compiled, page cache warm: not the figures
        run_backend(ckpt, impl, toks[:1, :8], device, dtype, 1)
    res = {impl: run_backend(ckpt, impl, toks, device, dtype, mb) for impl in ("transformers", "reference")}
    peak = ev.PEAK if device == "cuda" else None
    rows = []
    for impl, r in res.items():
        moe_s = r["parts"].get("moe", 0.0)
        util = per_tok["moe"] * r["tokens"] / moe_s / peak if peak and moe_s else None
        rows += [(f"{impl}: tokens/s (the run, weight loading included; {n} x {L}, micro-batch {mb})", f"{r['tokens'] / r['wall_s']:,.0f}",
                  "the GPU's bf16 peak / model FLOPs per token: " + (f"{peak / per_tok['total']:,.0f}" if peak else "n/a (CPU)")),
                 (f"{impl}: MoE FLOP utilisation", f"{util:.1%}" if util is not None else "n/a (CPU)", "100 %"),
                 (f"{impl}: time per part", ", ".join(f"{k} {v:.2f} s" for k, v in sorted(r["parts"].items()) if v >= 0.005),
                  f"wall {r['wall_s']:.2f} s (+ {r['startup_s']:.2f} s building the runner)"),
                 (f"{impl}: weight loading hidden", f"{1 - r['wait_s'] / r['load_s']:.1%}" if r["load_s"] else "n/a", "100 %")]
    ratio = res["transformers"]["wall_s"] / res["reference"]["wall_s"]
    rows += [("reference / transformers throughput", f"{ratio:.2f}x", "1.00x (the same model)"),
             ("mean KLD reference vs transformers (last 64 positions, 2 sequences)",
              f"{mean_kld(res['transformers']['logits'], res['reference']['logits']):.3g} nats",
              "0 (bf16 routing near-ties differ, docs/runner.md)")]
    ev.print_table(rows, f"reference-code backend vs transformers, {device}, "
                         f"{'small' if a.small else 'DeepSeek-V3 layer sizes'}, {s['layers']} layers (1 dense), bf16")


if __name__ == "__main__":
    main()
