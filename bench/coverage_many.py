"""Family-wise coverage of ``fideval compare``'s simultaneous intervals: K builds on the same windows, known truth.

G windows in 4 domains (equal counts; domain multipliers 0.6, 0.8, 1.2, 1.4, mean one). Window w has a
difficulty d_w ~ LogNormal(-sb^2/2, sb) shared by every build (sb = 1.0: high between-window spread) and
N_w rows, uniform in [rows/2, rows]. Build k's mean on window w is m_k c_h d_w e_kw, e_kw ~ LogNormal(-t^2/2, t)
(t = 0.3: how much builds disagree about which windows are hard), and its rows are that mean times mean-one
draws: LogNormal(-s^2/2, s), s = 2 (heavy: per-token KLD's shape), or Gamma(2, 1/2) (light). Every factor
has mean one and N_w is independent of the rest, so build k's token-weighted mean estimates m_k exactly, its
ratios m_i / m_j, its differences m_i - m_j. Some builds are equal (the same m_k): the family must not
separate them more often than its level allows.

Each replication draws the windows, one shared [B, G] count matrix (within domain, as the report), and scores
three families at the stated 95 %: every pairwise ratio (compare's ``pairs[].ratio``), every pairwise
difference (``pairs[].difference``) and every build's own mean (``mean_kld_simultaneous``); a family covers
when ALL of its intervals hold their true values at once. ``marginal`` is the same K(K-1)/2 ratio intervals
each at 95 % alone (the report's paired ratio): what a reader gets without the adjustment. The Monte Carlo
standard error of a coverage c over R replications is sqrt(c (1 - c) / R).

    python bench/coverage_many.py --replications 400 --resamples 1000
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.simultaneous import simultaneous_means, simultaneous_pairs

DOMAINS = ("a", "b", "c", "d")
MULT = np.array([0.6, 0.8, 1.2, 1.4])
# K builds' true mean KLD (some equal), as a published family of quants might be
SHAPES = {
    "3 builds (2 equal)": (0.02, 0.02, 0.05),
    "5 builds (3 equal)": (0.01, 0.01, 0.01, 0.02, 0.06),
    "8 builds (2+3 equal)": (0.005, 0.005, 0.01, 0.01, 0.01, 0.02, 0.04, 0.08),
}


def draw(means, g: int, rng: np.random.Generator, *, rows: int = 256, sb: float = 1.0, t: float = 0.3,
         tail: str = "heavy") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-window sums ``s [G, K]``, rows ``n [G, K]`` and each window's stratum code [G]."""
    m = np.asarray(means, dtype=np.float64)
    k = m.size
    strata = np.arange(g) % len(DOMAINS)
    d = rng.lognormal(-sb * sb / 2, sb, g)
    e = rng.lognormal(-t * t / 2, t, (g, k))
    nw = rng.integers(rows // 2, rows + 1, g)
    mu = m[None, :] * MULT[strata][:, None] * d[:, None] * e
    total = int(nw.sum())
    if tail == "heavy":
        x = rng.lognormal(-2.0, 2.0, (total, k))
    else:
        x = rng.gamma(2.0, 0.5, (total, k))
    idx = np.repeat(np.arange(g), nw)
    sums = np.zeros((g, k))
    np.add.at(sums, idx, x)
    return mu * sums, np.repeat(nw[:, None].astype(np.float64), k, axis=1), strata


def replicate(means, g: int, reps: int, resamples: int, seed: int, tail: str = "heavy",
              confidence: float = 0.95) -> dict[str, float]:
    """Family-wise coverage of each family over ``reps`` replications."""
    m = np.asarray(means, dtype=np.float64)
    rng = np.random.default_rng(seed)
    cl = Clusters.from_pairs({f"{DOMAINS[i % len(DOMAINS)]}-{i:04d}": DOMAINS[i % len(DOMAINS)] for i in range(g)})
    # Clusters sorts ids by domain; the simulation's stratum of window i is i % 4, so reorder to match
    order = np.argsort(np.array([f"{DOMAINS[i % len(DOMAINS)]}-{i:04d}" for i in range(g)]))
    hits = {"ratio": 0, "difference": 0, "mean": 0, "marginal": 0, "equal pairs separated": 0}
    for r in range(reps):
        s, n, strata = draw(m, g, rng, tail=tail)
        s, n, strata = s[order], n[order], strata[order]
        counts = resample_counts(cl, resamples, seed * 100003 + r)
        ok = {}
        for kind in ("ratio", "difference"):
            f = simultaneous_pairs(kind, s, n, counts, strata, confidence=confidence)
            truth = np.array([m[i] / m[j] if kind == "ratio" else m[i] - m[j] for i, j in f["pairs"]])
            cover = (f["ci"][:, 0] <= truth) & (truth <= f["ci"][:, 1])
            ok[kind] = bool(cover.all())
            if kind == "ratio":
                equal = np.array([m[i] == m[j] for i, j in f["pairs"]])
                hits["equal pairs separated"] += bool((~cover & equal).any())
                st = f["stats"]
                marg = np.quantile(np.abs(st["t"]), f["level"], axis=0)
                lo, hi = np.exp(st["g"] - marg * st["se"]), np.exp(st["g"] + marg * st["se"])
                hits["marginal"] += bool(((lo <= truth) & (truth <= hi)).all())
        mm = simultaneous_means(s, n, counts, strata, confidence=confidence)
        ok["mean"] = bool(((mm["ci"][:, 0] <= m) & (m <= mm["ci"][:, 1])).all())
        for kname in ("ratio", "difference", "mean"):
            hits[kname] += ok[kname]
    return {k: v / reps for k, v in hits.items()}


def _cell(args):
    name, tail, g, reps, resamples, seed = args
    t0 = time.time()
    out = replicate(SHAPES[name], g, reps, resamples, seed, tail)
    return name, tail, g, reps, out, time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replications", type=int, default=400)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--windows", type=int, nargs="+", default=[64])
    ap.add_argument("--tails", nargs="+", default=["heavy", "light"], choices=["heavy", "light"])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    cells = [(name, tail, g, args.replications, args.resamples, args.seed + 17 * i)
             for i, (name, tail, g) in enumerate((n, t, g) for g in args.windows for t in args.tails for n in SHAPES)
             if name in args.shapes]
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        rows = list(ex.map(_cell, cells))
    print("| builds | rows | windows | R | ratios (simultaneous) | differences (simultaneous) | means (simultaneous) "
          "| ratios, each at 95 % alone | an equal pair separated |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, tail, g, reps, out, _ in rows:
        print(f"| {name} | {tail} | {g} | {reps} | {out['ratio']:.3f} | {out['difference']:.3f} | {out['mean']:.3f} "
              f"| {out['marginal']:.3f} | {out['equal pairs separated']:.3f} |")
    print(f"\n{time.time() - t0:.0f} s on {args.jobs} processes; B = {args.resamples}, seed {args.seed}")


if __name__ == "__main__":
    main()
