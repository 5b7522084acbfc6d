"""Every interval of a mean in report.json: the default, and the cluster BCa (the seed's method) beside it.

The default is the cluster bootstrap-t of ``studentized.py`` on the figure's scale (``SCALES``), symmetric
and at the level expanded for few windows (``VARIANT``), chosen from the coverage table of
``bench/coverage.py`` (docs/formats-report.md, "Measured coverage"): of the candidates measured, it is the
one that covers >= 93 % at a stated 95 % on every mean and top-1 shape of that bench with >= 64 windows
(not on concentrated windows: a log-scale mean stores ``concentration`` beside its interval and is flagged
``concentrated`` where it passes the threshold of ``fideval/stats/concentration.py``). The
cluster BCa stays beside it, labelled, so figures remain comparable with reports of the seed's method;
top-1 agreement also keeps the iid Wilson interval (tokens as independent trials, what published cards
quote) and the design-effect Wilson, each labelled by ``method`` and ``unit``.

Every interval block records how it was made: ``method``, ``unit`` (``window``: windows resampled as
clusters; ``token``: rows as independent), ``resamples`` (B; null for a closed-form interval), ``seed``,
``strata`` (domains the resampling or variance is stratified by) and ``clusters`` (windows with rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.stats.bootstrap import cluster_bca_means
from fideval.stats.concentration import EFFECTIVE_SHARE_FLAG, concentrated, concentration
from fideval.stats.domains import DESCRIPTION as POOLED_DESCRIPTION
from fideval.stats.domains import METHOD as POOLED_METHOD
from fideval.stats.domains import MIN_WINDOWS as DOMAIN_FEWEST
from fideval.stats.domains import UNION
from fideval.stats.studentized import cluster_t_means, method_name
from fideval.stats.wilson import wilson_figure

# the scale each figure's default interval is computed on
SCALES = {"kld": "log", "rkld": "log", "delta_nll": "identity", "top1": "logit", "top5": "logit", "top10": "logit"}
# the bootstrap-t variant chosen from the coverage table (docs/formats-report.md, "Measured coverage")
VARIANT = {"symmetric": True, "expand": True}
DEFAULTS = {
    "non-negative mean (KLD, reverse KLD)": method_name("log", **VARIANT),
    "signed mean (delta NLL)": method_name("identity", **VARIANT),
    "difference of two means": "mover-" + method_name("log", **VARIANT),
    "proportion (top-k agreement)": method_name("logit", **VARIANT),
    "ratio of two means": method_name("log", **VARIANT),
    "per-domain mean KLD": UNION,  # fideval/stats/domains.py; none below DOMAIN_FEWEST windows
}
BESIDE = {
    "cluster_bca": "cluster-bca: the seed's interval, BCa over the same window resamples (undercovers with few "
                   "heavy-tailed windows: docs/formats-report.md)",
    "wilson": "wilson: top-1 with tokens as independent trials (n = rows); far too narrow on clustered rows",
    "wilson_deff": "wilson-design-effect: Wilson at n_eff = rows / Deff",
}


def _bca_block(b: dict[str, Any], strata: int, seed: int, confidence: float) -> dict[str, Any]:
    return {"estimate": b["estimate"], "ci": b["ci"], "method": b["method"], "unit": "window", "z0": b["z0"],
            "acceleration": b["acceleration"], "se": b["se"], "flags": b["flags"], "confidence": confidence,
            "resamples": b["resamples"], "seed": seed, "strata": strata, "clusters": b["clusters"]}


def mean_intervals(
    s: np.ndarray,
    n: np.ndarray,
    counts: np.ndarray,
    strata: np.ndarray | None,
    scales: list[str],
    *,
    confidence: float,
    seed: int,
) -> list[dict[str, Any] | None]:
    """Per column of ``s``/``n`` ([G, F] per-window sums and rows): the MEAN block of docs/formats-report.md."""
    bt = cluster_t_means(s, n, counts, strata, scales, confidence, **VARIANT)
    bca = cluster_bca_means(s, n, counts, confidence)
    out: list[dict[str, Any] | None] = []
    s, n = np.asarray(s).reshape(len(s), -1), np.asarray(n).reshape(len(n), -1)  # [G, F] (a 1-D column: F = 1)
    for j, (t, b) in enumerate(zip(bt, bca)):
        if t is None:
            out.append(None)
            continue
        fig = {"estimate": t["estimate"], "ci": t["ci"], "method": t["method"], "unit": "window",
               "scale": t.get("scale"), "se": t["se"], "flags": t["flags"], "confidence": confidence,
               "resamples": t["resamples"], "seed": seed, "strata": t["strata"], "clusters": t["clusters"],
               "rows": t["rows"]}
        if scales[j] == "log":  # a non-negative mean (KLD): how much of it a few windows carry
            fig["concentration"] = _concentration(s[:, j], n[:, j], fig)
        fig["cluster_bca"] = _bca_block(b, t["strata"], seed, confidence)
        out.append(fig)
    return out


def _concentration(s: np.ndarray, n: np.ndarray, fig: dict[str, Any]) -> dict[str, Any] | None:
    """``concentration`` of a log-scale mean (fideval/stats/concentration.py) with the threshold it is flagged at;
    the figure's ``flags`` gain ``concentrated`` at or above it (not on a degenerate interval: it claims nothing)."""
    c = concentration(s, n)
    if c is None:
        return None
    c["flag_below"] = EFFECTIVE_SHARE_FLAG
    if concentrated(c) and fig["method"] != "degenerate":
        fig["flags"].append("concentrated")
    return c


def agreement_block(y: np.ndarray, n: np.ndarray, mean: dict[str, Any], confidence: float) -> dict[str, Any]:
    """AGREEMENT: the default (``mean``, from :func:`mean_intervals` on the agreement column), Wilson beside."""
    w = wilson_figure(y, n, confidence)
    rows = int(round(float(np.sum(n))))
    wil = {**w["wilson"], "unit": "token", "confidence": confidence, "resamples": None, "seed": None,
           "strata": None, "clusters": None, "rows": rows}
    deff = w["wilson_deff"]
    if deff is not None:
        deff = {**deff, "unit": "window", "confidence": confidence, "resamples": None, "seed": None, "strata": 1}
    out = {k: v for k, v in mean.items() if k != "cluster_bca"}
    return out | {"wilson": wil, "wilson_deff": deff, "cluster_bca": mean["cluster_bca"]}


def _describe(scale: str) -> str:
    g = {"identity": "theta", "log": "log(theta)", "logit": "logit(theta)"}[scale]
    words = (f"bootstrap-t of {g} over window resamples within domain: t* = (g(theta*) - g(theta)) / (g'(theta*) se*), "
             "se* each resample's stratified linearised (ratio-estimator) standard error")
    if VARIANT["symmetric"]:
        words += "; symmetric: g(theta) -+ q g'(theta) se, q the level's quantile of |t*|"
    else:
        words += "; equal-tailed: the level's two t* quantiles"
    if VARIANT["expand"]:
        words += ("; level expanded for few windows: its normal quantile is sqrt(G / (G - H)) times Student's "
                  "t_(G-H) quantile of the stated level (G windows, H domains)")
    return words + ("" if scale == "identity" else "; back-transformed")


METHODS = {
    **{method_name(sc, **VARIANT): _describe(sc) for sc in ("identity", "log", "logit")},
    "mover-" + method_name("log", **VARIANT): "MOVER (Zou & Donner 2008) for a difference m1 - m2: "
    "d -+ sqrt((m1 - l1)^2 + (u2 - m2)^2 - 2 rho ...) from each mean's own "
    + method_name("log", **VARIANT) + " interval and the correlation rho of the resampled means",
    UNION: f"per-domain mean KLD: the union (lower of the lower bounds, higher of the upper) of the domain's own "
           f"{method_name('log', **VARIANT)} interval (``bootstrap_t``) and {POOLED_METHOD} (``pooled_t``); no interval "
           f"below {DOMAIN_FEWEST} windows (flag too_few_windows)",
    POOLED_METHOD: POOLED_DESCRIPTION,
    "degenerate": "no spread to resample (fewer than two windows, zero variance, or the estimate on the "
                  "scale's boundary): the interval is the estimate",
}


def settings() -> dict[str, Any]:
    """report.json ``settings`` keys of version 2: the stratum column, the defaults and what is beside them."""
    return {
        "strata": "domain",
        "intervals": {
            "default": DEFAULTS,
            "beside": BESIDE,
            "coverage": "docs/formats-report.md, 'Measured coverage' (bench/coverage.py)",
        },
    }
