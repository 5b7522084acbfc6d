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
``--experts vendor|grouped|both`` (default both): the reference code's routed experts as its MoE loops over them,
grouped (fideval.model.reference.grouped_experts: one GEMM per projection), or each in turn -- then also the
grouped path's speed-up over the loop and how far apart their logits are (max |dlogit|, mean KLD), beside the
loop's own batch dependence (the loop again at micro-batch 1 on the same tokens; ``--no-batch-dependence``
skips that run): the measure by which docs/runner.md, 'Grouped experts', keeps ``vendor`` the default.
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
                micro_batch: int, experts: str = "vendor") -> dict:
    """One whole run over ``toks``: wall time, the runner's parts, the last sequence's logits (for the KLD);
    ``experts``: the reference code's routed experts path (vendor | grouped)."""
    from fideval.model.runner import RunnerOptions, make_runner

    extra = {"implementation": "reference", "trust_remote_code": True,
             "reference_experts": experts} if implementation == "reference" else {}
    opts = RunnerOptions(device=device, dtype=dtype, micro_batch=micro_batch, profile=True, mlp_tokens=None, **extra)
    t_build = time.perf_counter()
    runner = make_runner(ckpt, opts)
    startup = time.perf_counter() - t_build
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0)
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
    drv = getattr(runner, "driver", None)  # the reference backend's: what computed its routed experts
    # the allocator under pressure (cached blocks freed and allocations retried: synchronising, slow) is one suspect
    # for the reference path's MoE time at this size (bench/RESULTS.md, 2026-12-07)
    mem = ({"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved(),
            "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries0} if device == "cuda" else None)
    return {"wall_s": wall, "startup_s": startup, "parts": stats.get("parts", {}), "logits": kept, "tokens": toks.size, "memory": mem,
            "load_s": stats["load_s"], "wait_s": stats["wait_s"],
            "experts": drv.kernels.get("routed_experts", "the vendor's loop") if drv is not None else None,
            "head": runner.head_mode}


def mean_kld(a: dict, b: dict) -> float:
    vals = []
    for row in a:
        la, lb = a[row].log_softmax(-1), b[row].log_softmax(-1)
        vals.append((la.exp() * (la - lb)).sum(-1).mean().item())
    return float(np.mean(vals))


def max_abs(a: dict, b: dict) -> float:
    return max(float((a[row] - b[row]).abs().max()) for row in a)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized smoke run (seconds)")
    ap.add_argument("--dir", default="/tmp/fideval-reference-bench")
    ap.add_argument("--code", default=str(CODE), help="DeepSeek-V3's inference/ folder")
    ap.add_argument("--seqs", type=int, default=16, help="sequences per run")
    ap.add_argument("--length", type=int, default=2048, help="tokens per sequence")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--experts", choices=("vendor", "grouped", "both"), default="both",
                    help="the reference code's routed experts: its loop, grouped GEMMs, or each in turn")
    ap.add_argument("--no-batch-dependence", action="store_true",
                    help="with --experts both: skip the loop's run at micro-batch 1 (its own batch dependence; "
                         "never run when the micro-batch is 1)")
    ap.add_argument("--profile", default=None, help="after the table, one more run of the backends whose name holds this "
                    "text (all: every one) under torch.profiler: its top ops by device and by CPU time")
    ap.add_argument("--profile-rows", type=int, default=25)
    a = ap.parse_args()
    s = dict(ev.SMALL) if a.small else dict(ev.V3)
    device = "cpu" if a.small or not torch.cuda.is_available() else "cuda"
    n, L, mb = (2, 16, 2) if a.small else (a.seqs, a.length, a.micro_batch)
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
    experts = ("vendor", "grouped") if a.experts == "both" else (a.experts,)
    backends = {"transformers": ("transformers", "vendor")}
    backends.update({f"reference ({e} experts)": ("reference", e) for e in experts})
    for impl, e in backends.values():  # imports, kernels compiled, page cache warm: not the figures
        run_backend(ckpt, impl, toks[:1, :8], device, dtype, 1, e)
    res = {name: run_backend(ckpt, impl, toks, device, dtype, mb, e) for name, (impl, e) in backends.items()}
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
                 (f"{impl}: lm head", r["head"], "bf16 where it forms the float32 head's products (fideval.model.execution.head)"),
                 (f"{impl}: weight loading hidden", f"{1 - r['wait_s'] / r['load_s']:.1%}" if r["load_s"] else "n/a", "100 %")]
        if r["memory"] is not None:
            m = r["memory"]
            rows.append((f"{impl}: peak GPU memory allocated / reserved, allocator retries",
                         f"{m['peak_allocated'] / 2**30:.1f} / {m['peak_reserved'] / 2**30:.1f} GiB, {m['alloc_retries']}",
                         f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB on the card; 0 retries"))
    refs = [name for name in res if name != "transformers"]
    for name in refs:
        ratio = res["transformers"]["wall_s"] / res[name]["wall_s"]
        rows += [(f"{name} / transformers throughput", f"{ratio:.2f}x", "1.00x (the same model)"),
                 (f"mean KLD {name} vs transformers (last 64 positions, 2 sequences)",
                  f"{mean_kld(res['transformers']['logits'], res[name]['logits']):.3g} nats",
                  "0 (bf16 routing near-ties differ, docs/runner.md)"),
                 (f"{name}: routed experts computed by", str(res[name]["experts"]), "")]
    if len(refs) == 2:
        loop, grouped = (res[n] for n in refs)
        solo = None if a.no_batch_dependence or mb == 1 else run_backend(ckpt, "reference", toks, device, dtype, 1, "vendor")
        bound = (f"the loop at micro-batch 1 vs {mb}: {max_abs(solo['logits'], loop['logits']):.3g}, "
                 f"KLD {mean_kld(solo['logits'], loop['logits']):.3g} nats" if solo is not None else "")
        rows += [("grouped / vendor-loop throughput (reference code)", f"{loop['wall_s'] / grouped['wall_s']:.2f}x", ""),
                 ("grouped / vendor-loop MoE part time",
                  f"{grouped['parts'].get('moe', 0.0):.2f} s / {loop['parts'].get('moe', 0.0):.2f} s", ""),
                 ("grouped vs vendor loop: max abs dlogit, mean KLD (last 64 positions, 2 sequences)",
                  f"{max_abs(loop['logits'], grouped['logits']):.3g}, {mean_kld(loop['logits'], grouped['logits']):.3g} nats",
                  bound or "the loop's own batch dependence (docs/runner.md)")]
    ev.print_table(rows, f"reference-code backend vs transformers, {device}, "
                         f"{'small' if a.small else 'DeepSeek-V3 layer sizes'}, {s['layers']} layers (1 dense), bf16")
    if a.profile:  # where a backend's time goes, op by op (the MoE part's per-call cost at this size is not in its GEMMs)
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        for name, (impl, e) in backends.items():
            if a.profile != "all" and a.profile not in name:
                continue
            with profile(activities=acts) as prof:
                run_backend(ckpt, impl, toks, device, dtype, mb, e)
            key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
            print(f"\nprofile: {name} (one more run of the same tokens), by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=a.profile_rows))
            print(f"profile: {name}, by CPU time (Python-side launches and syncs)")
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=a.profile_rows))


if __name__ == "__main__":
    main()
