"""Cluster BCa speed: 10,000 resamples over 512 windows in 12 domains (ceiling: 2 s on the 2-core box).

Times what ``fideval report`` does per records set once per-window sums exist: draw the stratified
[B, G] count matrix from the seed, then cluster BCa intervals for mean KLD and top-1 overall and per
domain (26 figures, one matmul) and a build-vs-build ratio. A second row times the window-bootstrap
quantile intervals (median..p99.9) over 512 x 2,047 rows, for information.
Usage: python bench/bootstrap.py [--clusters 512] [--domains 12] [--resamples 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fideval.stats.bootstrap import cluster_bca_means, cluster_bca_ratio
from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.quantiles import quantile_figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clusters", type=int, default=512)
    ap.add_argument("--domains", type=int, default=12)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=2047, help="rows per window (quantile row only)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    g = a.clusters
    dom = np.arange(g) % a.domains
    cl = Clusters.from_pairs({f"d{d:02d}-{k:03d}": f"d{d:02d}" for k, d in enumerate(dom)})
    dom = np.array([int(s[1:]) for s in cl.strata])
    n = rng.integers(1500, 2048, g).astype(np.float64)
    kld = n * 0.01 * rng.lognormal(0, 0.5, g)
    top1 = n * np.clip(rng.normal(0.95, 0.02, g), 0, 1)
    kld2 = kld * rng.lognormal(0.2, 0.05, g)

    def once() -> float:
        t = time.perf_counter()
        counts = resample_counts(cl, a.resamples, seed=0)
        s_cols, n_cols = [kld, top1], [n, n]
        for d in range(a.domains):
            m = dom == d
            s_cols += [kld * m, top1 * m]
            n_cols += [n * m, n * m]
        figs = cluster_bca_means(np.stack(s_cols, 1), np.stack(n_cols, 1), counts)
        cluster_bca_ratio(kld2, n, kld, n, counts)
        assert len(figs) == 2 + 2 * a.domains and all(f["ci"][0] <= f["estimate"] <= f["ci"][1] for f in figs)
        return time.perf_counter() - t

    best = min(once() for _ in range(a.repeats))
    codes = np.repeat(np.arange(g), a.rows)
    values = rng.lognormal(-5, 1.5, codes.size) * rng.lognormal(0, 0.5, g)[codes]
    counts = resample_counts(cl, a.resamples, seed=0)
    t = time.perf_counter()
    quantile_figures(values, codes, counts, [0.5, 0.9, 0.99, 0.999])
    tq = time.perf_counter() - t
    ok = "PASS" if best <= 2.0 else "FAIL"
    print("| bench | B | clusters | domains | figure (s) | ceiling (s) | result |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| counts + {2 + 2 * a.domains} cluster BCa means + 1 ratio (best of {a.repeats}) | {a.resamples} | {g} | "
        f"{a.domains} | {best:.3f} | 2.0 | {ok} |"
    )
    print(
        f"| 4 quantile intervals over {codes.size:,} rows (information) | {a.resamples} | {g} | {a.domains} | "
        f"{tq:.3f} | — | — |"
    )


if __name__ == "__main__":
    main()
