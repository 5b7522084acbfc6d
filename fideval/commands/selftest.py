"""``fideval selftest``: the runner against transformers' own forward on the real model, before a long run."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options


def selftest(
    model: Annotated[str | None, typer.Option(
        "--model", help="Hugging Face checkpoint folder (config.json + safetensors), demo://model or hf://ORG/NAME")] = None,
    config: Annotated[Path | None, options.config("take the model, device and dtype from this config's teacher")] = None,
    device: options.Device = None,
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="compute dtype: float32 or bfloat16 (default: the config's teacher.dtype, else float32)")] = None,
    sequences: Annotated[int, typer.Option("--sequences", min=1, help="random sequences (one batch for both paths)")] = 3,
    length: Annotated[int, typer.Option("--length", min=2, help="tokens per sequence")] = 64,
    seed: Annotated[int, typer.Option("--seed", help="seed of the random token ids")] = 0,
    max_delta: Annotated[float | None, typer.Option(
        "--max-delta", help="fail above this max |delta logit| (default: 1e-4 in float32, 4 bf16 ulps of the largest "
        "logit in bfloat16)")] = None,
    out: Annotated[Path | None, options.out("also write the result as JSON here")] = None,
    if_possible: Annotated[bool, typer.Option(
        "--if-possible", help="where the model cannot be compared here (too large for the device's memory, an FP8 "
        "release), write a not-run result and exit 0 instead of failing; a mismatch still fails (the workflow's rule)")] = False,
    as_json: options.AsJson = False,
) -> None:
    """Run a few short sequences through the layer-major runner and through transformers' own full forward of the
    same model; print max |delta logit| and mean KLD, and fail (exit 2, one line) when they disagree."""
    import json

    from fideval.errors import FidevalError
    from fideval.model.selftest import CannotCompare, run_selftest

    if (model is None) == (config is None):
        raise FidevalError("give exactly one of --model DIR and --config FILE", hint="fideval selftest --model DIR")
    if config is not None:
        from fideval.config import load_config
        from fideval.model_source import locate

        cfg = load_config(config)
        model = locate(cfg.model.path, cfg.model.revision).folder
        device = device or cfg.teacher.device
        dtype = dtype or cfg.teacher.dtype
    elif "://" in model:  # demo://model, hf://ORG/NAME: as a config's model.path resolves
        from fideval.model_source import locate

        model = locate(model).folder
    from fideval.fsio import write_json

    try:
        r = run_selftest(model, device=device or "auto", dtype=dtype or "float32", sequences=sequences, length=length,
                         seed=seed, max_delta=max_delta)
    except CannotCompare as e:
        if not if_possible:
            raise
        if out is not None:
            write_json(out, {"model": str(model), "status": "not_run", "passed": None, "reason": str(e)})
        typer.echo(f"selftest not run: {e}")
        return
    r = {**r, "status": "pass" if r["passed"] else "fail"}
    if out is not None:
        write_json(out, r)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
    else:
        rows = [("model", r["model"]), ("architecture", str(r["arch"])), ("dtype / device", f"{r['dtype']} / {r['device']}"),
                ("sequences x tokens", f"{r['sequences']} x {r['length']} (seed {r['seed']})"),
                ("max |delta logit|", f"{r['max_abs_delta']:.3g} (bound {r['tolerance']:.3g}, max |logit| {r['max_abs_logit']:.3g})"),
                ("mean KLD", f"{r['mean_kld']:.3g} (max {r['max_kld']:.3g})"),
                ("time", f"runner {r['runner_s']:.1f} s, transformers {r['oracle_s']:.1f} s (transformers {r['transformers']})")]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            typer.echo(f"{k:<{width}}  {v}")
    if not r["passed"]:
        raise FidevalError(f"{r['model']}: the runner's logits differ from transformers' forward: max |delta logit| "
                           f"{r['max_abs_delta']:.3g} > {r['tolerance']:.3g} (mean KLD {r['mean_kld']:.3g})",
                           hint="do not start the teacher; report the model's config.json")
    typer.echo("selftest passed")
