"""``fideval teacher``: FP32 reference logits for every window/cut, layer by layer, into a logit store."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def teacher(
        model: Path = typer.Option(..., "--model", help="Hugging Face checkpoint folder (config.json + safetensors)"),
        windows: Path = typer.Option(..., "--windows", help="output folder of 'fideval windows'"),
        out: Path = typer.Option(..., "--out", help="logit store folder to write (resumes if present)"),
        lengths: str = typer.Option("windows,cuts", "--lengths", help="which sequence folders: windows, cuts or both"),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
        dtype: str = typer.Option("float32", "--dtype", help="compute dtype of the layers: float32 or bfloat16 (lm head is always float32)"),
        micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="sequences per forward call (fixed for reproducibility)"),
        model_id: str = typer.Option(None, "--model-id", help="recorded in the store (default: folder name)"),
        model_revision: str = typer.Option(None, "--model-revision", help="recorded in the store (default: 'local')"),
    ) -> None:
        """Run the reference model layer by layer and store float32 logits for every position.

        For model parallel, launch the library entry point under torchrun:
        ``torchrun --nproc-per-node N -m fideval.model.teacher --model ... --windows ... --out ...``.
        """
        from fideval.model.teacher import run_teacher

        r = run_teacher(model, windows, out, kinds=tuple(x.strip() for x in lengths.split(",") if x.strip()),
                        device=device, dtype=dtype, model_id=model_id, model_revision=model_revision,
                        micro_batch=micro_batch)
        st = r["stats"]
        canary = ", ".join(f"{c['folder']} {'identical' if c.get('identical') else 'DIFFERS'}" for c in r["canaries"]) or "none"
        typer.echo(f"{out}: {r['written']} sequences written, {r['skipped']} already done; canary {canary}; "
                   f"{st['tokens'] / max(st['wall_s'], 1e-9):,.0f} tokens/s, weight loading {st['load_s']:.1f} s "
                   f"({st['wait_s']:.1f} s not hidden)")
