"""One exception type for problems the user can fix.

The CLI prints a :class:`FidevalError` as a single line (``fideval: error: ...``) and exits 2; anything
else is a bug in fideval and keeps its traceback. Messages name the file or key at fault and what to do.
"""


class FidevalError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message.strip().replace("\n", " ")
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class Interrupted(FidevalError):
    """The user pressed Ctrl-C: one line saying what was kept and how to resume; the CLI exits 130."""
