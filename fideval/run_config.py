"""The config a Snakemake run evaluates: its ``--configfile`` with any ``--config`` overrides, in one file.

Every stage reads its config file itself (each rule passes ``--config FILE``), so Snakemake's in-memory
``config`` is not what the stages see. Two things went wrong with that: ``snakemake --config run=mytest``
was dropped silently, and ``--configfile X`` ran the Snakefile's default config (Snakemake lists the
``configfile:`` directive's file last, and the workflow took the last one). Here:

* the file is the last ``--configfile`` given on the command line, else the directive's;
* several ``--configfile`` files and ``--config`` overrides are merged as Snakemake merges them (nested
  mappings key by key, later wins) and checked by the config model: a problem is one line naming the file
  and the overrides, e.g. ``configs/demo.yaml with --config runn=x: unknown key 'runn'``;
* a merged config is written to ``results/<run>/config.yaml`` (only when its content changes, so an
  unchanged rerun triggers nothing) and that file is what the rules hand the stages.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from fideval.config import Config, load_config, parse_config, read_yaml
from fideval.errors import FidevalError

HINT = "see docs/config.md; 'fideval schema' prints the JSON schema"


def _read(path: Path) -> dict[str, Any]:
    data = read_yaml(path)  # load_config's reader: the same one-line errors, keys given twice and deep nesting refused
    if not isinstance(data, dict):
        raise FidevalError(f"{path}: the config must be a mapping of keys to values", hint=HINT)
    return data


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory when inside it (Snakemake makes --configfile absolute)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()) if path.is_absolute() else path
    except ValueError:
        return path


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` over ``base``, nested mappings merged key by key (Snakemake's ``update_config``)."""
    out = copy.deepcopy(base)
    for k, v in update.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def resolve(cli_files: list[Any], overrides: dict[str, Any], directive_files: list[Any],
            args: list[str] | None = None) -> tuple[str, Config]:
    """(the config file the stages read, its model). ``cli_files``: ``--configfile`` paths; ``overrides``:
    ``--config`` as Snakemake parsed it (``args``: as typed); ``directive_files``: the Snakefile's."""
    files = [_shown(Path(f)) for f in (cli_files or directive_files[-1:])]
    if not files:
        raise FidevalError("no config file", hint="give one with --configfile configs/X.yaml")
    if len(files) == 1 and not overrides:
        try:
            return str(files[0]), load_config(files[0])
        except FidevalError as e:
            raise FidevalError(e.message, hint=HINT) from None
    data: dict[str, Any] = {}
    for f in files:
        data = merge(data, _read(f))
    data = merge(data, dict(overrides))
    given = " ".join(args) if args else " ".join(f"{k}={v}" for k, v in overrides.items())
    origin = " + ".join(str(f) for f in files) + (f" with --config {given}" if overrides else "")
    try:
        cfg = parse_config(data, origin=origin)
    except FidevalError as e:
        raise FidevalError(e.message, hint=HINT) from None
    path = Path("results") / cfg.run / "config.yaml"
    text = (f"# The config of run {cfg.run!r}: {origin}.\n# Written by the workflow (fideval/run_config.py); "
            f"the stages read this file.\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    try:
        same = path.read_text(encoding="utf-8") == text
    except OSError:
        same = False
    if not same:
        from fideval.fsio import write_text

        write_text(path, text)
    return str(path), cfg
