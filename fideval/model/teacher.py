"""The teacher stage: FP32 logits for every position of every window or cut, streamed into a logit store.

Library side of ``fideval teacher`` with no CLI dependencies, so the GPU machine (no typer) runs it as
``torchrun --nproc-per-node N -m fideval.model.teacher --model ... --windows ... --out ...``. Under
torchrun every rank computes (experts and lm head split, see parallel.py) and rank 0 alone writes.

Checks before any compute: the windows' tokenizer fingerprint (``eval-windows.json`` provenance) must
equal the model folder's ``tokenizer.json`` SHA-256 when both exist, and no token id may reach the
model's vocabulary size. Resume: shards already present and verified (``StoreWriter.done``) are skipped.
The canary verdict (the first micro-batch recomputed at the end, bit for bit) lands in the manifest meta.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fideval.errors import FidevalError

KINDS = ("windows", "cuts")


def _tokenizer_shas(model_dir: Path, windows_dir: Path) -> tuple[str | None, str | None]:
    from fideval.fsio import sha256_file

    tok = model_dir / "tokenizer.json"
    model_sha = sha256_file(tok) if tok.is_file() else None
    win_sha = None
    ev = windows_dir / "eval-windows.json"
    if ev.is_file():
        try:
            win_sha = (json.loads(ev.read_text()).get("provenance") or {}).get("tokenizer_sha256")
        except (OSError, ValueError, AttributeError):
            raise FidevalError(f"{ev} is not valid JSON", hint="rebuild the windows") from None
    return model_sha, win_sha


def sequence_folders(windows: Path, kinds: tuple[str, ...]) -> tuple[Path, list[Path]]:
    """The windows folder (its ``eval-windows.json`` names the tokenizer) and the sequence folders to run.

    Given one token file (``cuts-512/tokens.safetensors``, the file a workflow rule declares), exactly its
    folder, whose length must be one of ``kinds``; given the windows folder, its ``windows-<W>/`` and
    ``cuts-<C>/`` folders of ``kinds``."""
    from fideval.windows.layout import FILE

    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise FidevalError(f"--lengths: {bad[0]!r} is not one of {', '.join(KINDS)}", hint="e.g. --lengths windows,cuts")
    if windows.is_file():
        kind = windows.parent.name.rpartition("-")[0]
        if windows.name != FILE or kind not in KINDS:
            raise FidevalError(f"--windows {windows}: not a {FILE} in a windows-<W>/ or cuts-<C>/ folder", hint="give the windows folder")
        if kind not in kinds:
            raise FidevalError(f"--windows {windows} holds {kind}, not --lengths {','.join(kinds)}", hint=f"pass --lengths {kind}")
        return windows.parent.parent, [windows.parent]
    folders = [p for k in kinds for p in sorted(windows.glob(f"{k}-*")) if p.is_dir()]
    if not folders:
        raise FidevalError(f"{windows} has no {' or '.join(k + '-<L>/' for k in kinds)} folder", hint="run 'fideval windows' first")
    return windows, folders


class _Quiet:
    """Progress stand-in for ranks other than 0 (one progress line per run, not per rank)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def advance(self, n=1):
        pass


def run_teacher(model_dir, windows_dir, out, *, kinds=KINDS, device="auto", dtype="float32", model_id=None,
                model_revision=None, micro_batch: int = 1, domains: list[str] | None = None) -> dict:
    import torch

    from fideval.model.device import resolve_device, resolve_dtype
    from fideval.model.parallel import init_from_env
    from fideval.model.runner import Runner, RunnerOptions
    from fideval.progress import progress
    from fideval.store import StoreWriter
    from fideval.windows.layout import read_sequences

    model_dir, windows_dir, out = Path(model_dir), Path(windows_dir), Path(out)
    resolve_dtype(dtype)  # a bad name fails before any file is read
    windows_dir, folders = sequence_folders(windows_dir, tuple(kinds))
    model_sha, win_sha = _tokenizer_shas(model_dir, windows_dir)
    if model_sha and win_sha and model_sha != win_sha:
        raise FidevalError(f"{windows_dir / 'eval-windows.json'} was tokenized with tokenizer {win_sha[:12]}…, "
                           f"{model_dir / 'tokenizer.json'} is {model_sha[:12]}…", hint="rebuild the windows with this model's tokenizer")
    dev = resolve_device(device)
    rank, world, group = init_from_env(dev)
    opts = RunnerOptions(device=dev, dtype=resolve_dtype(dtype), micro_batch=micro_batch)
    runner = Runner(model_dir, opts, rank=rank, world=world, group=group)
    meta = {"model_id": model_id or model_dir.name, "model_revision": model_revision or "local",
            "tokenizer_sha256": win_sha or model_sha or "unknown", "vocab_size": runner.vocab_size, "kind": "logits",
            "teacher": {"runner": "fideval.model.runner", "arch": runner.adapter.arch, "dtype": dtype,
                        "device": dev.type, "model_parallel": world, "micro_batch": micro_batch,
                        # CPU float sums change order with the thread count: part of what makes logits reproducible
                        "torch_threads": torch.get_num_threads() if dev.type == "cpu" else None,
                        "lm_head": "float32", "weights": runner.weights_description}}
    writer = StoreWriter(out, meta) if rank == 0 else None
    seqs = [read_sequences(f).select_domains(domains) for f in folders]
    if domains and not any(len(s.ids) for s in seqs):
        raise FidevalError(f"{windows_dir}: no sequences of domain {', '.join(domains)}",
                           hint="check --domain against the config's domains")
    for f, s in zip(folders, seqs):  # every length checked before the first forward pass
        if s.tokens.size and int(s.tokens.max()) >= runner.vocab_size:
            raise FidevalError(f"{f}: token id {int(s.tokens.max())} is outside the model's vocabulary of {runner.vocab_size}",
                               hint="the windows were tokenized with another tokenizer than this model's")
    done = {sid for s in seqs for sid in s.ids if writer.done(sid)} if writer is not None else set()
    if world > 1:
        import torch.distributed as dist

        box = [sorted(done)]
        dist.broadcast_object_list(box, src=0, group=group)
        done = set(box[0])
    todo = sum(len(s.ids) - sum(sid in done for sid in s.ids) for s in seqs)
    canaries, written = [], 0
    with (progress("teacher", total=todo, unit="sequences") if rank == 0 else _Quiet()) as bar:
        for f, s in zip(folders, seqs):
            if all(sid in done for sid in s.ids):
                continue
            row = {sid: k for k, sid in enumerate(s.ids)}
            # Only missing sequences run: the micro-batches a resumed run forms are the ones an uninterrupted
            # run would form for them, so its shards are bit-identical (the canary is the first one computed).
            for sid, logits in runner.iter_logits(s, skip=done.__contains__):
                if writer is not None:
                    k = row[sid]
                    writer.write(sid, logits, s.tokens[k], s.window_of(sid), s.domains[k])
                written += 1
                bar.advance(1)
            canaries.append({"folder": f.name, **(runner.canary or {})})
    result = {"written": written, "skipped": len(done), "canaries": canaries, "stats": dict(runner.stats)}
    bad = [c for c in canaries if not c.get("identical")]
    if writer is not None:
        if canaries:  # StoreWriter.finish() takes no meta: the verdict joins the manifest meta here
            # store meta values are strings (docs/formats-store.md), so the verdict is JSON text like `teacher`
            writer.meta["canary"] = json.dumps(canaries[0] if len(canaries) == 1 else canaries, sort_keys=True)
        writer.finish()
    if bad:
        raise FidevalError(f"canary {bad[0].get('seq_id')} in {bad[0]['folder']} changed between the start and the end of the run "
                           f"({bad[0].get('sha256_start', '')[:12]} vs {bad[0].get('sha256_end', '')[:12]})",
                           hint="the run is not bit-reproducible on this device; the store was written, its manifest records it")
    return result


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
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--model-id")
    ap.add_argument("--model-revision")
    a = ap.parse_args(argv)
    try:
        r = run_teacher(a.model, a.windows, a.out, kinds=tuple(x for x in a.lengths.split(",") if x), device=a.device,
                        dtype=a.dtype, model_id=a.model_id, model_revision=a.model_revision, micro_batch=a.micro_batch)
    except FidevalError as e:
        print(f"fideval: error: {e.line()}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: r[k] for k in ("written", "skipped", "canaries")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
