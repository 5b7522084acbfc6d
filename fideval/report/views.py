"""report.json ``results[].views``: the same records seen per window, by context depth, at the worst windows.

  micro_macro    mean KLD and top-1 agreement per token (micro: every row weighs the same, the report's
                 headline) and per window (macro: each window's own mean weighs the same, so a long window
                 does not count more and a few hard windows count as few);
  depth          mean KLD and the share of top-1 flips by context depth, in buckets of the row's position
                 that are the same at every length: edges 0, 64, then x4 (256, 1024, 4096, 16384, 65536...)
                 up to the last row (length - 1), so short and long contexts compare bucket by bucket and a
                 32,768-token window ends in [4096, 16384), [16384, 32767) (issue 41);
  top1_flips     the share of rows whose top-1 token differs from the reference's, overall and among rows
                 where the reference was confident (its top-1 probability >= 0.9);
  worst_windows  the 20 windows of highest mean KLD, with their domain, rows, mean KLD, top-1, largest row
                 KLD, share of the set's summed KLD, and the sources of their documents (eval-windows.json).

Every mean carries the report's default interval with the cluster BCa beside it (MEAN,
``fideval/stats/intervals.py``) on the shared resamples; a macro mean is the same estimator with each
window's mean as its one row. Single windows have no interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.report.inputs import RecordSet
from fideval.stats.clusters import cluster_sums
from fideval.stats.intervals import mean_intervals

DEPTH_FIRST, DEPTH_STEP = 64, 4  # edges 0, 64, 256, 1024, 4096, 16384, ... below the last row
CONFIDENT_P1 = 0.9
WORST = 20


def depth_edges(length: int) -> list[int]:
    """Bucket edges over row positions 0..length-2 (module docstring): 0, 64, x4 while below ``length - 1``, then
    ``length - 1``; at 8,192 tokens [0, 64) ... [4096, 8191) as before, at 32,768 two more buckets past 4,096."""
    end = length - 1
    edges, e = [0], DEPTH_FIRST
    while e < end:
        edges.append(e)
        e *= DEPTH_STEP
    return edges + [end]


def views(
    rs: RecordSet,
    codes: np.ndarray,
    g: int,
    counts: np.ndarray,
    strata: np.ndarray | None,
    *,
    confidence: float,
    seed: int,
    window_sources: dict[str, Any] | None = None,
    window_ids: tuple[str, ...] = (),
) -> dict[str, Any]:
    c = rs.cols
    kld, top1 = c["kld"], c["top1"].astype(np.float64)
    flip = 1.0 - top1
    ones = np.ones(codes.size)
    n = cluster_sums(codes, ones, g)
    present = n > 0
    s_kld, s_top1 = cluster_sums(codes, kld, g), cluster_sums(codes, top1, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        w_kld = np.where(present, s_kld / n, 0.0)
        w_top1 = np.where(present, s_top1 / n, 0.0)
    cols: list[tuple[str, np.ndarray, np.ndarray, str]] = [
        ("micro/kld", s_kld, n, "log"),
        ("macro/kld", w_kld, present.astype(np.float64), "log"),
        ("micro/top1", s_top1, n, "logit"),
        ("macro/top1", w_top1, present.astype(np.float64), "logit"),
        ("flips/all", cluster_sums(codes, flip, g), n, "logit"),
    ]
    conf_rows = c["p1_ref"] >= CONFIDENT_P1
    cols.append(("flips/confident", cluster_sums(codes[conf_rows], flip[conf_rows], g),
                 cluster_sums(codes[conf_rows], ones[conf_rows], g), "logit"))
    edges = depth_edges(rs.length)
    pos = c["position"]
    buckets = [(a, b, (pos >= a) & (pos < b)) for a, b in zip(edges[:-1], edges[1:])]
    for a, _, m in buckets:
        cols.append((f"depth{a}/kld", cluster_sums(codes[m], kld[m], g), cluster_sums(codes[m], ones[m], g), "log"))
        cols.append((f"depth{a}/flips", cluster_sums(codes[m], flip[m], g), cluster_sums(codes[m], ones[m], g),
                     "logit"))
    s = np.stack([x[1] for x in cols], axis=1)
    nn = np.stack([x[2] for x in cols], axis=1)
    figs = dict(zip((x[0] for x in cols), mean_intervals(s, nn, counts, strata, [x[3] for x in cols],
                                                         confidence=confidence, seed=seed)))
    depth = [{"start": a, "end": b, "rows": int(m.sum()), "mean_kld": figs[f"depth{a}/kld"],
              "top1_flips": figs[f"depth{a}/flips"]} for a, b, m in buckets]

    order = np.argsort(-w_kld, kind="stable")
    order = [int(w) for w in order if present[w]][:WORST]
    dom = dict(zip(c["window_id"].astype(str), c["domain"].astype(str)))
    max_kld = np.full(g, -np.inf)
    np.maximum.at(max_kld, codes, kld)
    total = float(s_kld.sum())
    worst = []
    for w in order:
        wid = window_ids[w] if window_ids else str(w)
        worst.append({
            "window_id": wid, "domain": dom.get(wid), "rows": int(n[w]), "mean_kld": float(w_kld[w]),
            "top1": float(w_top1[w]), "max_kld": float(max_kld[w]),
            "share_of_kld": float(s_kld[w] / total) if total > 0 else None,
            "sources": (window_sources or {}).get(wid),
        })
    return {
        "micro_macro": {"mean_kld": {"micro": figs["micro/kld"], "macro": figs["macro/kld"]},
                        "top1": {"micro": figs["micro/top1"], "macro": figs["macro/top1"]}},
        "depth": depth,
        "top1_flips": {"share": figs["flips/all"], "confident": figs["flips/confident"],
                       "confident_p1_ref": CONFIDENT_P1, "confident_rows": int(conf_rows.sum())},
        "worst_windows": worst,
    }
