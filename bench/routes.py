"""Bench: what routing fidelity costs (issue 42) -- a teacher run recording its routes, and a run with those routes
forced into its MoE layers, against a plain run, on one GPU, in the same process, on the same checkpoint and tokens.

Run on the GPU machine: ``PYTHONPATH=. python3 bench/routes.py`` (``--small`` for a CPU smoke run in seconds).
The checkpoint is bench/evaluation.py's: DeepSeek-V3's real layer shapes (hidden 7,168, 256 experts of 2,048, top-8
in 8 groups, vocabulary 129,280) in the FP8 release layout, 1 dense + 2 MoE layers, random values. The transformers
runner runs it as the teacher does on a GPU: bfloat16, the throughput mode's MLP token blocks (``--mlp-tokens``),
the logits consumed on the device; each of the three runs once as a warm-up (kernels, page cache) first.

Figures: tokens/s of the plain run, of the recording run (routes kept on the device per micro-batch, copied to the
host and written as each sequence leaves, as ``fideval teacher --routes`` does) and of the forced run (the recorded
routes read back from their files and handed to the experts); the two overheads against the plain run (ceiling
3 %, the issue's goal for recording); and whether the forced run's logits equal the plain run's bit for bit (the
teacher's own routes forced into the teacher, on CUDA). The three runs go round-robin ``--rounds`` times and the fastest of each counts.
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


def run(ckpt: Path, toks: np.ndarray, device: str, mb: int, mlp_tokens: int | None, ids: list[str],
        record: Path | None = None, force: Path | None = None) -> dict:
    """One whole run over ``toks``: wall time, a digest of every sequence's logits, the recording written to
    ``record``/routes/ (its index) or the routes of ``force`` forced."""
    from fideval.formats import routes as rf
    from fideval.model.execution.determinism import digest
    from fideval.model.routes import FileRoutes
    from fideval.model.runner import Runner, RunnerOptions

    source = None
    if force is not None:
        d, index = rf.read_index(force)
        source = FileRoutes(d, ids, index["layers"], index["n_experts"], index["top_k"])
    opts = RunnerOptions(device=device, dtype=torch.bfloat16, micro_batch=mb, mlp_tokens=mlp_tokens, profile=True,
                         routes=record is not None, force_routes=source)
    runner = Runner(ckpt, opts)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    digests = {}
    for row, logits in runner.run(toks, canary=False):
        digests[row] = digest(logits)
        if record is not None:
            rf.write_sequence(record, ids[row], runner.routes.pop(row))
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if record is not None:
        rf.write_index(record, "teacher", {"shards": {}})
    return {"wall_s": wall, "digests": digests, "tokens": toks.size, "parts": runner.finish_profile().get("parts", {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized smoke run (seconds)")
    ap.add_argument("--dir", default="/tmp/fideval-evaluation", help="bench/evaluation.py's folder: its checkpoint is reused")
    ap.add_argument("--seqs", type=int, default=16, help="sequences per run")
    ap.add_argument("--length", type=int, default=2048, help="tokens per sequence")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--mlp-tokens", type=int, default=65536, help="the throughput mode's token blocks (0: off)")
    ap.add_argument("--rounds", type=int, default=2, help="round-robin rounds of the three runs (the fastest of each counts)")
    a = ap.parse_args()
    s = dict(ev.SMALL) if a.small else dict(ev.V3)
    device = "cpu" if a.small or not torch.cuda.is_available() else "cuda"
    n, L, mb, mlp = (4, 16, 2, 24) if a.small else (a.seqs, a.length, a.micro_batch, a.mlp_tokens or None)
    work = Path(a.dir)
    ckpt = work / ("ckpt-small" if a.small else "ckpt")
    if not (ckpt / "model.safetensors.index.json").is_file():
        ev.write_checkpoint(ckpt, s)
    toks = np.random.default_rng(0).integers(0, s["vocab"], size=(n, L)).astype(np.int32)
    ids = [f"bench-{i:03d}.c0" for i in range(n)]
    routes = work / "routes-bench"
    warm = toks[:1, : min(L, 64)]
    run(ckpt, warm, device, 1, mlp, ids[:1])
    run(ckpt, warm, device, 1, mlp, ids[:1], record=work / "routes-warm")
    run(ckpt, warm, device, 1, mlp, ids[:1], force=work / "routes-warm")
    best: dict[str, dict] = {}
    for _ in range(a.rounds):  # round-robin, the fastest of each kind: the page cache and the clocks shared alike
        for kind, kw in (("plain", {}), ("rec", {"record": routes}), ("forced", {"force": routes})):
            r = run(ckpt, toks, device, mb, mlp, ids, **kw)
            if kind not in best or r["wall_s"] < best[kind]["wall_s"]:
                best[kind] = r
    plain, rec, forced = best["plain"], best["rec"], best["forced"]
    same = all(forced["digests"][r] == plain["digests"][r] for r in plain["digests"])
    rec_same = all(rec["digests"][r] == plain["digests"][r] for r in plain["digests"])
    per_seq = sum(p.stat().st_size for p in (routes / "routes").glob("*.safetensors")) / n
    rows = [(f"plain run: tokens/s ({n} x {L}, micro-batch {mb}, mlp tokens {mlp or 'off'})",
             f"{plain['tokens'] / plain['wall_s']:,.0f}", ""),
            ("recording run: tokens/s", f"{rec['tokens'] / rec['wall_s']:,.0f}", ""),
            ("recording overhead (wall, against the plain run)", f"{rec['wall_s'] / plain['wall_s'] - 1:+.1%}", "3 %"),
            ("forced-route run: tokens/s", f"{forced['tokens'] / forced['wall_s']:,.0f}", ""),
            ("forced-route overhead (wall, against the plain run)", f"{forced['wall_s'] / plain['wall_s'] - 1:+.1%}", ""),
            ("recording changes no logit bit", str(rec_same), "True"),
            ("teacher's own routes forced: logits equal the plain run's bit for bit", str(same), "True"),
            ("routes file per sequence", f"{per_seq / 1e6:.2f} MB ({s['layers'] - 1} MoE layers x {L} x top-{s['topk']})", ""),
            ("time per part (plain / recording / forced), moe", " / ".join(f"{r['parts'].get('moe', 0.0):.2f} s"
                                                                          for r in (plain, rec, forced)), "")]
    ev.print_table(rows, f"routes: record and force, {device}, {'small' if a.small else 'DeepSeek-V3 layer sizes'}, "
                         f"{s['layers']} layers (1 dense), bf16")
    if not (same and rec_same):
        sys.exit("bench/routes.py: the logits differ (see the table)")


if __name__ == "__main__":
    main()
