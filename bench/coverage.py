"""Coverage of the 95 % cluster BCa interval on data with between-window variation (floor: >= 93 %).

Prints one table, a row per (windows, between-window spread sigma_b): the cluster BCa's coverage against
the 93 % floor, with the iid-token interval's and the expanded BCa's (see bench/coverage_sim.py)
beside it. CPU only, about a minute at the defaults.
Usage: python bench/coverage.py [--replications 500] [--clusters 36 64 128] [--sigma 0.3 0.6] [--resamples 10000]
"""

from __future__ import annotations

import argparse
import time

from coverage_sim import simulate  # bench/coverage_sim.py (python puts bench/ on the path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replications", type=int, default=500)
    ap.add_argument(
        "--clusters", type=int, nargs="+", default=[36, 64, 128], help="windows per replication (demo: 36)"
    )
    ap.add_argument(
        "--sigma", type=float, nargs="+", default=[0.3, 0.6], help="between-window log-sd of the mean"
    )
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(
        "| windows | sigma_b | replications | B | cluster BCa coverage | floor | result | iid-token coverage "
        "| expanded BCa coverage | width BCa / iid | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for g in a.clusters:
        for sb in a.sigma:
            t = time.perf_counter()
            r = simulate(a.replications, g, a.rows, a.resamples, sigma_b=sb, seed=a.seed)
            dt = time.perf_counter() - t
            ok = "PASS" if r.bca >= 0.93 else "FAIL"
            print(
                f"| {g} | {sb:g} | {r.replications} | {r.resamples} | {r.bca:.3f} | 0.930 | {ok} | {r.iid_token:.3f} "
                f"| {r.bca_expanded:.3f} | {r.mean_width_bca / r.mean_width_iid:.1f}x | {dt:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
