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
    from fideval.config import load_config, resolve_path
    from fideval.windows.encode import Encoder, load_tokenizer
    from fideval.windows.layout import length_dir, read_sequences
    from fideval.windows.records import read_eval_windows
    from fideval.windows.screen import Screen

    cfg = load_config(config)
    rec = read_eval_windows(windows_dir)
    seqs = read_sequences(length_dir(windows_dir, "windows", rec["windows_config"]["window_tokens"]))
    tok_dir = resolve_path(cfg.model.tokenizer or cfg.model.path)
    enc = Encoder(load_tokenizer(tok_dir, cfg.model.trust_remote_code), rec["windows_config"]["separator"])
    # the windows are all known up front: queue them all, then one calibration pass
    scr = Screen.from_config(cfg.screen, enc)
    if scr is None:
        typer.echo("screen: skipped (no screen.calibration configured)")
        return
    rows = {i: t for i, t in zip(seqs.ids, seqs.tokens)}
    segments = {}
    for w in rec["windows"]:
        if w["id"] not in rows:
            raise FidevalError(f"{windows_dir}: window {w['id']} is in eval-windows.json but not in the token file",
                               hint="rebuild the windows")
        t = rows[w["id"]]
        segments[w["id"]] = [t[a:b] for a, b in (d["tokens"] for d in w["documents"]) if b > a]
        scr.of_segments(segments[w["id"]])  # queues its n-grams
    scr.resolve()
    limit = cfg.screen.max_window_fraction
    fails = 0
    typer.echo(f"{'window':<24} {'ngrams':>8} {'matched':>8} {'fraction':>9}  recorded  verdict")
    for w in rec["windows"]:
        ov = scr.of_segments(segments[w["id"]])
        fails += ov.fraction > limit
        old = w["overlap"]["fraction"] if w.get("overlap") else None
        typer.echo(f"{w['id']:<24} {ov.total:>8} {ov.matched:>8} {ov.fraction:>9.4f}  "
                   f"{'-' if old is None else f'{old:.4f}':>8}  {'FAIL' if ov.fraction > limit else 'ok'}")
    typer.echo(f"screen: {fails} of {len(rec['windows'])} windows above {limit:.1%} "
               f"({cfg.screen.unit} {cfg.screen.ngram}-grams, {scr.documents} calibration documents)")
