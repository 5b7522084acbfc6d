"""``fideval compare`` and ``fideval plan``: many builds at once (comparison.json), and how many windows to score."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options
from fideval.errors import FidevalError

Path_ = Annotated[str | None, typer.Option("--path", help="the path to compare: serving, weights-only or store "
                                           "(needed when the reports hold several)")]
Length = Annotated[int | None, typer.Option("--length", help="the sequence length (needed when the reports hold several)")]


def _sizes(given: list[str]) -> dict[str, float]:
    out = {}
    for item in given:
        name, sep, value = item.rpartition("=")
        try:
            out[name] = float(value)
        except ValueError:
            name = ""
        if not sep or not name or not out.get(name, 0) > 0:
            raise FidevalError(f"--size {item!r} is not NAME=BITS_PER_WEIGHT", hint="e.g. --size q4k=4.85")
    return out


def compare(
    out: Annotated[Path, options.out("folder for comparison.json and comparison.png")],
    reports: Annotated[list[Path] | None, typer.Argument(
        help="report.json files (or their folders) scored on the same windows")] = None,
    records: Annotated[list[Path], typer.Option(
        "--records", help="instead of reports: records folders (or their records.parquet), repeatable")] = [],
    windows: Annotated[Path | None, typer.Option(
        "--windows", help="eval-windows.json (or its folder): with --records, the windows' token SHA-256; with "
        "--unit document, the windows' documents")] = None,
    unit: Annotated[str, typer.Option(
        "--unit", help="what to resample: window, or document (windows that share a document drawn together; "
        "needs --windows)")] = "window",
    path: Path_ = None,
    length: Length = None,
    size: Annotated[list[str], typer.Option(
        "--size", help="NAME=BITS_PER_WEIGHT: a build's size, where its score.json has none (repeatable)")] = [],
    resamples: Annotated[int | None, typer.Option("--resamples", min=100, help="window resamples (default: the first report's)")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="resampling seed (default: the first report's)")] = None,
    confidence: Annotated[float | None, typer.Option(
        "--confidence", min=0.5, max=0.999, help="family-wise level (default: the first report's)")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="write comparison.png")] = True,
    html: Annotated[Path | None, typer.Option(
        "--html", help="also write the builds' table, frontier and groups as an HTML results page")] = None,
) -> None:
    """Compare many builds on the same windows and teacher: sizes, mean KLD, simultaneous pairwise intervals (max-t
    over the shared window resamples), the size/KLD frontier, the groups the data cannot separate -> comparison.json."""
    from fideval.report.compare import lines, run

    if html is not None:
        from fideval.report.card import refuse_overwrite

        refuse_overwrite(html, page=True)
    obj = run(reports or [], out, path=path, length=length, sizes=_sizes(size), resamples=resamples, seed=seed,
              confidence=confidence, plots=plots, records=[options.folder_of(r, "records.parquet") for r in records],
              windows=options.folder_of(windows, "eval-windows.json") if windows is not None else None, unit=unit)
    typer.echo(f"{out / 'comparison.json'}: " + lines(obj)[0])
    for line in lines(obj)[1:]:
        typer.echo(line)
    if html is not None:
        from fideval.fsio import write_text
        from fideval.report.card_family import results_page

        write_text(html, results_page(obj, out, html))
        typer.echo(f"{html}: results page written")


def plan(
    report: options.ReportFile,
    half_width: Annotated[float | None, typer.Option(
        "--half-width", help="target half-width of a build's interval (in the figure's units)")] = None,
    figure: Annotated[str, typer.Option("--figure", help="mean_kld or top1")] = "mean_kld",
    detect: Annotated[float | None, typer.Option(
        "--detect", help="a difference between two builds to detect: the windows that needs")] = None,
    windows: Annotated[int | None, typer.Option(
        "--windows", min=3, help="also give the half-width and minimum detectable difference at this many windows")] = None,
    power: Annotated[float, typer.Option("--power", help="power of the minimum detectable difference")] = 0.8,
    path: Path_ = None,
    length: Length = None,
    documents: Annotated[Path | None, typer.Option(
        "--documents", help="eval-windows.json (or its folder) of the report: plan in documents, windows sharing "
        "one counted as one unit (every count is then of documents)")] = None,
    as_json: options.AsJson = False,
) -> None:
    """Windows needed for a target half-width, and minimum detectable differences, per domain and overall, from a
    pilot report's between-window variance (formulas: fideval/report/plan.py, docs/formats-comparison.md)."""
    import json

    from fideval.report.plan import lines
    from fideval.report.plan import plan as make

    pl = make(report, figure=figure, half=half_width, detect=detect, windows=windows, path=path, length=length,
              power=power, documents=options.folder_of(documents, "eval-windows.json") if documents else None)
    if as_json:
        typer.echo(json.dumps(pl, indent=2, sort_keys=True))
        return
    for line in lines(pl):
        typer.echo(line)
