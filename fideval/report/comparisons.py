"""report.json ``comparisons``: paired ratios and differences of mean KLD on the report's shared resamples.

Two records sets are paired by window id (``fideval/stats/paired.py``): other builds at the same path and
length (``builds``: ratio, ``build_differences``: difference), an activation path (serving, llamacpp) and the
weights-only path of one build (``paths``: difference, ``path_ratios``: ratio) and a shorter against a longer length (``lengths``:
ratio). Each entry is a PAIRED block (the default interval, whether it excludes no difference, and the
cluster BCa beside it) plus the figure's identity.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.report.figures import SetFigures
from fideval.stats.intervals import VARIANT
from fideval.stats.paired import paired_interval

# the paths that also round activations, each paired with the same build's weights-only path (what the activations
# add): the seed's serving formats, and llama.cpp's CPU arithmetic for a GGUF (docs/quant.md)
ACTIVATION_PATHS = ("serving", "llamacpp")


def comparisons(
    figs: dict[tuple[str, str, int], SetFigures],
    counts: np.ndarray,
    conf: float,
    seed: int,
    strata: np.ndarray | None = None,
) -> dict[str, Any]:
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in ("builds", "build_differences", "paths",
                                                             "path_ratios", "lengths")}

    def pair(kind: str, fa: SetFigures, fb: SetFigures) -> dict[str, Any]:
        return paired_interval(kind, fa.s_kld, fa.n_all, fb.s_kld, fb.n_all, counts, strata,
                               confidence=conf, seed=seed, mover=kind == "difference", **VARIANT)

    keys = sorted(figs)
    for a in keys:
        for b in keys:
            fa, fb = figs[a], figs[b]
            if a == b:
                continue
            if a[1:] == b[1:]:  # same path and length, other candidate
                who = {"path": a[1], "length": a[2]}
                out["builds"].append({"figure": "mean_kld_ratio", **who, "numerator": a[0], "denominator": b[0],
                                      **pair("ratio", fa, fb)})
                out["build_differences"].append({"figure": "mean_kld_difference", **who, "minuend": a[0],
                                                 "subtrahend": b[0], **pair("difference", fa, fb)})
            if a[0] == b[0] and a[2] == b[2] and b[1] == "weights-only" and a[1] in ACTIVATION_PATHS:
                who = {"candidate": a[0], "length": a[2]}
                out["paths"].append({"figure": "mean_kld_difference", **who, "minuend": a[1], "subtrahend": b[1],
                                     **pair("difference", fa, fb)})
                out["path_ratios"].append({"figure": "mean_kld_ratio", **who, "numerator": a[1],
                                           "denominator": b[1], **pair("ratio", fa, fb)})
            if a[:2] == b[:2] and a[2] < b[2]:
                out["lengths"].append({"figure": "mean_kld_ratio", "candidate": a[0], "path": a[1],
                                       "numerator": a[2], "denominator": b[2], **pair("ratio", fa, fb)})
    return out
