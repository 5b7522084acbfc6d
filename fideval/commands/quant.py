"""``fideval quant inspect`` and ``fideval quant formats``: what a quant spec does to a checkpoint, before a run.

``inspect`` reads only the safetensors headers (:mod:`fideval.quant.inspect`) and prints per-class formats
and bits per weight; for a .gguf file, what the file holds.
"""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options
from fideval.errors import FidevalError

HELP = "Emulated quantization formats: inspect a quant spec on a checkpoint."


def inspect(
    model: Annotated[Path, typer.Option("--model", help="checkpoint folder (*.safetensors; only headers are read) or a .gguf file")],
    quant: Annotated[str | None, typer.Option(
        "--quant", help="e.g. 'routed_experts=mxfp4:rceil,attention=fp8_block', or a llama-quantize mix "
        "'gguf_mix=Q4_K_M' (not for .gguf)")] = None,
    as_json: options.AsJson = False,
) -> None:
    """Print each module class's format and bits per weight, and the whole model's.

    For a folder, what --quant would make of it; for a .gguf file, what the file holds."""
    if model.suffix == ".gguf":
        if quant:
            raise FidevalError(f"--quant does not apply to {model}: a GGUF file is already quantized",
                               hint="drop --quant to see its formats")
        from fideval.quant.gguf_file import gguf_bits
        from fideval.quant.gguf_mixes import gguf_mix_inputs, matching_mixes

        t = {**gguf_bits(model), "base_dtype": "GGUF", "llama_quantize_mixes": matching_mixes(*gguf_mix_inputs(model))}
    elif not quant:
        raise FidevalError("--quant is required for a checkpoint folder", hint="e.g. --quant routed_experts=mxfp4")
    else:
        from fideval.quant.inspect import inspect_model

        t = inspect_model(model, quant)
    if as_json:
        import json

        typer.echo(json.dumps(t, indent=2, sort_keys=True))
    else:
        _print_table(model, t)


def _print_table(model: Path, t: dict) -> None:
    typer.echo(f"{model}: {t['total']['params']:,} parameters, unquantized tensors at {t['base_dtype']}")
    typer.echo(f"{'module class':<16} {'format':<12} {'recipe':<18} {'group':>5} {'tensors':>7} {'params':>14} {'bpw':>8}")
    for cls, r in sorted(t["per_class"].items()):
        typer.echo(f"{cls:<16} {r['format'] or '-':<12} {r['recipe'] or '-':<18} {r['group'] or '-':>5} "
                   f"{r['tensors']:>7} {r['params']:>14,} {r['bpw']:>8.4f}")
    typer.echo(f"{'total':<16} {'':<12} {'':<18} {'':>5} {'':>7} {t['total']['params']:>14,} {t['total']['bpw']:>8.4f}")
    if "llama_quantize_mixes" in t:
        mixes = t["llama_quantize_mixes"]
        typer.echo(f"llama-quantize mix: {' or '.join(mixes)} (every tensor's type as that mix gives it)" if mixes else
                   "llama-quantize mix: none (no named mix gives every tensor its type: hand-mixed or --tensor-type)")


def formats() -> None:
    """List the formats, their recipes (default first) and nominal bits per weight."""
    from fideval.quant import list_formats

    for f in list_formats():
        recipes = [f.default_recipe] + [r for r in f.recipes if r != f.default_recipe]
        typer.echo(f"{f.name:<12} bpw {f.bits_per_weight():>7.4f}  recipes {','.join(recipes):<28} {f.description}")
