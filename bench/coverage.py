"""Coverage of every 95 % interval fideval prints (and the candidates for its default), by data shape.

For each shape of bench/coverage_sim.py and each number of windows, draws ``--replications`` data sets,
computes every interval on its own resamples (``--resamples``) and counts how often it covers the truth.
Prints markdown: per shape, coverage by method and windows, the mean width relative to the truth, and
the verdict: each method's lowest coverage over the shapes with >= 64 windows against the 93 % floor.
The Monte Carlo standard error of a coverage c from R replications is sqrt(c (1 - c) / R): 0.49 points at
95 % and R = 2,000, 0.97 at R = 500 (cells above 128 windows get fewer replications by default: they cost
more and are the least in doubt). Single-threaded BLAS per process; cells run in ``--jobs`` processes.
Usage: python bench/coverage.py [--replications 2000] [--clusters 32 64 128 256 512] [--shapes ...]
       [--resamples 2000] [--full-replications-up-to 128] [--jobs N] [--json out.json]
       python bench/coverage.py --tables-from a.json b.json   (the tables of earlier runs, merged)
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: one BLAS thread per worker process
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from coverage_sim import (  # noqa: E402
    DELTA_METHODS,
    MEAN_METHODS,
    PAIRED_METHODS,
    QUANTILE_METHODS,
    SHAPES,
    TOP1_METHODS,
    replicate,
)

FLOOR = 0.93


def _cell(args: tuple[str, int, int, int, int]) -> dict:
    name, g, reps, b, seed = args
    t0 = time.perf_counter()
    tl = replicate(SHAPES[name], g, reps, b, seed)
    return {"shape": name, "windows": g, "replications": tl.reps, "resamples": b,
            "coverage": {k: tl.hits[k] / tl.reps for k in tl.hits},
            "below": {k: tl.below[k] / tl.reps for k in tl.below},
            "width": {k: tl.width(k) for k in tl.widths},  # median width / truth
            "bounded": {k: tl.bounded[k] / tl.reps for k in tl.bounded},  # share with both bounds stated
            "seconds": time.perf_counter() - t0}


def _cell_table(title: str, shapes: list, cells: list[dict], methods: list[str], figure: str) -> list[str]:
    """A markdown table of one figure (``width``, ``bounded``) per shape, windows and method."""
    out = [f"\n{title}\n", "| shape | windows | " + " | ".join(f"`{m}`" for m in methods) + " |",
           "|---|---|" + "---|" * len(methods)]
    for s in shapes:
        for c in sorted((c for c in cells if c["shape"] == s.name), key=lambda c: c["windows"]):
            out.append(f"| {s.name} | {c['windows']} | " + " | ".join(f"{c[figure][m]:.3f}" for m in methods) + " |")
    return out


def tables(cells: list[dict]) -> str:
    out = []
    titles = {"mean": "Mean KLD", "delta": "Mean delta NLL (signed rows)", "top1": "Top-1 agreement",
              "paired": "Paired build comparisons",
              "quantile": "KLD quantiles (of the pooled rows; truth: the design's pooled distribution)"}
    for kind, methods in (("mean", MEAN_METHODS), ("delta", DELTA_METHODS), ("top1", TOP1_METHODS),
                          ("paired", PAIRED_METHODS),
                          ("quantile", QUANTILE_METHODS)):
        shapes = [s for s in SHAPES.values() if s.kind == kind and any(c["shape"] == s.name for c in cells)]
        if not shapes:
            continue
        out.append(f"\n### {titles[kind]}: coverage at 95 % nominal\n")
        out.append("| shape | windows | R | " + " | ".join(f"`{m}`" for m in methods) + " |")
        out.append("|---|---|---|" + "---|" * len(methods))
        for s in shapes:
            for c in sorted((c for c in cells if c["shape"] == s.name), key=lambda c: c["windows"]):
                cov = [c["coverage"][m] for m in methods]
                out.append(f"| {s.name} | {c['windows']} | {c['replications']} | "
                           + " | ".join(f"**{v:.3f}**" if v < FLOOR else f"{v:.3f}" for v in cov) + " |")
        out += _cell_table("Median width / truth (same cells):", shapes, cells, methods, "width")
        partial = [m for m in methods if any(c.get("bounded", {}).get(m, 1.0) < 1.0 for c in cells)]
        if partial:
            out += _cell_table("Share of replications with both bounds stated (the rest: upper bound null):", shapes,
                               cells, partial, "bounded")
        out.append(f"\nVerdict (>= 64 windows, floor {FLOOR:.2f}):\n")
        out.append("| method | lowest coverage | at | misses below / above there | result |")
        out.append("|---|---|---|---|---|")
        for m in methods:
            big = [c for c in cells if c["windows"] >= 64 and SHAPES[c["shape"]].kind == kind]
            if not big:
                continue
            w = min(big, key=lambda c: c["coverage"][m])
            v, r = w["coverage"][m], w["replications"]
            mc = math.sqrt(max(v * (1 - v), 1e-12) / r)
            lo_miss = w["below"][m]
            out.append(f"| `{m}` | {v:.3f} ± {mc:.3f} | {w['shape']} / {w['windows']} | "
                       f"{lo_miss:.3f} / {max(1 - v - lo_miss, 0.0):.3f} | {'PASS' if v >= FLOOR else 'FAIL'} |")
    out.append("\nShapes: " + "; ".join(f"`{s.name}`: {s.note}" for s in SHAPES.values()
                                        if any(c["shape"] == s.name for c in cells)) + ".")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replications", type=int, default=2000)
    ap.add_argument("--clusters", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--full-replications-up-to", type=int, default=128, metavar="G",
                    help="cells with more windows get replications * G / windows (their cost grows with windows; "
                         "they are the least in doubt); 0: all get --replications")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path, default=None, help="also write every cell's figures here")
    ap.add_argument("--tables-from", type=Path, nargs="+", default=None,
                    help="print the tables of cells written by earlier --json runs (merged), run nothing")
    a = ap.parse_args()
    if a.tables_from:
        print(tables([c for f in a.tables_from for c in json.loads(f.read_text())]))
        return
    cap = a.full_replications_up_to

    def reps(g: int) -> int:
        return a.replications if not cap or g <= cap else max(a.replications * cap // g, 100)

    work = [(s, g, reps(g), a.resamples, a.seed) for s in a.shapes for g in a.clusters]
    work.sort(key=lambda w: -w[1] * w[2] * (1 if SHAPES[w[0]].kind == "top1" else 3))  # longest first
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as ex:
        cells = list(ex.map(_cell, work))
    print(f"{len(cells)} cells, up to {a.replications} replications (column R), B = {a.resamples}, seed {a.seed}, "
          f"{time.perf_counter() - t0:.0f} s on {a.jobs} processes")
    print(tables(cells))
    if a.json:
        a.json.write_text(json.dumps(cells, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
