"""Bench (diagnostic): where the GPU memory of the fused pass's compute goes, unit by unit, at full size.

Run on the GPU machine after ``bench/evaluation.py`` has written its checkpoint (or with ``--write``):
``PYTHONPATH=. python3 bench/fused_memory.py --tokens 524288 --length 2048``. It runs the same compute as
``evaluation.py``'s ``fused`` role (teacher + MXFP4 serving + weights-only candidate through
fideval.model.lockstep, with the sizing the verbs choose) and prints:

* the sizing's plan (free memory, weights, reserve, activations, states);
* after every unit's load and every model's layer step: memory allocated before it and at its peak, so the
  measured peak of each phase stands beside what the sizing counted;
* on an out-of-memory error, a CUDA memory snapshot taken at the failed allocation (PyTorch's out-of-memory
  observer, before the error unwinds anything): the live memory summed by the allocation's first frame in
  fideval, bench or transformers, and how much is pending on a stream or cached but free.

This is how the fused pass's full-size out-of-memory was traced to a reference cycle that kept a released
MoE layer's experts alive (docs/runner.md, 'The fused pass'): this file is that session's diagnostic made
reusable (the same observer, snapshot and grouping by site); in this form it has not yet run on a GPU (the
session's device time was spent). Recording the allocation history slows the run; its times are not figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import evaluation as ev  # noqa: E402

from fideval.model import lockstep, sizing  # noqa: E402
from fideval.model import runner as runner_mod  # noqa: E402

GB = 1e9
SITES = ("/fideval/", "/bench/", "/transformers/")


def site(frames: list[dict]) -> str:
    """The innermost frame in fideval, bench or transformers: where a block was allocated."""
    for f in frames:
        name = f.get("filename", "")
        if any(s in name for s in SITES):
            short = name.split("/site-packages/")[-1]
            for s in SITES:
                if s in short:
                    short = s.strip("/") + "/" + short.split(s, 1)[1]
                    break
            return f"{short}:{f.get('line')} {f.get('name')}"
    return "elsewhere"


def snapshot_summary(top: int = 20) -> list[str]:
    """The allocator's blocks now, by state and by allocation site."""
    snap = torch.cuda.memory._snapshot()
    by_state, by_site, count = collections.Counter(), collections.Counter(), collections.Counter()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            by_state[b["state"]] += b["size"]
            if b["state"] != "inactive":
                key = (b["state"], site(b.get("frames", [])))
                by_site[key] += b["size"]
                count[key] += 1
    lines = ["blocks by state: " + ", ".join(f"{k} {v / GB:.2f} GB" for k, v in sorted(by_state.items()))]
    lines += [f"  {v / GB:7.2f} GB {count[k]:5d} blocks  {k[0]:20s} {k[1]}" for k, v in by_site.most_common(top)]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/fideval-evaluation", help="evaluation.py's folder (its ckpt/)")
    ap.add_argument("--write", action="store_true", help="write the checkpoint first (evaluation.py's)")
    ap.add_argument("--tokens", type=int, default=524288, help="tokens per model")
    ap.add_argument("--length", type=int, default=2048)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fused_memory.py needs a CUDA GPU")
    ckpt = Path(a.dir) / "ckpt"
    if a.write:
        ev.write_checkpoint(ckpt, dict(ev.V3))
    if not (ckpt / "config.json").is_file():
        raise SystemExit(f"{ckpt}: no checkpoint; run bench/evaluation.py first or pass --write")
    s = dict(ev.V3)
    s["layers"] = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]

    log: list[str] = []
    t0 = time.perf_counter()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100_000)
    seen = []

    def on_oom(device, alloc, device_alloc, device_free):
        if seen:
            return
        seen.append(True)
        print(f"out of memory: a request of {alloc / GB:.2f} GB with {device_free / GB:.2f} GB free", flush=True)
        for line in snapshot_summary() + ["last events:"] + log[-10:]:
            print(line, flush=True)

    torch._C._cuda_attach_out_of_memory_observer(on_oom)

    choose = sizing.choose

    def choose_logged(*args, **kw):
        st = choose(*args, **kw)
        plan = {k: (f"{v / GB:.1f} GB" if k.endswith("_bytes") else v) for k, v in st.plan.items() if k != "per_token"}
        print(f"sizing: {st.recorded()}, states on the device {st.device_budget_bytes / GB:.1f} GB a model; {plan}", flush=True)
        return st

    sizing.choose = choose_logged
    load = lockstep.Lockstep._load

    def load_logged(self, key):
        before = torch.cuda.memory_allocated() / GB
        mod = load(self, key)
        log.append(f"{time.perf_counter() - t0:7.2f} s  load {key}: allocated {before:.1f} -> "
                   f"{torch.cuda.memory_allocated() / GB:.1f} GB")
        return mod

    lockstep.Lockstep._load = load_logged
    step = runner_mod.Runner.layer_step
    peak = [0.0]  # the steps reset the peak counter: the run's own peak is the largest of theirs

    def step_logged(self, c, i, layer):
        before = torch.cuda.memory_allocated() / GB
        torch.cuda.reset_peak_memory_stats()
        step(self, c, i, layer)
        torch.cuda.synchronize()
        peak[0] = max(peak[0], torch.cuda.max_memory_allocated() / GB)
        model = "teacher" if self.options.weight_transform is None else (
            "serving" if self.options.act_transform else "weights-only")
        log.append(f"{time.perf_counter() - t0:7.2f} s  step layer {i} {model}: allocated {before:.1f} GB, "
                   f"peak {torch.cuda.max_memory_allocated() / GB:.1f} GB")
        print(log[-1], flush=True)

    runner_mod.Runner.layer_step = step_logged
    try:
        c = ev.run_compute(ckpt, s, a.length, a.tokens, "cuda", "fused")
        print(f"fits: peak {max(peak[0], c['peak_gpu_gb']):.1f} GB, settings {c['settings']}, canary {c['canary']}", flush=True)
    except torch.OutOfMemoryError as e:
        print(f"out of memory: {str(e).splitlines()[0]}", flush=True)
    print("\n".join(log))


if __name__ == "__main__":
    main()
