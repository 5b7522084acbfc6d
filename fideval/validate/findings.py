"""What ``fideval validate`` found: each problem names the config key at fault (its own module, so the checks
import it and not the package that runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fideval.errors import FidevalError


@dataclass(frozen=True)
class Problem:
    key: str | None  # dotted config key, e.g. "candidates.mxfp4.quant.routed_experts.format"
    message: str
    hint: str | None = None

    def line(self) -> str:
        text = f"'{self.key}': {self.message}" if self.key else self.message
        return f"{text} ({self.hint})" if self.hint else text


@dataclass
class Findings:
    """What validate found: problems (each a refusal), notes (what could not be checked yet, and why) and
    facts worth printing (the teacher stores' size)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)

    def add(self, key: str | None, err: FidevalError | str, hint: str | None = None) -> None:
        if isinstance(err, FidevalError):
            self.problems.append(Problem(key, err.message, err.hint))
        else:
            self.problems.append(Problem(key, err, hint))
