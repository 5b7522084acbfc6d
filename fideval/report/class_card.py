"""The card's token-class sections: "Where it degrades" and the classes-by-build table.

Someone shipping a build for agent use needs to know whether it loses fidelity on tool-call syntax, reasoning
or the first tokens of a turn, not only on average. The section ranks the classes of each of the build's
records sets by ``ratio_to_overall`` (the class's mean KLD over the set's own, a paired interval on the same
windows) and names only those whose interval lies above 1: a class whose interval reaches 1 is not shown to
degrade more than the average token, whatever its estimate, nor is one too thin for a mean interval at all
(``too_few_windows``, as a domain under 8 windows). A class resting on fewer windows than a per-domain
figure needs is labelled so (flag ``few_windows``), as the domain table is. The table gives every class with
rows: its share of the rows and its mean KLD with interval per path and length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TOP = 3  # classes named per records set in "Where it degrades"


def _thin(c: dict[str, Any]) -> bool:
    return "few_windows" in ((c.get("mean_kld") or {}).get("flags") or [])


def class_context(report: dict[str, Any], candidate: str, ci: Callable[..., str]) -> dict[str, Any] | None:
    """The card's ``token_classes`` context (None when the report has no measured classes); ``ci`` formats an
    interval as the rest of the card does."""
    block = report.get("token_classes") or {}
    if block.get("status") != "measured":
        return None
    sets = [r for r in block["results"] if r["candidate"] == candidate]
    if not sets:
        return None
    names = [c["name"] for c in block["classes"] if any(r["classes"][c["name"]]["rows"] for r in sets)]
    rows = []
    for n in names:
        cells = []
        for r in sets:
            c = r["classes"][n]
            cells.append("—" if not c["rows"] else
                         f"{ci(c['mean_kld'], 3)}{' †' if _thin(c) else ''} · ×{c['ratio_to_overall']['estimate']:.2f}")
        rows.append({"name": n, "share": f"{100 * max(r['classes'][n]['share_of_rows'] for r in sets):.1f} %",
                     "cells": cells})
    degrades = []
    for r in sets:
        found = []
        for n in names:
            c = r["classes"][n]
            ratio = c.get("ratio_to_overall") or {}
            lo = (ratio.get("ci") or [None, None])[0]
            no_interval = "too_few_windows" in ((c.get("mean_kld") or {}).get("flags") or [])
            if c["rows"] and not no_interval and lo is not None and lo > 1.0:
                found.append((ratio["estimate"], n, c, ratio))
        found.sort(key=lambda x: -x[0])
        items = [f"`{n}` ×{est:.2f} the mean KLD of all tokens ({ci(ratio, 3, kind='ratio')}; mean KLD "
                 f"{ci(c['mean_kld'], 3)}, {c['rows']:,} rows in {c['clusters']} windows{'; few windows' if _thin(c) else ''})"
                 for est, n, c, ratio in found[:TOP]]
        degrades.append({"path": r["path"], "length": r["length"], "items": items, "more": max(0, len(found) - TOP)})
    fewest = min((r["classes"][n]["clusters"] for r in sets for n in names if _thin(r["classes"][n])), default=None)
    return {"columns": [f"{r['path']}, {r['length']}" for r in sets], "rows": rows, "degrades": degrades,
            "rule": block["source"].get("rule"), "few": fewest}
