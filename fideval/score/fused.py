"""The fused pass (``fideval fused``): the teacher store and every emulated candidate's records from one pass.

Why: separately, each candidate pass reads every layer's weights again and reads the teacher's whole store back
from disk; at the seed's size the read-back alone is 24 of an extrapolated 46 minutes (docs/runner.md). Here the
teacher and the candidates advance through each layer together (fideval.model.lockstep: one read of each layer),
the teacher's logits stream into its store exactly as ``fideval teacher`` writes them, and each candidate's rows
are scored against the teacher's rows of the same micro-batch while both are on the device. The teacher against
itself (the self-check, ``records/teacher-self``) is scored the same way.

What it writes is what the separate verbs write from the same settings: the store's shards byte for byte (the
settings, sized for all the pass's models, are recorded in the store; the manifest's meta adds ``fused``, the
candidates of the pass, and the pass's profile), and every ``records.parquet`` byte for byte (the same rows,
kernel and CPU-check sampling). Each ``score.json`` carries the pass's profile. Resuming: finished teacher shards
and records kept in ``records.partial/`` (fideval.score.resume) are skipped; a chunk holding anything missing for
any model is computed whole, so resumed bits equal an uninterrupted run's. A candidate shard's records are kept
once the teacher shard they were scored against is on disk (its SHA-256 is their key).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fideval.errors import FidevalError, Interrupted

SELF = ("self", "store")  # the self-check's candidate name and path (``fideval score --self-check``)


def fusable(cfg: Any) -> list[tuple[Any, str]]:
    """The config's (candidate, path) pairs the fused pass runs: every emulated candidate (a real build reads its
    own files, so it keeps its own pass)."""
    return [(c, p) for c in cfg.candidates if c.checkpoint is None for p in c.paths]


def refusal(cfg: Any) -> str | None:
    """Why the config cannot run fused (``fideval validate`` asks this when ``teacher.fused`` is set), else None."""
    if cfg.model.implementation != "transformers":
        return "teacher.fused needs model.implementation: transformers (the reference code loads its own weights)"
    if cfg.teacher.model_parallel > 1:
        return f"teacher.fused runs on one GPU, not model_parallel {cfg.teacher.model_parallel}"
    if not fusable(cfg):
        return "teacher.fused needs at least one emulated candidate (a quant: spec); real builds run their own pass"
    return None


class _Live:
    """The teacher as the scorer sees it (a StoreReader's ``vocab_size``/``entry``/``row_start``/``meta``) before its
    store is finished, and the feed of the rows in flight: the teacher's logits of the current micro-batch."""

    def __init__(self, seqs: Any, vocab: int, meta: dict[str, Any], root: Path):
        self.vocab_size, self.meta, self.root = vocab, meta, root
        self.seq_ids = list(seqs.ids)
        L = int(seqs.tokens.shape[1])
        self._entries = {sid: {"tokens": L, "rows": L, "row_start": 0, "window_id": seqs.window_of(sid),
                               "domain": seqs.domains[k]} for k, sid in enumerate(self.seq_ids)}
        self.rows: dict[str, tuple[Any, Any]] = {}

    def entry(self, sid: str) -> dict[str, Any]:
        return self._entries[sid]

    def row_start(self, sid: str) -> int:
        return 0

    def get(self, sid: str):  # the TeacherFeed interface
        return self.rows.get(sid)


@dataclass
class _Scoring:
    """One candidate (or the self-check) of the pass: its scorer, its kept shards and those waiting for their key."""

    candidate: Any
    out_dir: Path
    settings: Any  # fideval.score.run.ScoreSettings
    run: Any  # fideval.score.run._Run
    cache: Any  # fideval.score.resume.ShardCache
    starts: dict[str, int]
    stats: dict[str, dict] = field(default_factory=dict)  # kept or scored shards' figures
    waiting: list = field(default_factory=list)  # scored, waiting for their teacher shard on disk

    def score(self, sid: str, logits: Any) -> None:
        from fideval.score.candidate import CandidateShard
        from fideval.score.records import shard_table
        from fideval.score.run import _scored

        self.run.seen = self.starts[sid]
        out, st = _scored(self.run, CandidateShard(sid, logits))
        with self.run.tl.part("records"):
            table = shard_table(candidate=self.candidate.name, path=self.candidate.path, **out) if out and st["rows"] else None
        self.waiting.append((sid, table, st))

    def keep(self, teacher_sha: Any) -> None:
        """Keep the waiting shards whose teacher shard is written (``teacher_sha(sid)``: its SHA-256, or None)."""
        still = []
        for sid, table, st in self.waiting:
            sha = teacher_sha(sid)
            if sha is None:
                still.append((sid, table, st))
                continue
            with self.run.tl.part("records"):
                self.cache.save(sid, self.cache.key(sid, sha, None, self.starts[sid]), table, st)
            self.stats[sid] = st
        self.waiting = still


def chunks_note(n: int, fused_seqs: int, separate_seqs: int) -> str:
    """What the start line adds when the fused pass needs more chunks than a separate pass would (its models' states
    share the GPU): each extra chunk reads and materialises every unit of every model again, which on an 80 GB GPU at
    DeepSeek-V3 layer sizes made the fused compute slower than the separate ones (docs/runner.md, 'The fused pass')."""
    fused, alone = -(-n // max(1, fused_seqs)), -(-n // max(1, separate_seqs))
    if fused <= alone:
        return ""
    return (f"; a separate pass would compute {alone} chunk{'s' if alone != 1 else ''} here, and each extra chunk "
            "materialises every unit of every model again: teacher.fused: false may be faster on this GPU "
            "(docs/runner.md, 'The fused pass')")


def one_length(windows: str | Path) -> tuple[Path, Path, str]:
    """The windows folder, the one sequence folder and its kind (``windows``/``cuts``) a fused pass runs on."""
    from fideval.model.teacher import sequence_folders

    windows_dir, folders = sequence_folders(Path(windows), ("windows", "cuts"))
    if len(folders) != 1:
        raise FidevalError(f"--windows {windows}: the fused pass takes one token file (one length)",
                           hint="give windows-<W>/tokens.safetensors or cuts-<C>/tokens.safetensors")
    return windows_dir, folders[0], folders[0].name.rpartition("-")[0]


def run_fused(cfg: Any, windows: str | Path, domain: str, out: str | Path, records: str | Path, *, device: str = "auto",
              settings: Any = None, self_check: bool = True, peak_tflops: float | None = None) -> dict[str, Any]:
    """The fused pass over one token file's sequences of ``domain``: the teacher store at ``out`` and each candidate's
    records at ``records/<candidate>/<path>/<kind>/<domain>`` (the self-check's at ``records/self...``: see
    :func:`records_dir`). Returns ``written``, ``skipped``, ``canaries``, ``settings``, ``profile`` and ``scored``
    (each records folder's score.json)."""
    t_start = time.perf_counter()
    from fideval.model import accounting
    from fideval.model.adapters import Adapter
    from fideval.model.checkpoint import open_weights
    from fideval.model.device import resolve_dtype
    from fideval.model.flops import flops_per_token
    from fideval.model.layer_major import sequences_per_chunk
    from fideval.model.lockstep import Lockstep
    from fideval.model.profile import Timeline
    from fideval.model.runner import Runner, RunnerOptions
    from fideval.model.sizing import parse
    from fideval.model.teacher import (
        adopt_head,
        read_checked,
        recorded_settings,
        sized_settings,
        store_meta,
        stored_digest,
        tokenizer_shas,
    )
    from fideval.model_source import locate
    from fideval.progress import progress
    from fideval.score.candidate import Candidate, describe
    from fideval.score.resume import ShardCache, first_rows
    from fideval.score.run import ScoreSettings, _inputs, _Run, pick
    from fideval.store import StoreWriter
    from fideval.store.background import BackgroundWriter

    why = refusal(cfg)
    if why:
        raise FidevalError(why, hint="set teacher.fused: false to run the teacher and each candidate separately")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise FidevalError("fideval fused runs on one GPU, not under torchrun", hint="set teacher.fused: false for model parallel")
    out, records = Path(out), Path(records)
    windows_dir, folder, kind = one_length(windows)
    files = locate(cfg.model.path, cfg.model.revision)
    model_dir = Path(files.folder)
    model_sha, win_sha = tokenizer_shas(model_dir, windows_dir)
    if model_sha and win_sha and model_sha != win_sha:
        raise FidevalError(f"{windows_dir / 'eval-windows.json'} was tokenized with tokenizer {win_sha[:12]}…, "
                           f"{model_dir / 'tokenizer.json'} is {model_sha[:12]}…", hint="rebuild the windows with this model's tokenizer")
    pairs = fusable(cfg)
    hooks = [describe(cfg, c, p, files) for c, p in pairs]  # specs compiled, classes checked: before the store exists
    settings = settings or ScoreSettings.of(cfg.score, device=device)
    dev, kernel = pick(settings.device, settings.kernel)
    dtype = cfg.teacher.dtype
    ckpt = open_weights(model_dir)
    adapter = Adapter.load(ckpt)
    vocab = adapter.vocab_size
    block, meta = store_meta(model_dir, ckpt, implementation="transformers", arch=adapter.arch, dtype=dtype, dev=dev, world=1,
                             release=adapter.release, vocab=vocab, model_id=cfg.model.id,
                             model_revision=files.revision or cfg.model.revision, tokenizer_sha256=win_sha or model_sha)
    writer = StoreWriter(out, meta)
    seqs = read_checked(windows_dir, [folder], [domain], vocab)[0]
    ids = list(seqs.ids)
    done = {sid for sid in ids if writer.done(sid)}
    live = _Live(seqs, vocab, meta, out)
    starts = first_rows(live, ids, None)
    recorded = recorded_settings(out)
    asked = {k: parse(getattr(cfg.teacher, k), f"teacher.{k}", off=k != "micro_batch")
             for k in ("micro_batch", "mlp_tokens", "chunk_bytes")}
    st = sized_settings(dev, dtype, adapter.config, [seqs], len(ids), out, 1, None, asked, recorded, models=1 + len(pairs),
                        stored_bytes=1 if adapter.release is not None else None)
    block.update(st.recorded())
    alone = None  # a separate pass's chunk, for the start line (a resumed store keeps what it recorded)
    if st.plan and not recorded and asked["chunk_bytes"] == "auto":
        alone = sized_settings(dev, dtype, adapter.config, [seqs], len(ids), out, 1, None, asked, None)
    timeline = Timeline(dev)
    head = adopt_head(cfg.teacher.lm_head, (recorded or {}).get("lm_head"), f"store {out}")
    base = dict(device=dev, dtype=resolve_dtype(dtype), profile=True, **st.runner_options())
    teacher = Runner(model_dir, RunnerOptions(head=head, **base), timeline=timeline)
    block["lm_head"] = teacher.head_mode
    cand_head = "auto" if teacher.head_mode == "bf16" else "float32"  # as fideval.score.candidate.teacher_settings
    runners = [teacher] + [Runner(model_dir, RunnerOptions(head=cand_head, **h, **base), timeline=timeline) for h, _ in hooks]
    named = [(*SELF, None, None)] if self_check else []  # the self-check, as `fideval score --self-check` runs it
    named += [(c.name, p, {**info, "run_settings": {"dtype": dtype, **st.recorded(), "lm_head": r.head_mode}}, settings)
              for (c, p), (_, info), r in zip(pairs, hooks, runners[1:])]
    active: list[_Scoring] = []
    for name, path, info, own in named:
        own = own or ScoreSettings(device=settings.device, kernel=settings.kernel)  # the self-check: no config
        cand = Candidate(name=name, path=path, shards=(), info=info, is_teacher=info is None)
        where = records_dir(records, name, path, kind, domain)
        s = _Scoring(cand, where, own, _Run(live, dev, kernel, own, live, timeline),
                     ShardCache(where, _inputs(cand, kernel, dev, own)), starts)
        for sid in done:  # a teacher shard on disk has its key: its records may be kept from a killed run
            kept = s.cache.load(sid, s.cache.key(sid, writer.entry(sid)["sha256"], None, starts[sid]))
            if kept is not None:
                s.stats[sid] = kept
        active.append(s)
    # scorings[k]: what scores model k's rows (model 0, the teacher: the self-check, when asked)
    scorings: list[_Scoring | None] = ([] if self_check else [None]) + active
    write = {sid for sid in ids if sid not in done}
    emit = {k for k, sid in enumerate(ids) if sid in write or any(sid not in s.stats for s in active)}
    writer.meta["teacher"] = json.dumps(block, sort_keys=True)
    bg = BackgroundWriter(writer, timeline=timeline)
    lock = Lockstep(runners)
    L = seqs.tokens.shape[1]
    per_chunk = lock.chunk_sequences(L)
    n_chunks = -(-len(ids) // per_chunk)
    note = chunks_note(len(ids), per_chunk, sequences_per_chunk(alone.chunk_bytes, L * lock.hidden_size * lock.dtype.itemsize,
                                                                 alone.micro_batch)) if alone else ""
    print(f"fused {kind}/{domain}: {len(runners)} models, {len(emit)} of {len(ids)} sequences to compute in "
          f"{n_chunks} chunk{'s' if n_chunks != 1 else ''} (each layer is read once a chunk); micro-batch "
          f"{st.micro_batch}, mlp tokens {st.mlp_tokens or 'off'}{note}", file=sys.stderr, flush=True)
    last, written = len(runners) - 1, 0

    def teacher_sha(sid: str):
        e = writer.entry(sid)
        return e["sha256"] if e is not None else None

    startup = time.perf_counter() - t_start
    timeline.start()
    try:
        with progress(f"fused {kind}/{domain}", total=len(emit), unit="sequences") as bar:
            first = (lambda: stored_digest(out, ids[0])) if ids else None
            for k, row, logits in lock.run_models(seqs.tokens, emit=emit, canary_start=[first] + [None] * last):
                sid = ids[row]
                if k == 0:
                    if sid in write:
                        bg.write(sid, logits, seqs.tokens[row], seqs.window_of(sid), seqs.domains[row])
                        written += 1
                    live.rows[sid] = (logits, seqs.tokens[row])
                s = scorings[k]
                if s is not None and sid not in s.stats:
                    s.score(sid, logits)
                del logits
                if k == last:
                    live.rows.pop(sid, None)
                    for s in active:
                        s.keep(teacher_sha)
                    bar.advance(1)
        with timeline.part("store_write"):
            bg.flush()
        for s in active:
            s.keep(teacher_sha)
        stats = lock.finish_profile()
    except FidevalError:
        bg.close()
        for s in active:  # a failed scorer keeps nothing (as fideval score does); the teacher's shards stay
            s.cache.clear()
        raise
    except KeyboardInterrupt:
        bg.close()  # the queued teacher shards are written: the records scored against them are kept
        for s in active:
            s.keep(teacher_sha)
        raise Interrupted(f"fused pass interrupted: {len(done) + written} teacher shards and the records scored against "
                          f"them are kept", hint="run the same command again to resume") from None
    except BaseException:
        bg.close()
        raise
    names = ["teacher"] + [f"{c.name}/{p}" for c, p in pairs]
    canaries = [{"folder": folder.name, "model": n, **(c or {"identical": None})} for n, c in zip(names, lock.canaries)]
    tokens = int(stats["tokens"]) * len(runners)
    peak = peak_tflops if peak_tflops is not None else accounting.peak_tflops(accounting.device_name(dev), dtype)
    prof = accounting.summary(time.perf_counter() - t_start, {"startup": startup, **stats.get("parts", {})},
                              device=accounting.device_name(dev), tokens=tokens,
                              model_flops=flops_per_token(adapter.config, seqs.tokens.shape[1])["total"] * tokens,
                              peak=peak if dev.type == "cuda" else None, world=1,
                              hidden={"load": accounting.hidden_share(stats["load_s"], stats["wait_s"]), "write": bg.hidden()})
    teacher_canary = {k: v for k, v in canaries[0].items() if k != "model"}
    bg.meta["canary"] = json.dumps(teacher_canary, sort_keys=True)  # as fideval teacher records it
    bg.meta["profile"] = json.dumps(prof, sort_keys=True)
    bg.meta["fused"] = json.dumps(names[1:])
    bg.finish()
    scored = _conclude(active, ids, out, dev, kernel, prof)
    bad = [c for c in canaries if c.get("identical") is False]
    if bad:
        raise FidevalError(f"canary of {bad[0]['model']} ({bad[0].get('seq_id')}) changed between the start and the end of the "
                           f"pass", hint="the run is not bit-reproducible on this device; the store and records were written")
    return {"written": written, "skipped": len(done), "canaries": canaries, "settings": st.recorded(), "profile": prof,
            "scored": scored, "stats": dict(stats)}


def records_dir(records: Path, name: str, path: str, kind: str, domain: str) -> Path:
    """The workflow's layout: ``records/<candidate>/<path>/<kind>/<domain>``; the self-check's is ``teacher-self``."""
    folder = "teacher-self" if (name, path) == SELF else name
    return Path(records) / folder / path / kind / domain


def _conclude(scorings: list[_Scoring], ids: list[str], out: Path, dev: Any, kernel: str,
              prof: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each records folder's records.parquet and score.json, against the finished store."""
    from fideval.fsio import write_json
    from fideval.score.run import _self_result, conclude, summarize
    from fideval.store import StoreReader

    reader = StoreReader(out)
    done: dict[str, dict[str, Any]] = {}
    for s in scorings:
        conclude(s.run, s.stats, ids, s.cache, s.out_dir)
        checked_self = _self_result(s.run, kernel) if s.candidate.is_teacher else None
        summary = summarize(s.run, s.candidate, reader, None, s.settings, dev, kernel, None, checked_self, prof)
        write_json(s.out_dir / "score.json", summary)
        s.cache.clear()
        done[str(s.out_dir)] = summary
    return done
