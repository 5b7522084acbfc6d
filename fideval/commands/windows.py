"""``fideval windows`` (build screened evaluation windows and cuts) and ``fideval screen`` (report-only
re-screen of built windows against the configured calibration data)."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options
from fideval.errors import FidevalError


def windows(
    config: options.ConfigFile,
    out: Annotated[Path, options.out("output folder (windows-<W>/, cuts-<C>/, eval-windows.json, index.parquet)")],
    seed: Annotated[int | None, typer.Option("--seed", help="override windows.seed")] = None,
) -> None:
    """Sample, tokenize, screen and pack each domain's documents into windows, and cut them."""
    from fideval.config import load_config
    from fideval.fsio import remove_temps
    from fideval.lock import output_lock
    from fideval.windows.build import build
    from fideval.windows.records import write_outputs

    cfg = load_config(config)
    if seed is not None:
        cfg = cfg.model_copy(update={"windows": cfg.windows.model_copy(update={"seed": seed})})
    if out.exists() and not out.is_dir():
        raise FidevalError(f"--out {out} exists and is not a folder", hint="choose a folder")
    with output_lock(out, "windows"):  # a second run into the same --out is refused while this one runs
        remove_temps(out)  # temp files of a killed run (we hold the lock: nobody else is writing them)
        built, meta = build(cfg)
        rec = write_outputs(out, built, meta, cfg.windows.model_dump(mode="json"))
    scr = rec["screen"]
    note = (f"screen: {sum(len(w['replacements']) for w in rec['windows'])} windows replaced, "
            f"{sum(len(d['conversations_dropped']) for d in rec['domains'].values())} conversations dropped"
            if scr["status"] == "applied" else "screen: skipped (no calibration configured)")
    typer.echo(f"{out}: {len(built)} windows of {cfg.windows.window_tokens} tokens "
               f"({len(cfg.domains)} domains), cuts of {cfg.windows.cut_tokens}; {note}")


def screen(
    config: Annotated[Path, typer.Argument(help="YAML config (its screen section and calibration sources)")],
    windows_dir: options.Windows,
) -> None:
    """Report each window's n-gram overlap with the calibration data (writes nothing)."""
    from fideval.config import load_config
    from fideval.windows.records import EVAL_WINDOWS
    from fideval.windows.screen import report_lines, rescreen

    for line in report_lines(*rescreen(load_config(config), options.folder_of(windows_dir, EVAL_WINDOWS))):
        typer.echo(line)
