"""The ``fideval`` command line: one verb per pipeline stage, each a thin call into a library function.

Heavy imports (torch, polars, datasets...) live inside the commands so that ``fideval --help`` is instant.
A :class:`~fideval.errors.FidevalError` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from fideval.errors import FidevalError

app = typer.Typer(
    name="fideval",
    help="Fidelity evaluation of quantized LLM checkpoints: windows -> teacher logits -> score -> report -> card.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Each module defines ``register(app)``; the order is the order of the pipeline.
COMMAND_MODULES = [
    "fideval.commands.config_cmd",
    "fideval.commands.windows",
    "fideval.commands.teacher",
    "fideval.commands.store",
    "fideval.commands.quant",
    "fideval.commands.score",
    "fideval.commands.report",
]


def _register() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register()


def main() -> None:
    try:
        app()
    except FidevalError as e:
        print(f"fideval: error: {e.line()}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("fideval: interrupted; finished files are kept, the partial one was discarded", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
