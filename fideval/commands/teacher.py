"""``fideval teacher``: FP32 reference logits for every window/cut, layer by layer, into a logit store."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def teacher(
        windows: Path = typer.Option(..., "--windows", help="output folder of 'fideval windows'"),
        out: Path = typer.Option(..., "--out", help="logit store folder to write (resumes if present)"),
        config: Path = typer.Option(None, "--config", help="take model, dtype and micro-batch from this config"),
        model: Path = typer.Option(None, "--model", help="Hugging Face checkpoint folder (config.json + safetensors)"),
        lengths: str = typer.Option("windows,cuts", "--lengths", "--kind", help="which sequence folders: windows, cuts or both"),
        domain: list[str] = typer.Option(None, "--domain", help="only this domain (repeatable); default all"),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
        dtype: str = typer.Option(None, "--dtype", help="compute dtype of the layers: float32 or bfloat16 (lm head is always float32)"),
        micro_batch: int = typer.Option(None, "--micro-batch", min=1, help="sequences per forward call (fixed for reproducibility)"),
        model_id: str = typer.Option(None, "--model-id", help="recorded in the store (default: folder name)"),
        model_revision: str = typer.Option(None, "--model-revision", help="recorded in the store (default: 'local')"),
    ) -> None:
        """Run the reference model layer by layer and store float32 logits for every position.

        For model parallel, launch the library entry point under torchrun:
        ``torchrun --nproc-per-node N -m fideval.model.teacher --model ... --windows ... --out ...``.
        """
        import os

        from fideval.errors import FidevalError
        from fideval.lock import output_lock
        from fideval.model.teacher import run_teacher

        if config is not None:
            from fideval.config import load_config
            from fideval.model_source import locate

            cfg = load_config(config)
            files = locate(cfg.model.path, cfg.model.revision) if model is None else None
            model = model or files.folder
            model_id = model_id or cfg.model.id
            model_revision = model_revision or (files.revision if files else cfg.model.revision)
            dtype = dtype or cfg.teacher.dtype
            micro_batch = micro_batch or cfg.teacher.micro_batch
        if model is None:
            raise FidevalError("no model given", hint="pass --model DIR or --config CONFIG")
        kinds = tuple(x.strip() for x in lengths.split(",") if x.strip())

        def run() -> dict:
            return run_teacher(model, windows, out, kinds=kinds, device=device, dtype=dtype or "float32",
                               model_id=model_id, model_revision=model_revision, micro_batch=micro_batch or 1,
                               domains=domain or None)

        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun rank 0 alone writes, and holds the lock
            with output_lock(out, "teacher"):
                r = run()
        else:
            r = run()
        st = r["stats"]
        canary = ", ".join(f"{c['folder']} {'identical' if c.get('identical') else 'DIFFERS'}" for c in r["canaries"]) or "none"
        typer.echo(f"{out}: {r['written']} sequences written, {r['skipped']} already done; canary {canary}; "
                   f"{st['tokens'] / max(st['wall_s'], 1e-9):,.0f} tokens/s, weight loading {st['load_s']:.1f} s "
                   f"({st['wait_s']:.1f} s not hidden)")
