"""report.json ``noise_floor``: how far the reference is from itself, and which builds are no farther.

The noise floor is the reference scored against itself under a harmless change — another micro-batch or
thread count, or a second teacher run on other hardware — given to ``fideval report --noise-floor DIR``
(records of a teacher store scored against the reference store: ``fideval score --teacher REF --candidate
OTHER --name noise-floor``). It is scored like a build on the report's shared resamples: its mean KLD and
top-1 agreement with the default interval (MEAN, AGREEMENT). A build at the same length whose mean-KLD
interval reaches down to the noise floor's interval (build low <= floor high) is reported as
*indistinguishable from the reference*: these windows cannot tell its error from the reference's own
run-to-run noise. The others are *above the noise floor*.
"""

from __future__ import annotations

from typing import Any

from fideval.report.figures import SetFigures

INDISTINGUISHABLE = "indistinguishable from the reference"
ABOVE = "above the noise floor"


def noise_floor(noise: dict[tuple[str, str, int], SetFigures], figs: dict[tuple[str, str, int], SetFigures]
                ) -> list[dict[str, Any]]:
    out = []
    for key in sorted(noise):
        r = noise[key].result
        floor = r["overall"]["mean_kld"]
        verdicts = []
        for bkey in sorted(figs):
            if bkey[2] != key[2]:
                continue
            m = figs[bkey].result["overall"]["mean_kld"]
            lo, top = m["ci"][0], floor["ci"][1]  # null: unbounded (the floor's top, or the build's bottom)
            overlaps = lo is None or top is None or lo <= top
            verdicts.append({"candidate": bkey[0], "path": bkey[1], "length": bkey[2],
                             "mean_kld": m["estimate"], "ci": m["ci"], "method": m["method"],
                             "overlaps": bool(overlaps), "verdict": INDISTINGUISHABLE if overlaps else ABOVE})
        out.append({"candidate": key[0], "path": key[1], "length": key[2], "rows": r["rows"],
                    "clusters": r["clusters"], "inputs": r["inputs"], "mean_kld": floor,
                    "top1": r["overall"]["top1"], "builds": verdicts})
    return out
