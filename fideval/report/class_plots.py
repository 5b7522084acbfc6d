"""``plots/token-classes-<candidate>-<path>-<length>.png``: mean KLD per token class with its default interval.

One horizontal bar per class with rows, longest-first by mean KLD, the set's overall mean as a vertical line: a
bar far right of the line is where the build degrades. Classes flagged ``few_windows`` are drawn hatched and
labelled ``(few windows)``, so a reader does not take a thin bar for a finding; an interval reaching past three
times the largest estimate is cut at the axis and marked. Drawn from report.json's
``token_classes`` block (not from the rows), so the plot shows exactly the figures the card prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.report.plots import PLOTS_DIR, _save, _yerr

KIND = "token-classes"


def _plot(res: dict[str, Any], overall: float | None, path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = [(n, c) for n, c in res["classes"].items() if c["mean_kld"] is not None]
    rows.sort(key=lambda x: x[1]["mean_kld"]["estimate"])
    est = np.array([c["mean_kld"]["estimate"] for _, c in rows], dtype=np.float64)
    ci = [c["mean_kld"].get("ci") or [None, None] for _, c in rows]
    lo = np.array([np.nan if a is None else a for a, _ in ci], dtype=np.float64)
    hi = np.array([np.nan if b is None else b for _, b in ci], dtype=np.float64)
    thin = ["few_windows" in (c["mean_kld"].get("flags") or []) for _, c in rows]
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(rows) + 1.4))
    y = np.arange(len(rows))
    ax.barh(y, est, color=["#c9c9c9" if t else "#4a7ab5" for t in thin], hatch=None, edgecolor="#333", lw=0.4)
    for k, t in enumerate(thin):
        if t:
            ax.patches[k].set_hatch("//")
    # an interval far wider than every estimate (a thin class) is cut at the axis' end and marked, so it does not
    # squash every bar to nothing
    xmax = 3.0 * max(float(est.max()) if est.size else 0.0, overall or 0.0) or 1.0
    cut = hi > xmax
    err = _yerr(est, np.where(np.isnan(lo), est, lo), np.where(np.isnan(hi), est, np.minimum(hi, xmax)))
    ax.errorbar(est, y, xerr=err, fmt="none", ecolor="#222", capsize=2, lw=0.8)
    for k in np.nonzero(cut)[0]:
        ax.annotate("→ beyond the axis", (xmax, y[k]), xytext=(-70, 3), textcoords="offset points", fontsize=7)
    ax.set_xlim(0, xmax * 1.02)
    def label(n: str, c: dict[str, Any], t: bool) -> str:
        none = "too_few_windows" in (c["mean_kld"].get("flags") or [])
        return f"{n} ({c['rows']:,} rows){' (no interval: < 8 windows)' if none else ' (few windows)' if t else ''}"

    ax.set_yticks(y, [label(n, c, t) for (n, c), t in zip(rows, thin)])
    if overall is not None:
        ax.axvline(overall, color="#b22", lw=1, ls="--", label=f"all tokens {overall:.4g}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("mean KLD (nats per predicted token), default interval")
    ax.set_title(f"Mean KLD by token class — {res['candidate']}, {res['path']}, {res['length']} tokens")
    fig.tight_layout()
    _save(fig, path)


def write_class_plots(report: dict[str, Any], out_dir: str | Path) -> list[dict[str, Any]]:
    """One plot per records set of the report's ``token_classes`` block; their report.json ``plots`` entries."""
    block = report.get("token_classes") or {}
    if block.get("status") != "measured":
        return []
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    overall = {(r["candidate"], r["path"], r["length"]): r["overall"]["mean_kld"]["estimate"] for r in report["results"]}
    listed = []
    (Path(out_dir) / PLOTS_DIR).mkdir(parents=True, exist_ok=True)
    with plt.rc_context({"font.size": 9}):
        for res in block["results"]:
            key = (res["candidate"], res["path"], res["length"])
            name = f"{PLOTS_DIR}/{KIND}-{'-'.join(map(str, key))}.png"
            _plot(res, overall.get(key), Path(out_dir) / name)
            listed.append({"file": name, "kind": KIND, "candidate": key[0], "path": key[1], "length": key[2]})
    return listed
