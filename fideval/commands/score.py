"""``fideval score``: FP64 full-vocabulary scoring of a candidate against the teacher store -> records."""

from __future__ import annotations

from pathlib import Path

import typer

from fideval.errors import FidevalError


def register(app: typer.Typer) -> None:
    @app.command()
    def score(
        teacher: str = typer.Option(..., "--teacher", help="teacher logit store: a folder or hf://datasets/ORG/NAME@REV/sub"),
        candidate: str = typer.Option(None, "--candidate", help="candidate logit store (folder or hf://...); with --config, a candidate name from the config"),
        config: Path = typer.Option(None, "--config", help="run the config's candidate through the layer-by-layer runner instead of reading a store"),
        out: Path = typer.Option(..., "--out", help="records folder: records.parquet + score.json"),
        name: str = typer.Option(None, "--name", help="candidate name in the records (default: the store's folder name)"),
        path: str = typer.Option("store", "--path", help="records 'path' column: serving, weights-only or store"),
        self_check: bool = typer.Option(False, "--self-check", help="first score the teacher against itself (must be exactly 0 KLD, 100 % top-1); alone, that is the run"),
        device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
        kernel: str = typer.Option("auto", "--kernel", help="auto (triton on CUDA), triton or torch"),
        cpu_check_every: int = typer.Option(1000, "--cpu-check-every", help="re-score 1 row in N (plus each shard's first and last) with the numpy float64 reference"),
        tolerance: float = typer.Option(2e-12, "--cpu-check-tolerance", help="largest allowed relative difference to the reference"),
        on_nonfinite: str = typer.Option("fail", "--on-nonfinite", help="fail (default) or skip rows holding NaN/+inf"),
    ) -> None:
        """Score candidate logits against the teacher's in float64 over the full vocabulary."""
        from fideval.score.run import pick, score_candidate, store_candidates, teacher_candidates
        from fideval.store import StoreReader
        from fideval.store.hub import resolve_store

        if path not in ("serving", "weights-only", "store"):
            raise FidevalError(f"--path {path!r}: expected serving, weights-only or store")
        if on_nonfinite not in ("fail", "skip"):
            raise FidevalError(f"--on-nonfinite {on_nonfinite!r}: expected fail or skip")
        if candidate is None and not self_check:
            raise FidevalError("give --candidate STORE (or --self-check to score the teacher against itself)")
        t = StoreReader(resolve_store(teacher))
        extra, order = None, None
        if config is not None:
            from fideval.score.candidate import emulated
            from fideval.config import load_config

            cfg = load_config(config)
            if candidate is None or path == "store":
                raise FidevalError("with --config give --candidate NAME and --path serving|weights-only",
                                   hint="names and paths are in the config's candidates")
            run = emulated(cfg, candidate, path, t, device)
            items, label, first, extra = run.logits, candidate, self_check, run.info
            cpu_check_every = cfg.score.cpu_check_every if cpu_check_every == 1000 else cpu_check_every
            on_nonfinite = cfg.score.on_nonfinite if on_nonfinite == "fail" else on_nonfinite
        elif candidate is None:
            items = teacher_candidates(t, t.seq_ids)
            label, first = name or "self", False
        else:
            c = StoreReader(resolve_store(candidate))
            if c.vocab_size != t.vocab_size:
                raise FidevalError(f"--candidate {candidate}: vocab_size {c.vocab_size} differs from the teacher's {t.vocab_size}",
                                   hint="teacher and candidate must share the tokenizer and output width")
            missing = [s for s in t.seq_ids if s not in c.entries]
            if missing:
                raise FidevalError(f"--candidate {candidate}: no shard for {len(missing)} teacher sequences (first {missing[0]!r})",
                                   hint="make the candidate store from the same windows")
            dev, _ = pick(device, kernel)
            items = store_candidates(c, t.seq_ids, device=dev if dev.type == "cuda" else None)
            label, first, order = name or Path(str(candidate).rstrip("/")).name, self_check, t.seq_ids
        from fideval.lock import output_lock

        with output_lock(out, "score"):
            summary = score_candidate(t, items, candidate=label, path=path, out_dir=out, device=device,
                                      cpu_check_every=cpu_check_every, cpu_check_tolerance=tolerance,
                                      on_nonfinite=on_nonfinite, kernel=kernel, self_check_first=first,
                                      teacher_spec=teacher, candidate_is_teacher=candidate is None and config is None,
                                      candidate_info=extra, teacher_order=order)
        typer.echo(f"{out}: {summary['rows']:,} rows scored with {summary['kernel']} on {summary['device']}; "
                   f"CPU check {summary['cpu_check']['rows_checked']} rows, max rel diff {summary['cpu_check']['max_rel_diff']:.2g}")
