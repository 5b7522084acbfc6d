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
import time
from pathlib import Path

from fideval.errors import FidevalError

KINDS = ("windows", "cuts")


def tokenizer_shas(model_dir: Path, windows_dir: Path) -> tuple[str | None, str | None]:
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


def recorded_settings(out: Path) -> dict | None:
    """The bit-shaping settings an existing store (a finished one, or the shards of a killed run) was written
    with, from its manifest or a shard's header; None for a new store. A ``teacher`` block without
    ``mlp_tokens`` (older stores) means no throughput mode."""
    from fideval.model.sizing import RECORDED
    from fideval.store import manifest as mf
    from fideval.store.shard import read_header

    meta = None
    if (out / mf.MANIFEST).is_file():
        meta = mf.load_manifest(out)["meta"]
    else:
        for shard in sorted((out / "shards").glob("*.safetensors"))[:1] if (out / "shards").is_dir() else []:
            try:
                meta = read_header(shard).meta
            except FidevalError:  # a damaged shard is rewritten; its settings say nothing
                meta = None
    if not meta or not meta.get("teacher"):
        return None
    ran = json.loads(meta["teacher"])
    return {k: ran.get(k) for k in (*RECORDED, "lm_head")}


def adopt_head(asked: str, recorded: str | None, where: str) -> str:
    """The lm head mode of a run that writes into a store recorded with ``recorded`` (None: a new store): the
    recorded one for ``auto``, else ``asked``, which must then match (a resumed store is bit-identical)."""
    from fideval.model.head import MODES

    if asked not in MODES:
        raise FidevalError(f"lm head {asked!r} is not known", hint=f"use one of {', '.join(MODES)}")
    if recorded is None or asked == recorded:
        return asked
    if asked == "auto":
        return recorded
    raise FidevalError(f"{where} was written with lm head {recorded!r}, this run asks for {asked!r}",
                       hint="resume with the same lm head (or auto), or write a new store")


def stored_digest(out: Path, seq_id: str) -> str | None:
    """The digest (fideval.model.determinism.digest) of a finished shard's logits: a resumed run's canary
    compares its recomputation of the first micro-batch with what the first run stored."""
    import numpy as np
    import torch

    from fideval.model.determinism import digest
    from fideval.store.shard import read_header, shard_rel

    path = out / shard_rel(seq_id)
    try:
        head = read_header(path)
    except FidevalError:
        return None
    logits = np.fromfile(path, dtype="<f4", count=head.rows * head.vocab, offset=head.logits_offset)
    return digest(torch.from_numpy(logits.reshape(head.rows, head.vocab)))


def store_meta(model_dir: Path, ckpt, *, implementation: str, arch: str, dtype: str, dev, world: int, release, vocab: int,
               model_id: str | None, model_revision: str | None, tokenizer_sha256: str | None) -> tuple[dict, dict]:
    """The store's ``teacher`` block (what computed the logits; the settings join it once sized) and its meta."""
    import torch

    from fideval.model import fp8_release
    from fideval.model.device import resolve_dtype

    runner_module = "fideval.model.reference.runner" if implementation == "reference" else "fideval.model.runner"
    block = {"runner": runner_module, "implementation": implementation, "arch": arch, "dtype": dtype,
             "device": dev.type, "model_parallel": world,
             # CPU float sums change order with the thread count: part of what makes logits reproducible
             "torch_threads": torch.get_num_threads() if dev.type == "cpu" else None,
             "weights": fp8_release.describe(ckpt, release, resolve_dtype(dtype), dev)}
    meta = {"model_id": model_id or model_dir.name, "model_revision": model_revision or "local",
            "tokenizer_sha256": tokenizer_sha256 or "unknown", "vocab_size": vocab, "kind": "logits", "teacher": block}
    return block, meta


def read_checked(windows_dir: Path, folders: list[Path], domains: list[str] | None, vocab: int) -> list:
    """The sequences of ``folders`` (only ``domains`` when given), every token id checked against the vocabulary
    before the first forward pass."""
    from fideval.windows.layout import read_sequences

    seqs = [read_sequences(f).select_domains(domains) for f in folders]
    if domains and not any(len(s.ids) for s in seqs):
        raise FidevalError(f"{windows_dir}: no sequences of domain {', '.join(domains)}",
                           hint="check --domain against the config's domains")
    for f, s in zip(folders, seqs):
        if s.tokens.size and int(s.tokens.max()) >= vocab:
            raise FidevalError(f"{f}: token id {int(s.tokens.max())} is outside the model's vocabulary of {vocab}",
                               hint="the windows were tokenized with another tokenizer than this model's")
    return seqs


def sized_settings(dev, dtype: str, config, seqs: list, todo: int, out: Path, world: int, group, asked: dict,
                   recorded: dict | None, reference: bool = False, models: int = 1, stored_bytes: int | None = None):
    """Sizing (fideval.model.sizing) for the longest sequences of the run, every ``auto`` a resumed store recorded
    taken from it; under torchrun rank 0's settings for every rank. ``reference``: the vendor's code, whose
    attention materialises its scores and splits its heads over the ranks."""
    from fideval.model import sizing
    from fideval.model.device import resolve_dtype

    asked = sizing.adopt(asked, recorded, f"store {out}")
    length = max((s.tokens.shape[1] for s in seqs if s.tokens.size), default=1)
    st = sizing.choose(dev, resolve_dtype(dtype), config, length, n_sequences=todo, world=world,
                       math_attention=True if reference else None, split_heads=reference, models=models,
                       stored_bytes=stored_bytes, **asked)
    if world > 1:  # sized from each rank's free memory: rank 0's numbers for all, or ranks would differ in bits
        import torch.distributed as dist

        box = [st]
        dist.broadcast_object_list(box, src=0, group=group)
        st = box[0]
    return st


def run_teacher(model_dir, windows_dir, out, *, kinds=KINDS, device="auto", dtype="float32", model_id=None,
                model_revision=None, micro_batch: int | str = "auto", mlp_tokens: int | str | None = "auto",
                chunk_bytes: int | str | None = "auto", peak_tflops: float | None = None,
                domains: list[str] | None = None, implementation: str = "transformers", code: str | None = None,
                trust_remote_code: bool = False, lm_head: str = "auto") -> dict:
    """The teacher run; returns ``written``, ``skipped``, ``canaries``, ``stats`` (the runner's), ``settings``
    (what ran) and ``profile`` (the whole run's accounting, also in the store's manifest meta). ``implementation``
    ``reference`` runs the vendor's code (``code``: its folder, relative to the model or absolute; needs
    ``trust_remote_code``); the store's ``teacher`` block then records the code's SHA-256 per file and kernels.
    ``lm_head``: the head's arithmetic (fideval.model.head), recorded; a resumed store keeps its own."""
    t_start = time.perf_counter()
    from fideval.model import accounting, sizing
    from fideval.model.adapters import Adapter
    from fideval.model.checkpoint import open_weights
    from fideval.model.device import resolve_device, resolve_dtype
    from fideval.model.flops import flops_per_token
    from fideval.model.parallel import init_from_env
    from fideval.model.profile import Timeline
    from fideval.model.runner import RunnerOptions, make_runner
    from fideval.progress import progress
    from fideval.store import StoreWriter
    from fideval.store.background import BackgroundWriter

    model_dir, windows_dir, out = Path(model_dir), Path(windows_dir), Path(out)
    resolve_dtype(dtype)  # a bad name fails before any file is read
    drv = None
    if implementation == "reference":  # the code, its trust, ModelArgs, dtype and the cuts: before the store exists
        from fideval.model.reference.runner import check

        drv = check(model_dir, code=code, trust=trust_remote_code, world=int(os.environ.get("WORLD_SIZE", "1")),
                    dtype=dtype)
    asked = {k: sizing.parse(v, "--" + k.replace("_", "-"), off=k != "micro_batch")
             for k, v in (("micro_batch", micro_batch), ("mlp_tokens", mlp_tokens), ("chunk_bytes", chunk_bytes))}
    if implementation == "reference":  # the vendor's blocks run whole per micro-batch: no throughput mode
        if asked["mlp_tokens"] not in (None, "auto"):
            raise FidevalError("--mlp-tokens (the throughput mode) is not available with the reference code",
                               hint="leave mlp_tokens auto or off with model.implementation: reference")
        asked["mlp_tokens"] = None
        if asked["micro_batch"] == "auto":  # the vendor's attention materialises [B, L, heads, L] scores: one at a time
            asked["micro_batch"] = 1
    windows_dir, folders = sequence_folders(windows_dir, tuple(kinds))
    model_sha, win_sha = tokenizer_shas(model_dir, windows_dir)
    if model_sha and win_sha and model_sha != win_sha:
        raise FidevalError(f"{windows_dir / 'eval-windows.json'} was tokenized with tokenizer {win_sha[:12]}…, "
                           f"{model_dir / 'tokenizer.json'} is {model_sha[:12]}…", hint="rebuild the windows with this model's tokenizer")
    dev = resolve_device(device)
    rank, world, group = init_from_env(dev)
    ckpt = open_weights(model_dir)
    if drv is None:
        adapter = Adapter.load(ckpt)  # the config, checked: sizing needs it before the runner
        vocab, arch, config, release = adapter.vocab_size, adapter.arch, adapter.config, adapter.release
    else:  # the vendor's code is the model: its driver gives the sizes (a family transformers lacks has no config)
        from fideval.model.reference.runner import sizing_config

        arch = (ckpt.config_dict.get("architectures") or [type(drv).__name__])[0]
        vocab, release = int(drv.vocab_size), getattr(ckpt, "release", None)
        config = sizing_config(drv, ckpt.config_dict)
    block, meta = store_meta(model_dir, ckpt, implementation=implementation, arch=arch, dtype=dtype, dev=dev, world=world,
                             release=release, vocab=vocab, model_id=model_id, model_revision=model_revision,
                             tokenizer_sha256=win_sha or model_sha)
    writer = StoreWriter(out, meta) if rank == 0 else None
    seqs = read_checked(windows_dir, folders, domains, vocab)
    done = {sid for s in seqs for sid in s.ids if writer.done(sid)} if writer is not None else set()
    if world > 1:
        import torch.distributed as dist

        box = [sorted(done)]
        dist.broadcast_object_list(box, src=0, group=group)
        done = set(box[0])
    todo = sum(len(s.ids) - sum(sid in done for sid in s.ids) for s in seqs)
    recorded = recorded_settings(out)  # a resumed store's settings: read once, for sizing and the lm head
    st = sized_settings(dev, dtype, config, seqs, todo, out, world, group, asked, recorded,
                        reference=implementation == "reference")
    block.update(st.recorded())
    timeline = Timeline(dev)
    head = adopt_head(lm_head, (recorded or {}).get("lm_head"), f"store {out}")
    opts = RunnerOptions(device=dev, dtype=resolve_dtype(dtype), profile=True, implementation=implementation, code=code,
                         trust_remote_code=trust_remote_code, head=head, **st.runner_options())
    runner = make_runner(model_dir, opts, rank=rank, world=world, group=group, timeline=timeline)
    block["lm_head"] = runner.head_mode
    if implementation == "reference":
        block["reference_code"] = runner.provenance()
        block["weights"] = runner.weights_description
    if writer is not None:  # before the first shard: every shard carries the store's meta
        writer.meta["teacher"] = json.dumps(block, sort_keys=True)
    bg = BackgroundWriter(writer, timeline=timeline) if writer is not None else None
    canaries, written, flops = [], 0, 0.0
    startup = time.perf_counter() - t_start
    timeline.start()
    try:
        with (progress("teacher", total=todo, unit="sequences") if rank == 0 else _Quiet()) as bar:
            for f, s in zip(folders, seqs):
                if all(sid in done for sid in s.ids):
                    continue
                row = {sid: k for k, sid in enumerate(s.ids)}
                per_token = flops_per_token(config, s.tokens.shape[1])["total"]
                # A resumed run computes the chunks that hold a missing sequence, whole: its micro-batches and MLP
                # blocks are an uninterrupted run's, so its shards are bit-identical; the canary's first pass,
                # when its chunk is done, is the stored shard.
                for sid, logits in runner.iter_logits(s, skip=done.__contains__,
                                                      stored_digest=(lambda x: stored_digest(out, x)) if rank == 0 else None):
                    if bg is not None:
                        k = row[sid]
                        bg.write(sid, logits, s.tokens[k], s.window_of(sid), s.domains[k])
                    written += 1
                    flops += per_token * logits.shape[0]
                    bar.advance(1)
                canaries.append({"folder": f.name, **(runner.canary or {"identical": None})})  # None: unchecked
        if bg is not None:
            with timeline.part("store_write"):
                bg.flush()
        stats = runner.finish_profile()
        wall = time.perf_counter() - t_start
    except BaseException:
        if bg is not None:
            bg.close()
        raise
    peak = peak_tflops if peak_tflops is not None else accounting.peak_tflops(accounting.device_name(dev), dtype)
    hidden = {"load": accounting.hidden_share(stats["load_s"], stats["wait_s"])}
    if bg is not None:
        hidden["write"] = bg.hidden()
    prof = accounting.summary(wall, {"startup": startup, **stats.get("parts", {})}, device=accounting.device_name(dev),
                              tokens=stats["tokens"], model_flops=flops, peak=peak if dev.type == "cuda" else None,
                              world=world, hidden=hidden)
    result = {"written": written, "skipped": len(done), "canaries": canaries, "stats": dict(stats), "settings": st.recorded(),
              "profile": prof}
    bad = [c for c in canaries if c.get("identical") is False]
    if bg is not None:
        # StoreWriter.finish() takes no meta: the verdict and the profile join the manifest meta here; store meta
        # values are strings (docs/formats-store.md), so they are JSON text like `teacher`
        if canaries:
            bg.meta["canary"] = json.dumps(canaries[0] if len(canaries) == 1 else canaries, sort_keys=True)
        bg.meta["profile"] = json.dumps(prof, sort_keys=True)
        bg.finish()
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
    ap.add_argument("--micro-batch", default="auto", help="sequences per attention call, or auto")
    ap.add_argument("--mlp-tokens", default="auto", help="MLP token block (throughput mode), auto, or off")
    ap.add_argument("--chunk-bytes", default="auto", help="hidden-state bytes per chunk, auto, or off (4 GiB)")
    ap.add_argument("--implementation", default="transformers", choices=("transformers", "reference"))
    ap.add_argument("--code", help="the reference code's folder (default: <model>/inference)")
    ap.add_argument("--trust-remote-code", action="store_true", help="needed by --implementation reference")
    ap.add_argument("--lm-head", default="auto", choices=("auto", "float32", "bf16"),
                    help="the lm head's arithmetic (auto: bf16 products with float32 sums where exact, docs/runner.md)")
    ap.add_argument("--peak-tflops", type=float, help="the GPU's peak for the utilisation figure (default: by its name)")
    ap.add_argument("--model-id")
    ap.add_argument("--model-revision")
    a = ap.parse_args(argv)
    try:
        r = run_teacher(a.model, a.windows, a.out, kinds=tuple(x for x in a.lengths.split(",") if x), device=a.device,
                        dtype=a.dtype, model_id=a.model_id, model_revision=a.model_revision, micro_batch=a.micro_batch,
                        mlp_tokens=a.mlp_tokens, chunk_bytes=a.chunk_bytes, peak_tflops=a.peak_tflops,
                        implementation=a.implementation, code=a.code, trust_remote_code=a.trust_remote_code,
                        lm_head=a.lm_head)
    except FidevalError as e:
        print(f"fideval: error: {e.line()}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: r[k] for k in ("written", "skipped", "canaries", "settings", "profile")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
