"""The option types the verbs share, declared once: each flag is spelled, typed and explained here.

Options that mean the same in every verb are ``Annotated`` types (``Device``, ``Kernel``, ...). ``--config``
and ``--out`` mean "this verb's config" and "this verb's output", so :func:`config` and :func:`out` make them
with the verb's own help line: ``out: Annotated[Path, options.out("records folder")]``. A parameter without a
default is required; ``= None`` makes it optional. Verb modules do not use ``from __future__ import
annotations``: typer reads these annotations at registration.
"""

from pathlib import Path
from typing import Annotated

import typer


def config(help: str) -> typer.models.OptionInfo:
    """``--config PATH``: the YAML config, as this verb uses it."""
    return typer.Option("--config", help=help)


def out(help: str) -> typer.models.OptionInfo:
    """``--out PATH``: what this verb writes."""
    return typer.Option("--out", help=help)


def folder_of(p: Path, file: str) -> Path:
    """A folder given as itself or as the named file in it (what a workflow rule declares as its input)."""
    return p.parent if p.name == file and not p.is_dir() else p


ConfigFile = Annotated[Path, typer.Argument(help="YAML config")]
ReportFile = Annotated[Path, typer.Argument(help="report.json (or its folder)")]
Windows = Annotated[Path, typer.Option("--windows", help="output folder of 'fideval windows' (or its eval-windows.json)")]
Teacher = Annotated[str, typer.Option("--teacher", help="teacher logit store: a folder or hf://datasets/ORG/NAME@REV/sub")]
Device = Annotated[str | None, typer.Option("--device", help="cpu, cuda or auto (default: the config's teacher.device, else auto)")]
Kernel = Annotated[str, typer.Option("--kernel", help="auto (triton on CUDA), triton or torch")]
AsJson = Annotated[bool, typer.Option("--json", help="print the table as JSON")]
