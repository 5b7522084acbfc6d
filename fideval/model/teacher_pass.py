"""One teacher pass: what ``fideval teacher`` and ``fideval fused`` share, from the checks before any compute to the
store's finished manifest.

A :class:`TeacherPass` is built before any compute and checks everything a run would fail on later: the windows'
tokenizer fingerprint (``eval-windows.json`` provenance) against the model folder's ``tokenizer.json``, every token
id against the model's vocabulary, a resumed store's recorded settings (a resume is bit-identical or refused). Then:

* the store's ``teacher`` block and meta (:func:`store_meta`), its writer, and the sequences already written
  (``StoreWriter.done``: a resumed run skips them);
* the run's settings sized for the pass's models (fideval.model.sizing), every ``auto`` a resumed store recorded
  taken from it; the lm head's mode adopted likewise;
* :meth:`TeacherPass.options` -- the runner options every model of the pass is built from;
* :meth:`TeacherPass.start` records what runs (the head's mode, the vendor code's provenance) in the writer's meta,
  before the first shard: every shard carries it; :meth:`TeacherPass.write` queues a shard on the background writer;
* :meth:`TeacherPass.finish` puts the canary verdict and the run's profile in the manifest meta and finishes the
  store; :meth:`TeacherPass.check_canaries` then fails a run that was not bit-reproducible.

The caller owns only what differs: ``fideval teacher`` runs one model (any backend, model parallel) over several
sequence folders; ``fideval fused`` runs the teacher and the emulated candidates in lockstep over one folder and
scores the candidates as they go (fideval.score.fused).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fideval.errors import FidevalError
from fideval.formats.store import BIT_SHAPING, settings_fingerprint

if TYPE_CHECKING:
    import torch

    from fideval.model.layer_major import ModelRunner
    from fideval.model.runner import RunnerOptions
    from fideval.model.sizing import Settings
    from fideval.windows.layout import Sequences

KINDS = ("windows", "cuts")
STORES = ("auto", "hidden", "logits")  # what a teacher store keeps (docs/formats-store.md)


def store_kind(asked: str, implementation: str = "transformers") -> str:
    """The store kind a run writes: ``asked``, or for ``auto`` ``hidden`` (36x smaller at DeepSeek-V3 sizes, no logit
    read-back), with either backend (the reference code's head is the vendor's ``F.linear`` in float32, replayed as
    such)."""
    if asked not in STORES:
        raise FidevalError(f"teacher store {asked!r} is not one of {', '.join(STORES)}", hint="use auto, hidden or logits")
    return "hidden" if asked == "auto" else asked
LATE = ("lm_head", "reference_code", "weights")  # known once the runner exists (TeacherPass.start)


def tokenizer_shas(model_dir: Path, windows_dir: Path) -> tuple[str | None, str | None]:
    """The SHA-256 of the model folder's ``tokenizer.json`` and the one the windows were built with (None: absent)."""
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

    windows = Path(windows)
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
    from fideval.model.execution.head import MODES

    if asked not in MODES:
        raise FidevalError(f"lm head {asked!r} is not known", hint=f"use one of {', '.join(MODES)}")
    if recorded is None or asked == recorded:
        return asked
    if asked == "auto":
        return recorded
    raise FidevalError(f"{where} was written with lm head {recorded!r}, this run asks for {asked!r}",
                       hint="resume with the same lm head (or auto), or write a new store")


def stored_digest(out: Path, seq_id: str, device: Any = None) -> str | None:
    """The digest (fideval.model.execution.determinism.digest) of a finished shard's rows (logits, or a hidden store's
    states), computed on ``device`` (the run's: the digest is the same on any device, and a GPU's is the fast one): a
    resumed run's canary compares its recomputation of the first micro-batch with what the first run stored."""
    from fideval.model.execution.determinism import digest
    from fideval.store.shard import data_rows, read_header, shard_rel

    path = out / shard_rel(seq_id)
    try:
        head = read_header(path)
    except FidevalError:
        return None
    return digest(data_rows(path, head), device)


def store_meta(model_dir: Path, ckpt, *, implementation: str, arch: str, dtype: str, dev, world: int, release, vocab: int,
               model_id: str | None, model_revision: str | None, tokenizer_sha256: str | None, store: str = "logits",
               hidden_size: int | None = None) -> tuple[dict, dict]:
    """The store's ``teacher`` block (what computed the logits; the settings join it once sized) and its meta."""
    import torch

    from fideval.model.device import resolve_dtype
    from fideval.model.weights import fp8_release
    from fideval.model.weights.identity import checkpoint_identity

    runner_module = "fideval.model.reference.runner" if implementation == "reference" else "fideval.model.runner"
    block = {"runner": runner_module, "implementation": implementation, "arch": arch, "dtype": dtype,
             "device": dev.type, "model_parallel": world,
             # another GPU kind may sum in another order: a store is computed on one
             "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
             # CPU float sums change order with the thread count: part of what makes logits reproducible
             "torch_threads": torch.get_num_threads() if dev.type == "cpu" else None,
             "weights": fp8_release.describe(ckpt, release, resolve_dtype(dtype), dev),
             "checkpoint": checkpoint_identity(model_dir)}
    meta = {"model_id": model_id or model_dir.name, "model_revision": model_revision or "local",
            "tokenizer_sha256": tokenizer_sha256 or "unknown", "vocab_size": vocab, "kind": store, "teacher": block}
    if store == "hidden":
        meta["hidden_size"] = hidden_size
    return block, meta


def read_checked(windows_dir: Path, folders: list[Path], domains: list[str] | None, vocab: int) -> list[Sequences]:
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


def sized_settings(dev: torch.device, dtype: str, config: Any, seqs: list[Sequences], todo: int, out: Path, world: int,
                   group: Any, asked: dict, recorded: dict | None, reference: bool = False, models: int = 1,
                   stored_bytes: int | None = None, grouped_experts: bool = False) -> Settings:
    """Sizing (fideval.model.sizing) for the longest sequences of the run, every ``auto`` a resumed store recorded
    taken from it; under torchrun rank 0's settings for every rank. ``reference``: the vendor's code, whose
    attention materialises its scores and splits its heads over the ranks."""
    from fideval.model import sizing
    from fideval.model.device import resolve_dtype

    asked = sizing.adopt(asked, recorded, f"store {out}")
    length = max((s.tokens.shape[1] for s in seqs if s.tokens.size), default=1)
    st = sizing.choose(dev, resolve_dtype(dtype), config, length, n_sequences=todo, world=world,
                       math_attention=True if reference else None, split_heads=reference, models=models,
                       stored_bytes=stored_bytes, grouped_experts=grouped_experts, **asked)
    if world > 1:  # sized from each rank's free memory: rank 0's numbers for all, or ranks would differ in bits
        import torch.distributed as dist

        box = [st]
        dist.broadcast_object_list(box, src=0, group=group)
        st = box[0]
    return st


class TeacherPass:
    """The teacher's side of a run, from its checks to its finished store (module docstring).

    ``folders``: the sequence folders of ``windows_dir`` to run (:func:`sequence_folders`); ``asked``: the sizing
    settings as parsed (``micro_batch``, ``mlp_tokens``, ``chunk_bytes``: a number, ``auto`` or None);
    ``models``: how many models compute in lockstep (1: a separate pass; more: the fused pass, whose states share
    the chunk and whose sizing also counts a unit's stored copy). Under torchrun every rank builds one (they
    compute together) and rank 0 alone writes."""

    def __init__(self, model_dir: str | Path, windows_dir: str | Path, folders: list[Path], out: str | Path, *,
                 asked: dict[str, Any], device: str | torch.device = "auto", dtype: str = "float32",
                 domains: list[str] | None = None, model_id: str | None = None, model_revision: str | None = None,
                 implementation: str = "transformers", code: str | None = None, trust_remote_code: bool = False,
                 lm_head: str = "auto", models: int = 1, peak_tflops: float | None = None, store: str = "auto",
                 reference_experts: str = "vendor"):
        self.t_start = time.perf_counter()
        from fideval.model.device import resolve_device, resolve_dtype
        from fideval.model.execution.parallel import init_from_env
        from fideval.model.weights.checkpoint import open_weights
        from fideval.store import StoreWriter
        from fideval.timing.timeline import Timeline

        self.model_dir, self.windows_dir, self.out = Path(model_dir), Path(windows_dir), Path(out)
        self.folders, self.dtype, self.implementation = list(folders), dtype, implementation
        self.code, self.trust_remote_code, self.peak_tflops = code, trust_remote_code, peak_tflops
        self.reference_experts = reference_experts  # the reference code's routed experts (its provenance records them)
        resolve_dtype(dtype)  # a bad name fails before any file is read
        self.store = store = store_kind(store, implementation)
        asked = dict(asked)
        drv = None
        if implementation == "reference":  # the code, its trust, ModelArgs, dtype and the cuts: before the store exists
            from fideval.model.reference.runner import check

            drv = check(self.model_dir, code=code, trust=trust_remote_code, world=int(os.environ.get("WORLD_SIZE", "1")),
                        dtype=dtype)
            if asked["mlp_tokens"] not in (None, "auto"):  # the vendor's blocks run whole per micro-batch
                raise FidevalError("--mlp-tokens (the throughput mode) is not available with the reference code",
                                   hint="leave mlp_tokens auto or off with model.implementation: reference")
            asked["mlp_tokens"] = None
            if asked["micro_batch"] == "auto":  # the vendor's attention materialises [B, L, heads, L] scores
                asked["micro_batch"] = 1
        model_sha, win_sha = tokenizer_shas(self.model_dir, self.windows_dir)
        if model_sha and win_sha and model_sha != win_sha:
            raise FidevalError(f"{self.windows_dir / 'eval-windows.json'} was tokenized with tokenizer {win_sha[:12]}…, "
                               f"{self.model_dir / 'tokenizer.json'} is {model_sha[:12]}…",
                               hint="rebuild the windows with this model's tokenizer")
        self.device = dev = resolve_device(device)
        self.rank, self.world, self.group = init_from_env(dev)
        ckpt = open_weights(self.model_dir)
        if drv is None:
            from fideval.model.adapters import Adapter

            adapter = Adapter.load(ckpt)  # the config, checked: sizing needs it before the runner
            vocab, arch, self.config, release = adapter.vocab_size, adapter.arch, adapter.config, adapter.release
        else:  # the vendor's code is the model: its driver gives the sizes (a family transformers lacks has no config)
            from fideval.model.reference.runner import sizing_config

            arch = (ckpt.config_dict.get("architectures") or [type(drv).__name__])[0]
            vocab, release = int(drv.vocab_size), getattr(ckpt, "release", None)
            self.config = sizing_config(drv, ckpt.config_dict)
        self.release, self.vocab = release, vocab
        self.block, self.meta = store_meta(self.model_dir, ckpt, implementation=implementation, arch=arch, dtype=dtype,
                                           dev=dev, world=self.world, release=release, vocab=vocab, model_id=model_id,
                                           model_revision=model_revision, tokenizer_sha256=win_sha or model_sha,
                                           store=store, hidden_size=_hidden_size(drv, self.config) if store == "hidden" else None)
        self.writer = StoreWriter(self.out, self.meta) if self.rank == 0 else None
        self.seqs = read_checked(self.windows_dir, self.folders, domains, vocab)
        done = {sid for s in self.seqs for sid in s.ids if self.writer.done(sid)} if self.writer is not None else set()
        if self.world > 1:
            import torch.distributed as dist

            box = [sorted(done)]
            dist.broadcast_object_list(box, src=0, group=self.group)
            done = set(box[0])
        self.done = done
        self.todo = sum(len(s.ids) - sum(sid in done for sid in s.ids) for s in self.seqs)
        self.check_resumed(final=False)  # before anything is sized or built: a changed setting fails in seconds
        recorded = recorded_settings(self.out)  # a resumed store's settings: read once, for sizing and the lm head
        self.resumed = recorded is not None
        self.asked = asked
        # a fused pass computes every chunk some model still needs (a candidate's records may be missing where the
        # teacher's shard is not): it is sized for all the sequences, a separate pass for those it writes
        self.n_sized = self.todo if models == 1 else sum(len(s.ids) for s in self.seqs)
        self.settings = sized_settings(dev, dtype, self.config, self.seqs, self.n_sized, self.out, self.world, self.group,
                                       asked, recorded, reference=implementation == "reference", models=models,
                                       stored_bytes=1 if models > 1 and release is not None else None,
                                       grouped_experts=implementation == "reference" and reference_experts == "grouped")
        self.block.update(self.settings.recorded())
        self.head = adopt_head(lm_head, (recorded or {}).get("lm_head"), f"store {self.out}")
        self.timeline = Timeline(dev)
        self.bg = None
        self.written = 0
        self.startup = 0.0

    # -- the models --------------------------------------------------------------------------------------------
    def options(self, **extra: Any) -> RunnerOptions:
        """The runner options every model of the pass computes with (the sized settings, the run's device and dtype,
        profiling on); ``extra``: a model's own (a candidate's hooks and head)."""
        from fideval.model.device import resolve_dtype
        from fideval.model.runner import RunnerOptions

        base = dict(device=self.device, dtype=resolve_dtype(self.dtype), profile=True, implementation=self.implementation,
                    code=self.code, trust_remote_code=self.trust_remote_code, head=self.head,
                    reference_experts=self.reference_experts, **self.settings.runner_options())
        return RunnerOptions(**{**base, **extra})

    def runner(self, **extra: Any) -> ModelRunner:
        """The teacher's runner (the backend ``implementation`` names), on this rank, on the pass's timeline; ``extra``:
        RunnerOptions fields that do not shape the bits (``routes``)."""
        from fideval.model.runner import make_runner

        return make_runner(self.model_dir, self.options(output=self.store, **extra), rank=self.rank, world=self.world,
                           group=self.group, timeline=self.timeline)

    def separate_settings(self) -> Settings:
        """The settings a separate pass (one model) would size here: what a fused pass's start line compares with."""
        return sized_settings(self.device, self.dtype, self.config, self.seqs, self.n_sized, self.out, 1, None, self.asked, None)

    # -- the store ---------------------------------------------------------------------------------------------
    def check_resumed(self, final: bool) -> None:
        """A resumed store holds one teacher: every shard already written must have been computed with this run's
        bit-shaping settings (:data:`BIT_SHAPING`) and, ``final``, on these windows' tokens; else one line naming the
        first difference. Not ``final`` (before sizing and the runner): the first written shard, on the keys known then
        (the sized settings are adopted from the store by fideval.model.sizing.adopt, which names its own refusals)."""
        if self.writer is None or not self.done:
            return
        from fideval.model.sizing import RECORDED  # sized after this early check, and adopted from the store
        from fideval.store.shard import read_header, shard_rel

        keys = BIT_SHAPING if final else tuple(k for k in BIT_SHAPING if k not in LATE and k not in RECORDED)
        where = f"store {self.out}"
        for s in self.seqs:
            for row, sid in enumerate(s.ids):
                if sid not in self.done:
                    continue
                path = self.out / shard_rel(sid)
                head = read_header(path)
                try:
                    ran = json.loads(head.meta.get("teacher") or "{}")
                except ValueError:
                    ran = {}
                for k in keys:
                    if k not in ran and self.block.get(k) is not None:
                        raise FidevalError(f"{where}: shard {sid} records no {k} (written by an older fideval), this run "
                                           f"computes with {k} {_shown(self.block.get(k))}",
                                           hint="write a new store: a resume must be computed exactly as the shards it joins")
                    if ran.get(k) != self.block.get(k):
                        raise FidevalError(f"{where}: shard {sid} was computed with {_difference(k, ran.get(k), self.block.get(k))}",
                                           hint=f"resume with the same {k}, or write a new store (one store holds one teacher)")
                if not final:
                    return
                import numpy as np

                stored = np.fromfile(path, dtype="<i4", count=head.length, offset=head.token_ids_offset)
                mine = np.asarray(s.tokens[row], dtype="<i4")
                if stored.shape != mine.shape or not np.array_equal(stored, mine):
                    n = min(len(stored), len(mine))
                    at = np.flatnonzero(stored[:n] != mine[:n])
                    what = f"first difference at position {int(at[0])}" if len(at) else f"{len(stored)} vs {len(mine)} tokens"
                    raise FidevalError(f"{where}: shard {sid} holds other tokens than {self.windows_dir}'s ({what}): the "
                                       "windows were rebuilt", hint="write a new store for these windows")

    def start(self, runner: ModelRunner) -> None:
        """Record what computes the teacher (its head's mode; the vendor code's provenance) in the store's meta, before
        the first shard (every shard carries it), start the background writer and the run's timeline."""
        from fideval.store.background import BackgroundWriter

        self.block["lm_head"] = runner.head_mode
        if self.implementation == "reference":
            self.block["reference_code"] = runner.provenance()
            self.block["weights"] = runner.weights_description
        self.check_resumed(final=True)
        self.head_weight = self.head_block = None
        if self.store == "hidden" and (self.rank == 0 or getattr(runner, "head_collective", False)):
            weight, info = runner.export_head()  # the head as the run applies it; part of the startup
            if self.writer is not None:
                self.head_block = self.writer.set_head(weight, info)
                self.head_weight = weight
        if self.writer is not None:
            self.writer.meta["teacher"] = json.dumps(self.block, sort_keys=True)
            self.writer.meta["settings_sha256"] = settings_fingerprint(self.block)
            self.bg = BackgroundWriter(self.writer, timeline=self.timeline)
        self.startup = time.perf_counter() - self.t_start
        self.timeline.start()

    def write(self, seqs: Sequences, row: int, logits: torch.Tensor) -> None:
        """Queue sequence ``row`` of ``seqs``'s logits as a shard (rank 0; other ranks compute only)."""
        if self.bg is not None:
            sid = seqs.ids[row]
            self.bg.write(sid, logits, seqs.tokens[row], seqs.window_of(sid), seqs.domains[row])
        self.written += 1

    def stored_digest(self, seq_id: str) -> str | None:
        """A written shard's logits digest (rank 0 only: the canary of a resumed run), else None."""
        return stored_digest(self.out, seq_id, self.device) if self.rank == 0 else None

    def sha256(self, seq_id: str) -> str | None:
        """A shard's SHA-256 once it is on disk (what records scored against it are kept under), else None."""
        e = self.writer.entry(seq_id) if self.writer is not None else None
        return e["sha256"] if e is not None else None

    def flush(self) -> None:
        """Every queued shard written (the wait is the timeline's ``store_write``)."""
        if self.bg is not None:
            with self.timeline.part("store_write"):
                self.bg.flush()

    def close(self) -> None:
        """After a failure or an interruption: the queued shards are written, the writer thread ends."""
        if self.bg is not None:
            self.bg.close()

    def finish(self, stats: dict[str, Any], *, tokens: int, model_flops: float, canary: Any,
               extra_meta: dict[str, str] | None = None) -> dict[str, Any]:
        """The run's profile (fideval.timing.accounting; ``stats``: the runner's, its timeline folded), which joins the
        manifest meta with the ``canary`` verdict (and ``extra_meta``); the store's manifest written. Returns the
        profile."""
        from fideval.timing import accounting

        wall = time.perf_counter() - self.t_start
        dev, dtype = self.device, self.dtype
        peak = self.peak_tflops if self.peak_tflops is not None else accounting.peak_tflops(accounting.device_name(dev), dtype)
        hidden = {"load": accounting.hidden_share(stats["load_s"], stats["wait_s"])}
        if self.bg is not None:
            hidden["write"] = self.bg.hidden()
        prof = accounting.summary(wall, {"startup": self.startup, **stats.get("parts", {})}, device=accounting.device_name(dev),
                                  tokens=tokens, model_flops=model_flops, peak=peak if dev.type == "cuda" else None,
                                  world=self.world, hidden=hidden)
        if self.bg is not None:
            # StoreWriter.finish() takes no meta: the verdict and the profile join the manifest meta here; store meta
            # values are strings (docs/formats-store.md), so they are JSON text like `teacher`
            if canary is not None:
                self.bg.meta["canary"] = json.dumps(canary, sort_keys=True)
            self.bg.meta["profile"] = json.dumps(prof, sort_keys=True)
            self.bg.meta.update(extra_meta or {})
            self.bg.finish()
            from fideval.store import card

            card.write(self.out, self.windows_dir / "eval-windows.json")  # the dataset card beside the store
        return prof

    @staticmethod
    def check_canaries(canaries: list[dict[str, Any]], what: str) -> None:
        """One line when any model's canary changed between the start and the end of the run (``what``: what was
        written all the same)."""
        bad = [c for c in canaries if c.get("identical") is False]
        if bad:
            from fideval.model.execution.hooks import canary_pair

            c = bad[0]
            of = f" of {c['model']}" if "model" in c else ""
            raise FidevalError(f"canary{of} {c.get('seq_id')} in {c['folder']} changed between the start and the end of the "
                               f"run ({canary_pair(c)})",
                               hint=f"the run is not bit-reproducible on this device; {what} written, the manifest records it")


def _hidden_size(drv: Any, config: Any) -> int:
    """H, the width of a hidden store's rows: the reference driver's own (its config is a plain dict), else the
    transformers config's."""
    return int(drv.hidden_size) if drv is not None else int(config.hidden_size)


def _shown(v: Any) -> str:
    return f"{len(v)} files fingerprinted" if isinstance(v, dict) and v and all(isinstance(x, str) for x in v.values()) else repr(v)


def _difference(key: str, ran: Any, now: Any) -> str:
    """What differs, in a few words: a checkpoint names its first differing file."""
    if key == "checkpoint" and isinstance(ran, dict) and isinstance(now, dict):
        for name in sorted(set(ran) | set(now)):
            if ran.get(name) != now.get(name):
                return (f"checkpoint file {name} {str(ran.get(name) or 'absent')[:28]}..., this run's is "
                        f"{str(now.get(name) or 'absent')[:28]}... (other weights)")
    if isinstance(ran, dict) or isinstance(now, dict):
        return f"another {key} than this run's"
    return f"{key} {ran!r}, this run computes {key} {now!r}"
