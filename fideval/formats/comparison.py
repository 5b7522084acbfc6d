"""``comparison.json`` (format ``fideval.comparison`` v2, v1 still read): many builds on the same windows, compared at
once. v2 added the resampling unit (``settings.unit``, ``settings.units``: windows, or documents where windows share
them) and the simultaneous top-1 differences (``pairs[].top1_difference``, ``families.top1_difference``); a v1 file
reads as unit ``window`` without them.

Written by ``fideval compare`` (``fideval.report.compare``): each build's size and figures, every pairwise
ratio and difference of mean KLD with simultaneous (family-wise) intervals, the size/KLD frontier with the
bootstrap probability that each build is dominated, and the groups of builds the data cannot separate.
Statistics in ``fideval/stats/simultaneous.py``; docs/formats-comparison.md has these tables and the measured
coverage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fideval.formats.model import Model, key

FILE = "comparison.json"
_HINT = "regenerate it with 'fideval compare' of this version"


@dataclass(frozen=True, kw_only=True)
class Interval(Model):
    HINT = _HINT

    estimate: float | None = key("the figure (null where undefined)")
    ci: list[float | None] = key("`[lower, upper]` at the stated level (the estimate twice where degenerate)")
    se: float | None = key("linearised standard error on the interval's scale (log for a ratio or a mean KLD)")
    method: str = key("how the interval was made (`settings.methods` describes each)")


@dataclass(frozen=True, kw_only=True)
class Build(Model):
    HINT = _HINT

    name: str = key("the candidate's name")
    report: str = key("the report.json it came from")
    size: float = key("bits per weight (or bytes, `size_unit`)")
    size_unit: str = key("`bits_per_weight` or `bytes`")
    size_source: str = key("where the size came from: `quant spec` (the emulated build's bits), `file bytes` "
                           "(a real build: 8 x bytes / the reference's parameters), `--size`")
    rows: int = key("records rows")
    clusters: int = key("windows with rows")
    mean_kld: Interval = key("mean KLD with its marginal default interval (the report's)")
    mean_kld_simultaneous: Interval = key("mean KLD with the interval that holds for all builds together (max-t)")
    top1: Interval | None = key("top-1 agreement with its marginal default interval")
    on_frontier: bool = key("no other build is no larger and has no higher mean KLD (one of them strictly)")
    p_dominated: float = key("fraction of window resamples in which some build dominates this one")
    dominated_by: list[str] = key("builds that dominate it at the estimates")
    certainly_dominated_by: list[str] = key("builds no larger whose simultaneous ratio interval puts their mean "
                                            "KLD below this one's")


@dataclass(frozen=True, kw_only=True)
class Pair(Model):
    HINT = _HINT

    a: str = key("first build")
    b: str = key("second build")
    ratio: Interval = key("mean KLD of a / mean KLD of b, simultaneous interval")
    difference: Interval = key("mean KLD of a - mean KLD of b, simultaneous interval")
    separated: bool = key("the simultaneous ratio interval excludes 1")
    top1_difference: Interval | None = key("top-1 agreement of a - of b, simultaneous interval over every pair's "
                                           "top-1 difference (its own family; null: top-1 not recorded)",
                                           default=None, since=2)
    top1_separated: bool | None = key("the simultaneous top-1 difference interval excludes 0", default=None, since=2)


@dataclass(frozen=True, kw_only=True)
class Family(Model):
    HINT = _HINT

    members: int = key("intervals in the family")
    level: float = key("the level the max-|t| quantile is taken at (the stated one, expanded for few windows)")
    quantile: float | None = key("that quantile of max |t*| over the family (null: every member degenerate)")
    resamples_used: int = key("resamples with every member's t* finite")
    bonferroni_quantile: float | None = key("the Bonferroni quantile on the same t* (each |t*| at level "
                                            "1 - (1 - level) / members; the largest member's), for comparison: "
                                            "never below `quantile`; null for `mean`")


@dataclass(frozen=True, kw_only=True)
class Settings(Model):
    HINT = _HINT

    figure: str = key("`mean_kld`")
    path: str = key("the path every build was scored on")
    length: int = key("the sequence length")
    confidence: float = key("the stated family-wise level, e.g. 0.95")
    resamples: int = key("B, window resamples shared by every build")
    seed: int = key("seed of the one resample matrix")
    clusters: int = key("G, windows")
    unit: str | None = key("what was resampled: `window`, or `document` (windows sharing a document drawn "
                           "together); absent in a v1 file: `window`", default=None, since=2)
    units: int | None = key("how many units were resampled: G windows, or the documents (connected groups of "
                            "windows sharing one) they came from; the intervals' degrees of freedom count these",
                            default=None, since=2)
    domains: list[str] = key("domains (strata of the resampling)")
    windows_verified: bool = key("every report recorded the same token SHA-256 for every window (false: "
                                 "windows matched by id and domain only, their tokens not recorded)")
    methods: dict[str, str] = key("each interval method's description")


@dataclass(frozen=True, kw_only=True)
class Comparison(Model):
    FORMAT = "fideval.comparison"
    VERSION = 2  # v2: settings.unit/units, pairs[].top1_difference/top1_separated, families.top1_difference
    READABLE = (1, 2)
    KIND = "comparison format"
    HINT = _HINT

    format: str = key("`fideval.comparison`", default=FORMAT)
    version: int = key("`2` (`1` is still read)", default=VERSION)
    settings: Settings = key("what was compared and how")
    reports: list[dict[str, Any]] = key("each input report: `file`, `sha256`")
    teacher: list[dict[str, Any]] = key("the teacher stores every build was scored against (the reports' "
                                        "`provenance.teacher_stores` at this length)")
    builds: list[Build] = key("one per build, sorted by size then name")
    pairs: list[Pair] = key("every pair of builds (a before b in `builds` order)")
    families: dict[str, Family] = key("`ratio`, `difference`, `mean`, `top1_difference` (v2, where top-1 was "
                                      "recorded): each family's max-t quantile")
    frontier: list[str] = key("the builds on the frontier, by size")
    groups: list[list[str]] = key("maximal runs of builds (by mean KLD) no two of which are separated")
    plot: str | None = key("the PNG beside comparison.json, or null")

    def problem(self) -> str | None:
        if self.settings.unit not in (None, "window", "document"):
            return f"settings.unit {self.settings.unit!r} is not window or document"
        names = [b.name for b in self.builds]
        if len(set(names)) != len(names):
            return "builds: a name is given twice"
        for p in self.pairs:
            if p.a not in names or p.b not in names:
                return f"pairs: {p.a}/{p.b} names a build that is not in builds"
        return None
