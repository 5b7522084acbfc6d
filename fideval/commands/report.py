"""``fideval report``, ``fideval card`` and ``fideval check``: records -> report.json -> README.md, and gates."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options


def report(
    records: Annotated[list[Path], typer.Option(
        "--records", help="records folder (records.parquet + score.json), or its records.parquet; repeat for each")],
    out: Annotated[Path, options.out("report folder: report.json, summary-*.json, *.png")],
    windows: Annotated[Path | None, typer.Option("--windows", help="eval-windows.json (token SHA-256 per window), or its folder")] = None,
    config: Annotated[Path | None, options.config("config YAML: report settings, gates, model ids")] = None,
    self_check: Annotated[list[Path], typer.Option("--self-check", help="records of the teacher scored against itself (repeatable)")] = [],
    noise_floor: Annotated[list[Path], typer.Option(
        "--noise-floor", help="records of the reference scored against itself under a harmless change (another "
        "micro-batch or thread count): the noise floor (repeatable)")] = [],
    teacher_manifest: Annotated[list[Path], typer.Option(
        "--teacher-manifest", help="a logit store's manifest.json (canary); repeatable")] = [],
    resamples: Annotated[int | None, typer.Option("--resamples", min=100, help="bootstrap resamples (default: config or 10,000)")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="resampling seed (default: config or 0)")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="write the PNG plots")] = True,
    allow_partial: Annotated[bool, typer.Option(
        "--allow-partial", help="write a report whose records do not cover what the config and windows ask for, marked "
        "partial in report.json, the coverage check and the card (default: refuse it)")] = False,
) -> None:
    """Statistics of per-token records: cluster bootstrap-t intervals (BCa, Wilson beside), quantiles, comparisons,
    views, checks -> report.json."""
    from fideval.config import ReportConfig, load_config
    from fideval.report.build import build, write
    from fideval.report.inputs import load_teacher_manifest, load_windows

    cfg = load_config(config) if config is not None else None
    rc = cfg.report if cfg is not None else ReportConfig()
    upd = {k: v for k, v in (("resamples", resamples), ("seed", seed)) if v is not None}
    rc = rc.model_copy(update=upd) if upd else rc
    win = load_windows(options.folder_of(windows, "eval-windows.json")) if windows is not None else None
    built = build([str(options.folder_of(r, "records.parquet")) for r in records],
                  self_check_dirs=[str(options.folder_of(d, "records.parquet")) for d in self_check],
                  noise_dirs=[str(options.folder_of(d, "records.parquet")) for d in noise_floor], windows=win, cfg=cfg,
                  manifests=[load_teacher_manifest(m) for m in teacher_manifest], settings=rc,
                  allow_partial=allow_partial)
    path = write(built, out, plots=plots)
    failed = [c["name"] for c in built.report["checks"] if c["status"] == "fail"]
    typer.echo(f"{path}: {len(built.report['results'])} result sets, {built.report['settings']['clusters']} windows, "
               f"B={rc.resamples}" + (f"; FAILED checks: {', '.join(failed)}" if failed else ""))


def card(
    report: options.ReportFile,
    out: Annotated[Path, options.out("the model card to write, e.g. README.md")],
    candidate: Annotated[str | None, typer.Option(
        "--candidate", help="which build the card is for (needed if the report has several)")] = None,
    template: Annotated[Path | None, typer.Option("--template", help="jinja2 markdown template replacing the card body")] = None,
    registry: Annotated[str | None, typer.Option(
        "--registry", help="x_fidelity.registry: the registry the card is filed with (default: none)")] = None,
    lane: Annotated[str | None, typer.Option(
        "--lane", help="x_fidelity.lane: the registry's lane the build is filed under (default: none)")] = None,
    html: Annotated[Path | None, typer.Option(
        "--html", help="also write the card's tables as an HTML page (snakemake --report's results page)")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="replace --out (and --html) even when it is not a card fideval wrote (e.g. a project's README)")] = False,
    comparison: Annotated[Path | None, typer.Option(
        "--comparison", help="comparison.json (fideval compare) of this build among others: adds that section")] = None,
) -> None:
    """Write the model card: model-index YAML + x_fidelity provenance + fidelity tables and plots.

    An existing --out (or --html) file is replaced only when it is a card (or results page) fideval card wrote,
    which its marker says (x_fidelity.generator: fideval card; the page's generator meta tag), or with --force."""
    from fideval.config import resolve_path
    from fideval.fsio import write_text
    from fideval.report.card import refuse_overwrite, render
    from fideval.report.schema import load_report

    refuse_overwrite(out, force=force)
    if html is not None:
        refuse_overwrite(html, force=force, page=True)
    path = report / "report.json" if report.is_dir() else report
    rep = load_report(path)
    if template is None and rep["settings"].get("card_template"):
        template = resolve_path(rep["settings"]["card_template"])
    text = render(rep, report_path=path, out_path=out, candidate=candidate, template=template, registry=registry,
                  lane=lane, comparison=comparison)
    write_text(out, text)
    typer.echo(f"{out}: model card written")
    if html is not None:
        import os

        from fideval.report.card import pick_candidate
        from fideval.report.results_page import page

        base = Path(os.path.relpath(out.resolve().parent, html.resolve().parent)).as_posix()  # the card's plots
        write_text(html, page(text, f"fideval results: {pick_candidate(rep, candidate)}", base))
        typer.echo(f"{html}: results page written")


def check(
    report: options.ReportFile,
    max_mean_kld: Annotated[float | None, typer.Option("--max-mean-kld", min=0, help="fail when a mean KLD exceeds this")] = None,
    min_top1: Annotated[float | None, typer.Option("--min-top1", min=0, max=1, help="fail when a top-1 agreement is below this")] = None,
    max_mean_kld_upper: Annotated[float | None, typer.Option(
        "--max-mean-kld-upper", min=0, help="fail when a mean KLD's upper interval bound (the default cluster "
        "bootstrap-t; a version 1 report's BCa) exceeds this")] = None,
    min_top1_lower: Annotated[float | None, typer.Option(
        "--min-top1-lower", min=0, max=1, help="fail when a top-1 agreement's lower interval bound (the default cluster "
        "bootstrap-t; a version 1 report's Wilson) is below this")] = None,
    allow_not_run: Annotated[list[str], typer.Option(
        "--allow-not-run", help="a check that may be not_run (repeatable; 'all' for every one); else not_run fails")] = [],
    config: Annotated[Path | None, options.config("take the gates from this config's report.gates")] = None,
    out: Annotated[Path | None, options.out("also write the verdict (one line per failure, or 'ok') here")] = None,
) -> None:
    """Exit non-zero when an integrity check failed or did not run, or a fidelity gate is exceeded (one line each).

    Gates: the options, else --config's report.gates, else the gates recorded in the report; a check that did
    not run fails unless --allow-not-run names it."""
    from fideval.config import load_config
    from fideval.fsio import write_text
    from fideval.report.schema import load_report
    from fideval.report.verdict import Bounds, failures

    rep = load_report(report)
    gates = load_config(config).report.gates if config is not None else None
    if gates is not None:
        max_mean_kld = max_mean_kld if max_mean_kld is not None else gates.mean_kld_max
        min_top1 = min_top1 if min_top1 is not None else gates.top1_min
    lines = [f"FAIL {line}" for line in failures(rep, max_mean_kld=max_mean_kld, min_top1=min_top1,
                                                 bounds=Bounds(max_mean_kld_upper, min_top1_lower),
                                                 allow_not_run=allow_not_run)]
    n = sum(c["status"] == "pass" for c in rep["checks"])
    skipped = sum(c["status"] == "not_run" for c in rep["checks"])
    verdict = lines or [f"{report}: ok ({n} checks passed" + (f", {skipped} not run (allowed)" if skipped else "")
                        + f", {len(rep['results'])} result sets within the gates)"]
    if out is not None:
        write_text(out, "\n".join(verdict) + "\n")
    for line in lines:
        typer.echo(line, err=True)
    if lines:
        raise typer.Exit(1)
    typer.echo(verdict[0])
