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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fideval.errors import FidevalError, Interrupted

if TYPE_CHECKING:
    import torch

    from fideval.config import Config
    from fideval.model.runner import Runner
    from fideval.model.sizing import Settings
    from fideval.model.teacher_pass import TeacherPass
    from fideval.score.candidate import Candidate
    from fideval.score.resume import ShardCache
    from fideval.score.run import Scorer, ScoreSettings
    from fideval.windows.layout import Sequences

SELF = ("self", "store")  # the self-check's candidate name and path (``fideval score --self-check``)


def fusable(cfg: Config) -> list[tuple[Any, str]]:
    """The config's (candidate, path) pairs the fused pass runs: every emulated candidate (a real build reads its
    own files, so it keeps its own pass), and with ``routing: decompose`` each path again with the teacher's routes
    forced (``<path>+teacher-routes``, the routes handed over in memory)."""
    from fideval.score.route_control import SUFFIX

    return [(c, p + suffix) for c in cfg.candidates if c.checkpoint is None
            for suffix in ("", SUFFIX) if suffix == "" or c.routing == "decompose" for p in c.paths]


def refusal(cfg: Config) -> str | None:
    """Why the config cannot run fused (``fideval validate`` asks this when ``teacher.fused`` is set), else None."""
    if cfg.model.implementation != "transformers":
        return "teacher.fused needs model.implementation: transformers (the reference code loads its own weights)"
    if cfg.teacher.model_parallel > 1:
        return f"teacher.fused runs on one GPU, not model_parallel {cfg.teacher.model_parallel}"
    if not fusable(cfg):
        return "teacher.fused needs at least one emulated candidate (a quant: spec); real builds run their own pass"
    return None


class LiveTeacher:
    """The teacher as the scorer sees it before its store is finished (:class:`~fideval.store.rows.TeacherRows`) and
    the feed of the rows in flight (:class:`~fideval.store.rows.RowFeed`): the teacher's logits of the micro-batch
    the lockstep has just computed, on the device, dropped once every model's rows of it are scored."""

    def __init__(self, seqs: Sequences, vocab: int, meta: dict[str, Any], root: Path):
        self.vocab_size, self.meta, self.root = vocab, meta, root
        self.seq_ids = list(seqs.ids)
        L = int(seqs.tokens.shape[1])
        self._entries = {sid: {"tokens": L, "rows": L, "row_start": 0, "window_id": seqs.window_of(sid),
                               "domain": seqs.domains[k]} for k, sid in enumerate(self.seq_ids)}
        self.rows: dict[str, tuple[torch.Tensor, np.ndarray]] = {}

    def entry(self, sid: str) -> dict[str, Any]:
        return self._entries[sid]

    def row_start(self, sid: str) -> int:
        return 0

    def get(self, sid: str) -> tuple[torch.Tensor, np.ndarray] | None:
        return self.rows.get(sid)

    def read(self, sid: str) -> tuple[np.ndarray, np.ndarray]:
        """A sequence's rows as host arrays, while they are in flight (the scorer asks :meth:`get` first)."""
        if sid not in self.rows:
            raise FidevalError(f"the fused pass's teacher rows of {sid} are no longer on the device",
                               hint="a candidate's rows must be scored while the teacher's micro-batch is in flight")
        logits, tokens = self.rows[sid]
        return logits.float().cpu().numpy(), np.asarray(tokens)


@dataclass
class _Scoring:
    """One candidate (or the self-check) of the pass: its scorer, its kept shards and those waiting for their key."""

    candidate: Candidate
    out_dir: Path
    settings: ScoreSettings
    scorer: Scorer
    cache: ShardCache
    starts: dict[str, int]
    stats: dict[str, dict] = field(default_factory=dict)  # kept or scored shards' figures
    waiting: list = field(default_factory=list)  # scored, waiting for their teacher shard on disk

    def score(self, sid: str, logits: torch.Tensor) -> None:
        from fideval.score.candidate import CandidateShard
        from fideval.score.records import shard_table

        out, st = self.scorer.scored(CandidateShard(sid, logits), self.starts[sid])
        with self.scorer.tl.part("records"):
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
            with self.scorer.tl.part("records"):
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
    from fideval.model.teacher_pass import sequence_folders

    windows_dir, folders = sequence_folders(Path(windows), ("windows", "cuts"))
    if len(folders) != 1:
        raise FidevalError(f"--windows {windows}: the fused pass takes one token file (one length)",
                           hint="give windows-<W>/tokens.safetensors or cuts-<C>/tokens.safetensors")
    return windows_dir, folders[0], folders[0].name.rpartition("-")[0]


def run_fused(cfg: Config, windows: str | Path, domain: str, out: str | Path, records: str | Path, *, device: str = "auto",
              settings: ScoreSettings | None = None, self_check: bool = True, peak_tflops: float | None = None) -> dict[str, Any]:
    """The fused pass over one token file's sequences of ``domain``: the teacher store at ``out`` and each candidate's
    records at ``records/<candidate>/<path>/<kind>/<domain>`` (the self-check's at ``records/self...``: see
    :func:`records_dir`). Returns ``written``, ``skipped``, ``canaries``, ``settings``, ``profile`` and ``scored``
    (each records folder's score.json)."""
    why = refusal(cfg)
    if why:
        raise FidevalError(why, hint="set teacher.fused: false to run the teacher and each candidate separately")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise FidevalError("fideval fused runs on one GPU, not under torchrun", hint="set teacher.fused: false for model parallel")
    fp = _FusedPass(cfg, windows, domain, Path(out), Path(records), device, settings, self_check, peak_tflops)
    stats = fp.compute()
    return fp.finish(stats)


class _FusedPass:
    """The fused pass's state: the teacher pass (fideval.model.teacher_pass), its models, the candidates' scorings."""

    def __init__(self, cfg: Config, windows: str | Path, domain: str, out: Path, records: Path, device: str,
                 settings: ScoreSettings | None, self_check: bool, peak_tflops: float | None):
        from fideval.model.lockstep import Lockstep
        from fideval.model.sizing import parse
        from fideval.model.teacher_pass import TeacherPass
        from fideval.model_source import locate
        from fideval.score.hooks_of import describe
        from fideval.score.kernels import pick
        from fideval.score.resume import first_rows
        from fideval.score.run import ScoreSettings

        windows_dir, folder, self.kind = one_length(windows)
        self.domain, self.folder, self.cfg, self.records = domain, folder, cfg, records
        files = locate(cfg.model.path, cfg.model.revision)
        self.pairs = fusable(cfg)
        from fideval.score.route_control import SUFFIX

        # specs compiled, classes checked: before the store exists
        hooks = [describe(cfg, c, p.removesuffix(SUFFIX), files) for c, p in self.pairs]
        self.settings = settings or ScoreSettings.of(cfg.score, device=device)
        self.dev, self.kernel = pick(self.settings.device, self.settings.kernel)
        asked = {k: parse(getattr(cfg.teacher, k), f"teacher.{k}", off=k != "micro_batch")
                 for k in ("micro_batch", "mlp_tokens", "chunk_bytes")}
        self.tp = tp = TeacherPass(files.folder, windows_dir, [folder], out, asked=asked, device=self.dev,
                                   dtype=cfg.teacher.dtype, domains=[domain], model_id=cfg.model.id,
                                   model_revision=files.revision or cfg.model.revision, lm_head=cfg.teacher.lm_head,
                                   models=1 + len(self.pairs), peak_tflops=peak_tflops, store=cfg.teacher.store)
        self.seqs = tp.seqs[0]
        # a separate pass's chunk, for the start line (sized before any model takes memory; a resumed store keeps
        # what it recorded)
        alone = tp.separate_settings() if tp.settings.plan and not tp.resumed and asked["chunk_bytes"] == "auto" else None
        self.ids = list(self.seqs.ids)
        self.live = LiveTeacher(self.seqs, tp.vocab, tp.meta, out)
        self.starts = first_rows(self.live, self.ids, None)
        # a candidate's routing: the teacher records its routes (written beside the store, as `fideval teacher --routes`
        # does), a free path records its own, a forced path takes the teacher's as the lockstep has just computed them
        teacher = tp.runner(routes=True) if any(c.routing != "off" for c in cfg.candidates) else tp.runner()
        cand_head = "auto" if teacher.head_mode == "bf16" else "float32"  # as fideval.score.candidate.teacher_settings
        self.runners = [teacher] + [_runner(tp, cand_head, {**h, **_routing(c, p, teacher)})
                                    for (c, p), (h, _) in zip(self.pairs, hooks)]
        infos = [{**info, "run_settings": {"dtype": tp.dtype, **tp.settings.recorded(), "lm_head": r.head_mode},
                  **({"routes_forced": {"of": "teacher", "routes": "the fused pass's teacher, in memory"}}
                     if p.endswith(SUFFIX) else {})}
                 for (_, info), r, (_, p) in zip(hooks, self.runners[1:], self.pairs)]
        self.infos = infos  # each candidate's score.json candidate_info: its canary joins run_settings at the end
        self.active = self._scorings(records, infos, self_check)
        # scorings[k]: what scores model k's rows (model 0, the teacher: the self-check, when asked)
        self.scorings: list[_Scoring | None] = ([] if self_check else [None]) + self.active
        self.write = {sid for sid in self.ids if sid not in tp.done}
        self.emit = {k for k, sid in enumerate(self.ids) if sid in self.write or any(sid not in s.stats for s in self.active)}
        self.lock = Lockstep(self.runners)
        self._start_line(alone)
        tp.start(teacher)
        self.replay = None
        if tp.store == "hidden":  # the teacher's rows are its states: scored through the store's head, as a reader replays them
            from fideval.store.replay import ReplayHead

            self.replay = ReplayHead(tp.head_weight, tp.head_block, self.dev)

    def _scorings(self, records: Path, infos: list[dict[str, Any]], self_check: bool) -> list[_Scoring]:
        """Each candidate's (and the self-check's) scoring, with the records a killed pass kept against a teacher
        shard that is on disk."""
        from fideval.score.candidate import Candidate
        from fideval.score.resume import ShardCache
        from fideval.score.run import Scorer, ScoreSettings, shard_inputs

        named = [(*SELF, None, None)] if self_check else []  # the self-check, as `fideval score --self-check` runs it
        named += [(c.name, p, info, self.settings) for (c, p), info in zip(self.pairs, infos)]
        out = []
        for name, path, info, own in named:
            own = own or ScoreSettings(device=self.settings.device, kernel=self.settings.kernel)  # the self-check: no config
            cand = Candidate(name=name, path=path, shards=(), info=info, is_teacher=info is None)
            where = records_dir(records, name, path, self.kind, self.domain)
            s = _Scoring(cand, where, own, Scorer(self.live, self.dev, self.kernel, own, self.live, self.tp.timeline),
                         ShardCache(where, shard_inputs(cand, self.kernel, self.dev, own)), self.starts)
            for sid in self.tp.done:  # a teacher shard on disk has its key: its records may be kept from a killed run
                kept = s.cache.load(sid, s.cache.key(sid, self.tp.sha256(sid), None, self.starts[sid]))
                if kept is not None:
                    s.stats[sid] = kept
            out.append(s)
        return out

    def _start_line(self, alone: Settings | None) -> None:
        from fideval.model.layer_major import sequences_per_chunk

        lock, st, L = self.lock, self.tp.settings, self.seqs.tokens.shape[1]
        per_chunk = lock.chunk_sequences(L)
        n_chunks = -(-len(self.ids) // per_chunk)
        note = chunks_note(len(self.ids), per_chunk, sequences_per_chunk(
            alone.chunk_bytes, L * lock.hidden_size * lock.dtype.itemsize, alone.micro_batch)) if alone else ""
        print(f"fused {self.kind}/{self.domain}: {len(self.runners)} models, {len(self.emit)} of {len(self.ids)} sequences to "
              f"compute in {n_chunks} chunk{'s' if n_chunks != 1 else ''} (each layer is read once a chunk); micro-batch "
              f"{st.micro_batch}, mlp tokens {st.mlp_tokens or 'off'}{note}", file=sys.stderr, flush=True)

    def compute(self) -> dict[str, Any]:
        """Every model through each chunk: the teacher's shards written, each candidate's rows scored against the
        teacher's while both are on the device. Returns the lockstep's stats."""
        from fideval.progress import progress

        tp, ids, seqs, live = self.tp, self.ids, self.seqs, self.live
        last = len(self.runners) - 1
        try:
            with progress(f"fused {self.kind}/{self.domain}", total=len(self.emit), unit="sequences") as bar:
                first = (lambda: tp.stored_digest(ids[0])) if ids else None
                for k, row, logits in self.lock.run_models(seqs.tokens, emit=self.emit, canary_start=[first] + [None] * last):
                    sid = ids[row]
                    self._routes(k, sid, row)
                    if k == 0:
                        if sid in self.write:
                            tp.write(seqs, row, logits)  # a hidden store's: the final norm's output
                        if self.replay is not None:
                            with tp.timeline.part("head"):
                                logits = self.replay(logits)
                        live.rows[sid] = (logits, seqs.tokens[row])
                    s = self.scorings[k]
                    if s is not None and sid not in s.stats:
                        s.score(sid, logits)
                    del logits
                    if k == last:
                        live.rows.pop(sid, None)
                        for s in self.active:
                            s.keep(tp.sha256)
                        bar.advance(1)
            tp.flush()
            for s in self.active:
                s.keep(tp.sha256)
            return self.lock.finish_profile()
        except FidevalError as e:
            from fideval.score.run import resumable, rows_suspect

            tp.close()  # the queued teacher shards are written (the teacher's finished shards always stay)
            if rows_suspect(e):  # a wrong kernel or broken logits (fideval.score.run.rows_suspect): no records kept
                for s in self.active:
                    s.cache.clear()
                raise
            for s in self.active:  # about the inputs or the disk: the records scored against a written shard stay
                try:
                    s.keep(tp.sha256)
                except FidevalError:  # the disk still full: what is not kept is computed again by the rerun
                    pass
            shards = sum(tp.sha256(sid) is not None for sid in ids)
            records = sum(len(s.stats) for s in self.active)
            raise resumable(e, f"{shards} of {len(ids)} teacher shards and the records of {records} shards scored against "
                            "them are kept", "only what is missing is computed") from None
        except KeyboardInterrupt:
            tp.close()  # the queued teacher shards are written: the records scored against them are kept
            for s in self.active:
                s.keep(tp.sha256)
            raise Interrupted(f"fused pass interrupted: {len(tp.done) + tp.written} teacher shards and the records scored "
                              f"against them are kept", hint="run the same command again to resume") from None
        except BaseException:
            tp.close()
            raise

    def _routes(self, k: int, sid: str, row: int) -> None:
        """Model ``k``'s routes of ``row``, written as its rows come out (all its layers have run): the teacher's beside
        the store, a recording candidate's beside its records."""
        runner = self.runners[k]
        if runner.routes is None or row not in runner.routes.rows:
            return
        from fideval.formats.routes import write_sequence

        took = runner.routes.pop(row)
        if k == 0:
            write_sequence(self.tp.out, sid, took)
        else:
            c, p = self.pairs[k - 1]
            write_sequence(records_dir(self.records, c.name, p, self.kind, self.domain), sid, took)

    def _seal_routes(self) -> None:
        """The routes indexes, once the shards and records they belong to are written."""
        from fideval.formats.routes import seal_candidate, write_index

        if self.runners[0].routes is not None:
            write_index(self.tp.out, "teacher", {"shards": {sid: self.tp.sha256(sid) for sid in self.ids}})
        for r, (c, p) in zip(self.runners[1:], self.pairs):
            if r.routes is not None:
                seal_candidate(records_dir(self.records, c.name, p, self.kind, self.domain))

    def finish(self, stats: dict[str, Any]) -> dict[str, Any]:
        """The store's manifest (the teacher's canary, the pass's profile, the candidates it ran), every records
        folder's records.parquet and score.json; one line if any model's canary changed."""
        from fideval.model.flops import flops_per_token

        tp = self.tp
        names = ["teacher"] + [f"{c.name}/{p}" for c, p in self.pairs]
        verdicts = [None if c is None else {**{k: v for k, v in c.items() if k != "row"}, "seq_id": self.ids[c["row"]]}
                    for c in self.lock.canaries]  # named by sequence, as a separate pass's runner names them
        canaries = [{"folder": self.folder.name, "model": n, **(c or {"identical": None})} for n, c in zip(names, verdicts)]
        tokens = int(stats["tokens"]) * len(self.runners)
        teacher_canary = {k: v for k, v in canaries[0].items() if k != "model"}  # as fideval teacher records it
        prof = tp.finish(stats, tokens=tokens, model_flops=flops_per_token(tp.config, self.seqs.tokens.shape[1])["total"] * tokens,
                         canary=teacher_canary, extra_meta={"fused": json.dumps(names[1:])})
        for info, c in zip(self.infos, verdicts[1:]):  # as a separate `fideval score` records it
            info["run_settings"]["canary"] = c
        scored = _conclude(self.active, self.ids, tp.out, self.dev, self.kernel, prof)
        self._seal_routes()
        tp.check_canaries(canaries, "the store and records were")
        return {"written": tp.written, "skipped": len(tp.done), "canaries": canaries, "settings": tp.settings.recorded(),
                "profile": prof, "scored": scored, "stats": dict(stats)}


def _routing(cand: Any, path: str, teacher: Any) -> dict[str, Any]:
    """A candidate runner's route options in the fused pass: its own routes recorded (a free path of a candidate whose
    routing is on), or the teacher's forced (a ``+teacher-routes`` path), from the teacher's recorder."""
    from fideval.model.routes import RecordedRoutes
    from fideval.score.route_control import SUFFIX

    if path.endswith(SUFFIX):
        return {"force_routes": RecordedRoutes(teacher.routes, sorted(teacher.experts),
                                               getattr(teacher.adapter.config, "num_experts_per_tok", None))}
    return {"routes": True} if cand.routing != "off" else {}


def _runner(tp: TeacherPass, head: str, hooks: dict[str, Any]) -> Runner:
    """A candidate's runner: the teacher pass's options with the candidate's hooks and head, on the pass's timeline."""
    from fideval.model.runner import Runner

    return Runner(tp.model_dir, tp.options(head=head, **hooks), timeline=tp.timeline)


def records_dir(records: Path, name: str, path: str, kind: str, domain: str) -> Path:
    """The workflow's layout: ``records/<candidate>/<path>/<kind>/<domain>``; the self-check's is ``teacher-self``."""
    folder = "teacher-self" if (name, path) == SELF else name
    return Path(records) / folder / path / kind / domain


def _conclude(scorings: list[_Scoring], ids: list[str], out: Path, dev: torch.device, kernel: str,
              prof: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each records folder's records.parquet and score.json, against the finished store."""
    from fideval.fsio import write_json
    from fideval.score.run import summarize
    from fideval.store import StoreReader

    reader = StoreReader(out)
    done: dict[str, dict[str, Any]] = {}
    from fideval.formats.records import FILE as RECORDS_FILE
    from fideval.score.run import SelfCheckFailed

    for s in scorings:
        s.scorer.conclude(s.stats, ids, s.cache, s.out_dir)
        try:
            checked_self = s.scorer.self_result() if s.candidate.is_teacher else None
        except SelfCheckFailed:  # the kernel is broken: none of its rows is kept (as fideval score --self-check)
            s.cache.clear()
            (s.out_dir / RECORDS_FILE).unlink(missing_ok=True)
            raise
        summary = summarize(s.scorer, s.candidate, reader, None, s.settings, dev, kernel, None, checked_self, prof, s.out_dir)
        write_json(s.out_dir / "score.json", summary)
        s.cache.clear()
        done[str(s.out_dir)] = summary
    return done
