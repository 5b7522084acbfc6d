"""The card's section for a collection of builds: ``fideval card REPORT --comparison comparison.json``.

A card is written for one build; a family of builds (Q2 ... Q8 of one model) is compared by ``fideval compare``.
Given the comparison, the card gains a section placing its build among the others: every build's size, mean KLD
with the interval that holds for all builds together, top-1 agreement, whether it is on the size/KLD frontier
and how often the window resamples found it dominated; then, for this build, what dominates it, which builds the
data cannot tell it apart from, and which builds' top-1 agreement differs from its own. The comparison's plot is
listed with the card's plots (so the results page, which shows the plots itself, leaves it out).

The comparison must be of this report's build as the report measured it: the build is in it, at a path and length
the report holds, and its mean KLD there is the report's (the same rows); anything else is refused in one line.
:func:`section` is the markdown (the card's template prints ``card.family.markdown``); ``fideval compare --html``
prints the same section, without a highlighted build, as a standalone results page.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from fideval.errors import FidevalError
from fideval.formats import nesting


def load(path: Path) -> dict[str, Any]:
    """comparison.json (or its folder), checked against its model (v1 or v2); one line otherwise."""
    from fideval.formats.comparison import FILE, Comparison
    from fideval.formats.model import dump, parse

    path = Path(path)
    if path.is_dir():
        path = path / FILE
    try:
        obj = nesting.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FidevalError(f"comparison {path} not found", hint="run 'fideval compare' first") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FidevalError(f"{path} is not readable JSON ({type(e).__name__})",
                           hint="regenerate it with 'fideval compare'") from None
    return dump(parse(Comparison, obj, str(path)))


def check(cmp: dict[str, Any], report: dict[str, Any], candidate: str, where: str) -> None:
    """Refuse a comparison that is not of ``candidate`` as ``report`` measured it (module docstring)."""
    st = cmp["settings"]
    names = [b["name"] for b in cmp["builds"]]
    if candidate not in names:
        raise FidevalError(f"{where} does not compare {candidate} (it compares {', '.join(names)})",
                           hint="give the comparison of this report's builds")
    res = next((r for r in report["results"] if (r["candidate"], r["path"], r["length"]) ==
                (candidate, st["path"], st["length"])), None)
    if res is None:
        raise FidevalError(f"{where} compares {candidate} at {st['path']}/{st['length']}, which the report does "
                           "not hold", hint="give the comparison made from this report")
    mine = next(b for b in cmp["builds"] if b["name"] == candidate)["mean_kld"]["estimate"]
    theirs = res["overall"]["mean_kld"]["estimate"]
    if mine is None or theirs is None or not math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=0.0):
        raise FidevalError(f"{where}: the mean KLD of {candidate} there ({mine}) is not the report's ({theirs}): "
                           "other rows", hint="give the comparison made from this report's records")


def _g(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _ci(fig: dict[str, Any] | None, digits: int = 4, pct: bool = False) -> str:
    if fig is None or fig.get("estimate") is None:
        return "—"
    f = (lambda x: "—" if x is None else f"{100 * x:.2f}") if pct else (lambda x: _g(x, digits))
    lo, hi = fig["ci"]
    return f"{f(fig['estimate'])}{' %' if pct else ''} [{f(lo)}, {f(hi)}]"


def _size(b: dict[str, Any]) -> str:
    return f"{b['size']:.3g}" if b["size_unit"] == "bits_per_weight" else f"{b['size']:,.0f} bytes"


def section(cmp: dict[str, Any], candidate: str | None = None) -> str:
    """The markdown section: the table of builds, then this build's place among them (``candidate``) or the
    frontier and the groups (no candidate)."""
    st, fam = cmp["settings"], cmp["families"]
    pct = f"{100 * st['confidence']:g} %"
    doc = st.get("unit") == "document"
    unit = (f"{st['units']} documents ({st['clusters']} windows; windows sharing a document are resampled together)"
            if doc else f"{st['clusters']} windows")
    q = fam["ratio"]
    out = [f"## Among {len(cmp['builds'])} builds compared at once", "",
           f"{len(cmp['builds'])} builds scored against the same teacher on the same {st['clusters']} windows "
           f"({st['path']}, {st['length']} tokens). The intervals below hold **for all builds together** at "
           f"{pct} (max-t over {st['resamples']} joint resamples of {unit}: critical value "
           f"{_g(q['quantile'], 3)} over {q['members']} pairs, against {_g(q['bonferroni_quantile'], 3)} for "
           "Bonferroni). A build is on the frontier when no other is at most its size with at most its mean KLD; "
           "P(dominated) is how often the resamples found another build that does.", "",
           f"| build | {'bits per weight' if cmp['builds'][0]['size_unit'] == 'bits_per_weight' else 'size'} "
           f"| mean KLD [simultaneous {pct}] | top-1 [{pct}, this build alone] | frontier | P(dominated) |",
           "|---|---|---|---|---|---|"]
    for b in cmp["builds"]:
        name = f"**{b['name']}** (this build)" if b["name"] == candidate else b["name"]
        out.append(f"| {name} | {_size(b)} | {_ci(b['mean_kld_simultaneous'])} | {_ci(b['top1'], pct=True)} | "
                   f"{'yes' if b['on_frontier'] else 'no'} | {b['p_dominated']:.2f} |")
    out.append("")
    groups = "; ".join("{" + ", ".join(g) + "}" for g in cmp["groups"] if len(g) > 1)
    if candidate is None:
        out.append(f"- Frontier: {', '.join(cmp['frontier'])}.")
        out.append(f"- The data cannot separate: {groups}." if groups else
                   "- Every pair of builds is separated (each simultaneous ratio interval excludes 1).")
    else:
        me = next(b for b in cmp["builds"] if b["name"] == candidate)
        if me["on_frontier"]:
            out.append(f"- This build is on the frontier (dominated in {100 * me['p_dominated']:.0f} % of resamples).")
        else:
            sure = me["certainly_dominated_by"]
            out.append(f"- This build is dominated by {', '.join(me['dominated_by'])} at the estimates (in "
                       f"{100 * me['p_dominated']:.0f} % of resamples)" + (
                           f"; {', '.join(sure)} {'is' if len(sure) == 1 else 'are'} no larger with a mean KLD below "
                           "it by the simultaneous intervals." if sure else
                           "; no build is certainly better by the simultaneous intervals."))
        same = sorted({x for p in cmp["pairs"] if candidate in (p["a"], p["b"]) and not p["separated"]
                       for x in (p["a"], p["b"])} - {candidate})
        out.append(f"- The data cannot tell its mean KLD from {', '.join(same)}'s (simultaneous ratio interval "
                   "includes 1)." if same else "- Its mean KLD is separated from every other build's.")
        tops = [p for p in cmp["pairs"] if candidate in (p["a"], p["b"]) and p.get("top1_difference")]
        if tops:
            sep = [f"{p['b'] if p['a'] == candidate else p['a']} "
                   f"({100 * (1 if p['a'] == candidate else -1) * p['top1_difference']['estimate']:+.2f} points)"
                   for p in tops if p["top1_separated"]]
            out.append("- Its top-1 agreement differs (simultaneous intervals of the top-1 differences) from: "
                       + (", ".join(sep) + "." if sep else "no other build."))
    ratio = next((p for p in cmp["pairs"] if p["separated"]), None)
    if ratio is not None:
        out.append(f"- For instance {ratio['a']} / {ratio['b']}: mean KLD ratio {_ci(ratio['ratio'], 3)} "
                   f"(simultaneous {pct}).")
    return "\n".join(out) + "\n"


def context(cmp: dict[str, Any], cmp_path: Path, candidate: str, out_dir: Path) -> dict[str, Any]:
    """What the card's template gets as ``card.family``: the section's markdown, the comparison's figures, and
    its plot as a card plot (``href`` relative to the card; None when the file is not there)."""
    folder = cmp_path if cmp_path.is_dir() else cmp_path.parent
    plot = None
    if cmp.get("plot") and (folder / cmp["plot"]).is_file():
        href = Path(os.path.relpath((folder / cmp["plot"]).resolve(), out_dir.resolve())).as_posix()
        plot = {"href": href, "alt": f"size against mean KLD, {len(cmp['builds'])} builds"}
    return {"markdown": section(cmp, candidate), "comparison": cmp, "plot": plot}


def results_page(cmp: dict[str, Any], folder: Path, page_path: Path) -> str:
    """The standalone results page of a comparison (``fideval compare --html``): the section without a highlighted
    build, and the plot where it is beside comparison.json (linked relative to the page)."""
    from fideval.report.results_page import page

    text = section(cmp)
    if cmp.get("plot") and (folder / cmp["plot"]).is_file():
        href = Path(os.path.relpath((folder / cmp["plot"]).resolve(), page_path.parent.resolve())).as_posix()
        text += f"\n## Size against mean KLD\n\n![size against mean KLD]({href})\n"
    st = cmp["settings"]
    return page(text, f"fideval results: {len(cmp['builds'])} builds, {st['path']}/{st['length']}")
