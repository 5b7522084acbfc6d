"""report.json ``token_classes``: every headline figure per token class, on the report's shared resamples.

**The join.** The scorer is not told about classes: a records row names its sequence and position, and the
windows stage wrote each window's class bits beside its tokens (``token-classes.safetensors``, docs/formats-classes.md).
Row ``r`` of sequence ``s`` predicts token ``r + 1`` of ``s``, which is token ``offset(s) + r + 1`` of its window
(a window's offset is 0, cut ``j``'s is ``j * length``); the row takes that token's classes, the class of what is
being predicted. Before joining, the side file's window SHA-256 must equal eval-windows.json's for every window
(the records were already checked against eval-windows.json, ``coverage.token_links``), so the classes describe
the very tokens that were scored; any break in that chain is one line, not a figure.

**The figures.** Per records set and class, as the per-domain block: rows, windows, mean KLD (the default
interval, flagged as a per-domain mean is: ``few_windows`` below 64 windows, no interval below 8; classes overlap
and are not strata, so nothing is pooled across them; "Thin evidence"), mean delta NLL, top-1 agreement (AGREEMENT), the KLD
quantiles; and ``ratio_to_overall``, the class's mean KLD over the set's own (PAIRED, the same windows), which is
what "where it degrades" ranks on. Paired build comparisons per class (``comparisons``: other builds at the same
path and length, activation path against weights-only) use the same resamples as the headline's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import classes as fmt
from fideval.formats.ids import CUT_SEP, window_of
from fideval.fsio import sha256_file
from fideval.report.comparisons import ACTIVATION_PATHS
from fideval.report.figures import SetFigures, few_windows
from fideval.stats.clusters import cluster_sums
from fideval.stats.intervals import SCALES, VARIANT, agreement_block, mean_intervals
from fideval.stats.paired import paired_interval
from fideval.stats.quantiles import quantile_figures

FORMAT = "fideval.token-class-figures"
VERSION = 1
FIGURES = ("kld", "top1", "delta_nll")


def not_measured(reason: str) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "status": "not_measured", "reason": reason}


def load(windows: dict[str, Any] | None) -> tuple[fmt.TokenClasses | None, dict[str, Any]]:
    """The side file beside eval-windows.json, checked against it; (None, why) when there is none to read."""
    if windows is None:
        return None, not_measured("no eval-windows.json given to the report")
    path = Path(windows["file"]).parent / fmt.FILE
    if not path.is_file():
        return None, not_measured(f"no {fmt.FILE} beside {windows['file']} (windows built before token classes)")
    tc = fmt.read(path)
    known = windows["windows"]
    for wid, sha in zip(tc.ids, tc.window_sha256):
        want = (known.get(wid) or {}).get("token_sha256")
        if want is None:
            raise FidevalError(f"{path}: window {wid} is not in {windows['file']}",
                               hint="the classes and eval-windows.json are from different runs; rebuild the windows")
        if want != sha:
            raise FidevalError(f"{path}: window {wid} was classified on tokens {sha[:12]}..., {windows['file']} says "
                               f"{want[:12]}...", hint="the classes describe other tokens; rebuild the windows")
    rule = (tc.meta.get("rules") or {}).get("rule")
    return tc, {"format": FORMAT, "version": VERSION, "status": "measured", "reason": None,
                "source": {"file": str(path), "sha256": sha256_file(path), "format": fmt.FORMAT, "version": fmt.VERSION,
                           "rule": rule.get("name") if isinstance(rule, dict) else None, "rules": tc.meta.get("rules"),
                           "rules_sha256": tc.meta.get("rules_sha256"), "tokenizer_sha256": tc.meta.get("tokenizer_sha256"),
                           "windows_checked": len(tc.ids)},
                "classes": [{"name": n, "bit": i, "meaning": m} for i, (n, m) in enumerate(fmt.CLASSES)]}


def row_bits(rs: Any, tc: fmt.TokenClasses) -> np.ndarray:
    """Each records row's class bits: those of the token it predicts (module docstring)."""
    index = {w: i for i, w in enumerate(tc.ids)}
    sid = rs.cols["seq_id"].astype(str)
    uniq, inv = np.unique(sid, return_inverse=True)
    rows, offs = np.empty(uniq.size, np.int64), np.empty(uniq.size, np.int64)
    for k, s in enumerate(uniq.tolist()):
        w = window_of(s)
        if w not in index:
            raise FidevalError(f"{rs.where}: sequence {s} belongs to window {w}, which the token classes do not name",
                               hint="report with the windows folder the teacher ran on")
        rows[k] = index[w]
        offs[k] = 0 if s == w else int(s.rsplit(CUT_SEP, 1)[1]) * rs.length
    tok = offs[inv] + rs.cols["position"].astype(np.int64) + 1
    if tok.size and int(tok.max()) >= tc.classes.shape[1]:
        raise FidevalError(f"{rs.where}: a row predicts token {int(tok.max())} of a window of {tc.classes.shape[1]} tokens",
                           hint="the records come from other windows; report with the windows folder the teacher ran on")
    return tc.classes[rows[inv], tok]


def _stamp(fig: dict[str, Any] | None, f: SetFigures) -> dict[str, Any] | None:
    if fig is not None:
        fig.update(seed=f.seed, confidence=f.confidence)
    return fig


def set_block(f: SetFigures, bits: np.ndarray) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """One records set's per-class figures, and each class's per-window (KLD sum, rows) for the comparisons."""
    masks = {n: (bits & fmt.BIT[n]) != 0 for n in fmt.NAMES}
    present = [n for n in fmt.NAMES if masks[n].any()]
    s = np.empty((f.g, len(present) * len(FIGURES)))
    n = np.empty_like(s)
    sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i, name in enumerate(present):
        m = masks[name]
        cm = f.codes[m]
        rows = cluster_sums(cm, np.ones(cm.size), f.g)
        for j, v in enumerate(FIGURES):
            s[:, i * len(FIGURES) + j] = cluster_sums(cm, f.values[v][m], f.g)
            n[:, i * len(FIGURES) + j] = rows
        sums[name] = (s[:, i * len(FIGURES)].copy(), rows)
    figs = mean_intervals(s, n, f.counts, f.strata, [SCALES[v] for _ in present for v in FIGURES],
                          confidence=f.confidence, seed=f.seed) if present else []
    out: dict[str, Any] = {}
    for name in fmt.NAMES:
        if name not in present:
            out[name] = {"rows": 0, "clusters": 0, "share_of_rows": 0.0, "mean_kld": None, "mean_delta_nll": None,
                         "top1": None, "kld_quantiles": None, "ratio_to_overall": None, "flags": ["no_rows"]}
            continue
        i = present.index(name)
        m = masks[name]
        kld, top1, dnll = figs[i * 3: i * 3 + 3]
        y1 = cluster_sums(f.codes[m], f.values["top1"][m], f.g)
        strata = 1 if f.strata is None else int(np.unique(np.asarray(f.strata)[np.unique(f.codes[m])]).size)
        out[name] = {
            "rows": int(m.sum()), "clusters": int(np.unique(f.codes[m]).size), "share_of_rows": float(m.mean()),
            "mean_kld": _stamp(few_windows(kld), f), "mean_delta_nll": _stamp(dnll, f),
            "top1": agreement_block(y1, sums[name][1], top1, f.confidence),
            "kld_quantiles": [_stamp(q, f) | {"unit": "window", "strata": strata} for q in quantile_figures(
                f.values["kld"][m], f.codes[m], f.counts, f.qs, f.confidence, strata)],
            "ratio_to_overall": paired_interval("ratio", sums[name][0], sums[name][1], f.s_kld, f.n_all, f.counts,
                                                f.strata, confidence=f.confidence, seed=f.seed, **VARIANT),
            "flags": [],
        }
    return out, sums


def _pairs(figs: dict[tuple[str, str, int], SetFigures], sums: dict[tuple[str, str, int], dict]) -> list[dict[str, Any]]:
    """Per class: other builds at the same path and length (ratio), activation path vs weights-only (difference)."""
    out = []
    for a in sorted(figs):
        for b in sorted(figs):
            if a == b:
                continue
            if a[1:] == b[1:]:
                kind, who = "ratio", {"figure": "mean_kld_ratio", "path": a[1], "length": a[2], "numerator": a[0],
                                      "denominator": b[0]}
            elif a[0] == b[0] and a[2] == b[2] and b[1] == "weights-only" and a[1] in ACTIVATION_PATHS:
                kind, who = "difference", {"figure": "mean_kld_difference", "candidate": a[0], "length": a[2],
                                           "minuend": a[1], "subtrahend": b[1]}
            else:
                continue
            f = figs[a]
            for name in fmt.NAMES:
                if name in sums[a] and name in sums[b]:
                    (s1, n1), (s2, n2) = sums[a][name], sums[b][name]
                    out.append({"class": name, **who, **paired_interval(
                        kind, s1, n1, s2, n2, f.counts, f.strata, confidence=f.confidence, seed=f.seed,
                        mover=kind == "difference", **VARIANT)})
    return out


def class_report(sets: list[Any], figs: dict[tuple[str, str, int], SetFigures], windows: dict[str, Any] | None) -> dict[str, Any]:
    """The ``token_classes`` block of report.json (``status: not_measured`` with its reason when there are no classes)."""
    tc, block = load(windows)
    if tc is None:
        return block
    results, sums = [], {}
    for rs in sets:
        f = figs[rs.key]
        per, sums[rs.key] = set_block(f, row_bits(rs, tc))
        results.append({"candidate": rs.candidate, "path": rs.path, "length": rs.length, "rows": rs.rows, "classes": per})
    return block | {"results": results, "comparisons": _pairs(figs, sums)}
