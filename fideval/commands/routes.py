"""``fideval routes``: routing fidelity of a build against the teacher, from the routes both recorded -> routing.json."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options


def routes(
    teacher: Annotated[Path, typer.Option("--teacher", help="teacher store recorded with 'fideval teacher --routes' (or its routes/)")],
    candidate: Annotated[Path, typer.Option(
        "--candidate", help="records folder recorded with 'fideval score --routes' (or its routes/)")],
    out: Annotated[Path, options.out("routing.json to write (the plot beside it: same name, .png)")],
    resamples: Annotated[int, typer.Option("--resamples", min=100, help="window resamples of the intervals")] = 2000,
    seed: Annotated[int, typer.Option("--seed", min=0, help="resampling seed")] = 0,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999, help="interval level")] = 0.95,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="write the per-layer plot")] = True,
) -> None:
    """Which experts the build picks against the teacher, per MoE layer and overall, with window-cluster intervals:
    exact top-k set agreement, Jaccard, top-1 expert agreement, L1 drift of the weights, first-flip layer."""
    from fideval.fsio import write_json
    from fideval.report.routing import plot, routing

    r = routing(teacher, candidate, confidence=confidence, resamples=resamples, seed=seed)
    write_json(out, r)
    if plots:
        plot(r, out.with_suffix(".png"))
    o = r["overall"]
    typer.echo(f"{out}: {r['tokens']:,} positions x {len(r['layers'])} MoE layers of {r['sequences']} sequences; exact top-k "
               f"{o['exact_agreement']['estimate']:.4f}, Jaccard {o['jaccard']['estimate']:.4f}, top-1 {o['top1']['estimate']:.4f}, "
               f"L1 drift {o['l1_drift']['estimate']:.4g}, some layer differs on {o['any_flip']['estimate']:.4f}")
