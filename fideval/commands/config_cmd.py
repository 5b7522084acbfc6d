"""``fideval validate`` and ``fideval schema``: check a config before a long run; emit its JSON schema."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options
from fideval.errors import FidevalError
from fideval.validate import Problem


def validate(config: Annotated[Path, typer.Argument(help="YAML config to check")]) -> None:
    """Check a config before a long run: unknown keys, bad values, missing files, and what the stages would
    refuse later (quant specs, module classes, architecture, missing shards, lengths past the model's positions,
    real builds, tokenizer and its size, model parallel, disk with the noise floor); notes on too few windows."""
    from fideval.config import load_config
    from fideval.validate import check_config

    cfg = load_config(config)
    found = check_config(cfg)
    for note in found.notes:
        typer.echo(f"{config}: note: {note}", err=True)
    for fact in found.facts:
        typer.echo(f"{config}: {fact}")
    problems = found.problems
    if len(problems) == 1:
        p = problems[0]
        raise FidevalError(f"{config}: {Problem(p.key, p.message).line()}", hint=p.hint)
    if problems:
        for p in problems:
            typer.echo(f"{config}: {p.line()}", err=True)
        raise FidevalError(f"{config}: {len(problems)} problems (listed above)", hint="fix each key named above")
    typer.echo(f"{config}: ok (run '{cfg.run}', {len(cfg.domains)} domains, {len(cfg.candidates)} candidates)")


def schema(
    out: Annotated[Path | None, options.out("write here instead of stdout")] = None,
    format: Annotated[str, typer.Option("--format", help="json (for Snakemake) or markdown (docs/config.md)")] = "json",
) -> None:
    """Print the config's JSON schema or its markdown reference (both generated from fideval/config.py)."""
    import json

    from fideval.config import json_schema, markdown_reference
    from fideval.fsio import write_text

    if format not in ("json", "markdown"):
        raise FidevalError(f"unknown --format {format!r}", hint="use json or markdown")
    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n" if format == "json" else markdown_reference()
    if out is None:
        typer.echo(text, nl=False)
    else:
        write_text(out, text)
