"""``fideval fused``: the teacher store and every emulated candidate's records in one pass (teacher.fused)."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options
from fideval.commands.teacher import per_domain


def fused(
    config: Annotated[Path, options.config("the evaluation's config: model, teacher settings, candidates, score")],
    windows: Annotated[Path, typer.Option("--windows", help="one token file of 'fideval windows': windows-<W>/ or "
                                          "cuts-<C>/tokens.safetensors")],
    domain: Annotated[list[str], typer.Option("--domain", help="the domain whose sequences this pass runs (repeatable, with "
                                              "{domain} in --out: one pass per domain, in turn, in this process)")],
    out: Annotated[Path, options.out("teacher logit store folder to write (resumes if present); with {domain} in it, "
                                     "one store per --domain")],
    records: Annotated[Path, typer.Option("--records", help="records root: each candidate's records go to "
                                          "<records>/<candidate>/<path>/<kind>/<domain>, the self-check's to "
                                          "<records>/teacher-self/store/<kind>/<domain>")],
    device: options.Device = None,
    kernel: options.Kernel = "auto",
    self_check: Annotated[bool, typer.Option("--self-check/--no-self-check",
                                             help="also score the teacher against itself (the workflow's selfcheck records)")] = True,
    peak_tflops: Annotated[float | None, typer.Option(
        "--peak-tflops", help="the GPU's dense peak for the utilisation figure (default: by GPU name)")] = None,
) -> None:
    """Run the teacher and every emulated candidate through each layer together; write the store and the records.

    The store and every records.parquet are bit-identical to 'fideval teacher' then 'fideval score --config' with the
    settings this pass records; each layer is read once and the teacher's store is never read back."""
    from fideval.config import load_config
    from fideval.score.fused import one_length, refusal
    from fideval.score.run import ScoreSettings

    cfg = load_config(config)
    why = refusal(cfg)
    if why:
        from fideval.errors import FidevalError

        raise FidevalError(f"{config}: {why}", hint="set teacher.fused: false to run the teacher and each candidate separately")
    _, _, kind = one_length(windows)  # a bad --windows fails before any output folder exists
    runs = per_domain(out, domain, "--out")
    if len(runs) == 1 and len(domain) > 1:
        from fideval.errors import FidevalError

        raise FidevalError(f"{len(domain)} --domain values but --out {out} does not name {{domain}}",
                           hint="one store per domain: write --out .../{domain}")
    settings = ScoreSettings.of(cfg.score, device=device or cfg.teacher.device, kernel=kernel)
    for store, (d,) in runs:
        _one_domain(cfg, windows, kind, d, store, records, settings, self_check, peak_tflops)


def _one_domain(cfg, windows: Path, kind: str, domain: str, out: Path, records: Path, settings, self_check: bool,
                peak_tflops: float | None) -> None:
    """One domain's fused pass: its store, its records folders, its line."""
    from contextlib import ExitStack

    from fideval.fsio import remove_temps
    from fideval.lock import output_lock
    from fideval.score.fused import fusable, records_dir, run_fused

    dirs = [records_dir(records, c.name, p, kind, domain) for c, p in fusable(cfg)]
    if self_check:
        dirs.append(records_dir(records, "self", "store", kind, domain))
    with ExitStack() as stack:  # every output this pass writes is locked, the store first
        stack.enter_context(output_lock(out, "fused"))
        for d in dirs:
            stack.enter_context(output_lock(d, "fused"))
            remove_temps(d)
        try:
            r = run_fused(cfg, windows, domain, out, records, device=settings.device, settings=settings,
                          self_check=self_check, peak_tflops=peak_tflops)
        except RuntimeError as e:  # torch.OutOfMemoryError: the finished teacher shards and kept records stay
            if "out of memory" not in str(e):
                raise
            from fideval.errors import FidevalError

            raise FidevalError(f"the fused pass ran out of GPU memory ({str(e).splitlines()[0][:160]})",
                               hint="set teacher.fused: false (separate passes), or smaller teacher.chunk_bytes and "
                               "mlp_tokens; docs/runner.md, 'The fused pass'") from None
    from fideval.timing.accounting import line

    verdict = {True: "identical", False: "DIFFERS", None: "unchecked"}
    canary = ", ".join(f"{c['model']} {verdict[c.get('identical')]}" for c in r["canaries"])
    ran = r["settings"]
    typer.echo(f"{out}: {r['written']} sequences written, {r['skipped']} already done; {len(r['scored'])} records folders; "
               f"canary {canary}; micro-batch {ran['micro_batch']}, mlp tokens {ran['mlp_tokens'] or 'off'}; {line(r['profile'])}")
