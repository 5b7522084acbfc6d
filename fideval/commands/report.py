"""``fideval report``, ``fideval card`` and ``fideval check``: records -> report.json -> README.md, and gates."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        records: list[Path] = typer.Option(
            ..., "--records", help="records folder (records.parquet + score.json); repeat for each"
        ),
        out: Path = typer.Option(..., "--out", help="report folder: report.json, summary-*.json, *.png"),
        windows: Path = typer.Option(
            None, "--windows", help="folder with eval-windows.json (token SHA-256 per window)"
        ),
        config: Path = typer.Option(None, "--config", help="config YAML: report settings, gates, model ids"),
        self_check: list[Path] = typer.Option(
            [], "--self-check", help="records of the teacher scored against itself (repeatable)"
        ),
        teacher_manifest: list[Path] = typer.Option(
            [], "--teacher-manifest", help="a logit store's manifest.json (canary); repeatable"
        ),
        resamples: int = typer.Option(
            None, "--resamples", min=100, help="bootstrap resamples (default: config or 10,000)"
        ),
        seed: int = typer.Option(None, "--seed", help="resampling seed (default: config or 0)"),
        plots: bool = typer.Option(True, "--plots/--no-plots", help="write the PNG plots"),
    ) -> None:
        """Statistics of per-token records: cluster BCa, Wilson, quantiles, breakdowns, checks -> report.json."""
        from fideval.config import ReportConfig, load_config
        from fideval.report.build import build, write
        from fideval.report.inputs import load_teacher_manifest, load_windows

        cfg = load_config(config) if config is not None else None
        rc = cfg.report if cfg is not None else ReportConfig()
        upd = {k: v for k, v in (("resamples", resamples), ("seed", seed)) if v is not None}
        if upd:
            rc = rc.model_copy(update=upd)
        win = load_windows(windows) if windows is not None else None
        mans = [load_teacher_manifest(m) for m in teacher_manifest]
        built = build(
            [str(r) for r in records],
            self_check_dirs=[str(d) for d in self_check],
            windows=win,
            cfg=cfg,
            manifests=mans,
            settings=rc,
        )
        path = write(built, out, plots=plots)
        failed = [c["name"] for c in built.report["checks"] if c["status"] == "fail"]
        typer.echo(
            f"{path}: {len(built.report['results'])} result sets, {built.report['settings']['clusters']} windows, "
            f"B={rc.resamples}" + (f"; FAILED checks: {', '.join(failed)}" if failed else "")
        )

    @app.command()
    def card(
        report: Path = typer.Argument(..., help="report.json (or its folder)"),
        out: Path = typer.Option(..., "--out", help="the model card to write, e.g. README.md"),
        candidate: str = typer.Option(
            None, "--candidate", help="which build the card is for (needed if the report has several)"
        ),
        template: Path = typer.Option(
            None, "--template", help="jinja2 markdown template replacing the card body"
        ),
    ) -> None:
        """Write the model card: model-index YAML + x_fidelity provenance + fidelity tables and plots."""
        from fideval.fsio import write_text
        from fideval.report.card import render
        from fideval.report.schema import load_report

        path = report / "report.json" if report.is_dir() else report
        rep = load_report(path)
        if template is None:
            from fideval.config import resolve_path

            t = rep["settings"].get("card_template")
            template = resolve_path(t) if t else None
        write_text(out, render(rep, report_path=path, out_path=out, candidate=candidate, template=template))
        typer.echo(f"{out}: model card written")

    @app.command()
    def check(
        report: Path = typer.Argument(..., help="report.json (or its folder)"),
        max_mean_kld: float = typer.Option(
            None, "--max-mean-kld", min=0, help="fail when a mean KLD exceeds this"
        ),
        min_top1: float = typer.Option(
            None, "--min-top1", min=0, max=1, help="fail when a top-1 agreement is below this"
        ),
        config: Path = typer.Option(None, "--config", help="take the gates from this config's report.gates"),
        out: Path = typer.Option(
            None, "--out", help="also write the verdict (one line per failure, or 'ok') here"
        ),
    ) -> None:
        """Exit non-zero when an integrity check failed or a fidelity gate is exceeded (one line per failure).

        Gates: the options, else --config's report.gates, else the gates recorded in the report."""
        from fideval.report.checks import gate_failures
        from fideval.report.schema import load_report

        rep = load_report(report)
        if config is not None:
            from fideval.config import load_config

            gates = load_config(config).report.gates
            max_mean_kld = max_mean_kld if max_mean_kld is not None else gates.mean_kld_max
            min_top1 = min_top1 if min_top1 is not None else gates.top1_min
        lines = [f"FAIL {line}" for line in gate_failures(rep, max_mean_kld, min_top1)]
        n = sum(c["status"] == "pass" for c in rep["checks"])
        verdict = lines or [
            f"{report}: ok ({n} checks passed, {len(rep['results'])} result sets within the gates)"
        ]
        if out is not None:
            from fideval.fsio import write_text

            write_text(out, "\n".join(verdict) + "\n")
        for line in lines:
            typer.echo(line, err=True)
        if lines:
            raise typer.Exit(1)
        typer.echo(verdict[0])
