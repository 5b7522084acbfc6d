"""Per-domain mean KLD: its own bootstrap-t joined with a log-scale t-interval whose spread is pooled over domains.

A per-domain figure rests on one domain's windows, about a dozen at the seed's scale (128 windows over 11
domains); a bootstrap of a dozen heavy-tailed windows cannot see its own spread well. This interval borrows
strength across domains, and says so (``method: "pooled-t-log"``). The model: each domain d has its own mean
theta_d (the domain effect, on the log scale), and the windows' residuals relative to their domain's mean
have a common spread. For the ratio estimator theta_d = sum_w S_w / sum_w N_w over the G_d windows of d with
rows, with e_w = S_w - theta_d N_w and Nbar_d = N_d / G_d,

    u_w = e_w / (theta_d Nbar_d)                            (a window's relative residual; sum_w e_w = 0)
    s_d^2 = sum_{w in d} u_w^2 / (G_d - 1)                  (so s_d^2 / G_d is the domain's own linearised
                                                             variance of log theta_d: V_d / theta_d^2)
    s^2 = sum_d sum_{w in d} u_w^2 / sum_d (G_d - 1)        (pooled over domains with >= 2 windows and a
                                                             positive mean; df = sum_d (G_d - 1) = G - H)
    se_d = sqrt(max(s^2, s_d^2) / G_d)                      (the larger of the pooled and the domain's own)
    ci_d = theta_d exp(-+ t_(df, (1 + level) / 2) se_d)

Taking the larger of the pooled and the domain's own spread keeps a domain more spread than the rest from
hiding behind the pool (bench/coverage_domains.py measures both; ``larger_of_own=False`` gives the pooled one
alone). Alone it does not hold with few heavy-tailed windows (0.85-0.93 at 8-16 windows a domain: the mean of
a dozen skewed windows is skewed, which no variance fixes), nor does the domain's own bootstrap-t everywhere
(0.92-0.93 at 24-128 windows a domain; below it holds by being very wide). The report prints their union
(``UNION``: the lower of the two lower bounds, the higher of the two upper bounds), which covers 0.949-0.976
on every non-concentrated shape measured at 8-128 windows a domain (0.88-0.94 on the one domain of
``dom-heavy-mixed`` whose windows are far more spread than the other domains'). It is printed for every
per-domain mean with at least :data:`MIN_WINDOWS` windows: the domain's own bootstrap-t stays short of the
floor at 64 windows a domain too (0.927 on ``dom-heavy-high``; 0.920 at 128-256 in bench/coverage_thin.py),
where the union covers 0.954. Below :data:`MIN_WINDOWS` no interval is printed (``ci: [null, null]``, flag
``too_few_windows``): what was measured there holds only with intervals 19-74 times the truth wide
(docs/formats-report.md, "Thin evidence").
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from fideval.stats.concentration import DOMAIN_MIN_WINDOWS

METHOD = "pooled-t-log"
UNION = "union-bootstrap-t-pooled-t-log"  # the printed interval of a per-domain mean KLD (from MIN_WINDOWS)
MIN_WINDOWS = 8  # fewer windows in a domain: no interval (bench/coverage_domains.py)
# the measured coverage the card quotes (docs/formats-report.md, "Thin evidence": bench/coverage_domains.py)
UNION_COVERAGE = ("0.949-0.976 with 8-128 windows a domain (0.88-0.94 for a domain whose windows are far more "
                  "spread than the other domains')")
DESCRIPTION = ("t-interval of log(theta_d) with the windows' relative spread pooled over domains (a domain effect "
               "on the log scale, a common relative spread): theta_d exp(-+ t_(G-H) se_d), se_d^2 = max(s^2, s_d^2) "
               "/ G_d, s^2 the pooled and s_d^2 the domain's own variance of e_w / (theta_d Nbar_d); "
               "fideval/stats/domains.py")


def pooled_domain_intervals(
    s: np.ndarray, n: np.ndarray, confidence: float = 0.95, *, larger_of_own: bool = True
) -> list[dict[str, Any] | None]:
    """Per column of ``s``/``n`` ([G, H]: each domain's per-window KLD sums and rows, zero outside it): the
    pooled-t interval of its mean (module docstring), or None for a column without rows.

    Each entry: ``estimate``, ``ci``, ``se`` (theta_d se_d, the delta-method se of theta_d), ``own_se``,
    ``pooled_se``, ``df``, ``pooled_domains``, ``clusters`` (G_d). A column with one window or a zero mean
    gets ``ci = [estimate, estimate]`` and the flag ``degenerate`` (it neither enters nor draws on the pool)."""
    s = np.asarray(s, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if s.ndim != 2 or s.shape != n.shape:
        raise ValueError(f"pooled_domain_intervals: s and n must be [windows, domains] of one shape, got {s.shape} and {n.shape}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"pooled_domain_intervals: confidence must lie in (0, 1), got {confidence}")
    if np.any(n < 0) or np.any(s < 0):
        raise ValueError("pooled_domain_intervals: sums and rows must be non-negative (a mean KLD)")
    cols = []
    ss_total, df = 0.0, 0
    for j in range(s.shape[1]):
        m = n[:, j] > 0
        gd = int(m.sum())
        if gd == 0:
            cols.append(None)
            continue
        nd = float(n[m, j].sum())
        theta = float(s[m, j].sum()) / nd
        if gd < 2 or not theta > 0.0:
            cols.append((theta, gd, None))
            continue
        u = (s[m, j] - theta * n[m, j]) / (theta * nd / gd)
        ssq = float(np.sum(u * u))
        ss_total += ssq
        df += gd - 1
        cols.append((theta, gd, ssq / (gd - 1)))
    pooled_var = ss_total / df if df > 0 else None
    q = float(stats.t.ppf(0.5 + confidence / 2.0, df)) if df > 0 else None
    out: list[dict[str, Any] | None] = []
    pooled_domains = sum(1 for c in cols if c is not None and c[2] is not None)
    for c in cols:
        if c is None:
            out.append(None)
            continue
        theta, gd, own_var = c
        base = {"estimate": theta, "clusters": gd, "df": df, "pooled_domains": pooled_domains}
        if own_var is None or pooled_var is None or not (pooled_var > 0 or own_var > 0):
            out.append(base | {"ci": [theta, theta], "se": None, "own_se": None, "pooled_se": None,
                               "flags": ["degenerate"]})
            continue
        var = max(pooled_var, own_var) if larger_of_own else pooled_var
        se_log = float(np.sqrt(var / gd))
        out.append(base | {"ci": [theta * float(np.exp(-q * se_log)), theta * float(np.exp(q * se_log))],
                           "se": theta * se_log, "own_se": theta * float(np.sqrt(own_var / gd)),
                           "pooled_se": theta * float(np.sqrt(pooled_var / gd)), "flags": []})
    return out


def domain_mean(fig: dict[str, Any] | None, pooled: dict[str, Any] | None) -> dict[str, Any] | None:
    """A per-domain MEAN block as report.json prints it (a degenerate one unchanged): the flag ``few_windows``
    under ``DOMAIN_MIN_WINDOWS`` windows; from ``MIN_WINDOWS`` the union of its own interval and the pooled one
    (``ci``, ``method``; the two kept as ``bootstrap_t`` and ``pooled_t``), below ``MIN_WINDOWS`` no interval
    (``ci: [null, null]``, flag ``too_few_windows``; the domain's own interval kept in ``bootstrap_t``)."""
    if fig is None or fig.get("method") == "degenerate":
        return fig
    if fig["clusters"] < DOMAIN_MIN_WINDOWS:
        fig["flags"].append("few_windows")
    how = {k: fig.get(k) for k in ("unit", "confidence", "resamples", "seed", "strata", "clusters")}
    own = {"ci": fig["ci"], "method": fig["method"]} | how
    fig["bootstrap_t"] = own
    if fig["clusters"] < MIN_WINDOWS:
        fig["flags"].append("too_few_windows")
        fig["ci"] = [None, None]
        fig["pooled_t"] = None
        return fig
    if pooled is None or "degenerate" in pooled["flags"]:  # no pool to draw on: the domain's own interval stands
        fig["pooled_t"] = None
        return fig
    fig["pooled_t"] = {k: pooled[k] for k in ("ci", "se", "own_se", "pooled_se", "df", "pooled_domains")} | {
        "method": METHOD, "unit": "window", "confidence": fig.get("confidence"), "resamples": None, "seed": None,
        "strata": pooled["pooled_domains"], "clusters": pooled["clusters"]}  # closed form: no resamples
    lo, hi = own["ci"]
    plo, phi = pooled["ci"]
    fig["ci"] = [None if lo is None else min(lo, plo), None if hi is None else max(hi, phi)]
    fig["method"] = UNION
    return fig
