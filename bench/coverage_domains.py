"""Coverage of per-domain mean KLD intervals at 6-64 windows a domain, on several domains at once (issue 48).

A report's per-domain figure rests on one domain's windows: at the seed's scale (128 windows over 11 domains)
about a dozen. Each replication draws H domains of G_d windows each (coverage_sim's machinery: a window's mean
is the domain's level times LogNormal(-b^2/2, b), its rows that mean times mean-one rows) and scores, for every
domain, against its own truth (its level times ``base``: N_w is independent of the window mean):

- ``default``: the report's per-domain interval (``cluster_t_means`` on the domain's column with the report's
  stratified count matrix: the bootstrap-t, log scale, symmetric, expanded on the domain's own windows);
- ``t-own-log``: log(theta_d) -+ t_(G_d - 1) se_d / theta_d (the domain's own linearised se, Student's df);
- ``pooled-t-log``: ``fideval.stats.domains`` (the model it states: log-scale domain means, a common relative
  spread of the windows' residuals, pooled over every domain with >= 2 windows, Student's t on G - H df);
- ``pooled-or-own``: ``fideval.stats.domains``' pooled interval (the pooled se or the domain's own
  linearised one, whichever is larger, on the pooled df: the pooled model may not hide a domain that is
  more spread than the rest);
- ``union``: what the report prints under 64 windows (``fideval.stats.domains.domain_mean``): the union of
  ``default`` and ``pooled-or-own``; below 8 windows no interval (scored as covering, width inf: read those
  cells as "none printed").

Shapes (``DOMAIN_SHAPES``): equal spread in every domain (``dom-heavy-high``, ``dom-light-high``), a spread
that differs by domain (``dom-heavy-mixed``: b from 0.5 to 1.4; the pooled model is wrong there), windows
that carry much of a domain's KLD (``dom-conc``: b = 1.5, LogNormal(s = 1.5) rows), and the seed's layout
(``dom-seed``: 11 domains of 6-18 windows, b = 1.0, heavy rows). Domain levels 0.3-4x apart. Coverage is
over all (replication, domain) pairs and, per shape, for the domain of the largest spread (``worst``); the
Monte Carlo se of a coverage c over R x H pairs is about sqrt(c (1 - c) / (R H)) (domains of one replication
share the pooled variance, so it is a lower bound; the worst domain's is over R).

Usage: python bench/coverage_domains.py [--shapes ...] [--per-domain 6 8 12 24 48] [--replications 300]
       [--resamples 400] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from fideval.stats.clusters import Clusters, resample_counts  # noqa: E402
from fideval.stats.domains import domain_mean, pooled_domain_intervals  # noqa: E402
from fideval.stats.studentized import cluster_t_means, linearized_variance  # noqa: E402


@dataclass(frozen=True)
class DomainShape:
    name: str
    domains: int
    sigma_b: tuple[float, ...]  # per domain (cycled)
    token: str  # "lognormal" or "gamma"
    token_param: float
    sizes: tuple[int, ...] = ()  # fixed windows per domain (dom-seed); else --per-domain
    rows: int = 256
    base: float = 0.02
    note: str = ""


DOMAIN_SHAPES = {s.name: s for s in (
    DomainShape("dom-heavy-high", 6, (1.0,), "lognormal", 2.0, note="6 domains, b 1.0, LogNormal(s=2) rows"),
    DomainShape("dom-light-high", 6, (1.0,), "gamma", 2.0, note="6 domains, b 1.0, Gamma(2) rows"),
    DomainShape("dom-heavy-mixed", 6, (0.5, 0.7, 0.9, 1.1, 1.25, 1.4), "lognormal", 2.0,
                note="6 domains, b 0.5-1.4 by domain (the pooled model's common spread is wrong)"),
    DomainShape("dom-conc", 6, (1.5,), "lognormal", 1.5, note="6 domains, b 1.5, LogNormal(s=1.5) rows (concentrated)"),
    DomainShape("dom-seed", 11, (1.0,), "lognormal", 2.0, sizes=(6, 8, 9, 10, 11, 12, 12, 13, 14, 15, 18),
                note="the seed's layout: 128 windows over 11 domains (6-18 each), b 1.0, LogNormal(s=2) rows"),
)}
METHODS = ("default", "t-own-log", "pooled-t-log", "pooled-or-own", "union")


def levels(h: int) -> np.ndarray:
    return np.exp(np.linspace(math.log(0.3), math.log(4.0), h))


def draw(shape: DomainShape, sizes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dom = np.repeat(np.arange(sizes.size), sizes)
    g = dom.size
    b = np.resize(np.asarray(shape.sigma_b), sizes.size)[dom]
    mu = shape.base * levels(sizes.size)[dom] * np.exp(b * rng.standard_normal(g) - b**2 / 2)
    n = rng.integers(shape.rows // 2, shape.rows + 1, g)
    codes = np.repeat(np.arange(g), n)
    if shape.token == "gamma":
        x = rng.gamma(shape.token_param, 1.0 / shape.token_param, codes.size)
    else:
        x = rng.lognormal(-shape.token_param**2 / 2, shape.token_param, codes.size)
    return np.bincount(codes, weights=x * mu[codes], minlength=g), n.astype(np.float64), dom


def replicate(name: str, per_domain: int, reps: int, b: int, seed: int, conf: float = 0.95) -> dict:
    shape = DOMAIN_SHAPES[name]
    sizes = np.array(shape.sizes) if shape.sizes else np.full(shape.domains, per_domain)
    h = sizes.size
    rng = np.random.default_rng([seed, per_domain, zlib.crc32(name.encode())])
    dom = np.repeat(np.arange(h), sizes)
    cl = Clusters.from_pairs({f"{k:04d}": f"d{d:02d}" for k, d in enumerate(dom)})
    truth = shape.base * levels(h)
    worst = int(np.argmax(np.resize(np.asarray(shape.sigma_b), h) + 1e-9 * np.arange(h)))  # largest spread
    hit = {m: np.zeros(h) for m in METHODS}
    above = {m: np.zeros(h) for m in METHODS}
    width = {m: [] for m in METHODS}
    for _ in range(reps):
        counts = resample_counts(cl, b, int(rng.integers(2**62)))
        s, n, _ = draw(shape, sizes, rng)
        onehot = (dom[:, None] == np.arange(h)[None, :]).astype(np.float64)
        sd, nd = s[:, None] * onehot, n[:, None] * onehot  # [G, H]: the report's per-domain columns
        default = cluster_t_means(sd, nd, counts, dom, "log", conf, symmetric=True, expand=True)
        theta = sd.sum(0) / nd.sum(0)
        se = np.sqrt(linearized_variance(sd, nd, dom))
        q = stats.t.ppf(0.5 + conf / 2, sizes - 1)
        own = np.stack([theta * np.exp(-q * se / theta), theta * np.exp(q * se / theta)], 1)
        pooled = pooled_domain_intervals(sd, nd, conf, larger_of_own=False)
        printed = pooled_domain_intervals(sd, nd, conf)
        cis = {"default": [d["ci"] for d in default], "t-own-log": own.tolist(),
               "pooled-t-log": [p["ci"] for p in pooled], "pooled-or-own": [p["ci"] for p in printed],
               "union": [domain_mean(d | {"flags": list(d["flags"])}, p)["ci"] for d, p in zip(default, printed)]}
        for m, ci in cis.items():
            for d, (lo, hi) in enumerate(ci):
                lo = -math.inf if lo is None else lo
                hi = math.inf if hi is None else hi
                hit[m][d] += lo <= truth[d] <= hi
                above[m][d] += truth[d] > hi
                width[m].append((hi - lo) / truth[d])
    pairs = reps * h
    return {"shape": name, "per_domain": per_domain if not shape.sizes else None, "sizes": sizes.tolist(),
            "domains": h, "replications": reps, "resamples": b,
            "coverage": {m: float(hit[m].sum() / pairs) for m in METHODS},
            "coverage_worst": {m: float(hit[m][worst] / reps) for m in METHODS},
            "coverage_min_domain": {m: float(hit[m].min() / reps) for m in METHODS},
            "truth_above": {m: float(above[m].sum() / pairs) for m in METHODS},
            "width": {m: float(np.median(width[m])) for m in METHODS}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(DOMAIN_SHAPES))
    ap.add_argument("--per-domain", nargs="+", type=int, default=[6, 8, 12, 24, 48])
    ap.add_argument("--replications", type=int, default=300)
    ap.add_argument("--resamples", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    print("| shape | windows a domain | R x domains | " + " | ".join(f"`{m}`" for m in METHODS)
          + " | worst domain (largest spread): " + " / ".join(METHODS) + " | median width / truth: "
          + " / ".join(METHODS) + " |")
    print("|---|---|---|" + "---|" * (len(METHODS) + 2))
    cells = []
    for name in a.shapes:
        for pd in ([0] if DOMAIN_SHAPES[name].sizes else a.per_domain):
            t0 = time.perf_counter()
            c = replicate(name, pd, a.replications, a.resamples, a.seed)
            c["seconds"] = time.perf_counter() - t0
            cells.append(c)
            wd = f"{min(c['sizes'])}-{max(c['sizes'])}" if c["per_domain"] is None else str(pd)
            print(f"| {name} | {wd} | {c['replications']} x {c['domains']} | "
                  + " | ".join(f"{c['coverage'][m]:.3f}" for m in METHODS) + " | "
                  + " / ".join(f"{c['coverage_worst'][m]:.3f}" for m in METHODS) + " | "
                  + " / ".join(f"{c['width'][m]:.2f}" for m in METHODS) + " |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
