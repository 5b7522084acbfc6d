"""``fideval check``'s verdict: failed checks, checks that did not run, and the fidelity gates.

A check that did not run vouches for nothing, so it fails the verdict unless the caller names it (or
``all``) as allowed: a CI gate must not print ``ok`` over a report whose self-check, canary or windows
match were never looked at. Gates come in two kinds: on the point estimate (``--max-mean-kld``,
``--min-top1``) and on the interval the card prints (``--max-mean-kld-upper``: the upper bound of the mean
KLD's interval, cluster BCa in a version 1 report; ``--min-top1-lower``: the lower bound of top-1 agreement's,
Wilson), which is the claim a published card makes: with 95 % confidence the build is at least this close.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fideval.errors import FidevalError
from fideval.report.checks import gate_failures

ALL = "all"


@dataclass(frozen=True)
class Bounds:
    max_mean_kld_upper: float | None = None
    min_top1_lower: float | None = None


def not_run_failures(report: dict[str, Any], allowed: list[str]) -> list[str]:
    """One line per check with status ``not_run`` that ``allowed`` does not name; unknown names are an error."""
    names = [c["name"] for c in report["checks"]]
    unknown = sorted(set(allowed) - set(names) - {ALL})
    if unknown:
        raise FidevalError(f"--allow-not-run {unknown[0]!r} is not a check of this report",
                           hint=f"one of: {', '.join(names)}, or {ALL}")
    if ALL in allowed:
        return []
    return [
        f"check {c['name']} not run: {c['detail']} (give its input to 'fideval report', or --allow-not-run {c['name']})"
        for c in report["checks"]
        if c["status"] == "not_run" and c["name"] not in allowed
    ]


def _b(x: float | None) -> str:
    return "unbounded" if x is None else f"{x:.6g}"


def bound_failures(report: dict[str, Any], bounds: Bounds) -> list[str]:
    """One line per results set whose interval bound crosses a bound gate."""
    lines = []
    for r in report["results"]:
        who = f"{r['candidate']}/{r['path']}/{r['length']}"
        m = r["overall"]["mean_kld"]
        # an unbounded side (null: too few windows for the interval) cannot pass a gate on that bound
        if bounds.max_mean_kld_upper is not None and (m["ci"][1] is None or m["ci"][1] > bounds.max_mean_kld_upper):
            lines.append(f"gate mean_kld_upper_max failed: {who} mean KLD {100 * m['confidence']:g} % upper bound "
                         f"{_b(m['ci'][1])} > {bounds.max_mean_kld_upper:g} (estimate {m['estimate']:.6g})")
        t = r["overall"]["top1"]
        w = t if "ci" in t else t["wilson"]  # the interval the card prints: the report's default, else Wilson
        if bounds.min_top1_lower is not None and (w["ci"][0] is None or w["ci"][0] < bounds.min_top1_lower):
            lines.append(f"gate top1_lower_min failed: {who} top-1 agreement {100 * w['confidence']:g} % lower bound "
                         f"{_b(w['ci'][0])} < {bounds.min_top1_lower:g} (estimate {r['overall']['top1']['estimate']:.6g})")
    return lines


def failures(report: dict[str, Any], *, max_mean_kld: float | None, min_top1: float | None, bounds: Bounds,
             allow_not_run: list[str]) -> list[str]:
    """Every reason the report fails, one line each: failed and not-run checks, point gates, bound gates."""
    lines = gate_failures(report, max_mean_kld, min_top1)
    n_checks = sum(line.startswith("check ") for line in lines)
    return lines[:n_checks] + not_run_failures(report, allow_not_run) + lines[n_checks:] + bound_failures(report, bounds)
