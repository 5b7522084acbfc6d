"""``fideval score``: FP64 full-vocabulary scoring of a candidate against the teacher store -> records."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options


def score(
    teacher: options.Teacher,
    out: Annotated[Path, options.out("records folder: records.parquet + score.json")],
    candidate: Annotated[str | None, typer.Option(
        "--candidate", help="candidate logit store (folder or hf://...); with --config, a candidate name from the config")] = None,
    config: Annotated[Path | None, options.config(
        "run the config's candidate through the layer-by-layer runner instead of reading a store")] = None,
    name: Annotated[str | None, typer.Option("--name", help="candidate name in the records (default: the store's folder name)")] = None,
    path: Annotated[str, typer.Option("--path", help="records 'path' column: serving, weights-only or store")] = "store",
    self_check: Annotated[bool, typer.Option(
        "--self-check", help="first score the teacher against itself (must be exactly 0 KLD, 100 % top-1); alone, that is the run",
    )] = False,
    device: options.Device = None,
    kernel: options.Kernel = "auto",
    cpu_check_every: Annotated[int | None, typer.Option("--cpu-check-every", help="re-score 1 row in N (plus each shard's first and "
                                                         "last) with the numpy float64 reference (default: config or 1000)")] = None,
    tolerance: Annotated[float | None, typer.Option("--cpu-check-tolerance", help="largest allowed relative difference to the "
                                                    "reference (default: config or 2e-12)")] = None,
    on_nonfinite: Annotated[str | None, typer.Option("--on-nonfinite", help="fail or skip rows holding NaN/+inf "
                                                     "(default: config or fail)")] = None,
    peak_tflops: Annotated[float | None, typer.Option(
        "--peak-tflops", help="the GPU's dense peak for a model run's utilisation figure (default: by GPU name)")] = None,
) -> None:
    """Score candidate logits against the teacher's in float64 over the full vocabulary."""
    import os

    from fideval.config import load_config
    from fideval.fsio import remove_temps
    from fideval.lock import output_lock
    from fideval.score.candidate import select
    from fideval.score.run import ScoreSettings, score_candidate
    from fideval.store import StoreReader
    from fideval.store.hub import resolve_store

    cfg = load_config(config) if config is not None else None
    device = device or (cfg.teacher.device if cfg is not None else "auto")
    settings = ScoreSettings.of(cfg.score if cfg is not None else None, device=device, kernel=kernel,
                                cpu_check_every=cpu_check_every, cpu_check_tolerance=tolerance, on_nonfinite=on_nonfinite,
                                peak_tflops=peak_tflops)
    t = StoreReader(resolve_store(teacher))
    cand = select(t, candidate, path, settings, cfg=cfg, name=name, self_check=self_check)
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 alone scores, writes and holds the lock
        score_candidate(t, cand, out, settings, teacher_spec=teacher)
        return
    with output_lock(out, "score"):
        remove_temps(out)  # temp files of a killed run (we hold the lock: nobody else is writing them)
        s = score_candidate(t, cand, out, settings, self_check_first=self_check and not cand.is_teacher, teacher_spec=teacher)
    from fideval.timing.accounting import line

    typer.echo(f"{out}: {s['rows']:,} rows scored with {s['kernel']} on {s['device']}; "
               f"CPU check {s['cpu_check']['rows_checked']} rows, max rel diff {s['cpu_check']['max_rel_diff']:.2g}; "
               f"{line(s['profile'])}")
