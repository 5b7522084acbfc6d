"""Report plots (matplotlib, Agg, PNG) written to plots/ beside report.json and linked from the card.

Per records set (candidate, path, length):
  ``kld-cdf-*.png``         empirical CDF of per-token KLD per domain on a log x axis — where the mean hides
                            a heavy tail, the CDF shows which domain carries it;
  ``kld-position-*.png``    mean KLD by position bucket with its default interval (cluster bootstrap-t);
  ``top1-confidence-*.png`` top-1 agreement by reference top-1 probability bucket (default interval): a
                            good build loses agreement only where the reference itself is unsure.
PNG metadata carries no software version or date (``metadata={"Software": None}``), so the same report
gives byte-identical files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.fsio import atomic_path
from fideval.report.figures import SetFigures

_CDF_POINTS = 2000


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)


def _stem(f: SetFigures) -> str:
    return f"{f.rs.candidate}-{f.rs.path}-{f.rs.length}"


def _yerr(est: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """Error bars of intervals [lo, hi] around ``est``: a missing end (NaN) draws no bar on its side, and an
    interval collapsed to its estimate (few windows) draws none either, where rounding put an end a few ulps on
    the wrong side (matplotlib refuses negative bars)."""
    return [np.maximum(est - lo, 0.0), np.maximum(hi - est, 0.0)]


def _title(f: SetFigures, what: str) -> str:
    return f"{what} — {f.rs.candidate}, {f.rs.path}, {f.rs.length} tokens"


def kld_cdf(f: SetFigures, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    kld, dom = f.rs.cols["kld"], f.rs.cols["domain"].astype(str)
    floor = max(float(kld[kld > 0].min()) if (kld > 0).any() else 1e-12, 1e-12)
    for d in f.domains:
        x = np.sort(kld[dom == d])
        if x.size == 0:
            continue
        idx = np.unique(np.linspace(0, x.size - 1, min(_CDF_POINTS, x.size)).astype(np.int64))
        ax.plot(np.maximum(x[idx], floor), (idx + 1) / x.size, label=f"{d} ({x.size:,} rows)", lw=1.3)
    ax.set_xscale("log")
    pos = kld[kld > 0]
    if pos.size:
        ax.set_xlim(left=max(floor, float(np.quantile(pos, 0.001))))
    ax.set_xlabel("KLD(P_ref || P_cand), nats")
    ax.set_ylabel("fraction of tokens <= x")
    ax.set_title(_title(f, "Per-token KLD CDF by domain"), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    _save(fig, path)


def kld_position(f: SetFigures, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    pts = [(p["start"], p["end"], p["mean_kld"]) for p in f.result["positions"] if p["mean_kld"] is not None]
    mid = np.array([(a + b - 1) / 2 if b - a > 1 else a for a, b, _ in pts], dtype=np.float64)
    est = np.array([m["estimate"] for _, _, m in pts])
    lo = np.array([np.nan if m["ci"][0] is None else m["ci"][0] for _, _, m in pts], dtype=np.float64)
    hi = np.array([np.nan if m["ci"][1] is None else m["ci"][1] for _, _, m in pts], dtype=np.float64)
    ax.errorbar(np.maximum(mid, 0.5), est, yerr=_yerr(est, lo, hi), fmt="o-", capsize=3, lw=1.3)
    ax.set_xscale("log")
    ax.set_xlabel("position in sequence (bucket middle)")
    ax.set_ylabel("mean KLD, nats (cluster bootstrap-t 95 %)")
    ax.set_title(_title(f, "Mean KLD by position"), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def top1_confidence(f: SetFigures, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    b = [c for c in f.result["confidence_buckets"] if c["top1"] is not None]
    labels = [f"{c['p1_low']:g}-{c['p1_high']:g}" for c in b]
    est = np.array([c["top1"]["estimate"] for c in b])
    lo = np.array([np.nan if c["top1"]["ci"][0] is None else c["top1"]["ci"][0] for c in b], dtype=np.float64)
    hi = np.array([np.nan if c["top1"]["ci"][1] is None else c["top1"]["ci"][1] for c in b], dtype=np.float64)
    x = np.arange(len(b))
    ax.errorbar(x, est, yerr=_yerr(est, lo, hi), fmt="o-", capsize=3, lw=1.3)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_xlabel("reference top-1 probability")
    ax.set_ylabel("top-1 agreement (cluster bootstrap-t 95 %)")
    ax.set_title(_title(f, "Top-1 agreement by reference confidence"), fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


PLOTS_DIR = "plots"  # one folder, so the workflow can declare it as an output for `snakemake --report`
PLOTS = (("kld-cdf", kld_cdf), ("kld-position", kld_position), ("top1-confidence", top1_confidence))


def write_plots(figures: list[SetFigures], out_dir: str | Path) -> list[dict[str, Any]]:
    """Write every plot; returns report.json's ``plots`` list (file names relative to the report folder)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    (out / PLOTS_DIR).mkdir(parents=True, exist_ok=True)
    listed = []
    with plt.rc_context({"font.size": 9}):
        for f in figures:
            for kind, fn in PLOTS:
                name = f"{PLOTS_DIR}/{kind}-{_stem(f)}.png"
                fn(f, out / name)
                listed.append(
                    {
                        "file": name,
                        "kind": kind,
                        "candidate": f.rs.candidate,
                        "path": f.rs.path,
                        "length": f.rs.length,
                    }
                )
    return listed
