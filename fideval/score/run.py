"""The scoring driver: teacher store + candidate logits -> ``records.parquet`` + ``score.json``.

A :class:`~fideval.score.candidate.Candidate` yields shards (:class:`~fideval.score.candidate.CandidateShard`;
a store's carry their token ids and first row), so the same loop scores a candidate store or a model run
on the fly; :class:`ScoreSettings` says how (device, kernel, CPU check, non-finite rows). Per shard:
checks (vocab, token ids, non-finite rows) before any scoring, the fast scorer (Triton on CUDA, else
torch), the numpy float64 reference on sampled rows, one Parquet row group. Each scored shard is kept at
once in ``records.partial/`` (fideval.score.resume), so an interrupted run resumes where it stopped;
records.parquet appears only when every shard passed. A run that fails on its inputs or the disk (a corrupt shard,
a full disk) keeps what it scored, as an interrupted one does; one whose rows are suspect (CPU check, self-check,
non-finite candidate logits: :func:`rows_suspect`) keeps nothing.

Host memory. On a GPU, a candidate store and the teacher are streamed side by side (``StoreReader.iter``,
one page-locked buffer each, the next shard read while this one is scored), so a store-against-store run
holds two shards of host memory whatever the stores' size (bench/score_stream.py: 2.82 shards peak above
base on an H200, SHA-256 checked on the way). On the CPU both are memory-mapped and the torch scorer's
float64 temporaries are capped at half a shard. A model run's teacher shards are memory-mapped.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fideval.errors import FidevalError, Interrupted
from fideval.formats.ids import window_of
from fideval.formats.model import dump
from fideval.formats.records import FILE as RECORDS_FILE
from fideval.formats.score import CpuCheck, RunProfile, ScoreSummary, SelfCheck, TeacherRef
from fideval.fsio import sha256_file, write_json
from fideval.progress import progress
from fideval.score import reference, resume
from fideval.score.candidate import Candidate, CandidateShard, teacher_shards
from fideval.score.kernels import pick, score_tensors
from fideval.score.lossy import RULE_ENCODE, llamacpp_roundtrip, lossy_rule
from fideval.score.metrics import FIGURES, max_rel_diff
from fideval.score.records import shard_table
from fideval.score.resume import ShardCache
from fideval.store.feed import TeacherFeed, mapped_tensor
from fideval.store.replay import HiddenStore
from fideval.store.rows import RowFeed, TeacherRows
from fideval.windows.layout import token_sha256

if TYPE_CHECKING:
    from fideval.config import ScoreConfig
    from fideval.store.reader import StoreReader
from fideval.timing import accounting
from fideval.timing.timeline import Timeline


@dataclass(frozen=True)
class ScoreSettings:
    """How a candidate is scored; none of it changes a figure beyond the CPU check's tolerance."""

    device: str = "auto"  # auto, cpu or cuda[:n]
    kernel: str = "auto"  # auto (triton on CUDA), triton or torch
    cpu_check_every: int = 1000  # re-score 1 row in N (plus each shard's first and last) in float64 on the CPU
    cpu_check_tolerance: float = 2e-12  # largest relative difference to that reference
    on_nonfinite: str = "fail"  # fail, or skip (drop and count) rows holding NaN/+inf
    peak_tflops: float | None = None  # the GPU's peak for the utilisation figure (None: by its name)

    def __post_init__(self) -> None:
        if self.on_nonfinite not in ("fail", "skip"):
            raise FidevalError(f"--on-nonfinite {self.on_nonfinite!r}: expected fail or skip")
        if self.cpu_check_every < 1:
            raise FidevalError(f"cpu_check_every {self.cpu_check_every}: must be >= 1")

    @classmethod
    def of(cls, score_cfg: ScoreConfig | None = None, **given: Any) -> "ScoreSettings":
        """The options given (None: not given), else the config's ``score:`` section, else the defaults."""
        keys = ("cpu_check_every", "cpu_check_tolerance", "on_nonfinite")
        base = {k: getattr(score_cfg, k) for k in keys} if score_cfg is not None else {}
        return cls(**{**base, **{k: v for k, v in given.items() if v is not None}})


def _check_rows(every: int, start: int, n: int) -> np.ndarray:
    """Rows (local indices) the CPU reference re-scores: global row index % every == 0, plus first and last."""
    if n == 0:
        return np.zeros(0, np.int64)
    g = np.arange(start, start + n)
    pick_ = np.flatnonzero(g % every == 0)
    return np.unique(np.concatenate([pick_, [0, n - 1]])).astype(np.int64)


class Scorer:
    """One scoring run: candidate shards scored against the teacher's rows, and the run's running figures (rows,
    top-1 count, largest |KLD|, the CPU check's worst difference) that score.json reports.

    ``teacher``: where the rows come from (a store on disk, or the fused pass's rows still on the device:
    :class:`~fideval.store.rows.TeacherRows`); ``feed``: rows already on the scoring device, asked first
    (:class:`~fideval.store.rows.RowFeed`: a :class:`~fideval.store.feed.TeacherFeed` or the fused pass's live
    rows). ``fideval score`` and ``fideval fused`` both score through this class."""

    def __init__(self, teacher: TeacherRows, dev: torch.device, kernel: str, settings: ScoreSettings,
                 feed: RowFeed | None = None, timeline: Timeline | None = None):
        self.teacher, self.dev, self.kernel, self.feed = teacher, dev, kernel, feed
        self.tl = timeline if timeline is not None else Timeline(dev, on=False)
        self.every, self.tolerance = settings.cpu_check_every, settings.cpu_check_tolerance
        self.on_nonfinite = settings.on_nonfinite
        self.rows = self.checked = self.nonfinite = self.seen = 0
        self.worst, self.worst_at = 0.0, ""
        self.max_kld, self.top1 = 0.0, 0
        self.lengths: set[int] = set()
        self.transform = None  # an exact candidate's rows against a lossy teacher (fideval.score.lossy)
        self.token_sha: str | None = None  # the last shard's teacher tokens, SHA-256 (eval-windows.json's hash)
        self.sequences: dict[str, str | None] = {}  # seq id -> its tokens' SHA-256, once concluded

    def shard(self, item: CandidateShard) -> dict[str, Any] | None:
        """Score one candidate shard against its teacher shard; None when nothing is scorable."""
        sid, cand, cand_tokens, cand_start = item.seq_id, item.logits, item.token_ids, int(item.row_start)
        vocab = self.teacher.vocab_size
        if not isinstance(cand, torch.Tensor):
            cand = torch.from_numpy(np.asarray(cand))
        if cand.ndim != 2 or cand.shape[1] != vocab:
            raise FidevalError(f"candidate {sid}: logits shape {tuple(cand.shape)} does not match the teacher's vocab {vocab}",
                               hint="teacher and candidate must use the same tokenizer and output width")
        with self.tl.part("read_back"):
            fed = self.feed.get(sid) if self.feed is not None else None
            if fed is not None:
                ref_all, tokens = fed  # the whole shard, on the device
            else:  # memory-mapped: only the rows scored are read, and nothing is copied on the host
                ref_np, tokens = self.teacher.read(sid)
                ref_all = mapped_tensor(ref_np)
        tokens = np.asarray(tokens)
        self.token_sha = token_sha256(tokens)  # what score.json names: the tokens these rows were scored on
        if cand_tokens is not None:
            ct = np.asarray(cand_tokens)
            if ct.shape != tokens.shape or not np.array_equal(ct, tokens):
                n = min(len(ct), len(tokens))
                diff = np.flatnonzero(ct[:n] != tokens[:n])
                where = f"first at position {int(diff[0])}" if len(diff) else f"{len(ct)} vs {len(tokens)} tokens"
                raise FidevalError(f"shard {sid}: candidate token ids differ from the teacher's ({where})",
                                   hint="score a candidate made from the same windows and tokenizer")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
            raise FidevalError(f"shard {sid}: token ids outside [0, {vocab})", hint="the store is corrupt or from another tokenizer")
        length = len(tokens)
        ref_start = self.teacher.row_start(sid)
        lo = max(ref_start, cand_start)
        hi = min(ref_start + ref_all.shape[0], cand_start + cand.shape[0], length - 1)
        if hi <= lo:
            return None
        ref = ref_all[lo - ref_start: hi - ref_start]
        cand_rows = cand[lo - cand_start: hi - cand_start]
        positions = np.arange(lo, hi, dtype=np.int64)
        targets_np = tokens[positions + 1].astype(np.int64)
        with self.tl.part("read_back"):  # memory-mapped rows onto the device (a CPU run reads them while scoring)
            ref_d = ref.to(self.dev).contiguous()
            cand_d = cand_rows.to(self.dev).contiguous()
        with self.tl.part("scoring"):
            if self.transform is not None:  # the CPU check below scores the same transformed rows
                cand_d = cand_rows = self.transform(cand_d)
            figs, flags, bad = score_tensors(ref_d, cand_d, torch.from_numpy(targets_np).to(self.dev), self.kernel)
        del ref_d, cand_d
        keep = ~bad
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            if self.on_nonfinite != "skip":
                raise SuspectRows(f"shard {sid}: row {positions[r]} (and {int(bad.sum()) - 1} more) holds NaN/+inf or no finite logit",
                                   hint="fix the model run, or pass --on-nonfinite skip to drop and count such rows")
            self.nonfinite += int(bad.sum())
        # CPU float64 reference on sampled rows (never on the non-finite ones)
        sel = _check_rows(self.every, self.seen, len(positions))
        sel = sel[keep[sel]]
        with self.tl.part("cpu_check"):
            self._cpu_check(sid, sel, ref, cand_rows, targets_np, figs, flags)
        self.seen += len(positions)
        self.rows += int(keep.sum())
        if keep.any():
            self.max_kld = max(self.max_kld, float(np.max(np.abs(figs[keep, 0]))))
            self.top1 += int(flags[keep, 0].sum())
        self.lengths.add(length)
        entry = self.teacher.entry(sid)
        return dict(seq_id=sid, window_id=str(entry.get("window_id", window_of(sid))), domain=str(entry.get("domain", "")),
                    length=length, positions=positions[keep], tokens=targets_np[keep], figs=figs[keep], flags=flags[keep])

    def _cpu_check(self, sid: str, sel: np.ndarray, ref: torch.Tensor, cand_rows: torch.Tensor, targets_np: np.ndarray,
                   figs: np.ndarray, flags: np.ndarray) -> None:
        """The numpy float64 reference on rows ``sel``; a difference beyond the tolerance fails the run."""
        if not len(sel):
            return
        ref_cpu, cand_cpu = (x[torch.from_numpy(sel).to(x.device)].cpu().numpy() if x.device.type != "cpu"
                             else x.numpy()[sel] for x in (ref, cand_rows))
        rf, rfl = reference.score_rows(ref_cpu, cand_cpu, targets_np[sel])
        d, where = max_rel_diff(figs[sel], flags[sel], rf, rfl)
        self.checked += len(sel)
        if d > self.worst:
            self.worst, self.worst_at = d, f"{where} in shard {sid}"
        if d > self.tolerance:
            raise KernelMismatch(f"CPU check failed: {where} differs from the float64 reference by {d:.3g} (> {self.tolerance:g}) "
                               f"in shard {sid}", hint=f"the {self.kernel} kernel is wrong on this device; rerun with --kernel torch")


    def scored(self, item: CandidateShard, start: int | None = None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Score one shard; its records and its own share of score.json's figures (fideval.score.resume.fold).
        ``start``: the shard's first global row, where the CPU check's sampling resumes (each shard samples the
        rows an uninterrupted run would)."""
        if start is not None:
            self.seen = start
        before = {k: getattr(self, k) for k in resume.STAT_KEYS}
        seen, self.token_sha = self.seen, None
        self.worst, self.worst_at, self.max_kld = 0.0, "", 0.0
        out = self.shard(item)
        st = {k: int(getattr(self, k) - before[k]) for k in resume.STAT_KEYS}
        st.update(positions=self.seen - seen, max_kld=self.max_kld, worst=self.worst, worst_at=self.worst_at,
                  length=out["length"] if out is not None else None, token_sha256=self.token_sha)
        return out, st

    def conclude(self, stats: dict[str, dict[str, Any]], ids: list[str], cache: ShardCache, out_dir: Path) -> None:
        """Every shard scored (or one line): their stats folded into the run, records.parquet assembled in ``ids``
        order."""
        missing = [sid for sid in ids if sid not in stats]
        if missing:
            raise FidevalError(f"the candidate gave no logits for {len(missing)} teacher sequences (first {missing[0]!r})",
                               hint="score a candidate made from the same windows")
        folded = resume.fold([stats[sid] for sid in ids])
        self.sequences = {sid: stats[sid].get("token_sha256") for sid in ids}
        self.rows, self.checked, self.nonfinite, self.top1 = (folded[k] for k in resume.STAT_KEYS)
        self.max_kld, self.worst, self.worst_at, self.lengths = (folded[k] for k in ("max_kld", "worst", "worst_at", "lengths"))
        with self.tl.part("records"):
            cache.assemble(out_dir, ids, {sid for sid in ids if int(stats[sid]["rows"]) > 0})

    def self_result(self) -> dict[str, Any]:
        """The self-check's verdict (the teacher scored against itself): exactly 0 and top-1 everywhere, or one line."""
        result = {"max_kld": self.max_kld, "top1": self.top1 / self.rows if self.rows else 1.0, "rows": self.rows}
        if self.max_kld != 0.0 or self.top1 != self.rows:
            raise SelfCheckFailed(f"self-check failed: the teacher scored against itself gives max |KLD| {self.max_kld:.3g} and "
                               f"top-1 {result['top1']:.6f} (expected exactly 0 and 1)",
                               hint=f"the {self.kernel} kernel is broken on this device")
        return result

def _parts_of(items: Any, tl: Timeline, part: str | None) -> Any:
    """``items``, each ``next()`` timed as ``part`` of ``tl`` (None: left to the producer's own parts)."""
    it = iter(items)
    while True:
        with tl.part(part) if part else nullcontext():
            item = next(it, None)
        if item is None:
            return
        yield item


class SuspectRows(FidevalError):
    """The scored rows themselves are wrong, so a failed run keeps none of them (:func:`rows_suspect`): non-finite
    candidate logits here; the subclasses below."""


class KernelMismatch(SuspectRows):
    """The fast kernel disagrees with the float64 reference: the run fails and keeps nothing it scored."""


class SelfCheckFailed(SuspectRows):
    """The teacher scored against itself is not exactly 0 everywhere: the kernel is broken on this device."""


def rows_suspect(e: FidevalError) -> bool:
    """Whether a failed run's scored rows are themselves suspect, so that none may be kept for a rerun.

    A failed CPU check (:class:`KernelMismatch`) or self-check (the teacher against itself not exactly 0) says the
    kernel computed wrong numbers: every row it scored is wrong. Non-finite candidate rows (``on_nonfinite:
    fail``) count with them: NaN/inf logits say the candidate's computation is broken (overflowing weights, a
    broken model run, or the run that wrote a candidate store), so the finite rows of the same run are not to be
    trusted either; and a model run's rows are kept under a key naming the model by id, revision, quant spec and
    settings, not its weights' bytes, so a fix made in place (weights fetched again under the same revision) would
    be served the broken run's rows. Anything else (a corrupt or truncated teacher or candidate shard, a full
    disk, a refused write, a candidate that gave no logits for a sequence) is about the inputs or the disk: the
    shards already scored stay valid under the keys of their own inputs, and a rerun re-uses only those."""
    return isinstance(e, SuspectRows)


def resumable(e: FidevalError, kept: str, rest: str) -> FidevalError:
    """``e``'s line saying what was kept (``kept``) and that a rerun of the same command resumes (``rest``)."""
    again = f"a rerun of the same command resumes: {rest}"
    return FidevalError(f"{e.message}; {kept}", hint=f"{e.hint}; {again}" if e.hint else again)


def shard_inputs(candidate: Candidate, kernel: str, dev: torch.device, settings: ScoreSettings) -> dict[str, Any]:
    """What every shard's rows depend on besides the shard itself (fideval.score.resume's key)."""
    from fideval.formats.records import VERSION as RECORDS_VERSION
    from fideval.provenance import tool_block

    tool = tool_block()
    return {"candidate": candidate.name, "path": candidate.path, "info": candidate.info, "teacher_itself": candidate.is_teacher,
            "kernel": kernel, "device": dev.type, "cpu_check_every": settings.cpu_check_every,
            "cpu_check_tolerance": settings.cpu_check_tolerance, "on_nonfinite": settings.on_nonfinite,
            "records_version": RECORDS_VERSION, "fideval": [tool["version"], tool["git_commit"]]}


def _teacher_block(teacher: TeacherRows, store: str | None, ids: list[str]) -> TeacherRef:
    man = Path(teacher.root) / "manifest.json"
    shards = {sid: teacher.entry(sid).get("sha256") for sid in ids}
    return TeacherRef(store=str(store if store is not None else teacher.root), model_id=teacher.meta.get("model_id"),
                      lossy=teacher.meta.get("lossy") or None,
                      model_revision=teacher.meta.get("model_revision"),
                      manifest_sha256=sha256_file(man) if man.exists() else None, kind=teacher.meta.get("kind"),
                      settings_sha256=teacher.meta.get("settings_sha256"),
                      shards=shards if shards and all(shards.values()) else None,
                      head_sha256=_head_digest(teacher.meta))


def _head_digest(meta: dict[str, Any]) -> str | None:
    """A hidden store's head content digest, from its meta's ``head`` block (None: a logit store)."""
    import json

    try:
        block = json.loads(meta.get("head") or "null")
    except ValueError:
        return None
    return block.get("weight_sha256") if isinstance(block, dict) else None


def self_check(teacher: TeacherRows, *, device: str = "auto", kernel: str = "auto") -> dict[str, Any]:
    """Score the teacher against itself: every row must give KLD exactly 0 and top-1 agreement.

    A scorer that returns 1e-17 here has a bug (identical inputs take identical float64 paths); the check
    is exact on purpose. Raises :class:`FidevalError` otherwise; returns ``{max_kld, top1, rows}``.
    """
    dev, kernel = pick(device, kernel)
    ids = teacher.seq_ids
    feed = teacher.feed(list(ids), dev) if isinstance(teacher, HiddenStore) else None  # replayed on the device
    run = Scorer(teacher, dev, kernel, ScoreSettings(cpu_check_every=10**12, cpu_check_tolerance=float("inf")), feed)
    try:
        with progress("self-check", total=sum(teacher.entry(s)["rows"] for s in ids), unit="rows") as bar:
            for item in teacher_shards(teacher, ids, dev):
                out = run.shard(item)
                bar.advance(len(out["positions"]) if out else 0)
    finally:
        if feed is not None:
            feed.close()
    return run.self_result()


def summarize(run: Scorer, candidate: Candidate, teacher: TeacherRows, teacher_spec: str | None, settings: ScoreSettings,
              dev: torch.device, kernel: str, rule: str | None, checked_self: dict[str, Any] | None,
              profile: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """score.json's content (fideval.formats.score) for a finished run whose records.parquet is in ``out_dir``: with
    the links of the chain of custody (docs/formats.md): the records' SHA-256, each sequence's token SHA-256 and
    teacher shard SHA-256, the candidate's fingerprint."""
    from fideval.provenance import canonical_hash

    try:
        from fideval.provenance import tool_block

        tool = tool_block()
    except Exception:  # pragma: no cover - provenance needs git; never fail a finished run on it
        tool = None
    return dump(ScoreSummary(
        candidate=candidate.name, path=candidate.path, length=next(iter(run.lengths)) if len(run.lengths) == 1 else None,
        rows=run.rows, teacher=_teacher_block(teacher, teacher_spec, list(run.sequences)), lossy_rule=rule,
        cpu_check=CpuCheck(rows_checked=run.checked, max_rel_diff=run.worst, tolerance=settings.cpu_check_tolerance,
                           every=settings.cpu_check_every, worst=run.worst_at or None),
        self_check=SelfCheck(**checked_self) if checked_self is not None else None, nonfinite_rows=run.nonfinite,
        on_nonfinite=settings.on_nonfinite, device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        kernel=kernel, figures=list(FIGURES), records=RECORDS_FILE, candidate_info=candidate.info, tool=tool,
        profile=RunProfile(**profile), records_sha256=sha256_file(Path(out_dir) / RECORDS_FILE),
        sequences=dict(run.sequences) or None,
        candidate_sha256=canonical_hash(candidate.info) if candidate.info is not None else None))


def score_candidate(teacher: StoreReader, candidate: Candidate, out_dir: str | Path, settings: ScoreSettings = ScoreSettings(), *,
                    self_check_first: bool = False, teacher_spec: str | None = None, total_rows: int | None = None
                    ) -> dict[str, Any]:
    """Score every shard of ``candidate`` against ``teacher`` (a StoreReader); write the records.

    Writes ``out_dir/records.parquet`` and ``out_dir/score.json``; returns the score.json dict.
    ``self_check_first`` scores the teacher against itself before the candidate; a candidate that IS the
    teacher (``is_teacher``) makes the run the self-check. Either way ``self_check`` in score.json holds
    ``{max_kld, top1, rows}`` and a non-exact result fails the run. The candidate's ``info`` is recorded as
    score.json's ``candidate_info``. When the candidate's ``order`` is known (a store's), on a GPU the
    teacher's shards are streamed in that order (:class:`TeacherFeed`), else each is memory-mapped.
    """
    t0 = time.perf_counter()
    teacher.check_files()  # sizes and headers of every shard before the first is scored; hashes as each is read
    dev, kernel = pick(settings.device, settings.kernel)
    tl = candidate.timeline if candidate.timeline is not None else Timeline(dev)
    tl.start()
    checked_self = None
    if self_check_first:
        with tl.part("self_check"):
            checked_self = self_check(teacher, device=str(dev), kernel=kernel)
    out_dir = Path(out_dir)
    ids = list(teacher.seq_ids)
    cache = ShardCache(out_dir, shard_inputs(candidate, kernel, dev, settings))
    starts = resume.first_rows(teacher, ids, candidate.extent)
    keys = {sid: cache.key(sid, teacher.entry(sid).get("sha256"),
                           candidate.shard_sha256(sid) if candidate.shard_sha256 is not None else None, starts[sid])
            for sid in ids}
    stats: dict[str, dict[str, Any]] = {}
    for sid in ids:
        if (kept := cache.load(sid, keys[sid])) is not None:
            stats[sid] = kept
    if stats and os.environ.get("RANK", "0") == "0":
        print(f"score {candidate.name}: {len(stats)} of {len(ids)} shards already scored from the same inputs "
              f"({cache.dir}), scoring the other {len(ids) - len(stats)}", file=sys.stderr, flush=True)
    candidate.skip.update(stats)  # the model runner reads it when it starts; store shards are filtered here
    if candidate.pending is not None:
        candidate.pending[:] = [sid for sid in candidate.pending if sid not in stats]
    if os.environ.get("RANK", "0") != "0":
        # under torchrun every rank runs the model (collectives) and yields the same logits; rank 0 alone scores
        # and writes. The other ranks skip what rank 0 skips (the same kept shards, read before any is added).
        if len(stats) < len(ids):
            for _ in candidate.shards:
                pass
        return {}
    order = candidate.order  # a store's: the same list as ``pending``, so without the shards already scored
    if isinstance(teacher, HiddenStore):  # the head replayed on the scoring device, the next shard read ahead
        feed = teacher.feed(list(order) if order else [s for s in ids if s not in stats], dev)
    else:
        feed = TeacherFeed(teacher, list(order), dev) if order and dev.type == "cuda" else None
    run = Scorer(teacher, dev, kernel, settings, feed, tl)
    rule = lossy_rule(teacher.meta, candidate.lossy) if not candidate.is_teacher else None
    if rule == RULE_ENCODE:
        run.transform = llamacpp_roundtrip
    if total_rows is None:
        total_rows = sum(max(int(teacher.entry(s)["rows"]) - 1, 0) for s in teacher.seq_ids)
    tokens, model_run = 0, candidate.flops_per_token is not None
    try:
        with progress(f"score {candidate.name}", total=total_rows, unit="rows") as bar:
            bar.advance(sum(int(s["positions"]) for s in stats.values()))
            # a model run's runner marks its own parts; reading a store's shard is read-back
            todo = len(ids) - len(stats)
            for item in (_parts_of(candidate.shards, tl, None if model_run else "read_back") if todo else ()):
                if item.seq_id in stats:  # never produced by the shards above; a guard, not the mechanism
                    continue
                tokens += item.logits.shape[0] if model_run else 0
                out, st = run.scored(item, starts[item.seq_id])
                with tl.part("records"):
                    table = shard_table(candidate=candidate.name, path=candidate.path, **out) if out and st["rows"] else None
                    cache.save(item.seq_id, keys[item.seq_id], table, st)
                stats[item.seq_id] = st
                bar.advance(st["positions"])
            run.conclude(stats, ids, cache, out_dir)
            if candidate.is_teacher:
                checked_self = run.self_result()
    except FidevalError as e:
        if rows_suspect(e):  # a wrong kernel or broken candidate logits: nothing scored is kept
            cache.clear()
            if isinstance(e, SelfCheckFailed):  # raised after conclude: its records.parquet holds those rows
                (out_dir / RECORDS_FILE).unlink(missing_ok=True)
            raise
        # about the inputs or the disk: the shards already scored are kept under the keys of their own inputs
        kept = sum(cache.load(sid, keys[sid]) is not None for sid in ids)
        if not kept:
            raise
        raise resumable(e, f"{kept} of {len(ids)} shards are scored and kept in {cache.dir}",
                        f"only the other {len(ids) - kept} are scored" if kept < len(ids)
                        else "none is scored again, the records are assembled from them") from None
    except KeyboardInterrupt:
        kept = sum(cache.load(sid, keys[sid]) is not None for sid in ids)
        raise Interrupted(f"score interrupted: {kept} of {len(ids)} shards are scored and kept in {cache.dir}",
                          hint=f"run the same command again to resume: only the other {len(ids) - kept} are scored") from None
    finally:
        if feed is not None:
            feed.close()
    parts = tl.fold()
    dtype = (candidate.info or {}).get("run_settings", {}).get("dtype")
    peak = None
    if dev.type == "cuda" and model_run:
        peak = settings.peak_tflops or accounting.peak_tflops(accounting.device_name(dev), dtype)
    profile = accounting.summary(time.perf_counter() - t0, parts, device=accounting.device_name(dev), tokens=tokens or None,
                      model_flops=tokens * candidate.flops_per_token if model_run else None, peak=peak)
    summary = summarize(run, candidate, teacher, teacher_spec, settings, dev, kernel, rule, checked_self, profile, out_dir)
    write_json(out_dir / "score.json", summary)
    cache.clear()
    changed = ((candidate.info or {}).get("run_settings") or {}).get("canary") or {}
    if changed.get("identical") is False:  # as fideval teacher: the records are written, the command fails
        from fideval.model.execution.hooks import canary_pair

        raise FidevalError(f"the canary of {candidate.name}/{candidate.path} (sequence {changed.get('seq_id')}) changed "
                           f"between the start and the end of the run ({canary_pair(changed)})",
                           hint="the candidate's run is not bit-reproducible on this device; the records were written and "
                                "score.json records it")
    return summary
