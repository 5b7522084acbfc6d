"""``fideval quant inspect`` and ``fideval quant formats``: what a quant spec does to a checkpoint, before a run.

``inspect`` reads only the safetensors headers (shapes and dtypes, no tensor data), maps every tensor to
its module class with :func:`fideval.quant.spec.module_class_of`, checks that the spec's classes exist in
the model and that every block divides its tensor, and prints per-class formats and bits per weight.
"""

from __future__ import annotations

from pathlib import Path

import typer

from fideval.errors import FidevalError

DTYPE_BITS = {"F64": 64, "F32": 32, "BF16": 16, "F16": 16, "F8_E4M3": 8, "F8_E5M2": 8, "I64": 64, "I32": 32,
              "I16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E8M0": 8}
FLOAT_DTYPES = {"F64", "F32", "BF16", "F16"}


def read_safetensors_shapes(model_dir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, dtype)} from the headers of every ``*.safetensors`` file in ``model_dir``."""
    import json
    import math
    import struct

    if not model_dir.is_dir():
        raise FidevalError(f"--model {model_dir}: not a folder", hint="give a checkpoint folder with *.safetensors")
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FidevalError(f"--model {model_dir}: no *.safetensors files", hint="give a Hugging Face checkpoint folder")
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    fix = "the file is truncated or not safetensors; re-download the checkpoint"
    for f in files:
        try:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 100_000_000 or 8 + n > size:  # bounded before reading: a hostile length allocates nothing
                    raise ValueError(f"header length {n} is impossible for a {size}-byte file")
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error) as e:
            raise FidevalError(f"{f}: not a readable safetensors file ({str(e)[:120]})", hint=fix) from None
        if not isinstance(header, dict):
            raise FidevalError(f"{f}: safetensors header is not a JSON object", hint=fix)
        data_bytes = size - 8 - n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:  # the shape must match the byte range, and the range must lie inside the file
                shape, dtype = tuple(int(d) for d in info["shape"]), str(info["dtype"])
                a, b = (int(o) for o in info["data_offsets"])
                ok = (dtype in DTYPE_BITS and all(d >= 0 for d in shape) and 0 <= a <= b <= data_bytes
                      and b - a == math.prod(shape) * DTYPE_BITS[dtype] // 8)
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                raise FidevalError(f"{f}: tensor {str(name)[:80]!r} has an impossible header entry: "
                                   f"dtype, shape and byte range disagree or leave the file", hint=fix)
            out[name] = (shape, dtype)
    return out


def inspect_model(model_dir: Path, spec_text: str) -> dict:
    """The per-class bits table of ``spec_text`` applied to the checkpoint in ``model_dir``."""
    from fideval.quant.base import get_format
    from fideval.quant.spec import check_spec_classes, compile_spec, is_quantized_tensor, module_class_of

    compiled = compile_spec(spec_text)
    tensors = read_safetensors_shapes(model_dir)
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    present, dtype_count, quantized = set(), {}, []
    for name, (shape, dtype) in sorted(tensors.items()):
        cls = module_class_of(name) or "other"
        shapes.setdefault(cls, {})[name] = shape
        if cls != "other" and is_quantized_tensor(name, shape, dtype in FLOAT_DTYPES):
            present.add(cls)
            quantized.append((name, cls, shape))
        dtype_count[dtype] = dtype_count.get(dtype, 0) + 1
    check_spec_classes(spec_text, present)  # first: a class the model lacks is the bigger mistake
    for name, cls, shape in quantized:  # then every block must divide its tensor (fail now, not mid-run)
        m = compiled.modules.get(cls)
        if m is not None:
            try:
                get_format(m.format).check_divides(shape, m.group)
            except FidevalError as e:
                raise FidevalError(f"{name}: {e.message}", hint=e.hint) from None
    base = max(dtype_count, key=dtype_count.get)
    table = compiled.bits(shapes, base_bits=DTYPE_BITS.get(base, 16))
    table["base_dtype"] = base
    table["classes_present"] = sorted(present)
    return table


def register(app: typer.Typer) -> None:
    quant_app = typer.Typer(help="Emulated quantization formats: inspect a quant spec on a checkpoint.",
                            no_args_is_help=True)

    @quant_app.command("inspect")
    def inspect(
        model: Path = typer.Option(..., "--model", help="checkpoint folder (*.safetensors; only headers are read) or a .gguf file"),
        quant: str = typer.Option(None, "--quant", help="e.g. 'routed_experts=mxfp4:rceil,attention=fp8_block' (not for .gguf)"),
        as_json: bool = typer.Option(False, "--json", help="print the table as JSON"),
    ) -> None:
        """Print each module class's format and bits per weight, and the whole model's.

        For a folder, what --quant would make of it; for a .gguf file, what the file holds."""
        if model.suffix == ".gguf":
            if quant:
                raise FidevalError(f"--quant does not apply to {model}: a GGUF file is already quantized",
                                   hint="drop --quant to see its formats")
            from fideval.quant.gguf_file import gguf_bits

            t = gguf_bits(model)
            t["base_dtype"] = "GGUF"
        elif not quant:
            raise FidevalError("--quant is required for a checkpoint folder", hint="e.g. --quant routed_experts=mxfp4")
        else:
            t = inspect_model(model, quant)
        if as_json:
            import json

            typer.echo(json.dumps(t, indent=2, sort_keys=True))
            return
        typer.echo(f"{model}: {t['total']['params']:,} parameters, unquantized tensors at {t['base_dtype']}")
        typer.echo(f"{'module class':<16} {'format':<12} {'recipe':<18} {'group':>5} {'tensors':>7} {'params':>14} {'bpw':>8}")
        for cls, r in sorted(t["per_class"].items()):
            typer.echo(f"{cls:<16} {r['format'] or '-':<12} {r['recipe'] or '-':<18} {r['group'] or '-':>5} "
                       f"{r['tensors']:>7} {r['params']:>14,} {r['bpw']:>8.4f}")
        typer.echo(f"{'total':<16} {'':<12} {'':<18} {'':>5} {'':>7} {t['total']['params']:>14,} {t['total']['bpw']:>8.4f}")

    @quant_app.command("formats")
    def formats() -> None:
        """List the formats, their recipes (default first) and nominal bits per weight."""
        from fideval.quant import list_formats

        for f in list_formats():
            recipes = [f.default_recipe] + [r for r in f.recipes if r != f.default_recipe]
            typer.echo(f"{f.name:<12} bpw {f.bits_per_weight():>7.4f}  recipes {','.join(recipes):<28} {f.description}")

    app.add_typer(quant_app, name="quant")
