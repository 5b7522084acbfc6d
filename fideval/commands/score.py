"""``fideval score``: FP64 full-vocabulary scoring of a candidate against the teacher store -> records."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options
from fideval.commands.teacher import PER_DOMAIN


def score(
    teacher: options.Teacher,
    out: Annotated[Path, options.out("records folder: records.parquet + score.json")],
    candidate: Annotated[str | None, typer.Option(
        "--candidate", help="candidate store, logits or hidden (folder or hf://...); with --config, a candidate name from "
        "the config")] = None,
    config: Annotated[Path | None, options.config(
        "run the config's candidate through the layer-by-layer runner instead of reading a store")] = None,
    name: Annotated[str | None, typer.Option("--name", help="candidate name in the records (default: the store's folder name)")] = None,
    path: Annotated[str, typer.Option("--path", help="records 'path' column: serving, weights-only, llamacpp or store; with "
                                      "--config, P+teacher-routes is path P with --teacher-routes")] = "store",
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
    domain: Annotated[list[str] | None, typer.Option(
        "--domain", help="score each of these domains in turn (repeatable): --teacher and --out (and a --candidate store) "
        "name {domain}, one records folder per domain")] = None,
    routes: Annotated[bool, typer.Option(
        "--routes", help="also record the config candidate's routed experts and weights per MoE layer and position into "
        "<out>/routes/ (docs/formats-routes.md; records unchanged)")] = False,
    teacher_routes: Annotated[bool, typer.Option(
        "--teacher-routes", help="the route-controlled run: the config candidate's MoE layers take the routes recorded "
        "beside --teacher (fideval teacher --routes) instead of their own router's; its KLD is the expert arithmetic's "
        "share (docs/formats-routes.md)")] = False,
    head_from: Annotated[str | None, typer.Option(
        "--head-from", help="a hidden teacher store published without its head.safetensors: the model folder (or hf://ORG/NAME) "
        "to take the lm head from, checked against the store's digest")] = None,
) -> None:
    """Score candidate logits against the teacher's in float64 over the full vocabulary."""
    import os

    from fideval.config import load_config
    from fideval.fsio import remove_temps
    from fideval.lock import output_lock
    from fideval.score.candidate import select
    from fideval.score.run import ScoreSettings, score_candidate
    from fideval.score.stores import open_store

    cfg = load_config(config) if config is not None else None
    device = device or (cfg.teacher.device if cfg is not None else "auto")
    settings = ScoreSettings.of(cfg.score if cfg is not None else None, device=device, kernel=kernel,
                                cpu_check_every=cpu_check_every, cpu_check_tolerance=tolerance, on_nonfinite=on_nonfinite,
                                peak_tflops=peak_tflops)
    from fideval.timing.accounting import line

    if cfg is not None:  # the config's routing: the routes recorded, or the route-controlled run asked by its path
        from fideval.score.route_control import SUFFIX

        if path.endswith(SUFFIX):
            path, teacher_routes = path.removesuffix(SUFFIX), True
        chosen = next((c for c in cfg.candidates if c.name == candidate), None)
        routes = routes or (chosen is not None and chosen.routing != "off" and not teacher_routes)
    for d in _domains(domain, teacher, out, candidate if cfg is None else None):  # [None]: the one run
        def at(x, d=d):
            return x if d is None or x is None else type(x)(str(x).replace(PER_DOMAIN, d))

        t_spec, d_out = at(teacher), at(out)
        t = open_store(t_spec, head_from)
        cand = select(t, candidate if cfg is not None else at(candidate), path, settings, cfg=cfg, name=name, self_check=self_check,
                      routes=Path(d_out) if routes else None, force_routes=Path(t_spec) if teacher_routes else None)
        if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 alone scores, writes and holds the lock
            score_candidate(t, cand, d_out, settings, teacher_spec=t_spec)
            continue
        with output_lock(d_out, "score"):
            remove_temps(d_out)  # temp files of a killed run (we hold the lock: nobody else is writing them)
            s = score_candidate(t, cand, d_out, settings, self_check_first=self_check and not cand.is_teacher, teacher_spec=t_spec)
            if routes:  # the index names the records the routes belong to
                from fideval.formats.routes import seal_candidate

                seal_candidate(d_out)
        typer.echo(f"{d_out}: {s['rows']:,} rows scored with {s['kernel']} on {s['device']}; "
                   f"CPU check {s['cpu_check']['rows_checked']} rows, max rel diff {s['cpu_check']['max_rel_diff']:.2g}; "
                   f"{line(s['profile'])}")


def _domains(domains: list[str] | None, teacher: str, out: Path, store: str | None) -> list[str | None]:
    """The domains to score one after another ([None]: one run, no --domain); with --domain, --teacher and --out (and a
    candidate store) must name {domain}, so that each domain reads its own stores and writes its own records."""
    from fideval.errors import FidevalError

    named = {"--teacher": teacher, "--out": str(out)} | ({"--candidate": store} if store is not None else {})
    if not domains:
        for opt, v in named.items():
            if PER_DOMAIN in v:
                raise FidevalError(f"{opt} {v} names {PER_DOMAIN} but no --domain is given", hint="pass --domain D once per domain")
        return [None]
    for opt, v in named.items():
        if PER_DOMAIN not in v:
            raise FidevalError(f"--domain is given but {opt} {v} does not name {PER_DOMAIN}",
                               hint=f"write {opt} .../{PER_DOMAIN}: each domain has its own stores and records")
    return list(dict.fromkeys(domains))
