"""How concentrated a non-negative mean is on a few windows: the diagnostic stored beside each mean KLD interval.

For a token-weighted mean theta = sum_w S_w / sum_w N_w over the G windows with rows (S_w >= 0 a window's
KLD sum), the diagnostic is

- ``top_share``: the share of sum_w S_w carried by the k = ceil(G / 100) windows with the largest S_w (the
  top 1 % of windows, at least one);
- ``top_windows``: that k;
- ``effective_windows``: (sum_w S_w)^2 / sum_w S_w^2, the number of equal windows that would carry the
  same sum of squares (G when every window carries the same, 1 when one window carries all);
- ``effective_share``: effective_windows / G, and ``windows``: G.

When a few windows carry much of the total, the window bootstrap cannot see how often such windows occur:
bench/coverage_thin.py measures the default interval at 0.87-0.94 (64-512 windows) on shapes whose top 1 % of
windows hold 15-30 % of the total (0.48-0.99 where those windows are a rare burst), nearly every miss on the
high side, and no variant it tried (equal-tailed identity bootstrap-t, Hall's skewness-corrected interval, the
bootstrap-t of Hall's transformed statistic) reaches 0.93 on all of them. The flag ``concentrated`` marks a
figure whose effective share is below :data:`EFFECTIVE_SHARE_FLAG` (calibrated there: docs/formats-report.md,
"Thin evidence": it fires on 0-17 % of the replications of the shapes where the default covers and on 64-100 %
of those of the log-normal concentrated shapes, 41-75 % of the burst's); the card says the interval may
undercover. The top share is stored beside it, not flagged on: it separates the shapes less well (a single
window at G < 100 carries a noisy share).

The flag is a warning about the shape of the windows, not about this sample's interval: on the concentrated
shapes the samples that miss are those that drew too few of the heavy windows, which then look less concentrated
(there the default covers 0.89-1.00 of the flagged replications, and 0.12-0.82 of the unflagged ones at 64-256
windows wherever those are at least a tenth). A sample cannot show what it did not draw: where the heavy windows
are rarer than one in G (``conc-burst`` at 64 windows), most samples hold none of them, look spread, and are not
flagged, and the interval misses above. The lower bound holds on every shape measured (one-sided coverage at its
97.5 %: >= 0.995 on the concentrated shapes, >= 0.983 on the others).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TOP_FRACTION = 0.01  # the top 1 % of windows (at least one)
EFFECTIVE_SHARE_FLAG = 0.25  # flag ``concentrated`` below this effective share (bench/coverage_thin.py)
DOMAIN_MIN_WINDOWS = 64  # a per-domain mean on fewer windows: ``few_windows`` (docs/formats-report.md, "Thin evidence")
# the measured coverage the card quotes with each flag (docs/formats-report.md, "Thin evidence")
CONCENTRATED_COVERAGE = "0.87-0.94 (as low as 0.48 where the heavy windows are a rare burst)"
# a report before 2026-12-07 printed a per-domain mean's own bootstrap-t; the card's sentence for such a report quotes
# what that covers (a later report prints the domain-pooled union of fideval/stats/domains.py)
DOMAIN_COVERAGE = "0.91-0.93 with 24-32 windows of one domain"
DOMAIN_MEASURED_FROM = 8  # the fewest windows of one domain whose coverage was measured (the fourth run)


def concentration(s: np.ndarray, n: np.ndarray | None = None) -> dict[str, Any] | None:
    """The diagnostic of one figure from its per-window sums ``s`` (windows with rows: ``n > 0``; all when
    ``n`` is None). None when there is nothing to share (no window, or a sum that is not positive)."""
    s = np.asarray(s, dtype=np.float64)
    if n is not None:
        s = s[np.asarray(n) > 0]
    g = int(s.size)
    total = float(s.sum())
    if g == 0 or not total > 0 or not np.all(s >= 0):
        return None
    k = max(1, math.ceil(TOP_FRACTION * g))
    top = float(np.sort(s)[g - k:].sum())
    eff = total**2 / float(np.sum(s * s))
    return {"top_share": top / total, "top_windows": k, "effective_windows": eff, "effective_share": eff / g,
            "windows": g}


def concentrated(c: dict[str, Any] | None) -> bool:
    """Whether a diagnostic of :func:`concentration` raises the ``concentrated`` flag."""
    return c is not None and c["effective_share"] < EFFECTIVE_SHARE_FLAG
