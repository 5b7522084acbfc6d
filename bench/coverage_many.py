"""Family-wise coverage of ``fideval compare``'s simultaneous intervals: K builds on the same windows, known truth.

G windows in 4 domains (equal counts; domain multipliers 0.6, 0.8, 1.2, 1.4, mean one). Window w has a
difficulty d_w ~ LogNormal(-sb^2/2, sb) shared by every build (sb = 1.0: high between-window spread) and
N_w rows, uniform in [rows/2, rows]. Build k's mean on window w is m_k c_h d_w e_kw, e_kw ~ LogNormal(-t^2/2, t)
(t = 0.3: how much builds disagree about which windows are hard), and its rows are that mean times mean-one
draws: LogNormal(-s^2/2, s), s = 2 (heavy: per-token KLD's shape), or Gamma(2, 1/2) (light). Every factor
has mean one and N_w is independent of the rest, so build k's token-weighted mean estimates m_k exactly, its
ratios m_i / m_j, its differences m_i - m_j. Some builds are equal (the same m_k): the family must not
separate them more often than its level allows.

Each replication draws the windows, one shared [B, G] count matrix (within domain, as the report), and scores
three families at the stated 95 %: every pairwise ratio (compare's ``pairs[].ratio``), every pairwise
difference (``pairs[].difference``) and every build's own mean (``mean_kld_simultaneous``); a family covers
when ALL of its intervals hold their true values at once. ``marginal`` is the same K(K-1)/2 ratio intervals
each at 95 % alone (the report's paired ratio): what a reader gets without the adjustment. The Monte Carlo
standard error of a coverage c over R replications is sqrt(c (1 - c) / R).

Top-1 agreement (``top1_sums``): build k disagrees with the reference at a known rate, through bounded mean-one
window factors, so its true agreement is known; the fourth family is every pairwise top-1 difference
(``pairs[].top1_difference``), drawn from a generator of its own so the KLD draws stay the earlier table's.

Windows sharing documents (``--per-doc 2 4``): windows i, i + 4, ... of a domain are cut from one document, which
carries 80 % of the log-variance of the window's difficulty and of the build-by-window disagreement (the top-1
difficulty is a document's Beta factor times a window's). Each replication is then scored twice on the same draws:
resampling windows (as if they were independent) and resampling documents (``fideval compare --unit document``).

    python bench/coverage_many.py --replications 400 --resamples 1000
    python bench/coverage_many.py --replications 400 --resamples 500 --tails heavy --per-doc 2 4
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.simultaneous import simultaneous_means, simultaneous_pairs

DOMAINS = ("a", "b", "c", "d")
MULT = np.array([0.6, 0.8, 1.2, 1.4])
# K builds' true mean KLD (some equal), as a published family of quants might be
SHAPES = {
    "3 builds (2 equal)": (0.02, 0.02, 0.05),
    "5 builds (3 equal)": (0.01, 0.01, 0.01, 0.02, 0.06),
    "8 builds (2+3 equal)": (0.005, 0.005, 0.01, 0.01, 0.01, 0.02, 0.04, 0.08),
}


def document_of(g: int, per_doc: int) -> np.ndarray:
    """[G] each window's document: windows i, i + 4, i + 8, ... of one domain, ``per_doc`` at a time (so a document's
    windows share the domain i % 4)."""
    return np.arange(g) % len(DOMAINS) + len(DOMAINS) * (np.arange(g) // (len(DOMAINS) * per_doc))


def _split(rng: np.random.Generator, sd: float, size, doc: np.ndarray | None, share: float) -> np.ndarray:
    """Mean-one log-normal factors of log-sd ``sd`` per window; with documents, a share ``share`` of the log-variance
    is the document's (the same for its windows) and the rest the window's."""
    if doc is None:
        return rng.lognormal(-sd * sd / 2, sd, size)
    sd_d, sd_w = sd * np.sqrt(share), sd * np.sqrt(1 - share)
    per_doc = rng.lognormal(-sd_d * sd_d / 2, sd_d, (int(doc.max()) + 1,) + tuple(size[1:]))
    return per_doc[doc] * rng.lognormal(-sd_w * sd_w / 2, sd_w, size)


def draw(means, g: int, rng: np.random.Generator, *, rows: int = 256, sb: float = 1.0, t: float = 0.3,
         tail: str = "heavy", per_doc: int = 1, share: float = 0.8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-window sums ``s [G, K]``, rows ``n [G, K]`` and each window's stratum code [G]. ``per_doc`` > 1: windows
    share documents (``document_of``), which carry ``share`` of the log-variance of the window's difficulty and of
    the build-by-window disagreement."""
    m = np.asarray(means, dtype=np.float64)
    k = m.size
    strata = np.arange(g) % len(DOMAINS)
    doc = document_of(g, per_doc) if per_doc > 1 else None
    d = _split(rng, sb, (g,), doc, share)
    e = _split(rng, t, (g, k), doc, share)
    nw = rng.integers(rows // 2, rows + 1, g)
    mu = m[None, :] * MULT[strata][:, None] * d[:, None] * e
    total = int(nw.sum())
    if tail == "heavy":
        x = rng.lognormal(-2.0, 2.0, (total, k))
    else:
        x = rng.gamma(2.0, 0.5, (total, k))
    idx = np.repeat(np.arange(g), nw)
    sums = np.zeros((g, k))
    np.add.at(sums, idx, x)
    return mu * sums, np.repeat(nw[:, None].astype(np.float64), k, axis=1), strata


def top1_sums(means, n: np.ndarray, doc: np.ndarray | None, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-window top-1 agreement sums [G, K] and the true agreements [K]. Build k disagrees with the reference at
    rate q_k = 0.02 + 2 m_k (equal mean KLD, equal top-1); on window w at q_k D_w E_kw, D_w = 2 Beta(2, 2) (per
    document where windows share them) times U(0.5, 1.5), E_kw ~ U(0.75, 1.25): bounded mean-one factors, so the
    true agreement is 1 - q_k exactly; each row agrees with probability 1 - q_kw."""
    q = 0.02 + 2.0 * np.asarray(means, dtype=np.float64)
    g, k = n.shape
    unit = doc if doc is not None else np.arange(g)
    dw = (2.0 * rng.beta(2.0, 2.0, int(unit.max()) + 1))[unit] * rng.uniform(0.5, 1.5, g)
    qkw = q[None, :] * dw[:, None] * rng.uniform(0.75, 1.25, (g, k))
    return rng.binomial(n.astype(np.int64), 1.0 - qkw).astype(np.float64), 1.0 - q


def _score(m, top1_true, s, n, t1, counts, strata, confidence, hits, prefix):
    """Add one replication's hits of every family to ``hits`` (keys prefixed by the unit)."""
    for kind, x, truth_of in (("ratio", s, lambda i, j: m[i] / m[j]), ("difference", s, lambda i, j: m[i] - m[j]),
                              ("top1", t1, lambda i, j: top1_true[i] - top1_true[j])):
        f = simultaneous_pairs("ratio" if kind == "ratio" else "difference", x, n, counts, strata, confidence=confidence)
        truth = np.array([truth_of(i, j) for i, j in f["pairs"]])
        cover = (f["ci"][:, 0] <= truth) & (truth <= f["ci"][:, 1])
        hits[prefix + kind] += bool(cover.all())
        if kind == "ratio":
            equal = np.array([m[i] == m[j] for i, j in f["pairs"]])
            hits[prefix + "equal pairs separated"] += bool((~cover & equal).any())
            st = f["stats"]
            marg = np.quantile(np.abs(st["t"]), f["level"], axis=0)
            lo, hi = np.exp(st["g"] - marg * st["se"]), np.exp(st["g"] + marg * st["se"])
            hits[prefix + "marginal"] += bool(((lo <= truth) & (truth <= hi)).all())
    mm = simultaneous_means(s, n, counts, strata, confidence=confidence)
    hits[prefix + "mean"] += bool(((mm["ci"][:, 0] <= m) & (m <= mm["ci"][:, 1])).all())


FAMILIES = ("ratio", "difference", "mean", "top1", "marginal", "equal pairs separated")


def _units(ids: list[str]) -> tuple[Clusters, np.ndarray]:
    """Clusters of ``ids`` (named ``<domain>-<k>``) and the order that sorts the simulation's arrays as they are."""
    return Clusters.from_pairs({i: i.split("-")[0] for i in ids}), np.argsort(np.array(ids))


def replicate(means, g: int, reps: int, resamples: int, seed: int, tail: str = "heavy",
              confidence: float = 0.95, per_doc: int = 1) -> dict[str, float]:
    """Family-wise coverage of each family over ``reps`` replications; with ``per_doc`` > 1 (windows sharing
    documents) twice: resampling windows (keys as they are) and documents (keys ``doc <family>``)."""
    m = np.asarray(means, dtype=np.float64)
    rng = np.random.default_rng(seed)
    top_rng = np.random.default_rng([seed, 7])  # top-1 draws apart, so the KLD draws are the table's as before
    cl, order = _units([f"{DOMAINS[i % len(DOMAINS)]}-{i:04d}" for i in range(g)])
    doc = document_of(g, per_doc) if per_doc > 1 else None
    if doc is not None:
        n_docs = int(doc.max()) + 1
        dcl, dorder = _units([f"{DOMAINS[j % len(DOMAINS)]}-{j:04d}" for j in range(n_docs)])
    hits = {p + f: 0 for p in ([""] + (["doc "] if doc is not None else [])) for f in FAMILIES}
    for r in range(reps):
        s, n, strata = draw(m, g, rng, tail=tail, per_doc=per_doc)
        t1, top1_true = top1_sums(m, n, doc, top_rng)
        counts = resample_counts(cl, resamples, seed * 100003 + r)
        _score(m, top1_true, s[order], n[order], t1[order], counts, strata[order], confidence, hits, "")
        if doc is not None:
            agg = [np.stack([np.bincount(doc, weights=x[:, j], minlength=n_docs) for j in range(x.shape[1])], 1)
                   for x in (s, n, t1)]
            dcounts = resample_counts(dcl, resamples, seed * 100003 + r)
            _score(m, top1_true, *(a[dorder] for a in agg), dcounts, (np.arange(n_docs) % len(DOMAINS))[dorder],
                   confidence, hits, "doc ")
    return {k: v / reps for k, v in hits.items()}


def _cell(args):
    name, tail, g, reps, resamples, seed, per_doc = args
    t0 = time.time()
    out = replicate(SHAPES[name], g, reps, resamples, seed, tail, per_doc=per_doc)
    return name, tail, g, reps, per_doc, out, time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replications", type=int, default=400)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--windows", type=int, nargs="+", default=[64])
    ap.add_argument("--tails", nargs="+", default=["heavy", "light"], choices=["heavy", "light"])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--per-doc", type=int, nargs="+", default=[1],
                    help="windows per document (1: none shared; 2, 4: documents resampled too)")
    args = ap.parse_args()
    cells = [(name, tail, g, args.replications, args.resamples, args.seed + 17 * i, pd)
             for pd in args.per_doc
             for i, (name, tail, g) in enumerate((n, t, g) for g in args.windows for t in args.tails for n in SHAPES)
             if name in args.shapes]
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        rows = list(ex.map(_cell, cells))
    print("| builds | rows | windows | windows a document | unit | R | ratios (simultaneous) | differences "
          "(simultaneous) | means (simultaneous) | top-1 differences (simultaneous) | ratios, each at 95 % alone "
          "| an equal pair separated |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, tail, g, reps, pd, out, _ in rows:
        for unit, p in [("window", "")] + ([("document", "doc ")] if pd > 1 else []):
            print(f"| {name} | {tail} | {g} | {pd} | {unit} | {reps} | {out[p + 'ratio']:.3f} | "
                  f"{out[p + 'difference']:.3f} | {out[p + 'mean']:.3f} | {out[p + 'top1']:.3f} | "
                  f"{out[p + 'marginal']:.3f} | {out[p + 'equal pairs separated']:.3f} |")
    print(f"\n{time.time() - t0:.0f} s on {args.jobs} processes; B = {args.resamples}, seed {args.seed}")


if __name__ == "__main__":
    main()
