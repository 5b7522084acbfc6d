"""Coverage simulation: does each interval fideval can print cover the truth at its stated level?

Windows (clusters) in domains (strata). Mean-type data (KLD): domain h has mean m_h; window w of domain h
has mean mu_w = m_h * LogNormal(-sigma_b^2 / 2, sigma_b) (mean m_h, between-window spread sigma_b) and
N_w rows, uniform in [rows/2, rows]; each row is mu_w times a mean-one draw: Gamma(k, 1/k) (light tail)
or LogNormal(-s^2 / 2, s) (heavy tail, per-token KLD's shape). N_w is independent of mu_w, so the
token-weighted mean over the design (G_h windows per domain, fixed) estimates sum_h G_h m_h / G — the truth
every interval is scored against. Proportion-type data (top-1 agreement): window w agrees on
y_w ~ Binomial(N_w, p_w) rows, logit p_w = logit p_h + sigma_b Z; the truth is sum_h G_h E[p_w] / G
(Gauss-Hermite). Only (S_w, N_w) or (y_w, N_w) enter any cluster interval, so rows are drawn per window.

Intervals scored (every one fideval computes, plus candidates): see ``MEAN_METHODS`` / ``TOP1_METHODS``.
Resampling is within domain (the report's count matrix) unless the name says ``unstratified``.
Used by ``bench/coverage.py`` (the table in docs/formats-report.md) and ``tests/test_stats_coverage.py``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np
from scipy import stats
from scipy.optimize import brentq
from scipy.special import expit, ndtri

from fideval.stats.bootstrap import bca_interval, ratio_means
from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.paired import paired_interval
from fideval.stats.quantiles import TAIL_WINDOWS, bootstrap_quantiles, tail_windows
from fideval.stats.studentized import (
    _dg,
    _g,
    cluster_t_means,
    expanded_confidence,
    linearized_variance,
    resampled_se,
    t_interval,
)
from fideval.stats.wilson import wilson_figure

MEAN_METHODS = (
    "cluster-bca",  # the seed's method, stratified resampling
    "cluster-bca-unstratified",
    "cluster-bca-log",  # BCa of log(mean) (acceleration on the log scale), back-transformed
    "cluster-bca-expanded",  # BCa at a nominal level widened by sqrt(G/(G-H)) t_(G-H) (Hesterberg 2015)
    "cluster-percentile",
    "t-linearized",  # theta +- t_(G-H) se (no bootstrap)
    "t-linearized-log",
    "cluster-bootstrap-t",
    "cluster-bootstrap-t-log",
    "cluster-bootstrap-t-log-unstratified",
    "cluster-bootstrap-t-log-expanded",  # at the expanded nominal level, as cluster-bca-expanded
    "cluster-bootstrap-t-log-symmetric",  # log(theta) -+ the 95 % quantile of |t*| times se
    "cluster-bootstrap-t-log-symmetric-expanded",
    "iid-token",  # mean +- z sd / sqrt(rows): tokens as independent
)
PAIRED_METHODS = (
    "ratio: cluster-bootstrap-t-log",  # the default of a ratio
    "ratio: cluster-bca",
    "difference: cluster-bootstrap-t",  # the default of a difference
    "difference: cluster-bca",
    "ratio: cluster-bootstrap-t-log-symmetric-expanded",
    "difference: cluster-bootstrap-t-symmetric-expanded",
    "difference: mover-cluster-bootstrap-t-log-symmetric-expanded",  # the default of a difference
)
DELTA_METHODS = (  # a signed mean (delta NLL): the identity scale
    "cluster-bca",
    "t-linearized",
    "cluster-bootstrap-t",
    "cluster-bootstrap-t-expanded",
    "cluster-bootstrap-t-symmetric",
    "cluster-bootstrap-t-symmetric-expanded",  # the default of delta NLL
    "iid-token",
)
TOP1_METHODS = (
    "wilson",  # iid Wilson, n = rows
    "wilson-design-effect",
    "cluster-bca",
    "t-linearized-logit",
    "cluster-bootstrap-t",
    "cluster-bootstrap-t-logit",
    "cluster-bootstrap-t-logit-expanded",
    "cluster-bootstrap-t-logit-symmetric",
    "cluster-bootstrap-t-logit-symmetric-expanded",
)
QUANTILES = (0.5, 0.9, 0.99, 0.999)  # the report's default KLD quantiles
TAIL_RULES = (20, 25, 30, 40)  # upper bound withheld (null) below this many tail windows; fideval's: TAIL_WINDOWS
_QNAME = {0.5: "median", 0.9: "p90", 0.99: "p99", 0.999: "p99.9"}


def _tail_rule(q: float, rule: int) -> str:
    """The expanded percentile interval, its upper bound null below ``rule`` tail windows (the report's default at
    rule = fideval.stats.quantiles.TAIL_WINDOWS)."""
    return f"{_QNAME[q]}: expanded, upper null below {rule} tail windows" + (" (default)" if rule == TAIL_WINDOWS else "")


QUANTILE_METHODS = tuple(f"{_QNAME[q]}: cluster-percentile" for q in QUANTILES) + tuple(
    f"{_QNAME[q]}: cluster-percentile-expanded" for q in QUANTILES) + (  # at the expanded level, as for means
    "median: iid-order-statistic",  # binomial ranks of the pooled rows: tokens as independent
    "p99: iid-order-statistic",
) + tuple(_tail_rule(q, t) for t in TAIL_RULES for q in QUANTILES)


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # "mean", "top1", "paired" (two builds on the same windows) or "quantile" (of the pooled rows)
    sigma_b: float  # between-window spread (log scale for means, logit scale for proportions)
    token: str = "lognormal"  # mean: "gamma" or "lognormal"
    token_param: float = 1.5  # gamma shape k, or lognormal sigma
    domain_weights: tuple[float, ...] = (1, 1, 1, 1, 1, 1)  # windows per domain, proportional
    domain_levels: tuple[float, ...] = (1, 1, 1, 1, 1, 1)  # mean m_h (mean) or p_h (top1)
    rows: int = 256
    base: float = 0.02
    effect: float = 1.0  # paired: build 1's mean KLD over build 2's
    effect_sigma: float = 0.0  # paired: per-window log spread of that effect (mean one)
    rows_min: int | None = None  # rows per window drawn from rows_min..rows (default rows // 2..rows)
    delta: float = 0.0  # delta: each row is mu_w (L1 - delta L2), L1, L2 iid mean-one rows (signed, like delta NLL)
    note: str = ""


SHAPES = {
    s.name: s
    for s in (
        Shape("light-low", "mean", 0.3, "gamma", 2.0, note="Gamma(2) rows, sigma_b 0.3"),
        Shape("light-high", "mean", 1.0, "gamma", 2.0, note="Gamma(2) rows, sigma_b 1.0"),
        Shape("heavy-low", "mean", 0.3, "lognormal", 2.0, note="LogNormal(s=2) rows, sigma_b 0.3"),
        Shape("heavy-high", "mean", 1.0, "lognormal", 2.0, note="LogNormal(s=2) rows, sigma_b 1.0"),
        Shape("heavy-unequal", "mean", 0.6, "lognormal", 2.0, (1, 1, 2, 3, 4, 5), (0.3, 0.5, 1, 1, 2, 4),
              note="LogNormal(s=2) rows, sigma_b 0.6, domains of 1:1:2:3:4:5 windows, means 0.3-4x"),
        Shape("domain-heavy-high", "mean", 1.0, "lognormal", 2.0, (1,), (1,),
              note="one domain (a per-domain figure's few windows): LogNormal(s=2) rows, sigma_b 1.0"),
        Shape("domain-light-high", "mean", 1.0, "gamma", 2.0, (1,), (1,),
              note="one domain: Gamma(2) rows, sigma_b 1.0"),
        Shape("paired-heavy", "paired", 1.0, "lognormal", 2.0, effect=1.3, effect_sigma=0.3,
              note="two builds on LogNormal(s=2) rows, sigma_b 1.0; build 1 = 1.3x build 2, per-window effect "
                   "spread 0.3, per-row 0.5"),
        Shape("paired-close", "paired", 0.6, "lognormal", 2.0, (1, 1, 2, 3, 4, 5), (0.3, 0.5, 1, 1, 2, 4),
              effect=1.05, effect_sigma=0.1,
              note="two builds 5 % apart, spread 0.1, heavy-unequal's domains"),
        Shape("quantile-light-high", "quantile", 1.0, "gamma", 2.0, note="quantiles of Gamma(2) rows, sigma_b 1.0"),
        Shape("quantile-heavy-low", "quantile", 0.3, "lognormal", 2.0, note="quantiles of LogNormal(s=2) rows, sigma_b 0.3"),
        Shape("quantile-heavy-high", "quantile", 1.0, "lognormal", 2.0,
              note="quantiles of LogNormal(s=2) rows, sigma_b 1.0"),
        Shape("quantile-heavy-unequal", "quantile", 0.6, "lognormal", 2.0, (1, 1, 2, 3, 4, 5), (0.3, 0.5, 1, 1, 2, 4),
              note="quantiles of heavy-unequal's rows and domains"),
        Shape("top1-0.95-low", "top1", 0.5, domain_levels=(0.95,) * 6, note="p 0.95, logit spread 0.5"),
        Shape("top1-0.95-high", "top1", 1.0, domain_levels=(0.95,) * 6, note="p 0.95, logit spread 1.0"),
        Shape("top1-0.99-high", "top1", 1.0, domain_levels=(0.99,) * 6, note="p 0.99, logit spread 1.0"),
        Shape("top1-bucket", "top1", 1.0, domain_levels=(0.6,) * 6, rows=40, rows_min=0,
              note="a confidence bucket's rows: p 0.6, logit spread 1.0, 0-40 rows a window (some windows none)"),
        Shape("top1-bucket-high", "top1", 1.0, domain_levels=(0.97,) * 6, rows=40, rows_min=0,
              note="the confident bucket: p 0.97, logit spread 1.0, 0-40 rows a window"),
        Shape("delta-heavy-high", "delta", 1.0, "lognormal", 1.5, delta=0.8,
              note="signed rows mu_w (L1 - 0.8 L2), L1, L2 LogNormal(s=1.5), sigma_b 1.0 (delta NLL: mean 0.2 mu_w)"),
        Shape("delta-heavy-unequal", "delta", 0.6, "lognormal", 1.5, (1, 1, 2, 3, 4, 5), (0.3, 0.5, 1, 1, 2, 4),
              delta=0.8, note="delta-heavy-high's rows, sigma_b 0.6, heavy-unequal's domains"),
        Shape("domain-top1-0.95-high", "top1", 1.0, domain_weights=(1,), domain_levels=(0.95,),
              note="one domain (a per-domain top-1's few windows): p 0.95, logit spread 1.0"),
        Shape("domain-top1-0.99-high", "top1", 1.0, domain_weights=(1,), domain_levels=(0.99,),
              note="one domain: p 0.99, logit spread 1.0"),
        Shape("top1-unequal", "top1", 1.0, domain_weights=(1, 1, 2, 3, 4, 5),
              domain_levels=(0.8, 0.9, 0.95, 0.97, 0.99, 0.995),
              note="p 0.8-0.995 by domain, logit spread 1.0, domains of 1:1:2:3:4:5 windows"),
    )
}


def allocate(g: int, weights: tuple[float, ...]) -> np.ndarray:
    """Windows per domain: largest remainder of g * weights, at least 2 each."""
    w = np.asarray(weights, dtype=np.float64)
    raw = g * w / w.sum()
    out = np.maximum(np.floor(raw).astype(int), 2)
    while out.sum() < g:
        out[np.argmax(raw - out)] += 1
    while out.sum() > g:
        out[np.argmax(out - raw)] -= 1
    return out


def truth(shape: Shape, sizes: np.ndarray) -> float:
    lv = np.asarray(shape.domain_levels, dtype=np.float64)
    if shape.kind in ("mean", "paired", "quantile", "delta"):
        return float(np.sum(sizes * lv * shape.base) / sizes.sum()) * (1.0 - shape.delta)  # build 2's (paired); the mean (quantile)
    x, w = np.polynomial.hermite_e.hermegauss(80)
    e = np.array([np.sum(w * expit(math.log(p / (1 - p)) + shape.sigma_b * x)) / np.sum(w) for p in lv])
    return float(np.sum(sizes * e) / sizes.sum())


def truth_quantiles(shape: Shape, sizes: np.ndarray) -> np.ndarray:
    """The quantiles of the pooled row distribution the design samples: a mixture over domains (weights G_h;
    N_w is independent of the window, so token weighting is window weighting) of the window-effect mixture.
    Lognormal rows: log x ~ Normal(log(base m_h) - (sigma_b^2 + s^2) / 2, sqrt(sigma_b^2 + s^2)) exactly;
    gamma rows: the window effect integrated by Gauss-Hermite quadrature."""
    w = sizes / sizes.sum()
    lv = np.log(shape.base * np.asarray(shape.domain_levels, dtype=np.float64))
    b = shape.sigma_b
    if shape.token == "lognormal":
        sd = math.hypot(b, shape.token_param)
        mu = lv - sd**2 / 2

        def cdf(x: float) -> float:
            return float(np.sum(w * stats.norm.cdf((math.log(x) - mu) / sd)))
    else:
        z, gw = np.polynomial.hermite_e.hermegauss(120)
        gw = gw / gw.sum()
        k = shape.token_param
        scale = np.exp(lv[:, None] + b * z[None, :] - b**2 / 2)  # [domain, node]: the window mean

        def cdf(x: float) -> float:
            return float(np.sum(w[:, None] * gw[None, :] * stats.gamma.cdf(x / scale, k, scale=1.0 / k)))
    return np.array([brentq(lambda x: cdf(x) - q, 1e-300, 1e12, xtol=1e-300, rtol=1e-14, maxiter=500)
                     for q in QUANTILES])


def draw(shape: Shape, sizes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Per-window (S or y, N, domain code) of one replication, and for means the rows (the iid interval's)."""
    dom = np.repeat(np.arange(sizes.size), sizes)
    g = dom.size
    n = rng.integers(shape.rows // 2 if shape.rows_min is None else shape.rows_min, shape.rows + 1, g)
    lv = np.asarray(shape.domain_levels, dtype=np.float64)[dom]
    if shape.kind == "top1":
        p = expit(np.log(lv / (1 - lv)) + shape.sigma_b * rng.standard_normal(g))
        return rng.binomial(n, p).astype(np.float64), n.astype(np.float64), dom
    mu = shape.base * lv * rng.lognormal(-shape.sigma_b**2 / 2, shape.sigma_b, g)
    codes = np.repeat(np.arange(g), n)
    if shape.token == "gamma":
        x = rng.gamma(shape.token_param, 1.0 / shape.token_param, codes.size)
    else:
        x = rng.lognormal(-shape.token_param**2 / 2, shape.token_param, codes.size)
    if shape.kind == "delta":
        x = x - shape.delta * rng.lognormal(-shape.token_param**2 / 2, shape.token_param, codes.size)
    x *= mu[codes]
    s = np.bincount(codes, weights=x, minlength=g)
    if shape.kind == "paired":  # build 1: the same rows times a per-window effect and a per-row wobble
        e = shape.effect * rng.lognormal(-shape.effect_sigma**2 / 2, shape.effect_sigma, g)
        x1 = x * e[codes] * rng.lognormal(-0.125, 0.5, codes.size)
        return s, n.astype(np.float64), dom, x, np.bincount(codes, weights=x1, minlength=g)
    return s, n.astype(np.float64), dom, x


@dataclass
class Tally:
    hits: dict[str, int] = field(default_factory=dict)
    below: dict[str, int] = field(default_factory=dict)  # truth below the interval
    widths: dict[str, list[float]] = field(default_factory=dict)  # width / truth, per replication
    bounded: dict[str, int] = field(default_factory=dict)  # replications with both bounds stated
    reps: int = 0

    def add(self, name: str, ci, t: float) -> None:
        lo, hi = ci  # None: unbounded on that side
        lo = -math.inf if lo is None else lo
        hi = math.inf if hi is None else hi
        self.hits[name] = self.hits.get(name, 0) + int(lo <= t <= hi)
        self.below[name] = self.below.get(name, 0) + int(t < lo)
        self.bounded[name] = self.bounded.get(name, 0) + int(math.isfinite(lo) and math.isfinite(hi))
        self.widths.setdefault(name, []).append((hi - lo) / abs(t))

    def width(self, name: str, q: float = 0.5) -> float:
        with np.errstate(invalid="ignore"):  # inf - inf between two unbounded widths: the width is inf
            w = float(np.quantile(self.widths[name], q))
        return math.inf if math.isnan(w) else w

    def coverage(self, name: str) -> float:
        return self.hits[name] / self.reps


def _bca(s, n, counts, conf, log=False):
    theta, star, jack = ratio_means(s, n, counts)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            lo, hi = bca_interval(np.log(theta[0]), np.log(star[:, 0]), np.log(jack[:, 0]), conf)["ci"]
        return math.exp(lo), math.exp(hi)
    return bca_interval(theta[0], star[:, 0], jack[:, 0], conf)["ci"]


VARIANTS = (("", {}), ("-expanded", {"expand": True}), ("-symmetric", {"symmetric": True}),
            ("-symmetric-expanded", {"symmetric": True, "expand": True}))


def _t_variants(s, n, counts, dom, scale: str, confidence: float, h: int) -> dict[str, tuple[float, float]]:
    """Each bootstrap-t variant of ``VARIANTS`` from one set of t* (as ``cluster_t_means`` computes them)."""
    star, se_star = resampled_se(s, n, counts, dom)
    se = float(np.sqrt(linearized_variance(s, n, dom)[0]))
    theta = float(s.sum() / n.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (_g(scale, star[:, 0]) - _g(scale, np.float64(theta))) / (_dg(scale, star[:, 0]) * se_star[:, 0])
    out = {}
    for suffix, kw in VARIANTS:
        level = expanded_confidence(confidence, s.size, h) if kw.get("expand") else confidence
        out[suffix] = t_interval(theta, se, t, scale, level, kw.get("symmetric", False))[:2]
    return out


def replicate(shape: Shape, g: int, reps: int, resamples: int, seed: int, confidence: float = 0.95) -> Tally:
    rng = np.random.default_rng([seed, g, zlib.crc32(shape.name.encode())])  # reproducible (str hash is not)
    sizes = allocate(g, shape.domain_weights)
    t = truth(shape, sizes)
    tqs = truth_quantiles(shape, sizes) if shape.kind == "quantile" else None
    h = sizes.size
    labels = {f"{k:03d}": f"d{d}" for k, d in enumerate(np.repeat(np.arange(h), sizes))}
    cl = Clusters.from_pairs(labels)  # ids sorted = in domain order, so codes 0..g-1 match draw()'s order
    zq = float(ndtri(0.5 + confidence / 2))
    tq = float(stats.t.ppf(0.5 + confidence / 2, g - h))
    conf_x = expanded_confidence(confidence, g, h)
    tally = Tally()
    for rep in range(reps):
        rs = int(rng.integers(2**62))
        counts = resample_counts(cl, resamples, rs)
        counts_u = resample_counts(cl, resamples, rs + 1, stratified=False)
        out = draw(shape, sizes, rng)
        s, n, dom = out[0], out[1], out[2]
        tally.reps += 1
        theta = float(s.sum() / n.sum())
        se = math.sqrt(float(linearized_variance(s, n, dom)[0]))
        if shape.kind == "paired":
            s1 = out[4]
            for kind, tp in (("ratio", shape.effect), ("difference", t * (shape.effect - 1.0))):
                r = paired_interval(kind, s1, n, s, n, counts, dom, confidence=confidence)
                name = "cluster-bootstrap-t-log" if kind == "ratio" else "cluster-bootstrap-t"
                tally.add(f"{kind}: {name}", r["ci"], tp)
                tally.add(f"{kind}: cluster-bca", r["cluster_bca"]["ci"], tp)
                r = paired_interval(kind, s1, n, s, n, counts, dom, confidence=confidence, symmetric=True, expand=True)
                tally.add(f"{kind}: {name}-symmetric-expanded", r["ci"], tp)
                if kind == "difference":
                    r = paired_interval(kind, s1, n, s, n, counts, dom, confidence=confidence, symmetric=True,
                                        expand=True, mover=True)
                    tally.add("difference: mover-cluster-bootstrap-t-log-symmetric-expanded", r["ci"], tp)
        elif shape.kind == "quantile":
            x = out[3]
            codes = np.repeat(np.arange(g), n.astype(np.int64))
            boot = bootstrap_quantiles(x, codes, counts, list(QUANTILES))  # what quantile_figures computes
            est = np.quantile(x, QUANTILES, method="linear")
            for i, q in enumerate(QUANTILES):
                for suffix, level in (("", confidence), ("-expanded", conf_x)):
                    a = (1 - level) / 2
                    tally.add(f"{_QNAME[q]}: cluster-percentile{suffix}", np.quantile(boot[:, i], [a, 1 - a]),
                              float(tqs[i]))
                lo, hi = np.quantile(boot[:, i], [(1 - conf_x) / 2, (1 + conf_x) / 2])
                tw = tail_windows(x, codes, float(est[i]))  # what quantile_figures records
                for rule in TAIL_RULES:
                    tally.add(_tail_rule(q, rule),
                              (lo, None if tw < rule else hi), float(tqs[i]))
            xs = np.sort(x)
            for q in (0.5, 0.99):
                m = xs.size
                half = zq * math.sqrt(m * q * (1 - q))
                lo, hi = int(max(math.floor(m * q - half), 0)), int(min(math.ceil(m * q + half), m - 1))
                tally.add(f"{_QNAME[q]}: iid-order-statistic", (xs[lo], xs[hi]), float(tqs[QUANTILES.index(q)]))
        elif shape.kind == "delta":
            x = out[3]
            tally.add("cluster-bca", _bca(s, n, counts, confidence), t)
            tally.add("t-linearized", (theta - tq * se, theta + tq * se), t)
            bt = cluster_t_means(s, n, counts, dom, "identity", confidence)
            tally.add("cluster-bootstrap-t", bt[0]["ci"], t)
            for suffix, ci in _t_variants(s, n, counts, dom, "identity", confidence, h).items():
                if suffix:
                    tally.add("cluster-bootstrap-t" + suffix, ci, t)
            half = zq * x.std(ddof=1) / math.sqrt(x.size)
            tally.add("iid-token", (x.mean() - half, x.mean() + half), t)
        elif shape.kind == "mean":
            x = out[3]
            tally.add("cluster-bca", _bca(s, n, counts, confidence), t)
            tally.add("cluster-bca-unstratified", _bca(s, n, counts_u, confidence), t)
            tally.add("cluster-bca-log", _bca(s, n, counts, confidence, log=True), t)
            tally.add("cluster-bca-expanded", _bca(s, n, counts, conf_x), t)
            star = (counts @ s) / (counts @ n)
            a = (1 - confidence) / 2
            tally.add("cluster-percentile", np.quantile(star, [a, 1 - a]), t)
            tally.add("t-linearized", (theta - tq * se, theta + tq * se), t)
            tally.add("t-linearized-log", (theta * math.exp(-tq * se / theta), theta * math.exp(tq * se / theta)), t)
            bt = cluster_t_means(np.stack([s, s], 1), np.stack([n, n], 1), counts, dom, ["identity", "log"],
                                 confidence)
            tally.add("cluster-bootstrap-t", bt[0]["ci"], t)
            tally.add("cluster-bootstrap-t-log", bt[1]["ci"], t)
            tally.add("cluster-bootstrap-t-log-unstratified",
                      cluster_t_means(s, n, counts_u, None, "log", confidence)[0]["ci"], t)
            for suffix, ci in _t_variants(s, n, counts, dom, "log", confidence, h).items():
                if suffix:
                    tally.add("cluster-bootstrap-t-log" + suffix, ci, t)
            half = zq * x.std(ddof=1) / math.sqrt(x.size)
            tally.add("iid-token", (x.mean() - half, x.mean() + half), t)
        else:
            w = wilson_figure(s, n, confidence)
            tally.add("wilson", w["wilson"]["ci"], t)
            tally.add("wilson-design-effect", w["wilson_deff"]["ci"] if w["wilson_deff"] else (theta, theta), t)
            tally.add("cluster-bca", _bca(s, n, counts, confidence), t)
            lg, sg = math.log(theta / (1 - theta)), se / (theta * (1 - theta))
            tally.add("t-linearized-logit", (expit(lg - tq * sg), expit(lg + tq * sg)), t)
            bt = cluster_t_means(np.stack([s, s], 1), np.stack([n, n], 1), counts, dom, ["identity", "logit"],
                                 confidence)
            tally.add("cluster-bootstrap-t", bt[0]["ci"], t)
            tally.add("cluster-bootstrap-t-logit", bt[1]["ci"], t)
            for suffix, ci in _t_variants(s, n, counts, dom, "logit", confidence, h).items():
                if suffix:
                    tally.add("cluster-bootstrap-t-logit" + suffix, ci, t)
    return tally
