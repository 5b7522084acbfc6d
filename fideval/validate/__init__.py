"""``fideval validate``: everything a config would fail on hours into a run, found in seconds.

The schema (:func:`fideval.config.load_config`) and the file check (:func:`fideval.config.check_files`) see
the config alone. This package also reads what the config points at -- config.json, safetensors and GGUF
headers, the tokenizer -- never a weight, and asks each question of the very code the stage that would
fail runs, so validate and the run cannot disagree:

* :mod:`.model`      the model folder (local, or ``hf://`` in the local Hub cache): the runner's adapter
                     (architecture, transformers config), its meta layers (module classes, routed experts
                     per layer), the model-parallel split of those experts, and the lm head's arithmetic;
                     every shard its safetensors index names; the lengths against its positions;
* :mod:`.reference`  with ``model.implementation: reference``: the vendor's code as the reference backend
                     imports it (folder, classes, ``ModelArgs``, the model-parallel cuts);
* :mod:`.tokenizer`  the tokenizer the windows stage loads, its separator tokens and chat template, its
                     size against the model's vocabulary;
* :mod:`.candidates` each candidate's quant spec (the candidate stage's builder) against the model's
                     classes and tensor shapes, or its real build (the classes that decode it);
* :mod:`.routing`    a candidate's ``routing`` (record or decompose) on a model without routed experts;
* :mod:`.attention`  one sequence of each length against the teacher's GPU, by the runner's own sizing
                     (:func:`fideval.model.sizing.choose`): a window too long for the device is refused;
* :mod:`.sizes`      the teacher stores' bytes by ``teacher.store`` kind (the teacher's, the noise floor's) against
                     the free space of the results folder;
* :mod:`.design`     a note (not a problem) when too few windows make the intervals wide or unbounded.

Each problem names the config key at fault; the command prints one line per problem.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fideval.validate.findings import Findings, Problem

if TYPE_CHECKING:
    from fideval.config import Config

__all__ = ["Findings", "Problem", "check_config"]


def check_config(cfg: Config) -> Findings:
    """Every check past the schema, in the order the stages would meet the problems."""
    from fideval.config import check_files
    from fideval.validate import attention, candidates, design, model, reference, routing, sizes, tokenizer

    found = Findings()
    for line in check_files(cfg):  # "'key': ..." lines; kept verbatim
        found.problems.append(Problem(None, line, "fix the path or create the file"))
    probe = model.probe(cfg, found)
    model.check_shards(cfg, probe, found)
    driver = reference.check(cfg, probe.folder, found)
    model.check_positions(cfg, probe, found)
    model.check_parallel(cfg, probe, found)
    model.check_head(cfg, found)
    model.check_fused(cfg, found)
    tokenizer.check(cfg, found, probe)
    candidates.check(cfg, probe, found)
    routing.check(cfg, probe, found)
    attention.check(cfg, probe, found, driver)
    sizes.check(cfg, probe, found)
    design.check(cfg, found)
    return found
