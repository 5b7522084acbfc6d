"""Every figure of one records set (a candidate, path and length), on the report's shared resamples.

Means are token-weighted (each scored row counts once, so a long window weighs more than a short one): the
figure a reader compares across builds is "mean KLD per predicted token". Their default interval is the
cluster bootstrap-t of ``fideval/stats/studentized.py``, with the cluster BCa of
``fideval/stats/bootstrap.py`` beside it (``fideval/stats/intervals.py``); top-1 agreement also carries the
Wilson and design-effect Wilson intervals, labelled: Wilson assumes independent tokens, the others account
for windows. A mean KLD stores ``concentration`` beside its interval and may be flagged ``concentrated``; a
per-domain mean on few windows ``few_windows``; a per-domain mean's interval is the union of its own and one pooled
over the domains (``fideval/stats/domains.py``; docs/formats-report.md, "Thin evidence"). All per-window
sums of a set go into one ``[G, F]`` matrix so every mean of the set (overall, per domain, per position
bucket) is one matmul with the count matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fideval.report.inputs import RecordSet
from fideval.stats.clusters import cluster_sums
from fideval.stats.domains import domain_mean, pooled_domain_intervals
from fideval.stats.intervals import SCALES, agreement_block, mean_intervals
from fideval.stats.quantiles import quantile_figures

# reference top-1 probability buckets for "top-1 agreement by reference confidence"
CONFIDENCE_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99, 1.0)
OVERALL_MEANS = (("mean_kld", "kld"), ("mean_rkld", "rkld"), ("mean_delta_nll", "delta_nll"))
AGREEMENT = ("top1", "top5", "top10")


def position_edges(length: int) -> list[int]:
    """Bucket edges over row positions 0..length-2: [0, 16), [16, 32), [32, 64), ... doubling, then the end.

    Doubling buckets because the reference's own uncertainty (and most quantization damage to attention)
    changes fastest over the first tokens of a sequence and slowly after a few hundred.
    """
    end = length - 1
    edges = [0]
    e = 16
    while e < end:
        edges.append(e)
        e *= 2
    edges.append(end)
    return edges


def few_windows(fig: dict[str, Any] | None, pooled: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A per-domain mean KLD as printed: flag ``few_windows`` under ``DOMAIN_MIN_WINDOWS`` windows; from
    ``domains.MIN_WINDOWS`` the union of its own interval and the domain-pooled t-interval ``pooled``, below it no
    interval (``fideval/stats/domains.py``: docs/formats-report.md, "Thin evidence"); a degenerate one is left alone."""
    return domain_mean(fig, pooled)


class SetFigures:
    """Figures of one records set; ``result`` is its report.json entry."""

    def __init__(
        self,
        rs: RecordSet,
        codes: np.ndarray,
        n_clusters: int,
        counts: np.ndarray,
        domains: list[str],
        *,
        confidence: float,
        seed: int,
        qs: list[float],
        strata: np.ndarray | None = None,
    ):
        self.rs, self.codes, self.g = rs, codes, n_clusters
        self.strata = strata  # domain of each window (None: one stratum)
        self.counts, self.confidence, self.seed, self.qs = counts, confidence, seed, qs
        c = rs.cols
        self.values = {
            "kld": c["kld"],
            "rkld": c["rkld"],
            "delta_nll": c["nll_cand"] - c["nll_ref"],
            **{a: c[a].astype(np.float64) for a in AGREEMENT},
        }
        self.n_all = cluster_sums(codes, np.ones(codes.size), n_clusters)
        self.s_kld = cluster_sums(codes, c["kld"], n_clusters)
        self.domains = domains
        self.edges = position_edges(rs.length)
        self.result = self._compute()

    def _stamp(self, fig: dict[str, Any] | None) -> dict[str, Any] | None:
        if fig is not None:
            fig.update(seed=self.seed, confidence=self.confidence)
        return fig

    def _quantiles(self, mask: np.ndarray | None) -> list[dict[str, Any]]:
        codes = self.codes if mask is None else self.codes[mask]
        kld = self.rs.cols["kld"] if mask is None else self.rs.cols["kld"][mask]
        n_strata = 1 if self.strata is None else int(np.unique(np.asarray(self.strata)[np.unique(codes)]).size)
        return [self._stamp(q) | {"unit": "window", "strata": n_strata}
                for q in quantile_figures(kld, codes, self.counts, self.qs, self.confidence, n_strata)]

    def _agreement(self, name: str, mask: np.ndarray | None, mean: dict[str, Any]) -> dict[str, Any]:
        codes = self.codes if mask is None else self.codes[mask]
        y = self.values[name] if mask is None else self.values[name][mask]
        n = cluster_sums(codes, np.ones(codes.size), self.g)
        return agreement_block(cluster_sums(codes, y, self.g), n, mean, self.confidence)

    def _compute(self) -> dict[str, Any]:
        rs, g, codes = self.rs, self.g, self.codes
        cols: list[tuple[str, np.ndarray | None, str]] = [(f, None, v) for f, v in OVERALL_MEANS]
        cols += [(a, None, a) for a in AGREEMENT]
        dom_masks = {d: rs.cols["domain"] == d for d in self.domains}
        for d, m in dom_masks.items():
            cols += [(f"{d}/mean_kld", m, "kld"), (f"{d}/top1", m, "top1")]
        pos = rs.cols["position"]
        pos_masks = [(a, b, (pos >= a) & (pos < b)) for a, b in zip(self.edges[:-1], self.edges[1:])]
        cols += [(f"pos{a}/mean_kld", m, "kld") for a, _, m in pos_masks]
        p1 = rs.cols["p1_ref"]
        last = len(CONFIDENCE_EDGES) - 2
        conf_masks = [(a, b, (p1 >= a) & ((p1 <= b) if i == last else (p1 < b)))
                      for i, (a, b) in enumerate(zip(CONFIDENCE_EDGES[:-1], CONFIDENCE_EDGES[1:]))]
        cols += [(f"conf{a}/top1", m, "top1") for a, _, m in conf_masks if m.any()]
        s = np.empty((g, len(cols)))
        n = np.empty((g, len(cols)))
        for j, (_, m, v) in enumerate(cols):
            cm = codes if m is None else codes[m]
            s[:, j] = cluster_sums(cm, self.values[v] if m is None else self.values[v][m], g)
            n[:, j] = cluster_sums(cm, np.ones(cm.size), g)
        scales = [SCALES[v] for _, _, v in cols]
        bca = dict(zip((name for name, _, _ in cols), mean_intervals(
            s, n, self.counts, self.strata, scales, confidence=self.confidence, seed=self.seed)))

        names = [name for name, _, _ in cols]
        dj = [names.index(f"{d}/mean_kld") for d in dom_masks]  # per-domain means: their spread pooled (domains.py)
        pooled = dict(zip(dom_masks, pooled_domain_intervals(s[:, dj], n[:, dj], self.confidence) if dj else []))
        overall: dict[str, Any] = {f: self._stamp(bca[f]) for f, _ in OVERALL_MEANS}
        overall |= {a: self._agreement(a, None, bca[a]) for a in AGREEMENT}
        overall["kld_quantiles"] = self._quantiles(None)

        domains = {}
        for d, m in dom_masks.items():
            if not m.any():
                # documented handling: a domain without rows is listed, with null figures and a flag
                domains[d] = {
                    "rows": 0,
                    "clusters": 0,
                    "mean_kld": None,
                    "top1": None,
                    "kld_quantiles": None,
                    "flags": ["no_rows"],
                }
                continue
            domains[d] = {
                "rows": int(m.sum()),
                "clusters": int(np.unique(codes[m]).size),
                "mean_kld": self._stamp(few_windows(bca[f"{d}/mean_kld"], pooled.get(d))),
                "top1": self._agreement("top1", m, bca[f"{d}/top1"]),
                "kld_quantiles": self._quantiles(m),
                "flags": [],
            }

        positions = []
        for a, b, m in pos_masks:
            positions.append(
                {
                    "start": a,
                    "end": b,
                    "rows": int(m.sum()),
                    "mean_kld": self._stamp(bca[f"pos{a}/mean_kld"]) if m.any() else None,
                }
            )

        conf = []
        for a, b, m in conf_masks:
            tot = int(m.sum())
            conf.append({"p1_low": a, "p1_high": b, "rows": tot, "mean_p1_ref": float(p1[m].mean()) if tot else None,
                         "top1": self._agreement("top1", m, bca[f"conf{a}/top1"]) if tot else None})

        return {
            "candidate": rs.candidate,
            "path": rs.path,
            "length": rs.length,
            "rows": rs.rows,
            "clusters": int(np.count_nonzero(self.n_all)),
            "sequences": int(np.unique(rs.cols["seq_id"]).size),
            "inputs": [p.record() for p in rs.parts],
            "overall": overall,
            "domains": domains,
            "positions": positions,
            "confidence_buckets": conf,
        }


def summary(sets: list[RecordSet]) -> dict[str, Any]:
    """``summary-<candidate>-<path>.json``: mean KLD, top-1 and rows per sequence and per window."""
    seqs, wins = [], []
    for rs in sorted(sets, key=lambda r: r.length):
        c = rs.cols
        for key, out in (("seq_id", seqs), ("window_id", wins)):
            ids, inv = np.unique(c[key].astype(str), return_inverse=True)
            rows = np.bincount(inv, minlength=ids.size)
            kld = np.bincount(inv, weights=c["kld"], minlength=ids.size) / rows
            top1 = np.bincount(inv, weights=c["top1"].astype(np.float64), minlength=ids.size) / rows
            dom = dict(zip(c[key].astype(str), c["domain"].astype(str)))
            win = dict(zip(c["seq_id"].astype(str), c["window_id"].astype(str)))
            for j, i in enumerate(ids):
                e = {
                    "length": rs.length,
                    key: str(i),
                    "domain": dom[i],
                    "rows": int(rows[j]),
                    "mean_kld": float(kld[j]),
                    "top1": float(top1[j]),
                }
                if key == "seq_id":
                    e["window_id"] = win[i]
                out.append(e)
    first = sets[0]
    return {
        "format": "fideval.summary",
        "version": 1,
        "candidate": first.candidate,
        "path": first.path,
        "sequences": seqs,
        "windows": wins,
    }
