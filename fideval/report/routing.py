"""Routing fidelity (``fideval routes``): which experts a build picks against the teacher's picks, per MoE layer and
overall, from the routes both recorded (fideval.formats.routes, docs/formats-routes.md), into ``routing.json``
(``fideval.routing`` v1) and a per-layer plot.

Per position and MoE layer, with T and C the teacher's and the candidate's top-k expert sets and t, c their routing
weights as dense vectors over the experts (0 off the set; the weights the experts were called with, float16):

* ``exact_agreement``: T == C (as sets; the order the router gave them in does not count);
* ``jaccard``: |T & C| / |T | C|;
* ``top1``: the expert of the largest weight is the same (ties: the first in the router's order);
* ``l1_drift``: sum over experts of |t - c| (0 to 2 x the weights' sum; DeepSeek's include routed_scaling_factor);
* ``first_flip``: the share of positions whose sets first differ at this layer (``no_flip``: at none).

``overall`` pools the (position, layer) pairs of every MoE layer (first_flip: ``any_flip``, 1 - no_flip). Every
figure is a mean over positions; its interval is the report's (fideval.stats.intervals.mean_intervals: the cluster
bootstrap-t by window, domains as strata, with the cluster BCa beside it), on the logit scale for shares and the log
scale for the drift. Every position of every sequence both recorded is counted (routes exist for the last position
too, which no next-token row scores).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import routes as rf
from fideval.formats.ids import window_of

FORMAT, VERSION = "fideval.routing", 1
SHARES = ("exact_agreement", "jaccard", "top1")
FIGURES = ("exact_agreement", "jaccard", "top1", "l1_drift", "first_flip")  # per layer; overall: the first four
SCALES = {"exact_agreement": "logit", "jaccard": "logit", "top1": "logit", "l1_drift": "log", "first_flip": "logit",
          "no_flip": "logit", "any_flip": "logit"}


def token_figures(t_ids: np.ndarray, t_w: np.ndarray, c_ids: np.ndarray, c_w: np.ndarray, n_experts: int) -> dict[str, np.ndarray]:
    """Per layer and position (``[n_layers, L]``) the figures of one sequence; ids ``[n_layers, L, k]``."""
    n_l, length, k = t_ids.shape
    t_ids, c_ids = t_ids.astype(np.int64), c_ids.astype(np.int64)
    dense_t = np.zeros((n_l, length, n_experts), dtype=np.float64)
    dense_c = np.zeros_like(dense_t)
    np.put_along_axis(dense_t, t_ids, t_w.astype(np.float64), axis=2)
    np.put_along_axis(dense_c, c_ids, c_w.astype(np.float64), axis=2)
    in_t = np.zeros(dense_t.shape, dtype=bool)
    in_c = np.zeros_like(in_t)
    np.put_along_axis(in_t, t_ids, True, axis=2)
    np.put_along_axis(in_c, c_ids, True, axis=2)
    inter, union = (in_t & in_c).sum(-1), (in_t | in_c).sum(-1)
    exact = (in_t == in_c).all(-1)
    top_t = np.take_along_axis(t_ids, np.argmax(t_w.astype(np.float64), axis=2)[..., None], axis=2)[..., 0]
    top_c = np.take_along_axis(c_ids, np.argmax(c_w.astype(np.float64), axis=2)[..., None], axis=2)[..., 0]
    differs = ~exact
    first = np.where(differs.any(0), np.argmax(differs, axis=0), n_l)  # the MoE layer's position in ``layers``; n_l: none
    return {"exact_agreement": exact.astype(np.float64), "jaccard": inter / np.maximum(union, 1),
            "top1": (top_t == top_c).astype(np.float64), "l1_drift": np.abs(dense_t - dense_c).sum(-1),
            "first_flip": (first[None, :] == np.arange(n_l)[:, None]).astype(np.float64),
            "no_flip": (first == n_l).astype(np.float64)}


def _load(root: str | Path, what: str) -> tuple[Path, dict[str, Any]]:
    d, index = rf.read_index(root)
    if not index.get("sequences"):
        raise FidevalError(f"{what} {root}: its routes index lists no sequences", hint=rf.HINT)
    return d, index


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pair(teacher: str | Path, candidate: str | Path) -> tuple[Path, dict[str, Any], Path, dict[str, Any]]:
    """One (teacher routes, candidate routes) pair, opened and checked: same MoE layers, top-k and experts, and every
    sequence of the candidate's held by the teacher's."""
    td, ti = _load(teacher, "teacher")
    cd, ci = _load(candidate, "candidate")
    for key in ("layers", "top_k", "n_experts"):
        if ti.get(key) != ci.get(key):
            raise FidevalError(f"the candidate's routes have {key} {ci.get(key)}, the teacher's {ti.get(key)}",
                               hint="compare routes of builds of the same model")
    missing = sorted(set(ci["sequences"]) - set(ti["sequences"]))
    if missing:
        raise FidevalError(f"the teacher's routes lack {len(missing)} of the candidate's sequences (first: {missing[0]})",
                           hint="record the teacher's routes over the same sequences (fideval teacher --routes)")
    return td, ti, cd, ci


def figures(pairs: list[tuple[str | Path, str | Path]], *, confidence: float = 0.95, resamples: int = 2000,
            seed: int = 0, clusters: Any = None, counts: np.ndarray | None = None,
            strata: np.ndarray | None = None) -> dict[str, Any]:
    """The routing figures pooled over several (teacher routes, candidate routes) pairs (a report's: one pair per
    domain's records folder): every sequence of every candidate counted once, windows as clusters, domains as strata.

    ``clusters``/``counts``/``strata``: the report's windows, its one resample matrix and each window's domain code
    (a window the routes hold must be one of them); without them the windows of the routes themselves, the domain
    being the window id's prefix, resampled ``resamples`` times from ``seed``."""
    from fideval.stats.clusters import Clusters, resample_counts
    from fideval.stats.intervals import mean_intervals

    opened = [_pair(t, c) for t, c in pairs]
    if not opened:
        raise FidevalError("no routes to compare", hint=rf.HINT)
    ti0 = opened[0][1]
    for _, ti, _, _ in opened[1:]:
        for key in ("layers", "top_k", "n_experts"):
            if ti.get(key) != ti0.get(key):
                raise FidevalError(f"routes pooled into one figure have {key} {ti.get(key)} and {ti0.get(key)}",
                                   hint="pool the routes of one model's runs")
    seqs: dict[str, tuple[Path, Path]] = {}
    for td, _, cd, ci in opened:
        for s in sorted(ci["sequences"]):
            if s in seqs:
                raise FidevalError(f"sequence {s} has routes in both {seqs[s][1]} and {cd}", hint="give each sequence once")
            seqs[s] = (td, cd)
    if clusters is None:
        clusters = Clusters.from_pairs({window_of(s): window_of(s).rsplit("-", 1)[0] for s in seqs})
        strata = np.asarray(clusters.strata, dtype=object)
        counts = resample_counts(clusters, resamples, seed)
    code = clusters.index()
    layers, n_experts = list(ti0["layers"]), int(ti0["n_experts"])
    g, n_l = clusters.size, len(layers)
    names = list(FIGURES)
    sums = {f: np.zeros((g, n_l)) for f in names}
    tokens, no_flip = np.zeros(g), np.zeros(g)
    for s in sorted(seqs):
        td, cd = seqs[s]
        if window_of(s) not in code:
            raise FidevalError(f"{cd}: sequence {s}'s window is not among the records' windows",
                               hint="the routes must come from the run of the records beside them")
        t, c = rf.read_sequence(td / f"{s}.safetensors"), rf.read_sequence(cd / f"{s}.safetensors")
        if t["ids"].shape != c["ids"].shape:
            raise FidevalError(f"sequence {s}: the teacher's routes are {list(t['ids'].shape)}, the candidate's "
                               f"{list(c['ids'].shape)}", hint="compare routes of the same sequences")
        figs = token_figures(t["ids"], t["weights"], c["ids"], c["weights"], n_experts)
        w = code[window_of(s)]
        for f in names:
            sums[f][w] += figs[f].sum(axis=1)
        tokens[w] += t["ids"].shape[1]
        no_flip[w] += figs["no_flip"].sum()
    # columns: per layer each figure, then overall each pooled figure, then any_flip and no_flip
    per_layer_cols = [sums[f][:, j] for j in range(n_l) for f in names]
    overall_cols = [sums[f].sum(axis=1) for f in names[:4]]
    s_mat = np.stack(per_layer_cols + overall_cols + [tokens - no_flip, no_flip], axis=1)
    n_mat = np.stack([tokens] * len(per_layer_cols) + [tokens * n_l] * len(overall_cols) + [tokens, tokens], axis=1)
    scales = [SCALES[f] for _ in range(n_l) for f in names] + [SCALES[f] for f in names[:4]] + ["logit", "logit"]
    blocks = mean_intervals(s_mat, n_mat, counts, strata, scales, confidence=confidence, seed=seed)
    per_layer = [{"layer": int(layer), **{f: blocks[j * len(names) + k] for k, f in enumerate(names)}}
                 for j, layer in enumerate(layers)]
    base = n_l * len(names)
    overall = {f: blocks[base + k] for k, f in enumerate(names[:4])}
    overall["any_flip"], overall["no_flip"] = blocks[base + 4], blocks[base + 5]
    return {"layers": [int(x) for x in layers], "top_k": int(ti0["top_k"]), "n_experts": n_experts,
            "sequences": len(seqs), "windows": int((tokens > 0).sum()), "tokens": int(tokens.sum()),
            "confidence": confidence, "resamples": int(counts.shape[0]), "seed": seed, "overall": overall,
            "per_layer": per_layer}


def routing(teacher: str | Path, candidate: str | Path, *, confidence: float = 0.95, resamples: int = 2000,
            seed: int = 0) -> dict[str, Any]:
    """routing.json's content for the candidate's routes against the teacher's (the candidate's sequences, each of
    which the teacher must hold: same MoE layers, top-k and experts)."""
    td, ti, cd, ci = _pair(teacher, candidate)
    out = figures([(teacher, candidate)], confidence=confidence, resamples=resamples, seed=seed)
    return {"format": FORMAT, "version": VERSION,
            "teacher": {"routes": str(td), "index_sha256": _sha(td / rf.INDEX), "shards": ti.get("shards")},
            "candidate": {"routes": str(cd), "index_sha256": _sha(cd / rf.INDEX), "records_sha256": ci.get("records_sha256")},
            **out}


def plot(result: dict[str, Any], path: str | Path) -> None:
    """The per-layer plot: agreement shares with their intervals (left), L1 drift and first-flip share (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fideval.fsio import atomic_path

    layers = [p["layer"] for p in result["per_layer"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for f, label in (("exact_agreement", "exact top-k set"), ("jaccard", "Jaccard"), ("top1", "top-1 expert")):
        est = np.array([p[f]["estimate"] for p in result["per_layer"]])
        lo = np.array([p[f]["ci"][0] if p[f]["ci"][0] is not None else np.nan for p in result["per_layer"]])
        hi = np.array([p[f]["ci"][1] if p[f]["ci"][1] is not None else np.nan for p in result["per_layer"]])
        err = np.nan_to_num(np.stack([np.maximum(est - lo, 0), np.maximum(hi - est, 0)]))
        a.errorbar(layers, est, yerr=err, marker="o", capsize=3, label=label)
    a.set_xticks(layers)
    a.set_xlabel("layer")
    a.set_ylabel("agreement with the teacher")
    a.set_title(f"routing agreement ({int(result['confidence'] * 100)} % window intervals)")
    a.legend()
    drift = [p["l1_drift"]["estimate"] for p in result["per_layer"]]
    flips = [p["first_flip"]["estimate"] for p in result["per_layer"]]
    b.bar(layers, flips, color="tab:orange", alpha=0.6, label="route first differs here")
    b.set_xticks(layers)
    b.set_xlabel("layer")
    b.set_ylabel("share of positions")
    b2 = b.twinx()
    b2.plot(layers, drift, color="tab:red", marker="s", label="L1 drift of the weights")
    b2.set_ylabel("mean L1 drift")
    b.set_title("first-flip layer and weight drift")
    b.legend(loc="upper left")
    b2.legend(loc="upper right")
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
