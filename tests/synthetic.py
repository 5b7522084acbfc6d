"""Synthetic per-token records, written exactly per the records contract, for the report and card tests.

Windows differ in difficulty (a per-window log-normal factor shared by every candidate, path and length,
as real windows are), so cluster intervals are wider than token ones and ratios of builds are tight.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from fideval.formats.ids import cut_id, window_id
from fideval.fsio import write_json, write_text
from fideval.windows.layout import token_sha256


def window_ids(domains: list[str], per_domain: int) -> list[tuple[str, str]]:
    return [(window_id(d, k), d) for d in domains for k in range(per_domain)]


def records_frame(
    candidate: str,
    path: str,
    length: int,
    window_tokens: int,
    windows: list[tuple[str, str]],
    *,
    effect: float = 1.0,
    seed: int = 0,
    vocab: int = 4096,
):
    """A polars DataFrame of records for one (candidate, path, length)."""
    import polars as pl

    cuts = window_tokens // length
    wrng = np.random.default_rng(seed)
    difficulty = wrng.lognormal(0.0, 0.5, len(windows))
    ref_skill = wrng.uniform(0.35, 0.75, len(windows))
    rng = np.random.default_rng([seed, zlib.crc32(f"{candidate}/{path}/{length}".encode())])
    parts = []
    rows = length - 1
    for (wid, dom), diff, skill in zip(windows, difficulty, ref_skill):
        for j in range(cuts):
            seq = wid if cuts == 1 else cut_id(wid, j)
            pos = np.arange(rows, dtype=np.int32)
            early = 1.0 + 2.0 / np.sqrt(1.0 + pos)
            kld = 0.01 * effect * diff * early * rng.gamma(0.4, 2.5, rows)
            p1 = np.clip(rng.beta(4 * skill, 4 * (1 - skill), rows), 1e-3, 1.0)
            ref_correct = rng.random(rows) < p1
            top1 = rng.random(rows) > np.minimum(0.6, 3.0 * kld) * (1.2 - p1)
            nll_ref = -np.log(np.where(ref_correct, p1, p1 * rng.uniform(0.01, 0.9, rows)))
            nll_cand = nll_ref + kld * rng.normal(1.0, 0.3, rows)
            parts.append(
                pl.DataFrame(
                    {
                        "candidate": [candidate] * rows,
                        "path": [path] * rows,
                        "length": np.full(rows, length, np.int32),
                        "seq_id": [seq] * rows,
                        "window_id": [wid] * rows,
                        "domain": [dom] * rows,
                        "position": pos,
                        "token": rng.integers(0, vocab, rows, dtype=np.int32),
                        "kld": kld,
                        "rkld": kld * rng.uniform(0.8, 1.2, rows),
                        "top1": top1,
                        "top5": top1 | (rng.random(rows) < 0.9),
                        "top10": top1 | (rng.random(rows) < 0.95),
                        "nll_ref": nll_ref,
                        "nll_cand": nll_cand,
                        "dp": np.exp(-nll_cand) - np.exp(-nll_ref),
                        "entropy_ref": rng.uniform(0.0, 5.0, rows),
                        "p1_ref": p1,
                        "ref_correct": ref_correct,
                    }
                )
            )
    return pl.concat(parts)


def write_records(
    folder: str | Path,
    df,
    candidate: str,
    path: str,
    length: int,
    *,
    self_check=None,
    cpu_diff: float = 1e-13,
    store: str = "store",
    model_id: str = "fideval/demo-moe",
    candidate_info: dict | None = None,
) -> Path:
    """records.parquet + score.json for one frame; returns the folder."""
    from fideval.fsio import atomic_path

    folder = Path(folder)
    with atomic_path(folder / "records.parquet") as tmp:
        df.write_parquet(tmp)
    write_json(
        folder / "score.json",
        {
            "format": "fideval.score",
            "version": 1,
            "candidate": candidate,
            "path": path,
            "length": length,
            "rows": df.height,
            "teacher": {
                "store": f"{store}-{length}",
                "model_id": model_id,
                "model_revision": "0" * 40,
                "manifest_sha256": "a" * 64,
                "kind": "logits",
            },
            "candidate_info": candidate_info,
            "cpu_check": {"rows_checked": 80, "max_rel_diff": cpu_diff, "tolerance": 2e-12},
            "self_check": self_check,
            "nonfinite_rows": 0,
            "device": "cpu",
            "kernel": "torch",
            "tool": {"name": "fideval", "version": "0.1.0", "git_commit": None, "python": "3.11"},
        },
    )
    return folder


def write_eval_windows(folder: str | Path, windows: list[tuple[str, str]], window_tokens: int) -> Path:
    """An eval-windows.json with a token SHA-256 per window (tokens made up from the window id)."""
    entries = []
    for wid, dom in windows:
        toks = np.frombuffer(wid.encode().ljust(64, b"."), dtype=np.uint8).astype(np.int32)
        entries.append(
            {"id": wid, "domain": dom, "tokens": window_tokens, "token_sha256": token_sha256(toks)}
        )
    doms = sorted({d for _, d in windows})
    obj = {
        "format": "fideval.eval-windows",
        "version": 1,
        "windows": entries,
        "domains": {d: {"source": {"type": "hf", "id": f"org/{d}", "revision": "1" * 40}} for d in doms},
    }
    path = Path(folder) / "eval-windows.json"
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
    return path
