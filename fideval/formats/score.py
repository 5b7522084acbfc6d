"""``score.json`` (format ``fideval.score`` v1): what one ``fideval score`` run scored, against what, and how
well its fast kernel agreed with the float64 reference. Written by ``fideval.score.run``, read by the report.

Only ``candidate``, ``path`` and ``length`` are required of a reader's input: records folders written by
hand or by the synthetic builders carry no more, and the report needs no more to trust the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fideval.formats.model import Model, key

FILE = "score.json"


@dataclass(frozen=True, kw_only=True)
class TeacherRef(Model):
    store: str = key("the teacher store as given (a folder or hf://... reference)")
    model_id: str | None = key("the teacher's model id, from its manifest", default=None)
    model_revision: str | None = key("the teacher's model revision, from its manifest", default=None)
    manifest_sha256: str | None = key("SHA-256 of the teacher's manifest.json (null if it has none)", default=None)
    kind: str | None = key("the store's kind: `logits` (FP32 logits of the model), `hidden` (the final norm's output, "
                           "replayed into FP32 logits through the store's head) or `logprobs` (an imported, lossy "
                           "llama.cpp file)", default=None)
    lossy: str | None = key("the teacher store's `lossy` note (a llama.cpp import), null for an exact FP32 teacher "
                            "(added in version 1, optional)", default=None)
    settings_sha256: str | None = key("the store's settings fingerprint (`settings_sha256` of its meta: every bit-shaping "
                                      "setting and the checkpoint's files; added in version 1, optional)", default=None)
    shards: dict[str, str] | None = key("sequence id -> SHA-256 of the teacher shard its rows were scored against, as "
                                        "the manifest names it (added in version 1, optional)", default=None)
    head_sha256: str | None = key("a hidden store's lm head: the SHA-256 of its tensor content (the `weight_sha256` of the "
                                  "store's `head` block, docs/formats-store.md), which the replayed logits came from; null "
                                  "for a logit store (optional)", default=None)


@dataclass(frozen=True, kw_only=True)
class CpuCheck(Model):
    rows_checked: int = key("rows re-scored by the numpy float64 reference")
    max_rel_diff: float = key("largest |x - r| / max(|r|, 0.01) over those rows and the seven figures")
    tolerance: float = key("above this the run fails and writes nothing (config score.cpu_check_tolerance)")
    every: int | None = key("rows whose run-wide index is a multiple of this are checked, plus each shard's "
                            "first and last", default=None)
    worst: str | None = key("where max_rel_diff was found, e.g. 'rkld in shard code-000.c1'", default=None)


@dataclass(frozen=True, kw_only=True)
class SelfCheck(Model):
    max_kld: float = key("largest |KLD| of the teacher scored against itself (must be exactly 0)")
    top1: float = key("top-1 agreement of the teacher with itself (must be exactly 1)")
    rows: int | None = key("rows scored", default=None)


@dataclass(frozen=True, kw_only=True)
class RunProfile(Model):
    wall_s: float = key("the run's wall time in seconds")
    parts: dict[str, float] = key("seconds per part of the run (docs/runner.md, 'Run settings and accounting'), summing "
                                  "to `wall_s`; `other` is the time no part claims")
    other_fraction: float = key("`other` / `wall_s`")
    device: str | None = key("`cpu` or the GPU's name", default=None)
    tokens: int | None = key("tokens the model computed (the canary's repeat not counted); null when no model ran",
                             default=None)
    tokens_per_s: float | None = key("`tokens` / `wall_s`", default=None)
    model_flops: float | None = key("analytic model FLOPs of those tokens (fideval.model.flops)", default=None)
    peak_tflops: float | None = key("the GPU's dense peak used for the utilisation (`--peak-tflops`, else by GPU name)",
                                    default=None)
    flop_utilisation: float | None = key("`model_flops` / `wall_s` / (peak x GPUs); null off CUDA or for an unknown GPU",
                                         default=None)
    hidden: dict[str, float] | None = key("share of background work the run did not wait for: `load` (weight "
                                          "prefetch), `write` (store writes)", default=None)


@dataclass(frozen=True, kw_only=True)
class ScoreSummary(Model):
    FORMAT = "fideval.score"
    VERSION = 1
    KIND = "score format"
    HINT = "re-score with this fideval version"

    format: str = key("`fideval.score`", default=FORMAT)
    version: int = key("`1`", default=VERSION)
    candidate: str = key("candidate name, as in the records' `candidate` column")
    path: str = key("`serving`, `weights-only`, `llamacpp` or `store`, as in the records' `path` column")
    length: int | None = key("the common sequence length, or null when the run mixes lengths")
    rows: int | None = key("records rows written (non-finite rows skipped are not counted)", default=None)
    teacher: TeacherRef | None = key("the teacher store scored against", default=None)
    cpu_check: CpuCheck | None = key("the float64 reference's check of the fast kernel", default=None)
    self_check: SelfCheck | None = key("the teacher against itself, when `--self-check` ran", default=None)
    nonfinite_rows: int | None = key("rows left out as non-finite (`--on-nonfinite skip`)", default=None)
    on_nonfinite: str | None = key("`fail` or `skip`", default=None)
    device: str | None = key("`cpu` or the GPU's name", default=None)
    kernel: str | None = key("`triton` or `torch`", default=None)
    figures: list[str] | None = key("the float figures of each row, in the scorer's order", default=None)
    records: str | None = key("the records file beside this one, `records.parquet`", default=None)
    candidate_info: dict[str, Any] | None = key("how the candidate was made: model id and revision, `source` "
                                                "(`emulated`, `checkpoint` or `store`), quant spec, checkpoint "
                                                "files' SHA-256, bits per weight (per module class and total); "
                                                "for a candidate store its spec, manifest SHA-256, model id and "
                                                "revision and kind (null for the teacher itself)", default=None)
    tool: dict[str, Any] | None = key("fideval's name, version, git commit and Python", default=None)
    lossy_rule: str | None = key("how the candidate met a lossy teacher: the llama.cpp encoding applied to the "
                                 "candidate, or none when both are lossy stores; null for an exact teacher (added in "
                                 "version 1, optional)", default=None)
    profile: RunProfile | None = key("where the run's time went, tokens/s and model FLOP utilisation (added in "
                                     "version 1, optional)", default=None)
    records_sha256: str | None = key("SHA-256 of `records.parquet` as written: the report refuses records that differ "
                                     "(added in version 1, optional)", default=None)
    sequences: dict[str, str | None] | None = key("sequence id -> SHA-256 of the teacher's token ids the rows were scored "
                                                  "on (little-endian int32, as eval-windows.json hashes them): the "
                                                  "report compares them with the windows (added in version 1, optional)",
                                                  default=None)
    candidate_sha256: str | None = key("SHA-256 of `candidate_info` (canonical JSON): the candidate's fingerprint "
                                       "(added in version 1, optional)", default=None)

    def problem(self) -> str | None:
        if self.length is not None and self.length < 1:
            return f"length {self.length} is not a positive integer"
        if self.rows is not None and self.rows < 0:
            return f"rows {self.rows} is negative"
        return None
