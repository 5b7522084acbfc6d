"""``fideval validate``: everything a config would fail on hours into a run, found in seconds.

The schema (:func:`fideval.config.load_config`) and the file check (:func:`fideval.config.check_files`) see
the config alone. This package also reads what the config points at -- config.json, safetensors and GGUF
headers, the tokenizer -- never a weight, and asks each question of the very code the stage that would
fail runs, so validate and the run cannot disagree:

* :mod:`.model`      the model folder (local, or ``hf://`` in the local Hub cache): the runner's adapter
                     (architecture, transformers config), its meta layers (module classes, routed experts
                     per layer), the model-parallel split of those experts, and the lm head's arithmetic;
* :mod:`.reference`  with ``model.implementation: reference``: the vendor's code as the reference backend
                     imports it (folder, classes, ``ModelArgs``, the model-parallel cuts);
* :mod:`.tokenizer`  the tokenizer the windows stage loads, its separator tokens and chat template;
* :mod:`.candidates` each candidate's quant spec (the candidate stage's builder) against the model's
                     classes and tensor shapes, or its real build (the classes that decode it);
* :mod:`.sizes`      the teacher stores' bytes against the free space of the results folder.

Each problem names the config key at fault; the command prints one line per problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


def check_config(cfg: Any) -> Findings:
    """Every check past the schema, in the order the stages would meet the problems."""
    from fideval.config import check_files
    from fideval.validate import candidates, model, reference, sizes, tokenizer

    found = Findings()
    for line in check_files(cfg):  # "'key': ..." lines; kept verbatim
        found.problems.append(Problem(None, line, "fix the path or create the file"))
    probe = model.probe(cfg, found)
    reference.check(cfg, probe.folder, found)
    model.check_parallel(cfg, probe, found)
    model.check_head(cfg, found)
    model.check_fused(cfg, found)
    tokenizer.check(cfg, found)
    candidates.check(cfg, probe, found)
    sizes.check(cfg, probe, found)
    return found
