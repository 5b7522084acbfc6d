"""The candidate: whatever is scored against the teacher, behind one interface (:class:`Candidate`).

Three sources: an *emulated* build (the reference checkpoint with quantize->dequantize hooks), a *real*
build (a GGUF file or a quantized safetensors folder, decoded layer by layer), and a *store* of logits
written elsewhere. The first two run through the very same layer-by-layer path as the teacher, so that the
quantization is the only difference between the two.

The quant spec becomes two hooks for the runner: ``weight_transform`` quantizes->dequantizes each listed
weight once, as its layer is materialised (never per token), and on the *serving* path ``act_transform``
quantizes the activations entering those modules to E4M3 per 1x128 as the serving kernels do; the
*weights-only* path leaves activations alone; the *llamacpp* path (GGUF candidates) rounds the input of each quantized
linear as llama.cpp's CPU backend does for the tensor's GGML type (:mod:`fideval.quant.ggml_path`). Bits per weight
are counted from the checkpoint's headers.

The settings that shape the bits (dtype, micro-batch, MLP token block and chunk, model id and revision,
tokenizer) are the teacher's, read back from its store's manifest: a model run with other settings would
differ from the teacher for reasons that are not the quantization (:func:`teacher_settings`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import nesting

if TYPE_CHECKING:
    from fideval.config import Config
    from fideval.model_source import ModelFiles
    from fideval.score.run import ScoreSettings
    from fideval.store.reader import StoreReader
    from fideval.store.rows import TeacherRows
    from fideval.windows.layout import Sequences


UNKNOWN = (None, "", "None", "local", "unknown")  # what a store records when it was told no identity


@dataclass(frozen=True)
class CandidateShard:
    """One sequence of candidate logits. A model run gives every row (row i predicts token i + 1) and no
    token ids; a store gives its token ids (checked against the teacher's) and the row its logits start at."""

    seq_id: str
    logits: Any  # float32 [rows, V]: a torch tensor or a numpy array
    token_ids: np.ndarray | None = None
    row_start: int = 0


@dataclass
class Candidate:
    """What ``fideval score`` scores: shards in the order they come, and what score.json records."""

    name: str  # the records' candidate column
    path: str  # serving, weights-only, llamacpp or store
    shards: Iterable[CandidateShard]
    info: dict[str, Any] | None = None  # score.json's candidate_info (source, quant spec, bits per weight)
    order: list[str] | None = None  # the seq ids in the shards' order, when known up front (a store's)
    is_teacher: bool = False  # the teacher scored against itself: the run is the self-check
    timeline: Any = None  # a model run's fideval.timing.timeline.Timeline: the runner's parts beside the scorer's
    flops_per_token: float | None = None  # a model run's analytic model FLOPs per token (fideval.model.flops)
    # resuming (fideval.score.resume): seq ids already scored, which the shards must not produce again. A model
    # run's runner reads ``skip`` when it starts; store and teacher shards iterate ``pending``, which the scorer
    # filters in place before the first shard is taken.
    skip: set[str] = field(default_factory=set)
    pending: list[str] | None = None
    extent: Callable[[str], tuple[int, int]] | None = None  # a shard's (row_start, rows); None: (0, length)
    shard_sha256: Callable[[str], str | None] | None = None  # a stored shard's SHA-256 (None: a model run)
    lossy: str | None = None  # a candidate store's own `lossy` meta (a llama.cpp import): scored as stored


def teacher_sequences(teacher: StoreReader) -> Sequences:
    """The teacher store's own token ids as Sequences: the candidate runs on exactly what the teacher saw."""
    from fideval.windows.layout import Sequences

    ids = list(teacher.seq_ids)
    if not ids:
        raise FidevalError(f"teacher store {teacher.root} holds no sequences", hint="run 'fideval teacher' first")
    rows = [teacher.token_ids(sid) for sid in ids]  # header + tokens only; logits are hashed when scored
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise FidevalError(f"teacher store {teacher.root} mixes sequence lengths {sorted(lengths)}",
                           hint="score one length (windows or cuts) per run")
    domains = [teacher.entry(sid).get("domain", "") for sid in ids]
    return Sequences(ids=ids, domains=domains, tokens=np.stack(rows).astype(np.int32))


def teacher_settings(cfg: Config, teacher: StoreReader, files: ModelFiles) -> dict[str, Any]:
    """``{dtype, micro_batch, mlp_tokens, chunk_bytes, lm_head}`` the teacher ran with (its manifest's ``teacher`` block),
    after checking that the config and the model folder agree with the store: a key the config sets to another
    value, another model id, revision or tokenizer is a one-line error. A key the config leaves out (or sets to
    ``auto``) follows the manifest; a ``teacher`` block without ``mlp_tokens``/``chunk_bytes`` (older stores)
    means none (no throughput mode, the runner's default chunk); a store that records no settings (a hand-made or
    imported one) takes the config's."""
    from fideval.fsio import sha256_file
    from fideval.model.sizing import AUTO, RECORDED

    meta, where = teacher.meta, f"teacher store {teacher.root}"
    ran = json.loads(meta["teacher"]) if meta.get("teacher") else {}
    impl = getattr(cfg.model, "implementation", "transformers")
    if ran and ran.get("implementation", "transformers") != impl:
        raise FidevalError(f"config model.implementation is {impl!r} but {where} was computed by "
                           f"{ran.get('implementation', 'transformers')!r}",
                           hint="score candidates in the implementation the teacher ran in (their logits are comparable only then)")
    out = {}
    for key in ("dtype", *RECORDED, "lm_head"):
        mine = getattr(cfg.teacher, key)
        known = key in ran or (bool(ran) and key in ("mlp_tokens", "chunk_bytes"))
        theirs = ran.get(key)
        if known and key in cfg.teacher.model_fields_set and mine != AUTO and mine != theirs:
            raise FidevalError(f"config teacher.{key} is {mine!r} but {where} was made with {key} {theirs!r}",
                               hint=f"set teacher.{key}: {theirs} (or drop it), or rerun the teacher with the config")
        out[key] = theirs if known else mine
    # the teacher's head arithmetic where the candidate's head allows it (a quantized head that is not bfloat16-exact
    # computes in float32 under a bf16 teacher, and score.json records it); a store that records none: the config's
    out["lm_head"] = {"bf16": AUTO, "float32": "float32"}.get(ran.get("lm_head"), out["lm_head"])
    tok = Path(files.folder) / "tokenizer.json"
    checks = [("model id", cfg.model.id, meta.get("model_id")), ("model revision", files.revision, meta.get("model_revision")),
              ("tokenizer SHA-256", sha256_file(tok) if tok.is_file() else None, meta.get("tokenizer_sha256"))]
    for what, mine, theirs in checks:
        if mine not in UNKNOWN and theirs not in UNKNOWN and mine != theirs:
            raise FidevalError(f"config's {what} {mine} differs from {where}'s {theirs}",
                               hint="score against a teacher store made from this config's model")
    return out


def run_options(files: Any, seqs: Any, settings: dict[str, Any], device: str,
                backend: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """RunnerOptions' fields for a model run over ``seqs`` with the teacher's ``settings`` (an ``auto`` left by a
    store that records none is sized here, fideval.model.sizing), and the config sizing and FLOPs read: the
    reference's transformers config, or with ``backend`` selecting the reference code its driver's
    (:func:`fideval.model.reference.runner.sizing_config`: a family transformers lacks has none)."""
    from fideval.model import sizing
    from fideval.model.device import resolve_device, resolve_dtype
    from fideval.model.sizing import AUTO

    dtype = resolve_dtype(settings["dtype"])
    if (backend or {}).get("implementation") == "reference":
        import os

        from fideval.model.reference.runner import check, sizing_config

        drv = check(files.folder, code=backend.get("code"), trust=bool(backend.get("trust_remote_code")),
                    world=int(os.environ.get("WORLD_SIZE", "1")), dtype=dtype)
        config = sizing_config(drv, nesting.load_file(Path(files.folder) / "config.json", "fix or re-download config.json"))
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(files.folder))
    reference = (backend or {}).get("implementation") == "reference"  # materialised scores, as the teacher sized
    st = sizing.choose(resolve_device(device), dtype, config, seqs.tokens.shape[1], n_sequences=len(seqs.ids),
                       math_attention=True if reference else None, split_heads=reference,
                       grouped_experts=reference and (backend or {}).get("reference_experts") == "grouped",
                       **{k: settings[k] for k in sizing.RECORDED})
    return {"device": device, "dtype": dtype, "profile": True, "head": settings.get("lm_head", AUTO),
            **st.runner_options()}, config


def _model_run(files: ModelFiles, teacher: StoreReader, settings: dict[str, Any], device: str, checkpoint: Any = None,
               timeline: Any = None, skip: set[str] | None = None, backend: dict[str, Any] | None = None,
               routes: Path | None = None, force: Any = None,
               **transforms: Any) -> tuple[Iterator[CandidateShard], float, dict[str, Any]]:
    """The runner over the teacher's sequences, with the teacher's settings; ``checkpoint`` (a real build)
    stands in for the reference's weights, ``transforms`` are RunnerOptions' weight/act transforms; the
    sequences in ``skip`` when the run starts are not yielded (nor computed, chunk by chunk); ``backend``:
    RunnerOptions' ``implementation``/``code``/``trust_remote_code`` (the config's model section). Returns the
    shards, the model FLOPs per token and the settings as run (with the reference code's provenance). ``routes``: a
    folder whose routes/ each sequence's routes are written into (fideval.formats.routes) as its shard is taken;
    ``force``: the route source the experts take their routes from (fideval.score.route_control)."""
    from fideval.model.device import resolve_device
    from fideval.model.execution import parallel
    from fideval.model.flops import flops_per_token
    from fideval.model.runner import RunnerOptions, make_runner

    seqs = teacher_sequences(teacher)
    fields, config = run_options(files, seqs, settings, device, backend)
    opts = RunnerOptions(**fields, **transforms, **(backend or {}), routes=routes is not None, force_routes=force)
    weights = checkpoint if checkpoint is not None else files.folder
    ran = {"dtype": settings["dtype"], "micro_batch": opts.micro_batch, "mlp_tokens": opts.mlp_tokens,
           "chunk_bytes": opts.host_budget_bytes}
    # built now: what computed the candidate (its lm head's arithmetic, the reference code) goes into score.json
    rank, world, group = parallel.init_from_env(resolve_device(opts.device))
    runner = make_runner(weights, opts, rank=rank, world=world, group=group, timeline=timeline)
    ran["lm_head"] = runner.head_mode
    if opts.implementation == "reference":
        ran["reference_code"] = runner.provenance()

    def run_then_provenance():  # what computed the reference code's transformed linears is known once they have loaded
        row = {sid: k for k, sid in enumerate(seqs.ids)}
        for sid, x in runner.iter_logits(seqs, skip=skip.__contains__ if skip is not None else None):
            if routes is not None:
                took = runner.routes.pop(row[sid])
                if rank == 0:
                    from fideval.formats.routes import write_sequence

                    write_sequence(routes, sid, took)
            yield sid, x
        ran["canary"] = runner.canary  # the first micro-batch again at the end: None when a resumed run did not compute it
        if opts.implementation == "reference":
            ran["reference_code"] = runner.provenance()

    logits = run_then_provenance()
    return (CandidateShard(sid, x) for sid, x in logits), flops_per_token(config, seqs.tokens.shape[1])["total"], ran


def from_config(cfg: Config, name: str, path: str, teacher: StoreReader, device: str, routes: Path | None = None,
                force_routes: Path | None = None) -> Candidate:
    """Candidate ``name`` of ``cfg`` on ``path`` (serving, weights-only or llamacpp), run over the teacher's sequences
    with the teacher's settings (:func:`teacher_settings`): its ``checkpoint:`` (a real build) when it names
    one, else its ``quant:`` spec emulated on the reference checkpoint. ``force_routes``: the teacher store whose
    recorded routes the candidate's MoE layers take (the route-controlled run, fideval.score.route_control)."""
    from fideval.model_source import locate

    by_name = {c.name: c for c in cfg.candidates}
    if name not in by_name:
        raise FidevalError(f"candidate {name!r} is not in the config", hint=f"one of: {', '.join(by_name) or 'none'}")
    cand = by_name[name]
    if path not in cand.paths:
        raise FidevalError(f"candidate {name!r} has no path {path!r}", hint=f"its paths: {', '.join(cand.paths)}")
    from fideval.model.device import resolve_device
    from fideval.timing.timeline import Timeline

    files = locate(cfg.model.path, cfg.model.revision)
    settings = teacher_settings(cfg, teacher, files)
    from fideval.score.hooks_of import describe

    hooks, info = describe(cfg, cand, path, files)
    timeline = Timeline(resolve_device(device))
    skip: set[str] = set()
    backend = {"implementation": cfg.model.implementation, "code": cfg.model.code,
               "trust_remote_code": cfg.model.trust_remote_code, "reference_experts": cfg.model.reference_experts}
    force = None
    if force_routes is not None:
        from fideval.score.route_control import teacher_routes

        force, info["routes_forced"] = teacher_routes(force_routes, teacher, list(teacher_sequences(teacher).ids))
    shards, per_token, ran = _model_run(files, teacher, settings, device, timeline=timeline, skip=skip,
                                        backend=backend, routes=routes, force=force, **hooks)
    info["run_settings"] = ran
    if force is not None:  # its records are told apart from the free run's by their path (e.g. weights-only+teacher-routes)
        from fideval.score.route_control import SUFFIX

        path += SUFFIX
    return Candidate(name=name, path=path, shards=shards, info=info, timeline=timeline, flops_per_token=per_token,
                     skip=skip)


def store_shards(reader: Any, seq_ids: Iterable[str], device: Any = None, prefetch: int = 1) -> Iterator[CandidateShard]:
    """A candidate store's shards. On a GPU (``device`` cuda) streamed ``prefetch`` shards ahead (one: with
    the teacher's stream beside it, two host buffers in all); else memory-mapped (the CPU scorer is far
    slower than the disk: read-ahead buys nothing)."""
    import torch

    from fideval.store.feed import mapped_tensor

    if hasattr(reader, "logits"):  # a hidden store: each shard's states through its own head, on the scoring device
        dev = torch.device(device) if device is not None else torch.device("cpu")
        for sid in seq_ids:
            logits, tokens = reader.logits(sid, dev)
            yield CandidateShard(sid, logits, tokens, reader.row_start(sid))
        return
    if device is None or torch.device(device).type == "cpu":
        for sid in seq_ids:
            logits, tokens = reader.read(sid)
            yield CandidateShard(sid, mapped_tensor(logits), tokens, reader.row_start(sid))
        return
    for sid, logits, tokens in reader.iter(list(seq_ids), device=device, prefetch=prefetch):
        yield CandidateShard(sid, logits, tokens, reader.row_start(sid))


def from_store(reader: StoreReader, teacher: StoreReader, name: str, path: str = "store", device: Any = None,
               spec: Any = None) -> Candidate:
    """A candidate store (logits, or hidden states replayed through the candidate's own head), checked against the
    teacher: same vocabulary, a shard for every teacher sequence. Its shards come in the teacher's order, so a GPU run
    streams both side by side."""
    where = f"--candidate {reader.root}"
    if reader.vocab_size != teacher.vocab_size:
        raise FidevalError(f"{where}: vocab_size {reader.vocab_size} differs from the teacher's {teacher.vocab_size}",
                           hint="teacher and candidate must share the tokenizer and output width")
    missing = [s for s in teacher.seq_ids if s not in reader.entries]
    if missing:
        raise FidevalError(f"{where}: no shard for {len(missing)} teacher sequences (first {missing[0]!r})",
                           hint="make the candidate store from the same windows")
    reader.check_files(teacher.seq_ids)  # sizes and headers now; hashes as each shard is read
    order = list(teacher.seq_ids)
    return Candidate(name=name, path=path, shards=store_shards(reader, order, device), order=order,
                     info=store_identity(reader, spec), pending=order,
                     extent=lambda sid: (reader.row_start(sid), int(reader.entry(sid)["rows"])),
                     shard_sha256=lambda sid: reader.entry(sid)["sha256"], lossy=reader.meta.get("lossy") or None)


def store_identity(reader: Any, spec: Any = None) -> dict[str, Any]:
    """score.json's candidate_info for a candidate logit store: the store as given, its manifest's SHA-256 (the
    hash that covers every shard's), and the model, revision and kind its manifest records."""
    from fideval.fsio import sha256_file

    man = Path(reader.root) / "manifest.json"
    meta = reader.meta or {}
    return {"source": "store", "store": str(spec if spec is not None else reader.root),
            "manifest_sha256": sha256_file(man) if man.exists() else None, "model_id": meta.get("model_id"),
            "model_revision": meta.get("model_revision"), "kind": meta.get("kind")}


def teacher_shards(teacher: TeacherRows, seq_ids: Iterable[str], device: Any = None) -> Iterator[CandidateShard]:
    """The teacher's own shards, copied out of the memory map, as a candidate's (a hidden store's replayed on ``device``)."""
    import torch

    if hasattr(teacher, "logits"):
        for sid in seq_ids:
            logits, tokens = teacher.logits(sid, device if device is not None else "cpu")
            yield CandidateShard(sid, logits, tokens, teacher.row_start(sid))
        return
    for sid in seq_ids:
        logits, tokens = teacher.read(sid)
        yield CandidateShard(sid, torch.from_numpy(np.array(logits, dtype=np.float32)), tokens, teacher.row_start(sid))


def teacher_itself(teacher: TeacherRows, name: str = "self", path: str = "store", device: Any = None) -> Candidate:
    """The teacher as its own candidate (``--self-check`` alone): every row must score exactly 0."""
    ids = list(teacher.seq_ids)
    return Candidate(name=name, path=path, shards=teacher_shards(teacher, ids, device), is_teacher=True, pending=ids,
                     extent=lambda sid: (teacher.row_start(sid), int(teacher.entry(sid)["rows"])),
                     shard_sha256=lambda sid: teacher.entry(sid)["sha256"])


def select(teacher: StoreReader, spec: str | None, path: str, settings: ScoreSettings, *, cfg: Config | None = None,
           name: str | None = None, self_check: bool = False, routes: Path | None = None,
           force_routes: Path | None = None) -> Candidate:
    """The candidate ``fideval score`` is asked for: with a config, its candidate ``spec`` run on ``path``;
    else the logit store at ``spec`` (named ``name``, default its folder's name); with neither and
    ``self_check``, the teacher itself. ``routes``: a config candidate's routes written there (fideval.formats.routes);
    ``force_routes``: the teacher store whose routes a config candidate takes (fideval.score.route_control)."""
    if path not in ("serving", "weights-only", "llamacpp", "store"):
        raise FidevalError(f"--path {path!r}: expected serving, weights-only, llamacpp or store")
    if cfg is not None:
        if spec is None or path == "store":
            raise FidevalError("with --config give --candidate NAME and --path serving|weights-only|llamacpp",
                               hint="names and paths are in the config's candidates")
        return from_config(cfg, spec, path, teacher, settings.device, routes=routes, force_routes=force_routes)
    if force_routes is not None:
        raise FidevalError("--teacher-routes forces routes into a model run: a logit store (or the teacher itself) runs none",
                           hint="give --config and --candidate NAME")
    if routes is not None:
        raise FidevalError("--routes records a model run's routes: a logit store (or the teacher itself) has none",
                           hint="give --config and --candidate NAME, or record the teacher's with fideval teacher --routes")
    if spec is None:
        if not self_check:
            raise FidevalError("give --candidate STORE (or --self-check to score the teacher against itself)")
        from fideval.score.kernels import pick

        return teacher_itself(teacher, name or "self", path, pick(settings.device, settings.kernel)[0])
    from fideval.score.kernels import pick
    from fideval.score.stores import open_store

    dev, _ = pick(settings.device, settings.kernel)
    return from_store(open_store(spec), teacher, name or Path(str(spec).rstrip("/")).name, path,
                      device=dev if dev.type == "cuda" else None, spec=spec)
