"""Wilson score intervals for top-1 agreement: plain, and with a cluster design effect.

Why Wilson: agreement is a proportion near 1 (0.9+ for good builds), where the Wald interval overshoots
1 and undercovers; Wilson's score interval stays inside [0, 1] and keeps near-nominal coverage. The
formula is Newcombe (1998) as in ``scipy.stats.binomtest(...).proportion_ci(method='wilson')``:

    centre = (2 n p + z^2) / (2 (n + z^2)),   half-width = z / (2 (n + z^2)) * sqrt(4 n p q + z^2)

with the endpoint clamped to 0 (1) exactly when k = 0 (k = n).

Why a design effect: tokens of a window agree or disagree together (a hard window has many misses), so
the binomial variance p q / N understates the real one. With y_w agreeing rows out of N_w in window w,
G windows and p = sum y / sum N, the linearised (ratio-estimator) cluster variance is

    V_clu = G / (G - 1) * sum_w (y_w - p N_w)^2 / (sum_w N_w)^2,

the design effect Deff = V_clu / (p q / N), and the design-effect Wilson interval is the Wilson formula
at the effective sample size n_eff = N / Deff (with p unchanged; n_eff need not be an integer).
Deff is reported as measured (it may fall below 1 when windows are more alike than chance).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import ndtri


def wilson_interval(k: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Wilson score interval for k successes out of n (k, n may be non-integer)."""
    if n <= 0:
        raise ValueError("Wilson interval needs n > 0")
    p = k / n
    q = 1.0 - p
    z = float(ndtri(0.5 + 0.5 * confidence))
    denom = 2.0 * (n + z**2)
    center = (2.0 * n * p + z**2) / denom
    delta = z / denom * math.sqrt(max(4.0 * n * p * q + z**2, 0.0))
    lo = 0.0 if k == 0 else center - delta
    hi = 1.0 if k == n else center + delta
    return float(lo), float(hi)


def design_effect(y: np.ndarray, n: np.ndarray) -> float | None:
    """Cluster design effect of the proportion sum(y)/sum(n) (see module docstring); None if undefined."""
    y = np.asarray(y, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    keep = n > 0
    y, n = y[keep], n[keep]
    g = y.size
    total = float(n.sum())
    if g < 2 or total <= 0:
        return None
    p = float(y.sum()) / total
    v_bin = p * (1.0 - p) / total
    if v_bin <= 0.0:
        return None
    v_clu = g / (g - 1.0) * float(np.sum((y - p * n) ** 2)) / total**2
    return v_clu / v_bin


def wilson_figure(y: np.ndarray, n: np.ndarray, confidence: float = 0.95) -> dict[str, Any]:
    """Plain and design-effect Wilson intervals of sum(y)/sum(n) from per-window counts."""
    y = np.asarray(y, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    k, total = float(y.sum()), float(n.sum())
    lo, hi = wilson_interval(k, total, confidence)
    deff = design_effect(y, n)
    out: dict[str, Any] = {
        "estimate": k / total,
        "wilson": {"ci": [lo, hi], "method": "wilson", "rows": int(round(total))},
        "wilson_deff": None,
    }
    if deff is not None and deff > 0:
        n_eff = total / deff
        dlo, dhi = wilson_interval(k / total * n_eff, n_eff, confidence)
        out["wilson_deff"] = {
            "ci": [dlo, dhi],
            "method": "wilson-design-effect",
            "deff": deff,
            "n_eff": n_eff,
            "clusters": int(np.count_nonzero(n > 0)),
        }
    return out
