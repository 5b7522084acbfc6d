"""``fideval screen``'s library side: re-screen built windows against the configured calibration data and
report each window's overlap beside the one recorded when it was built (writes nothing).

The windows are all known up front, so every one is queued and one calibration pass resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fideval.config import Config, resolve_path
from fideval.errors import FidevalError
from fideval.windows.encode import Encoder, load_tokenizer
from fideval.windows.layout import length_dir, read_sequences
from fideval.windows.screen.stage import Screen


@dataclass(frozen=True)
class ScreenRow:
    """One window's overlap now, and as recorded in eval-windows.json (``None``: none recorded)."""

    id: str
    ngrams: int
    matched: int
    fraction: float
    recorded: float | None
    fails: bool  # above the configured max_window_fraction


@dataclass(frozen=True)
class ScreenSummary:
    limit: float  # screen.max_window_fraction
    unit: str
    ngram: int
    documents: int  # calibration documents read


def rescreen(cfg: Config, windows_dir: Path) -> tuple[list[ScreenRow], ScreenSummary | None]:
    """Every window of ``windows_dir`` (written by ``fideval windows``) screened against ``cfg``'s
    calibration: (one row a window, in eval-windows.json's order; the summary, or ``None`` when no
    calibration is configured and nothing was screened)."""
    from fideval.windows.records import read_eval_windows  # records imports the stage below this package, not this

    rec = read_eval_windows(windows_dir)
    seqs = read_sequences(length_dir(windows_dir, "windows", rec["windows_config"]["window_tokens"]))
    tok_dir = resolve_path(cfg.model.tokenizer or cfg.model.path)
    enc = Encoder(load_tokenizer(tok_dir, cfg.model.trust_remote_code), rec["windows_config"]["separator"])
    scr = Screen.from_config(cfg.screen, enc)
    if scr is None:
        return [], None
    tokens = dict(zip(seqs.ids, seqs.tokens))
    segments = {}
    for w in rec["windows"]:
        if w["id"] not in tokens:
            raise FidevalError(f"{windows_dir}: window {w['id']} is in eval-windows.json but not in the token file",
                               hint="rebuild the windows")
        t = tokens[w["id"]]
        segments[w["id"]] = [t[a:b] for a, b in (d["tokens"] for d in w["documents"]) if b > a]
        scr.of_segments(segments[w["id"]])  # queues its n-grams
    scr.resolve()
    limit = cfg.screen.max_window_fraction
    rows = []
    for w in rec["windows"]:
        ov = scr.of_segments(segments[w["id"]])
        rows.append(ScreenRow(id=w["id"], ngrams=ov.total, matched=ov.matched, fraction=ov.fraction,
                              recorded=w["overlap"]["fraction"] if w.get("overlap") else None,
                              fails=ov.fraction > limit))
    return rows, ScreenSummary(limit=limit, unit=cfg.screen.unit, ngram=cfg.screen.ngram, documents=scr.documents)


def report_lines(rows: list[ScreenRow], summary: ScreenSummary | None) -> list[str]:
    """The report as ``fideval screen`` prints it: a table of windows, then one summary line."""
    if summary is None:
        return ["screen: skipped (no screen.calibration configured)"]
    lines = [f"{'window':<24} {'ngrams':>8} {'matched':>8} {'fraction':>9}  recorded  verdict"]
    for r in rows:
        recorded = "-" if r.recorded is None else f"{r.recorded:.4f}"
        lines.append(f"{r.id:<24} {r.ngrams:>8} {r.matched:>8} {r.fraction:>9.4f}  {recorded:>8}  "
                     f"{'FAIL' if r.fails else 'ok'}")
    lines.append(f"screen: {sum(r.fails for r in rows)} of {len(rows)} windows above {summary.limit:.1%} "
                 f"({summary.unit} {summary.ngram}-grams, {summary.documents} calibration documents)")
    return lines
