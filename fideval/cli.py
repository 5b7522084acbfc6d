"""The ``fideval`` command line: one verb per pipeline stage, each a thin call into a library function.

The verbs are plain functions in ``fideval/commands/`` (their shared options in ``commands/options.py``);
:data:`VERBS` registers them, in the order of the pipeline, which is the order ``--help`` lists them in.
Heavy imports (torch, polars, datasets...) live inside the verbs so that ``fideval --help`` is instant.
A :class:`~fideval.errors.FidevalError` becomes one line on stderr and exit status 2. Ctrl-C, and SIGTERM (what
SLURM and Kubernetes send to stop a job; :class:`~fideval.errors.StopSignals`), become one line saying what was kept
and how to resume, and exit status 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import functools
import sys

import typer

from fideval.commands import compare, config_cmd, fused, quant, report, routes, score, selftest, store, teacher, windows
from fideval.errors import FidevalError, Interrupted, StopSignals

app = typer.Typer(
    name="fideval",
    help="Fidelity evaluation of quantized LLM checkpoints: windows -> teacher logits -> score -> report -> card.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# (group, verb, function): a group is a sub-command (``fideval quant inspect``) with the help in GROUPS.
VERBS = [
    (None, "validate", config_cmd.validate),
    (None, "schema", config_cmd.schema),
    (None, "windows", windows.windows),
    (None, "screen", windows.screen),
    (None, "selftest", selftest.selftest),
    (None, "teacher", teacher.teacher),
    (None, "verify", store.verify),
    (None, "import-llamacpp", store.import_llamacpp_cmd),
    (None, "export-llamacpp", store.export_llamacpp_cmd),
    ("store", "materialize", store.materialize_cmd),
    ("store", "card", store.card_cmd),
    ("store", "import-hidden-suite", store.import_hidden_suite_cmd),
    ("quant", "inspect", quant.inspect),
    ("quant", "formats", quant.formats),
    (None, "score", score.score),
    (None, "fused", fused.fused),
    (None, "report", report.report),
    (None, "card", report.card),
    (None, "check", report.check),
    (None, "compare", compare.compare),
    (None, "plan", compare.plan),
    (None, "routes", routes.routes),
]
GROUPS = {"quant": quant.HELP, "store": store.HELP}


# Verbs whose output is written shard by shard and resumed by a rerun (the store writer); every other verb
# writes through a temp name and a rename, so an interrupted one leaves its previous output as it was.
RESUMABLE = {"teacher", "import-llamacpp", "fused", "materialize"}


def _interruptible(verb: str, fn):
    """Ctrl-C as one line: typer turns KeyboardInterrupt into a silent exit 130, so each verb turns it into
    :class:`Interrupted` first, saying what was kept (``score`` raises its own, with the shards it kept)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            if verb in RESUMABLE:
                raise Interrupted(f"{verb} interrupted: the finished shards are kept, the partial one was discarded",
                                  hint="run the same command again to resume: finished shards are skipped") from None
            raise Interrupted(f"{verb} interrupted: nothing partial was kept, earlier output is as it was",
                              hint="run the same command again") from None

    return run


def _register() -> None:
    groups: dict[str, typer.Typer] = {}
    for group, verb, fn in VERBS:
        fn = _interruptible(verb, fn)
        if group is None:
            app.command(verb)(fn)
            continue
        if group not in groups:
            groups[group] = typer.Typer(help=GROUPS[group], no_args_is_help=True)
            app.add_typer(groups[group], name=group)
        groups[group].command(verb)(fn)


_register()


def main() -> None:
    """Run the command line; SIGTERM (a scheduler stopping the job) takes the path of Ctrl-C (exit 143, not 130)."""
    with StopSignals() as stop:
        try:
            app()
        except Interrupted as e:
            print(f"fideval: {stop.named(e.line())}", file=sys.stderr)
            sys.exit(stop.status())
        except FidevalError as e:
            print(f"fideval: error: {e.line()}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:  # between verbs' own handling (while importing, parsing options)
            print(f"fideval: {stop.named('interrupted')}", file=sys.stderr)
            sys.exit(stop.status())
        except SystemExit as e:
            # typer turns a KeyboardInterrupt outside the verbs (parsing options) into a silent exit 130
            if stop.signum is not None and e.code == 130:
                print(f"fideval: {stop.named('interrupted')}", file=sys.stderr)
                sys.exit(stop.status())
            raise


if __name__ == "__main__":
    main()
