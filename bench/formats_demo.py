"""Fidelity of every emulated format on the demo model: routed experts quantized, everything else exact.

Each candidate is the demo checkpoint with only its routed experts quantized-dequantized (the class that
holds most of a DeepSeek-class model's weights), run through the same layer-by-layer runner as the teacher
and scored with the production scorer (``score_candidate``: float64 full-vocabulary KLD, CPU check) against
the demo run's own teacher stores (``results/demo/teacher/cuts/<domain>``). The identity spec (empty) is
the ceiling: it must give exactly 0 KLD and 100 % top-1 agreement on every row, which proves the candidate
path adds nothing but the quantization -- any non-zero figure for a format is the format's.

Weights-only for every format and recipe; the serving path (E4M3 per 1x128 activations entering the routed
experts) for fp8_block, mxfp4 rceil and nvfp4. Bits per weight from the checkpoint's headers
(``CompiledSpec.bits``); unquantized tensors count 16 bits (a bf16 release), as ``fideval score`` records it.
Figures pool all rows of the chosen domains (mean, median, p99 of per-row KLD in nats; top-1 agreement).

Prints ONE table sorted by mean KLD. Records go to ``--out`` (default /tmp/formats-demo), never into results/.
Usage: python bench/formats_demo.py [--teacher results/demo/teacher/cuts] [--domains code,legal,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

# (label, spec of routed_experts or None for identity, path)
RE = "routed_experts"


def candidates() -> list[tuple[str, dict | None, str]]:
    w = "weights-only"
    out: list[tuple[str, dict | None, str]] = [("identity", None, w)]
    add = [("fp8_block", "fp32", None), ("fp8_block", "ue8m0", None),
           ("mxfp4", "floor", None), ("mxfp4", "rceil", None),
           ("mxfp6_e2m3", None, None), ("mxfp6_e3m2", None, None),
           ("mxfp8_e4m3", None, None), ("mxfp8_e5m2", None, None),
           ("nvfp4", None, None),
           ("gguf_q8_0", None, None), ("gguf_q4_0", None, None), ("gguf_q4_1", None, None),
           ("gguf_q5_0", None, None), ("gguf_q5_1", None, None), ("gguf_mxfp4", None, None),
           ("int4", "sym", 32), ("int4", "sym", 128), ("int4", "asym", 32), ("int4", "asym", 128),
           ("int8", "sym", 128)]
    for fmt, recipe, group in add:
        out.append((fmt, {"format": fmt, "recipe": recipe, "group": group}, w))
    for fmt, recipe in (("fp8_block", "fp32"), ("mxfp4", "rceil"), ("nvfp4", None)):
        out.append((fmt, {"format": fmt, "recipe": recipe, "group": None}, "serving"))
    return out


def run_one(model: Path, teachers: dict, spec_dict: dict | None, path: str, out_dir: Path, by_class: dict,
            windows: int) -> dict:
    """Score one candidate on every domain; returns its pooled figures and bits."""
    import pyarrow.parquet as pq

    from fideval.model.runner import iter_logits
    from fideval.quant.spec import compile_spec
    from fideval.score.candidate import Candidate, CandidateShard, teacher_sequences
    from fideval.score.run import ScoreSettings, score_candidate

    spec = compile_spec({RE: spec_dict} if spec_dict else None)
    bits = spec.bits(by_class)
    kld, top1 = [], []
    for dom, teacher in teachers.items():
        seqs = teacher_sequences(teacher)
        if windows:
            from fideval.windows.layout import Sequences

            keep_w = sorted({i.split(".")[0] for i in seqs.ids})[:windows]
            k = [j for j, i in enumerate(seqs.ids) if i.split(".")[0] in keep_w]
            seqs = Sequences(ids=[seqs.ids[j] for j in k], domains=[seqs.domains[j] for j in k], tokens=seqs.tokens[k])
        logits = iter_logits(model, seqs, device="cpu", dtype=torch.float32, weight_transform=spec.weight_transform,
                             act_transform=spec.act_transform if path == "serving" else None, micro_batch=1)
        d = out_dir / dom
        cand = Candidate(name="c", path=path, shards=(CandidateShard(sid, x) for sid, x in logits))
        score_candidate(teacher, cand, d, ScoreSettings(device="cpu", kernel="torch"),
                        total_rows=len(seqs.ids) * (seqs.tokens.shape[1] - 1))
        t = pq.read_table(d / "records.parquet", columns=["kld", "top1"])
        kld.append(t.column("kld").to_numpy())
        top1.append(t.column("top1").to_numpy())
    k, t1 = np.concatenate(kld), np.concatenate(top1)
    mod = spec.modules.get(RE)
    return {"recipe": "-" if mod is None else f"{mod.recipe}" + (f"/{mod.group}" if mod.format.startswith("int") else ""),
            "bpw_re": bits["per_class"][RE]["bpw"], "bpw_all": bits["total"]["bpw"],
            "mean": float(k.mean()), "median": float(np.median(k)), "p99": float(np.quantile(k, 0.99)),
            "max": float(k.max()), "top1": float(t1.mean()), "rows": int(k.size)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--teacher", default="results/demo/teacher/cuts")
    ap.add_argument("--model", default="fideval/demo/assets/model")
    ap.add_argument("--domains", default="", help="comma-separated; default: every domain under --teacher")
    ap.add_argument("--out", default="/tmp/formats-demo")
    ap.add_argument("--windows", type=int, default=0, help="first N windows (all their cuts) per domain; 0: all")
    ap.add_argument("--teacher-threads", type=int, default=2,
                    help="torch threads the teacher store was made with (the demo's: 2); the exact identity row uses it")
    ap.add_argument("--only", default="", help="comma-separated labels to run (plus identity), for quick checks")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from fideval.formats.safetensors import folder_shapes
    from fideval.quant.spec import module_class_of
    from fideval.store import StoreReader

    root, model, out = Path(args.teacher), Path(args.model), Path(args.out)
    doms = [d for d in args.domains.split(",") if d] or sorted(p.name for p in root.iterdir() if p.is_dir())
    teachers = {d: StoreReader(root / d) for d in doms}
    by_class: dict = {}
    for name, (shape, _dt) in folder_shapes(model).items():
        by_class.setdefault(module_class_of(name), {})[name] = tuple(shape)
    only = {s for s in args.only.split(",") if s}

    rows = []
    t0 = time.perf_counter()
    # The exact ceiling: identity at the teacher's own thread count must reproduce the teacher's bytes, so
    # every row scores exactly 0. On CPU the thread count is part of the numerics (a few sequences' logits
    # differ by ~1e-6 between 1 and 2 threads), so identity at 1 thread -- the setting every format below
    # runs at -- is printed too: that is the floor the format rows are measured against.
    torch.set_num_threads(args.teacher_threads)
    r = run_one(model, teachers, None, "weights-only", out / "00-identity-exact", by_class, args.windows)
    assert r["max"] == 0.0 and r["top1"] == 1.0, f"identity is not exact: max KLD {r['max']!r}, top-1 {r['top1']}"
    rows.append({**r, "format": "identity", "recipe": f"{args.teacher_threads} threads", "path": "weights-only"})
    torch.set_num_threads(1)
    for i, (label, spec, path) in enumerate(candidates()):
        if only and label != "identity" and label not in only:
            continue
        r = run_one(model, teachers, spec, path, out / f"{i + 1:02d}-{label}-{path}", by_class, args.windows)
        if label == "identity":
            r["recipe"] = "1 thread"
        rows.append({**r, "format": label, "path": path})
    total = time.perf_counter() - t0

    seqs = rows[0]["rows"] // (len(teachers[doms[0]].read(teachers[doms[0]].seq_ids[0])[1]) - 1)
    L = len(teachers[doms[0]].read(teachers[doms[0]].seq_ids[0])[1])
    print(f"routed experts quantized, demo model; {len(doms)} domains ({','.join(doms)})"
          f"{f', first {args.windows} windows each' if args.windows else ''}, {seqs} sequences x {L} tokens; "
          f"KLD(teacher||candidate) in nats per row; bpw: unquantized tensors at 16 bits (bf16 base); "
          f"ceiling: identity = exactly 0; {total:.0f} s")
    head = f"| {'format':<11} | {'recipe':<18} | {'path':<12} | {'bpw RE':>6} | {'bpw all':>7} | {'mean KLD':>9} | " \
           f"{'median KLD':>10} | {'p99 KLD':>9} | {'top-1':>7} | {'rows':>6} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for r in sorted(rows, key=lambda r: (r["mean"], r["format"], r["recipe"])):
        print(f"| {r['format']:<11} | {r['recipe']:<18} | {r['path']:<12} | {r['bpw_re']:>6.3f} | {r['bpw_all']:>7.3f} | "
              f"{r['mean']:>9.2e} | {r['median']:>10.2e} | {r['p99']:>9.2e} | {100 * r['top1']:>6.2f}% | {r['rows']:>6} |")


if __name__ == "__main__":
    main()
