"""The card's interval labels, the intervals printed beside the default, the comparison sentences, and why an
interval has no bound.

A version 1 report's intervals are the cluster BCa (means) and the iid Wilson (top-1); a version 2 report's
default is the cluster bootstrap-t (``fideval/stats/intervals.py``), with the BCa and both Wilson intervals
beside it. The labels come from the report, so a card never calls one interval by another's name; for a
version 1 report every field here renders exactly the text cards had before.

An interval the report could not bound (a null end in report.json), that collapsed to its estimate, or that a
flag says may cover less than its stated level (:func:`thin`) is never printed without a word: :func:`reason`
says why from the figure's own fields (``flags``, ``clusters``, ``strata``, ``se``, ``tail_windows``;
docs/formats-report.md, "Guards"), and the printed cell (:class:`Cell`) carries a note mark whose text the card
lists after its tables (:class:`Notes`). Marks are numbered as the card prints the cells, so a template that
leaves a table out gets no note for it: a cell registers its note when it is
rendered, and the notes are listed where the template asks for them (after the tables).
"""

from __future__ import annotations

from typing import Any

from fideval.stats.concentration import (
    CONCENTRATED_COVERAGE,
    DOMAIN_COVERAGE,
    DOMAIN_MEASURED_FROM,
    DOMAIN_MIN_WINDOWS,
    EFFECTIVE_SHARE_FLAG,
)
from fideval.stats.domains import MIN_WINDOWS, UNION_COVERAGE

LABELS = {
    "cluster-bca": "BCa",
    "cluster-percentile": "percentile",
    "cluster-percentile-expanded": "percentile",
    "cluster-bootstrap-t": "bootstrap-t",
    "cluster-bootstrap-t-log": "bootstrap-t",
    "cluster-bootstrap-t-logit": "bootstrap-t",
    "wilson": "Wilson",
    "union-bootstrap-t-pooled-t-log": "bootstrap-t joined with a domain-pooled t",  # per-domain mean KLD
}


SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


class Notes:
    """The reasons of the card's unbounded or collapsed intervals, numbered in the order their cells are printed."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def mark(self, why: str) -> str:
        if why not in self.reasons:
            self.reasons.append(why)
        return str(self.reasons.index(why) + 1).translate(SUPERSCRIPT)

    def __len__(self) -> int:
        return len(self.reasons)

    @property
    def undercover(self) -> bool:
        """Whether a note says an interval may cover less than its level (:func:`thin`): the card's heading says so."""
        return any(r.startswith("may undercover") for r in self.reasons)

    def __iter__(self):
        return iter([{"mark": str(k + 1).translate(SUPERSCRIPT), "reason": r} for k, r in enumerate(self.reasons)])


class Cell(str):
    """A printed interval. Its value is the interval as before (what a template compares or measures); printed,
    it adds the mark of its note when the interval has no bound or collapsed (:func:`reason`)."""

    def __new__(cls, text: str, why: str | None = None, notes: Notes | None = None, at: int | None = None) -> "Cell":
        self = super().__new__(cls, text)
        self.why, self.notes, self.at = why, notes, len(text) if at is None else at  # ``at``: where the mark goes
        return self

    def __str__(self) -> str:
        text = str.__str__(self)
        if self.why is None or self.notes is None:
            return text
        return text[: self.at] + self.notes.mark(self.why) + text[self.at:]


def _windows(fig: dict[str, Any]) -> str:
    g, h = fig.get("clusters"), fig.get("strata")
    if g is None:
        return "these windows"
    return f"{g} window{'s' if g != 1 else ''}" + (f" in {h} domain{'s' if h != 1 else ''}" if isinstance(h, int) and h > 1 else "")


def reason(fig: dict[str, Any] | None, kind: str = "kld") -> str | None:
    """Why the card prints ``fig``'s interval without a bound (a null end in report.json) or collapsed to its
    estimate, in words, from the figure's own fields; None for an ordinary interval. ``kind``: ``kld`` (a mean
    KLD, log scale), ``agreement`` (top-1, logit scale), ``ratio`` or ``difference`` (paired comparisons)."""
    if fig is None:
        return None
    flags = set(fig.get("flags") or [])
    est, ci = fig.get("estimate"), fig.get("ci")
    if "no_rows" in flags:
        return "no rows: nothing was scored for this figure (flag `no_rows`)"
    if est is None or "undefined" in flags:
        return ("undefined: the estimate is not a finite number (a ratio over a build whose mean KLD is 0, or no rows "
                "on one side), so there is no interval (flag `undefined`)")
    if ci is None:
        return "no interval: report.json gives the estimate alone"
    lo, hi = ci
    if lo is None or hi is None:
        side = "upper" if lo is not None else "lower" if hi is not None else "finite"
        if "few_tail_windows" in flags:
            tw = fig.get("tail_windows")
            n = f"{tw:.1f} effective windows" if isinstance(tw, (int, float)) else "too few windows"
            from fideval.stats.quantiles import TAIL_WINDOWS

            return (f"no upper bound: the rows beyond this quantile come from {n} (fewer than {TAIL_WINDOWS:g}), and "
                    "resampling windows cannot show how far such a tail reaches (flag `few_tail_windows`)")
        if "lower_bound_only" in flags:
            return ("no upper bound: a two-sided interval this far in the tail covered as little as 50-89 % at its "
                    "stated level where few resamples reach the tail, and no rule from the data told those cases apart, "
                    "so only the lower bound, which holds, is given (flag `lower_bound_only`)")
        if "too_few_windows" in flags:
            from fideval.stats.domains import MIN_WINDOWS as fewest

            return (f"no interval: this domain's mean rests on {_windows(fig)}, fewer than {fewest}; no interval "
                    "measured on so few windows of one domain holds its level without bounds many times the estimate "
                    "(flag `too_few_windows`)")
        if "unbounded" in flags:
            return (f"no {side} bound: on {_windows(fig)} the bootstrap-t's quantile, at the level expanded for few "
                    f"windows, is so far out that the interval has no finite {side} end (flag `unbounded`); more "
                    "windows bound it")
        return f"no {side} bound: report.json gives none for this interval"
    if fig.get("method") == "degenerate" or "degenerate" in flags:
        g, se = fig.get("clusters"), fig.get("se")
        if isinstance(g, int) and g < 2:
            return (f"not an interval (the estimate alone): {_windows(fig)} with rows, and resampling needs at least "
                    "two (flag `degenerate`)")
        if kind == "kld" and est <= 0:
            return ("not an interval (the estimate alone): the mean KLD is exactly 0, every row equal to the reference, "
                    "the edge of the log scale the interval is computed on (flag `degenerate`)")
        if kind == "agreement" and not 0.0 < est < 1.0:
            return (f"not an interval (the estimate alone): the agreement is exactly {100 * est:g} %, the edge of the "
                    "logit scale the interval is computed on (flag `degenerate`)")
        if se is None or se == 0:
            return "not an interval (the estimate alone): zero variance, every window gives the same value (flag `degenerate`)"
        if "nonfinite_resamples" in flags:
            return ("not an interval (the estimate alone): fewer than two resamples gave a finite studentized "
                    "statistic (flags `nonfinite_resamples`, `degenerate`)")
        return "not an interval (the estimate alone): nothing varies across the window resamples (flag `degenerate`)"
    if abs(hi - lo) <= 1e-12 * max(abs(hi), abs(lo), 1e-300):
        shown = ", ".join(f"`{f}`" for f in sorted(flags))
        return (f"no width: on {_windows(fig)} every window resample that varies gives the estimate back, so the "
                f"interval collapses to it{f' (flags {shown})' if shown else ''}; more windows widen it")
    return thin(fig)


def thin(fig: dict[str, Any]) -> str | None:
    """Why an ordinary interval may cover less than its stated level, from its flags (docs/formats-report.md,
    "Thin evidence"): ``concentrated`` (a few windows carry much of a mean KLD). None when it is not raised.
    (``few_windows``, a per-domain mean on few windows, is said once under the per-domain table: :func:`few_windows`.)"""
    if "concentrated" not in set(fig.get("flags") or []):
        return None
    return (f"may undercover: a few windows carry much of this mean's KLD, its effective number of windows "
            f"(sum S)^2 / sum S^2 under {100 * EFFECTIVE_SHARE_FLAG:g} % of its windows (flag `concentrated`, "
            f"report.json `concentration`); on windows this concentrated the interval covers {CONCENTRATED_COVERAGE} "
            "at its stated level, its misses above the upper bound: the samples that miss are those that drew too few "
            "of the heavy windows, which the window resamples cannot make up, so read the upper bound as uncertain; "
            "the lower bound holds")


def few_windows(fewest: int, pooled: bool = False) -> str | None:
    """The card's sentence under the per-domain table when a domain's mean rests on fewer than
    ``DOMAIN_MIN_WINDOWS`` windows (flag ``few_windows``); None otherwise. ``pooled``: the report gives such a
    mean the union of its own interval and the domain-pooled one, none below ``domains.MIN_WINDOWS`` (reports
    before it print the domain's own bootstrap-t, and the sentence says what that covers)."""
    if fewest >= DOMAIN_MIN_WINDOWS:
        return None
    if pooled:
        none = (f"; below {MIN_WINDOWS} windows a domain gets no interval (flag `too_few_windows`), as none measured "
                "there holds without absurd widths" if fewest < MIN_WINDOWS else "")
        return (f"Per-domain figures rest on as few as {fewest} windows (flag `few_windows` under "
                f"{DOMAIN_MIN_WINDOWS}): each per-domain mean KLD borrows strength across the domains, its interval "
                "the union of its own bootstrap-t and a t-interval whose relative window spread is pooled over every "
                f"domain (a domain effect on the log scale, a common spread); it covers {UNION_COVERAGE} at its "
                f"stated level{none} (docs/formats-report.md, \"Thin evidence\").")
    unmeasured = f"; fewer than {DOMAIN_MEASURED_FROM} were not measured" if fewest < DOMAIN_MEASURED_FROM else ""
    return (f"Per-domain figures rest on as few as {fewest} windows: a per-domain mean on fewer than "
            f"{DOMAIN_MIN_WINDOWS} windows is flagged `few_windows`, and there its interval covers {DOMAIN_COVERAGE} "
            f"at its stated level{unmeasured} (docs/formats-report.md, \"Thin evidence\"): read them as indicative.")


def deff_reason(top1: dict[str, Any]) -> str:
    """Why a top-1 figure has no design-effect Wilson interval (``wilson_deff: null``)."""
    g, est = top1.get("clusters"), top1.get("estimate")
    if isinstance(g, int) and g < 2:
        return f"no design-effect Wilson interval: {_windows(top1)} with rows, and a design effect needs at least two"
    if est is not None and not 0.0 < est < 1.0:
        return f"no design-effect Wilson interval: the agreement is exactly {100 * est:g} %, so it has no binomial variance"
    return "no design-effect Wilson interval: every window agrees at the same rate (a design effect of 0)"


def _g(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _ci(est: float | None, ci: list[float] | None, digits: int = 4, fig: dict[str, Any] | None = None,
        kind: str = "kld", notes: Notes | None = None) -> str:
    if est is None or ci is None:
        return Cell("—", reason(fig, kind), notes) if fig is not None else "—"
    return Cell(f"{_g(est, digits)} [{_g(ci[0], digits)}, {_g(ci[1], digits)}]", reason(fig, kind), notes)


def _pct(est: float, block: dict[str, Any] | None, notes: Notes | None = None, why: str | None = None) -> str:
    if block is None or block.get("ci") is None:
        return Cell("—", why, notes)
    lo, hi = ("—" if x is None else f"{100 * x:.2f}" for x in block["ci"])
    return Cell(f"{100 * est:.2f} % [{lo}, {hi}]", reason({"estimate": est, **block}, "agreement"), notes)


def label(method: str) -> str:
    """A method's short name in the card: every cluster bootstrap-t variant is 'bootstrap-t'."""
    if method.startswith("mover-cluster-bootstrap-t"):
        return "MOVER bootstrap-t"
    return "bootstrap-t" if method.startswith("cluster-bootstrap-t") else LABELS.get(method, method)


def _label(methods: list[str], fallback: str) -> str:
    named = sorted({label(m) for m in methods if "cluster-bootstrap-t" in m or m in LABELS})
    return " / ".join(named) if named else fallback


def sentence(c: dict[str, Any], pct: str, notes: Notes | None = None) -> str:
    """'lowers the mean KLD 1.33 times [1.21, 1.46] against q8 (serving, 2048 tokens); the interval excludes 1'
    (the interval marked with its note when it has no bound: :func:`reason`)."""
    r, ci = c["estimate"], c["ci"]
    who = f"against {c['denominator']} ({c['path']}, {c['length']} tokens)"
    if r is None or ci is None:
        return Cell(f"mean KLD ratio undefined {who}", reason(c, "ratio"), notes)
    def inv(x: float | None) -> float | None:
        return None if x is None or x <= 0 else 1.0 / x

    if r < 1.0:
        words = f"lowers the mean KLD {_g(1.0 / r, 3)} times [{_g(inv(ci[1]), 3)}, {_g(inv(ci[0]), 3)}]"
    else:
        words = f"raises the mean KLD {_g(r, 3)} times [{_g(ci[0], 3)}, {_g(ci[1], 3)}]"
    verdict = ("the interval excludes 1: a difference these windows resolve" if c.get("excludes")
               else "the interval includes 1: not distinguishable on these windows")
    return Cell(f"{words} {who} ({pct} % {label(c['method'])}); {verdict}", reason(c, "ratio"), notes, at=len(words))


def beside_context(report: dict[str, Any], rows: list[dict[str, Any]], notes: Notes | None = None) -> dict[str, Any]:
    pct = f"{100 * report['settings']['confidence']:g}"
    v2 = int(report["version"]) >= 2
    cand = rows[0]["candidate"] if rows else None
    means = [r["overall"]["mean_kld"]["method"] for r in rows]
    cmps = [c for c in report["comparisons"].get("builds", []) if c["numerator"] == cand]
    out: dict[str, Any] = {
        "mean_label": _label(means, "BCa"),
        "top1_label": _label([r["overall"]["top1"].get("method", "wilson") for r in rows], "Wilson"),
        "cmp_label": _label([c["method"] for c in cmps] + [c["method"] for k in ("paths", "lengths")
                                                           for c in report["comparisons"].get(k, [])
                                                           if c.get("candidate") == cand], "BCa"),
        "beside": [],
        "build_sentences": [],
        "noise": [],
    }
    if not v2:
        return out
    for r in rows:
        m, t = r["overall"]["mean_kld"], r["overall"]["top1"]
        bca = m.get("cluster_bca") or {}
        out["beside"].append({
            "path": r["path"], "length": r["length"],
            "mean_bca": _ci(m["estimate"], bca.get("ci"), fig=bca or None, notes=notes),
            "top1_wilson": _pct(t["estimate"], t.get("wilson"), notes),
            "top1_deff": _pct(t["estimate"], t.get("wilson_deff"), notes, deff_reason(t)),
            "top1_bca": _pct(t["estimate"], t.get("cluster_bca"), notes),
        })
    out["build_sentences"] = [sentence(c, pct, notes) for c in cmps]
    out["noise"] = [
        {"name": f["candidate"], "path": f["path"], "length": f["length"],
         "floor": _ci(f["mean_kld"]["estimate"], f["mean_kld"]["ci"], fig=f["mean_kld"], notes=notes),
         "label": label(f["mean_kld"]["method"]),
         "builds": [b for b in f["builds"] if b["candidate"] == cand]}
        for f in report.get("noise_floor") or []
    ]
    return out
