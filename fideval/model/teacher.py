"""The teacher stage: FP32 logits for every position of every window or cut, streamed into a logit store.

Library side of ``fideval teacher`` with no CLI dependencies, so the GPU machine (no typer) runs it as
``torchrun --nproc-per-node N -m fideval.model.teacher --model ... --windows ... --out ...``. Under
torchrun every rank computes (experts and lm head split, see fideval.model.execution.parallel) and rank 0 alone
writes.

Everything but the loop is the teacher pass's (fideval.model.teacher_pass: the checks before any compute, the
store, resume, settings, the canary's record, the accounting), which ``fideval fused`` drives too. Resume: shards
already present and verified are skipped; a resumed run computes the chunks that hold a missing sequence, whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fideval.errors import FidevalError, StopSignals
from fideval.model.teacher_pass import KINDS, sequence_folders

# the line of an interrupted teacher run, as ``fideval teacher`` prints it (fideval.cli's resumable verbs)
INTERRUPTED = ("teacher interrupted: the finished shards are kept, the partial one was discarded (run the same command "
               "again to resume: finished shards are skipped)")


class _Quiet:
    """Progress stand-in for ranks other than 0 (one progress line per run, not per rank)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def advance(self, n=1):
        pass


def run_teacher(model_dir, windows_dir, out, *, kinds=KINDS, device="auto", dtype="float32", model_id=None,
                model_revision=None, micro_batch: int | str = "auto", mlp_tokens: int | str | None = "auto",
                chunk_bytes: int | str | None = "auto", peak_tflops: float | None = None,
                domains: list[str] | None = None, implementation: str = "transformers", code: str | None = None,
                trust_remote_code: bool = False, lm_head: str = "auto", routes: bool = False, store: str = "auto",
                reference_experts: str = "vendor") -> dict:
    """The teacher run; returns ``written``, ``skipped``, ``canaries``, ``stats`` (the runner's), ``settings``
    (what ran) and ``profile`` (the whole run's accounting, also in the store's manifest meta). ``implementation``
    ``reference`` runs the vendor's code (``code``: its folder, relative to the model or absolute; needs
    ``trust_remote_code``); the store's ``teacher`` block then records the code's SHA-256 per file and kernels.
    ``lm_head``: the head's arithmetic (fideval.model.execution.head), recorded; a resumed store keeps its own.
    ``routes``: every MoE layer's routes of each sequence written into ``out/routes/`` (docs/formats-routes.md;
    the shards' bytes are those of a run without). ``store``: ``logits`` (the FP32 logits), ``hidden`` (the final
    norm's output, with the head beside it in ``head.safetensors``; docs/formats-store.md) or ``auto`` (hidden, logits
    with the reference code)."""
    from fideval.formats import routes as route_files
    from fideval.model import sizing
    from fideval.model.flops import flops_per_token
    from fideval.model.teacher_pass import TeacherPass
    from fideval.progress import progress

    asked = {k: sizing.parse(v, "--" + k.replace("_", "-"), off=k != "micro_batch")
             for k, v in (("micro_batch", micro_batch), ("mlp_tokens", mlp_tokens), ("chunk_bytes", chunk_bytes))}
    windows_dir, folders = sequence_folders(Path(windows_dir), tuple(kinds))
    tp = TeacherPass(model_dir, windows_dir, folders, out, asked=asked, device=device, dtype=dtype, domains=domains,
                     model_id=model_id, model_revision=model_revision, implementation=implementation, code=code,
                     reference_experts=reference_experts,
                     trust_remote_code=trust_remote_code, lm_head=lm_head, peak_tflops=peak_tflops, store=store)
    runner = tp.runner(routes=True) if routes else tp.runner()
    tp.start(runner)
    canaries, flops, done = [], 0.0, tp.done
    try:
        with (progress("teacher", total=tp.todo, unit="sequences") if tp.rank == 0 else _Quiet()) as bar:
            for f, s in zip(tp.folders, tp.seqs):
                if all(sid in done for sid in s.ids):
                    continue
                row = {sid: k for k, sid in enumerate(s.ids)}
                per_token = flops_per_token(tp.config, s.tokens.shape[1])["total"]
                # A resumed run computes the chunks that hold a missing sequence, whole: its micro-batches and MLP
                # blocks are an uninterrupted run's, so its shards are bit-identical; the canary's first pass,
                # when its chunk is done, is the stored shard.
                for sid, logits in runner.iter_logits(s, skip=done.__contains__, stored_digest=tp.stored_digest):  # or states
                    tp.write(s, row[sid], logits)
                    if routes:
                        took = runner.routes.pop(row[sid])
                        if tp.rank == 0:
                            route_files.write_sequence(tp.out, sid, took)
                    flops += per_token * logits.shape[0]
                    bar.advance(1)
                canaries.append({"folder": f.name, **(runner.canary or {"identical": None})})  # None: unchecked
        tp.flush()
        if routes and tp.rank == 0:
            route_files.write_index(tp.out, "teacher", {"shards": {sid: tp.sha256(sid) for s in tp.seqs for sid in s.ids}})
        stats = runner.finish_profile()
    except BaseException:
        tp.close()
        raise
    prof = tp.finish(stats, tokens=stats["tokens"], model_flops=flops,
                     canary=(canaries[0] if len(canaries) == 1 else canaries) if canaries else None)
    tp.check_canaries(canaries, "the store was")
    return {"written": tp.written, "skipped": len(done), "canaries": canaries, "stats": dict(stats),
            "settings": tp.settings.recorded(), "profile": prof}


def main(argv=None) -> int:
    """``python -m fideval.model.teacher`` / ``torchrun -m fideval.model.teacher`` (no typer needed)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="fideval.model.teacher", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--windows", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="windows,cuts")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--micro-batch", default="auto", help="sequences per attention call, or auto")
    ap.add_argument("--mlp-tokens", default="auto", help="MLP token block (throughput mode), auto, or off")
    ap.add_argument("--chunk-bytes", default="auto", help="hidden-state bytes per chunk, auto, or off (4 GiB)")
    ap.add_argument("--implementation", default="transformers", choices=("transformers", "reference"))
    ap.add_argument("--code", help="the reference code's folder (default: <model>/inference)")
    ap.add_argument("--trust-remote-code", action="store_true", help="needed by --implementation reference")
    ap.add_argument("--lm-head", default="auto", choices=("auto", "float32", "bf16"),
                    help="the lm head's arithmetic (auto: bf16 products with float32 sums where exact, docs/runner.md)")
    ap.add_argument("--peak-tflops", type=float, help="the GPU's peak for the utilisation figure (default: by its name)")
    ap.add_argument("--store", default="auto", choices=("auto", "hidden", "logits"),
                    help="what the store keeps: the final norm's output and the head, or the FP32 logits (auto: hidden)")
    ap.add_argument("--routes", action="store_true", help="also record the MoE routes into <out>/routes/ (docs/formats-routes.md)")
    ap.add_argument("--model-id")
    ap.add_argument("--model-revision")
    a = ap.parse_args(argv)
    # SIGTERM (torchrun's agent stopping the ranks, a scheduler's time limit) takes Ctrl-C's path, as in fideval.cli
    with StopSignals() as stop:
        try:
            r = run_teacher(a.model, a.windows, a.out, kinds=tuple(x for x in a.lengths.split(",") if x), device=a.device,
                            dtype=a.dtype, model_id=a.model_id, model_revision=a.model_revision, micro_batch=a.micro_batch,
                            mlp_tokens=a.mlp_tokens, chunk_bytes=a.chunk_bytes, peak_tflops=a.peak_tflops,
                            implementation=a.implementation, code=a.code, trust_remote_code=a.trust_remote_code,
                            lm_head=a.lm_head, routes=a.routes, store=a.store)
        except FidevalError as e:
            print(f"fideval: error: {e.line()}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"fideval: {stop.named(INTERRUPTED)}", file=sys.stderr)
            return stop.status()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: r[k] for k in ("written", "skipped", "canaries", "settings", "profile")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
