"""Small designs: too few windows for the report's intervals to say much, noted before the run (not refused: a
small run is a fine smoke test; its intervals are what docs/formats-report.md's measured coverage tables say).

Two thresholds, from those tables:

* fewer than :data:`DOMAIN_WINDOWS` windows per domain: a per-domain figure resamples its domain's windows alone,
  and 8 is the fewest measured ("Per-domain figures: few windows in one stratum": at 8 windows the default
  interval is 3.7-3.9 times the truth wide, at 16 about 1.5 times; fewer were not measured, and one window gives
  no interval at all: ``degenerate``);
* fewer than :data:`RUN_WINDOWS` windows in the run (the report's ``TAIL_WINDOWS``, 25): every quantile
  interval is ``[lower, null]``, no upper bound (``few_tail_windows``: the rows beyond a quantile come from at most
  as many effective windows as the run has), and the means' intervals are below the 32 windows of the smallest
  measured cell ("Measured coverage").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fideval.stats.quantiles import TAIL_WINDOWS
from fideval.validate.findings import Findings

if TYPE_CHECKING:
    from fideval.config import Config

DOMAIN_WINDOWS = 8  # the fewest windows per domain of docs/formats-report.md's per-domain coverage table
RUN_WINDOWS = int(TAIL_WINDOWS)  # 25: below it, no quantile interval of the run has an upper bound


def check(cfg: Config, found: Findings) -> None:
    per = cfg.windows.windows_per_domain
    total = per * len(cfg.domains)
    if per < DOMAIN_WINDOWS:
        found.notes.append(
            f"windows.windows_per_domain {per} is fewer than {DOMAIN_WINDOWS}: each domain's intervals will be wide or "
            f"unbounded (at {DOMAIN_WINDOWS} windows, the fewest measured, the default interval is 3.7-3.9 times the truth "
            "wide; fewer were not measured, and 1 window gives none) (docs/formats-report.md, 'Per-domain figures'; "
            "16 windows per domain bring it to about 1.5 times)")
    if total < RUN_WINDOWS:
        found.notes.append(
            f"the run has {total} windows ({len(cfg.domains)} domains x {per}), fewer than {RUN_WINDOWS}: every quantile "
            f"interval will have no upper bound (few_tail_windows: a tail from fewer than {RUN_WINDOWS} effective "
            "windows), and the means' intervals are below the 32 windows their coverage was measured at "
            "(docs/formats-report.md, 'Measured coverage'; 64 windows hold the 93 % floor)")
