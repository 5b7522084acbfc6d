"""The field tables of ``docs/formats*.md``, generated from the file models so the docs cannot drift.

A table sits between ``<!-- fields:NAME -->`` and ``<!-- /fields -->`` lines; everything between them is
replaced by :data:`TABLES`' rendering of NAME. ``python -m fideval.formats.docs`` rewrites the docs;
``--check`` only reports the stale ones (exit 1), as ``tests/test_formats_docs.py`` does.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from fideval.errors import FidevalError
from fideval.formats import comparison, records, report, score, store, windows
from fideval.formats.model import fields_table

DOCS = Path(__file__).resolve().parents[2] / "docs"
_MODELS = {
    "score": score.ScoreSummary, "score.teacher": score.TeacherRef, "score.cpu_check": score.CpuCheck,
    "score.self_check": score.SelfCheck, "score.profile": score.RunProfile,
    "store": store.StoreManifest, "store.shard": store.ShardEntry,
    "eval-windows": windows.EvalWindows, "eval-windows.windows_config": windows.WindowsSettings,
    "eval-windows.window": windows.Window, "eval-windows.document": windows.Document,
    "eval-windows.replacement": windows.Replacement, "eval-windows.cut": windows.Cut,
    "report-windows": windows.Listing, "report-windows.window": windows.WindowRef,
    "report": report.Report, "report.settings": report.Settings, "report.provenance": report.Provenance,
    "report.dataset": report.Dataset, "report.dataset.window": report.DatasetWindow,
    "report.input": report.Input, "report.part": report.Part, "report.result": report.Result,
    "report.gates": report.Gates, "report.plot": report.Plot,
    "comparison": comparison.Comparison, "comparison.settings": comparison.Settings,
    "comparison.build": comparison.Build, "comparison.pair": comparison.Pair, "comparison.family": comparison.Family,
    "comparison.interval": comparison.Interval,
}
TABLES: dict[str, Callable[[], str]] = {name: (lambda m=m: fields_table(m)) for name, m in _MODELS.items()}
TABLES["records"] = records.columns_table
_BLOCK = re.compile(r"(<!-- fields:([\w.-]+) -->\n)(.*?)(<!-- /fields -->)", re.S)


def render(text: str, origin: str = "the text") -> str:
    """``text`` with every marked block's content replaced by its table; an unknown name is an error."""
    def table(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise FidevalError(f"{origin}: unknown table 'fields:{m.group(2)}'",
                               hint=f"one of {', '.join(sorted(TABLES))}")
        return f"{m.group(1)}{TABLES[m.group(2)]()}\n{m.group(4)}"
    return _BLOCK.sub(table, text)


def names(text: str) -> list[str]:
    """The table names marked in ``text``, in order."""
    return [m.group(2) for m in _BLOCK.finditer(text)]


def stale(docs: Path = DOCS) -> list[Path]:
    """The ``formats*.md`` files whose tables are not what the models give."""
    if not any(docs.glob("formats*.md")):
        raise FidevalError(f"no formats*.md in {docs}", hint="run it in a fideval checkout, or pass --docs")
    return [p for p in sorted(docs.glob("formats*.md")) if render(p.read_text(encoding="utf-8"), str(p)) !=
            p.read_text(encoding="utf-8")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fideval.formats.docs", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the docs folder (default: the checkout's)")
    args = ap.parse_args(argv)
    try:
        old = stale(args.docs)
        if not args.check:
            for p in old:
                p.write_text(render(p.read_text(encoding="utf-8"), str(p)), encoding="utf-8")
    except FidevalError as e:
        print(f"fideval: error: {e.line()}", file=sys.stderr)
        return 2
    for p in old:
        print(f"{p}: {'stale (run: python -m fideval.formats.docs)' if args.check else 'regenerated'}")
    return 1 if args.check and old else 0


if __name__ == "__main__":
    sys.exit(main())
