"""The one way the tests run the ``fideval`` command line.

``run_fideval(*args)`` runs ``fideval ARGS`` through the real entry point, ``fideval.cli.main`` (the console
script's target), so a test sees what a user's shell sees: the exit status (0, 1 for ``verify`` problems,
2 for a FidevalError turned into one ``fideval: error:`` line) and stdout and stderr apart. Any other
exception propagates and fails the test: that is a traceback a user would see.

By default it runs in this process (fast; ``monkeypatch`` reaches the library). ``fresh_process=True``
runs ``python -m fideval ARGS`` in a new interpreter instead, for what only a real process shows: settings
read at import time (``HF_HUB_OFFLINE``...), the interpreter's own exit path, no state left by earlier
tests. ``start_fideval`` starts one without waiting, for tests that signal, kill or race processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple


class Result(NamedTuple):
    """Exit status and output of one run (a tuple too: ``code, out, err = run_fideval(...)``)."""

    code: int
    stdout: str
    stderr: str

    def error(self) -> str:
        """The run's one ``fideval: error:`` line; asserts the contract of a refusal: exit status 2, no
        traceback, exactly one such line and it is the last line of stderr (progress lines may precede it)."""
        assert self.code == 2 and "Traceback" not in self.stderr, f"exit {self.code}, stderr:\n{self.stderr}"
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("fideval: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], self.stderr
        return errors[0]


def _argv(args: tuple) -> list[str]:
    return [str(a) for a in args]


def _process_env(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """os.environ with ``env`` applied; a None value removes the variable."""
    out = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = str(v)
    return out


@contextlib.contextmanager
def _patched(env: Mapping[str, str | None] | None, cwd: str | Path | None, argv: list[str]) -> Iterator[None]:
    """sys.argv, os.environ and the working directory as a fresh process would have them; restored after."""
    old_argv, old_env, old_cwd = sys.argv, dict(os.environ), os.getcwd()
    sys.argv = ["fideval", *argv]
    os.environ.clear()
    os.environ.update(_process_env(env) if env else old_env)
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        sys.argv = old_argv


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    return e.code if isinstance(e.code, int) else 1  # sys.exit("message") exits 1, as the interpreter does


def run_fideval(*args, env: Mapping[str, str | None] | None = None, cwd: str | Path | None = None,
                fresh_process: bool = False, timeout: float = 300) -> Result:
    """Run ``fideval ARGS`` (each arg passed through ``str``) and return its exit status, stdout and stderr."""
    argv = _argv(args)
    if fresh_process:
        p = subprocess.run([sys.executable, "-m", "fideval", *argv], capture_output=True, text=True,
                           env=_process_env(env), cwd=cwd, timeout=timeout)
        return Result(p.returncode, p.stdout, p.stderr)
    from fideval.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with _patched(env, cwd, argv), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as e:
            code = _exit_code(e)
    return Result(code, out.getvalue(), err.getvalue())


def start_fideval(*args, env: Mapping[str, str | None] | None = None, cwd: str | Path | None = None) -> subprocess.Popen:
    """``python -m fideval ARGS`` started in a fresh process and not waited for (text pipes on stdout/stderr)."""
    return subprocess.Popen([sys.executable, "-m", "fideval", *_argv(args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_process_env(env), cwd=cwd)
