"""Coverage where the evidence is thin: concentrated windows (issue 48), and the concentration diagnostic.

Concentrated shapes: the top 1 % of windows carry 15-30 % of the total KLD. Drawn with coverage_sim's
machinery (6 equal domains, 128-256 rows a window of LogNormal(s=1.5) rows) and a window mean that is

- ``conc-lognormal-1.5`` / ``conc-lognormal-1.8``: mean one times LogNormal(-b^2/2, b), b = 1.5 or 1.8
  (top 1 % of window means: 1 - Phi(z_0.99 - b) = 0.19 or 0.30 of the total);
- ``conc-burst``: 1 + 24 Bernoulli(0.01), rescaled to mean one (1 % of windows 25x the rest: 0.20 of it);
- ``conc-size``: as ``conc-lognormal-1.5``, with the window's rows rising with its mean (N_w = rows * (0.5 +
  0.5 U), U the window mean's normal rank): the token-weighted truth is E[N mu] / E[N], by quadrature.

Per replication it scores the report's default (``cluster-bootstrap-t-log-symmetric-expanded``: the report's
code path, ``cluster_t_means``), the equal-tailed identity bootstrap-t, Hall's (1992) skewness-corrected
studentized interval (cubic transformation of the linearised t, with the level expansion), the bootstrap-t
of Hall's transformed statistic, and the default's lower bound alone (one-sided, 97.5 %). It also records the
concentration diagnostic of ``fideval/stats/concentration.py`` and the default's coverage on the replications
it flags and on those it does not. The existing mean shapes of coverage_sim (``--shapes heavy-high ...``)
calibrate the flag: how often it fires where the default covers.

``--rule-shapes`` scores every report quantile as printed under the rule of ``quantile_figures`` (the p99 and
p99.9 with their lower bound alone); ``--double-shapes`` the calibrated double bootstrap beside the default.

Usage: python bench/coverage_thin.py [--shapes ...] [--clusters 64 128 256 512] [--replications 400]
       [--resamples 500] [--quantile-shapes ...] [--rule-shapes ...] [--double-shapes ... --inner 100]
       [--json out.json]
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
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from coverage_sim import QUANTILES, SHAPES, Shape, Tally, allocate, draw, truth, truth_quantiles  # noqa: E402  # noqa: E402

from fideval.stats.clusters import Clusters, resample_counts  # noqa: E402
from fideval.stats.concentration import concentrated, concentration  # noqa: E402
from fideval.stats.quantiles import bootstrap_quantiles, tail_windows  # noqa: E402
from fideval.stats.studentized import (  # noqa: E402
    cluster_t_means,
    expanded_confidence,
    linearized_variance,
    resampled_se,
)

THIN = {
    "conc-lognormal-1.5": Shape("conc-lognormal-1.5", "mean", 1.5, "lognormal", 1.5,
                                note="window means LogNormal(b=1.5): top 1 % ~0.19 of the total; LogNormal(s=1.5) rows"),
    "conc-lognormal-1.8": Shape("conc-lognormal-1.8", "mean", 1.8, "lognormal", 1.5,
                                note="window means LogNormal(b=1.8): top 1 % ~0.30 of the total"),
    "conc-burst": Shape("conc-burst", "mean", 0.0, "lognormal", 1.5,
                        note="1 % of windows 25x the rest (Bernoulli): top 1 % ~0.20 of the total"),
    "conc-size": Shape("conc-size", "mean", 1.5, "lognormal", 1.5,
                       note="conc-lognormal-1.5 with rows rising with the window mean (N = rows (0.5 + 0.5 U))"),
}
QUANTILE_THIN = {  # the p99's window-bootstrap interval on concentrated rows (coverage_sim's quantile machinery)
    "quantile-conc-1.5": Shape("quantile-conc-1.5", "quantile", 1.5, "lognormal", 1.5,
                               note="quantiles of conc-lognormal-1.5's rows"),
    "quantile-conc-1.8": Shape("quantile-conc-1.8", "quantile", 1.8, "lognormal", 1.5,
                               note="quantiles of conc-lognormal-1.8's rows"),
}
METHODS = ("default (bootstrap-t-log-symmetric-expanded)", "bootstrap-t identity equal-tailed",
           "hall-skew-corrected-expanded", "bootstrap-t of hall-transformed", "default lower bound only (97.5 %)")


def draw_thin(shape: Shape, sizes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dom = np.repeat(np.arange(sizes.size), sizes)
    g = dom.size
    if shape.name == "conc-burst":
        mu = shape.base * (1.0 + 24.0 * (rng.random(g) < 0.01)) / 1.24
        n = rng.integers(shape.rows // 2, shape.rows + 1, g)
    else:
        z = rng.standard_normal(g)
        mu = shape.base * np.exp(shape.sigma_b * z - shape.sigma_b**2 / 2)
        if shape.name == "conc-size":
            n = np.round(shape.rows * (0.5 + 0.5 * stats.norm.cdf(z))).astype(np.int64)
        else:
            n = rng.integers(shape.rows // 2, shape.rows + 1, g)
    # a window's row sum: mu_w times a sum of N_w mean-one LogNormal(s) rows
    codes = np.repeat(np.arange(g), n)
    x = rng.lognormal(-shape.token_param**2 / 2, shape.token_param, codes.size) * mu[codes]
    return np.bincount(codes, weights=x, minlength=g), n.astype(np.float64), dom


def truth_thin(shape: Shape) -> float:
    if shape.name == "conc-size":  # E[N mu] / E[N], N = rows (0.5 + 0.5 Phi(z)), mu = base exp(b z - b^2/2)
        z, w = np.polynomial.hermite_e.hermegauss(200)
        w = w / w.sum()
        nn = shape.rows * (0.5 + 0.5 * stats.norm.cdf(z))
        mu = shape.base * np.exp(shape.sigma_b * z - shape.sigma_b**2 / 2)
        return float(np.sum(w * nn * mu) / np.sum(w * nn))
    return shape.base


def hall_interval(theta: float, se: float, gamma: float, g: int, q: float, sign: float = 1.0) -> tuple[float, float]:
    """Hall (1992, JRSS B 54, 221-228): T = (theta - mu) / se, f(T) = T + a T^2 + a^2 T^3 / 3 + a / 2 with
    a = gamma / (3 sqrt(g)) (gamma the skewness of the window residuals) is N(0, 1) to o(g^-1/2); the interval
    is theta - se f^-1(+-q), f^-1(x) = ((1 + 3 a (x - a / 2))^(1/3) - 1) / a (monotone, real cube root)."""
    a = gamma / (3.0 * math.sqrt(g))

    def finv(x: float) -> float:
        if abs(a) < 1e-12:
            return x
        return (np.cbrt(1.0 + 3.0 * a * (x - a / 2.0)) - 1.0) / a

    return theta - se * finv(q), theta - se * finv(-q)


def _skew(e: np.ndarray) -> float:
    m2 = float(np.mean(e**2))
    return float(np.mean(e**3) / m2**1.5) if m2 > 0 else 0.0


def replicate(name: str, g: int, reps: int, b: int, seed: int, conf: float = 0.95) -> dict:
    shape = THIN.get(name) or SHAPES[name]
    rng = np.random.default_rng([seed, g, zlib.crc32(name.encode())])
    sizes = allocate(g, shape.domain_weights)
    t = truth_thin(shape) if name in THIN else truth(shape, sizes)
    h = sizes.size
    cl = Clusters.from_pairs({f"{k:03d}": f"d{d}" for k, d in enumerate(np.repeat(np.arange(h), sizes))})
    level = expanded_confidence(conf, g, h)
    q_x = float(stats.norm.ppf(0.5 + level / 2))
    tl = Tally()
    shares, flagged, hit_flag, hit_noflag, miss_high = [], 0, 0, 0, 0
    per_rep = []  # (top_share, effective_windows / G, default covers, miss high): to calibrate a flag offline
    for _ in range(reps):
        counts = resample_counts(cl, b, int(rng.integers(2**62)))
        s, n, dom = draw_thin(shape, sizes, rng) if name in THIN else draw(shape, sizes, rng)[:3]
        tl.reps += 1
        bt = cluster_t_means(np.stack([s, s], 1), np.stack([n, n], 1), counts, dom, ["log", "identity"], conf,
                             symmetric=True, expand=True)
        ci = bt[0]["ci"]
        tl.add(METHODS[0], ci, t)
        eq = cluster_t_means(s, n, counts, dom, "identity", conf)[0]["ci"]
        tl.add(METHODS[1], eq, t)
        theta = float(s.sum() / n.sum())
        se = math.sqrt(float(linearized_variance(s, n, dom)[0]))
        e = s - theta * n
        gam = _skew(e - np.array([e[dom == d].mean() for d in dom]))
        tl.add(METHODS[2], hall_interval(theta, se, gam, g, q_x), t)
        # bootstrap-t of Hall's transformed statistic: f_b(t*_b), each resample's own skewness (unstratified moments)
        star, se_star = resampled_se(s, n, counts, dom)
        d = star[:, 0] - theta
        m2 = (counts @ (e**2) - 2 * d * (counts @ (e * n)) + d**2 * (counts @ (n**2))) / g
        m3 = (counts @ (e**3) - 3 * d * (counts @ (e**2 * n)) + 3 * d**2 * (counts @ (e * n**2)) - d**3 * (counts @ n**3)) / g
        with np.errstate(invalid="ignore", divide="ignore"):
            gs = m3 / m2**1.5
            ts = (star[:, 0] - theta) / se_star[:, 0]
            a = gs / (3 * math.sqrt(g))
            f = ts + a * ts**2 + a**2 * ts**3 / 3 + a / 2
        f = f[np.isfinite(f)]
        qs = float(np.quantile(np.abs(f), level))
        tl.add(METHODS[3], hall_interval(theta, se, gam, g, qs), t)
        tl.add(METHODS[4], (ci[0], None), t)  # the lower bound alone: a one-sided 97.5 % claim
        c = concentration(s)
        shares.append(c["top_share"])
        miss_high += int(ci[1] is not None and t > ci[1])
        ok = int(ci[0] <= t <= (math.inf if ci[1] is None else ci[1]))
        per_rep.append([c["top_share"], c["effective_windows"] / c["windows"], ok, int(ci[1] is not None and t > ci[1])])
        if concentrated(c):
            flagged += 1
            hit_flag += ok
        else:
            hit_noflag += ok
    sh = np.array(shares)
    return {"shape": name, "windows": g, "replications": reps, "resamples": b,
            "coverage": {m: tl.coverage(m) for m in METHODS}, "width": {m: tl.width(m) for m in METHODS[:4]},
            "miss_high": miss_high / reps, "top_share_median": float(np.median(sh)),
            "top_share_p10_p90": [float(np.quantile(sh, 0.1)), float(np.quantile(sh, 0.9))],
            "effective_share_median": float(np.median([r[1] for r in per_rep])),
            "flagged": flagged / reps,
            "coverage_flagged": hit_flag / flagged if flagged else None,
            "coverage_unflagged": hit_noflag / (reps - flagged) if reps > flagged else None, "per_rep": per_rep}


def _log_t(s: np.ndarray, n: np.ndarray, counts: np.ndarray, dom: np.ndarray) -> np.ndarray:
    """The log-scale studentized statistic of every resample in ``counts``, about the data's own estimate."""
    theta = float(s.sum() / n.sum())
    star, se_star = resampled_se(s, n, counts, dom)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.log(star[:, 0]) - math.log(theta)) * star[:, 0] / se_star[:, 0]


def _inner_counts(dom: np.ndarray, c: int, rng: np.random.Generator) -> np.ndarray:
    out = np.zeros((c, dom.size))
    rows = np.arange(c)[:, None]
    for d in np.unique(dom):
        m = np.flatnonzero(dom == d)
        draws = rng.integers(0, m.size, (c, m.size))
        out[:, m] = np.bincount((rows * m.size + draws).ravel(), minlength=c * m.size).reshape(c, m.size)
    return out


def replicate_double(name: str, g: int, reps: int, b: int, c: int, seed: int, conf: float = 0.95) -> dict:
    """The calibrated (double) bootstrap of the symmetric log-scale bootstrap-t (Beran 1987's prepivoting; Hall
    1992, 3.11; Davison & Hinkley 1997, 3.9): for each of ``b`` outer resamples, ``c`` inner resamples of it give
    u_b = the share of inner |t**| at or below the outer |t*_b|; the calibrated level is the ``conf`` quantile of
    u_b, and the interval log(theta) -+ q se with q the calibrated-level quantile of the outer |t*| (no further
    expansion: the calibration replaces it). Scored beside the report's default on the same data and resamples."""
    shape = THIN.get(name) or SHAPES[name]
    rng = np.random.default_rng([seed, g, zlib.crc32(name.encode()), 11])
    sizes = allocate(g, shape.domain_weights)
    t = truth_thin(shape) if name in THIN else truth(shape, sizes)
    h = sizes.size
    cl = Clusters.from_pairs({f"{k:03d}": f"d{d}" for k, d in enumerate(np.repeat(np.arange(h), sizes))})
    tl, levels = Tally(), []
    for _ in range(reps):
        counts = resample_counts(cl, b, int(rng.integers(2**62)))
        s, n, dom = draw_thin(shape, sizes, rng) if name in THIN else draw(shape, sizes, rng)[:3]
        tl.reps += 1
        tl.add("default", cluster_t_means(s, n, counts, dom, "log", conf, symmetric=True, expand=True)[0]["ci"], t)
        t_out = np.abs(_log_t(s, n, counts, dom))
        u = np.empty(b)
        for k in range(b):
            idx = np.repeat(np.arange(g), counts[k].astype(np.int64))
            t_in = np.abs(_log_t(s[idx], n[idx], _inner_counts(dom[idx], c, rng), dom[idx]))
            t_in = t_in[np.isfinite(t_in)]
            u[k] = np.mean(t_in <= t_out[k]) if t_in.size and np.isfinite(t_out[k]) else 1.0
        lam = float(np.quantile(u, conf))
        levels.append(lam)
        theta = float(s.sum() / n.sum())
        se_log = math.sqrt(float(linearized_variance(s, n, dom)[0])) / theta
        q = float(np.quantile(t_out[np.isfinite(t_out)], lam))
        tl.add("double", (theta * math.exp(-q * se_log), theta * math.exp(q * se_log)), t)
    return {"shape": name, "windows": g, "replications": reps, "resamples": b, "inner": c,
            "coverage": {m: tl.coverage(m) for m in ("default", "double")},
            "width": {m: tl.width(m) for m in ("default", "double")},
            "calibrated_level_median": float(np.median(levels))}


P99_RULES = (25, 30, 40, 50, 60)


def replicate_p99(shape: Shape, g: int, reps: int, b: int, seed: int, conf: float = 0.95) -> dict:
    """The report's p99 interval (percentile of the pooled resampled rows at the expanded level, as
    ``quantile_figures``) with its tail windows: the two-sided coverage among the replications whose tail
    windows reach each rule, the share that reach it, and the lower bound's one-sided coverage (97.5 %)."""
    rng = np.random.default_rng([seed, g, zlib.crc32(shape.name.encode())])
    sizes = allocate(g, shape.domain_weights)
    t = float(truth_quantiles(shape, sizes)[QUANTILES.index(0.99)])
    h = sizes.size
    cl = Clusters.from_pairs({f"{k:03d}": f"d{d}" for k, d in enumerate(np.repeat(np.arange(h), sizes))})
    level = expanded_confidence(conf, g, h)
    rec = []
    for _ in range(reps):
        counts = resample_counts(cl, b, int(rng.integers(2**62)))
        s, n, _, x = draw(shape, sizes, rng)[:4]
        codes = np.repeat(np.arange(g), n.astype(np.int64))
        boot = bootstrap_quantiles(x, codes, counts, [0.99])[:, 0]
        lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
        tw = tail_windows(x, codes, float(np.quantile(x, 0.99)))
        rec.append((tw, lo <= t <= hi, lo <= t, concentrated(concentration(s))))
    r = np.array(rec, dtype=np.float64)
    out = {}
    for rule in P99_RULES:
        m = r[:, 0] >= rule
        out[str(rule)] = {"coverage": float(r[m, 1].mean()) if m.any() else None, "bounded": float(m.mean())}
    gate = r[:, 0] >= P99_RULES[0]
    split = {}  # at the report's gate: the two-sided coverage of the runs whose mean KLD is (not) flagged concentrated
    for key, m in (("concentrated", gate & (r[:, 3] > 0)), ("spread", gate & (r[:, 3] == 0))):
        split[key] = {"coverage": float(r[m, 1].mean()) if m.any() else None, "share": float(m.mean())}
    return {"shape": shape.name, "windows": g, "replications": reps, "resamples": b, "two_sided_at_or_above": out,
            "gate_by_concentration": split,
            "lower_only": float(r[:, 2].mean()), "tail_windows_median": float(np.median(r[:, 0]))}


def replicate_quantile_rule(shape: Shape, g: int, reps: int, b: int, seed: int, conf: float = 0.95) -> dict:
    """Every report quantile under the rule of ``quantile_figures`` (two-sided where its tail windows reach the
    gate and q is below ``LOWER_ONLY_FROM``, else the lower bound alone): coverage as printed (a withheld upper
    bound covers when the lower one holds), the two-sided coverage of the runs printed two-sided and their share,
    the two-sided coverage had every run that passes the gate been printed two-sided, and the lower bound's."""
    from fideval.stats.quantiles import LOWER_ONLY_FROM, TAIL_WINDOWS

    rng = np.random.default_rng([seed, g, zlib.crc32(shape.name.encode()), 7])
    sizes = allocate(g, shape.domain_weights)
    tq = truth_quantiles(shape, sizes)
    h = sizes.size
    cl = Clusters.from_pairs({f"{k:03d}": f"d{d}" for k, d in enumerate(np.repeat(np.arange(h), sizes))})
    level = expanded_confidence(conf, g, h)
    rec = []  # per replication, per quantile: (gate passed, two-sided covers, lower holds)
    for _ in range(reps):
        counts = resample_counts(cl, b, int(rng.integers(2**62)))
        _, n, _, x = draw(shape, sizes, rng)[:4]
        codes = np.repeat(np.arange(g), n.astype(np.int64))
        boot = bootstrap_quantiles(x, codes, counts, list(QUANTILES))
        est = np.quantile(x, QUANTILES)
        row = []
        for i, q in enumerate(QUANTILES):
            lo, hi = np.quantile(boot[:, i], [(1 - level) / 2, (1 + level) / 2])
            row.append((tail_windows(x, codes, float(est[i])) >= TAIL_WINDOWS, lo <= tq[i] <= hi, lo <= tq[i]))
        rec.append(row)
    r = np.array(rec, dtype=np.float64)  # [R, Q, 3]
    out = {}
    for i, q in enumerate(QUANTILES):
        gate, two, low = r[:, i, 0] > 0, r[:, i, 1] > 0, r[:, i, 2] > 0
        printed2 = gate if q < LOWER_ONLY_FROM else np.zeros_like(gate)
        out[str(q)] = {"as_printed": float(np.where(printed2, two, low).mean()),
                       "two_sided_printed": float(two[printed2].mean()) if printed2.any() else None,
                       "share_two_sided": float(printed2.mean()),
                       "two_sided_at_gate": float(two[gate].mean()) if gate.any() else None,
                       "share_at_gate": float(gate.mean()), "lower_only": float(low.mean())}
    return {"shape": shape.name, "windows": g, "replications": reps, "resamples": b, "quantiles": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=list(THIN))
    ap.add_argument("--clusters", nargs="+", type=int, default=[64, 128, 256, 512])
    ap.add_argument("--replications", type=int, default=400)
    ap.add_argument("--resamples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quantile-shapes", nargs="*", default=[],
                    help=f"quantile shapes whose p99 interval to score ({', '.join(QUANTILE_THIN)} or coverage_sim's)")
    ap.add_argument("--double-shapes", nargs="*", default=[],
                    help="shapes on which to score the calibrated double bootstrap beside the default")
    ap.add_argument("--inner", type=int, default=100, help="inner resamples of the double bootstrap")
    ap.add_argument("--rule-shapes", nargs="*", default=[],
                    help="quantile shapes on which to score every quantile under the report's rule")
    ap.add_argument("--json")
    a = ap.parse_args()
    cells = []
    if a.shapes:
        print("| shape | windows | R | " + " | ".join(f"`{m}`" for m in METHODS) + " | default: miss above | top share "
              "(median) | effective share (median) | flagged | default on flagged | default on unflagged |")
        print("|---|---|---|" + "---|" * (len(METHODS) + 6))
    for name in a.shapes:
        for g in a.clusters:
            t0 = time.perf_counter()
            c = replicate(name, g, a.replications, a.resamples, a.seed)
            c["seconds"] = time.perf_counter() - t0
            cells.append(c)
            cov = " | ".join(f"{c['coverage'][m]:.3f}" for m in METHODS)
            fc = "—" if c["coverage_flagged"] is None else f"{c['coverage_flagged']:.3f}"
            fu = "—" if c["coverage_unflagged"] is None else f"{c['coverage_unflagged']:.3f}"
            print(f"| {name} | {g} | {c['replications']} | {cov} | {c['miss_high']:.3f} | {c['top_share_median']:.3f} "
                  f"| {c['effective_share_median']:.3f} | {c['flagged']:.3f} | {fc} | {fu} |", flush=True)
    if a.quantile_shapes:
        print("\n| shape | windows | R | " + " | ".join(f"two-sided p99 where tail windows >= {r}: coverage / share"
                                                     for r in P99_RULES) + " | lower bound alone (97.5 %) | at the gate (25), mean KLD "
              "`concentrated`: coverage / share | at the gate, not concentrated: coverage / share |")
        print("|---|---|---|" + "---|" * (len(P99_RULES) + 3))
    for name in a.quantile_shapes:
        shape = QUANTILE_THIN.get(name) or SHAPES[name]
        for g in a.clusters:
            c = replicate_p99(shape, g, a.replications, a.resamples, a.seed)
            cells.append(c)
            print(f"| {name} | {g} | {c['replications']} | " + " | ".join(
                f"{r}: {v['coverage']:.3f} / {v['bounded']:.2f}" if v["coverage"] is not None else f"{r}: — / 0"
                for r, v in c["two_sided_at_or_above"].items()) + f" | {c['lower_only']:.3f} | " + " | ".join(
                f"{k}: {'—' if v['coverage'] is None else format(v['coverage'], '.3f')} / {v['share']:.2f}"
                for k, v in c["gate_by_concentration"].items()) + " |", flush=True)
    if a.double_shapes:
        print("\n| shape | windows | R | B x C | default | calibrated double bootstrap | width / truth: default / double "
              "| calibrated level (median) |")
        print("|---|---|---|---|---|---|---|---|")
    for name in a.double_shapes:
        for g in a.clusters:
            c = replicate_double(name, g, a.replications, a.resamples, a.inner, a.seed)
            cells.append(c)
            print(f"| {name} | {g} | {c['replications']} | {c['resamples']} x {c['inner']} | "
                  f"{c['coverage']['default']:.3f} | {c['coverage']['double']:.3f} | {c['width']['default']:.2f} / "
                  f"{c['width']['double']:.2f} | {c['calibrated_level_median']:.3f} |", flush=True)
    if a.rule_shapes:
        print("\n| shape | windows | R | " + " | ".join(f"{q}: as printed / two-sided as printed (share) / two-sided at "
                                                     "the gate (share) / lower alone" for q in QUANTILES) + " |")
        print("|---|---|---|" + "---|" * len(QUANTILES))
    for name in a.rule_shapes:
        shape = QUANTILE_THIN.get(name) or SHAPES[name]
        for g in a.clusters:
            c = replicate_quantile_rule(shape, g, a.replications, a.resamples, a.seed)
            cells.append(c)

            def f(v: float | None) -> str:
                return "—" if v is None else f"{v:.3f}"
            print(f"| {name} | {g} | {c['replications']} | " + " | ".join(
                f"{f(v['as_printed'])} / {f(v['two_sided_printed'])} ({v['share_two_sided']:.2f}) / "
                f"{f(v['two_sided_at_gate'])} ({v['share_at_gate']:.2f}) / {f(v['lower_only'])}"
                for v in c["quantiles"].values()) + " |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
