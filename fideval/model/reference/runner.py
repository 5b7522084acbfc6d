"""The reference-code backend's runner: the vendor's own modules, layer by layer, through a family driver.

The same interface as :class:`fideval.model.runner.Runner` (what the verbs use: ``iter_logits``, ``run``,
``vocab_size``, ``weights_description``, ``canary``, ``stats``, ``finish_profile``, ``timeline``), and the same
outer loop (:class:`~fideval.model.layer_major.LayerMajor`: chunks, micro-batches, skipped sequences, canary).
Everything about the model is the driver's (:mod:`fideval.model.reference.driver`): this module never names a
family. Per chunk: every micro-batch's state from ``driver.begin``; layer ``i`` loaded by ``driver.load_layer``
on the prefetch thread while layer ``i-1`` computes (:class:`~fideval.model.execution.prefetch.Prefetch`, depth 1), run by
``driver.forward_layer`` on each micro-batch's state; ``driver.finish`` gives float32 logits over every position.

States stay on the device between layers (a driver's state is its own structure, not a tensor the runner can
page out); the chunk size still bounds them (``host_budget_bytes`` of hidden states per chunk).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.formats import nesting
from fideval.model.device import resolve_device
from fideval.model.execution import determinism
from fideval.model.execution.hooks import check_act_transform
from fideval.model.execution.prefetch import Ledger, Prefetch
from fideval.model.layer_major import LayerMajor
from fideval.model.reference import driver as contract
from fideval.model.reference.code import load_vendor_code, resolve_code_dir
from fideval.model.weights import fp8_release
from fideval.model.weights.checkpoint import WeightSource, open_weights
from fideval.timing.timeline import Timeline, module_parts

DEFAULT_HOST_BUDGET = 4 << 30


def open_driver(weights: WeightSource | str | Path, *, code: str | Path | None = None, trust: bool = False,
                device="cpu", dtype: torch.dtype = torch.float32, rank: int = 0, world: int = 1, group=None,
                weight_transform: Callable | None = None, act_transform: dict | None = None, **driver_options):
    """The family driver for ``weights`` (a checkpoint folder or a WeightSource under the reference's names) with
    the vendor code from ``code`` (relative to the reference model folder, default ``inference``, or absolute).
    Everything checked here is a one-line error before any weight is read: the code folder, trust, the code's
    classes, a config the vendor's ``ModelArgs`` rejects, a world size that does not divide what it cuts."""
    ckpt = open_weights(weights)
    folder = resolve_code_dir(ckpt.config_dir, code)
    cfg = ckpt.config_dict
    device = resolve_device(device)
    fam = _family(cfg, folder, trust)
    cls = contract.driver_class(fam)
    stand, prefer = cls.stand_ins(device, dtype) if hasattr(cls, "stand_ins") else ({}, True)
    vendor = load_vendor_code(folder, trust=trust, stand_ins=stand, prefer_vendor=prefer)
    return cls(vendor, cfg, ckpt, rank=rank, world=world, group=group, device=device, dtype=dtype,
               weight_transform=weight_transform, act_transform=act_transform, **driver_options)


def _family(cfg: dict, folder: Path, trust: bool) -> str:
    """The driver family: by config.json's model_type where it names one; else by the code's own shape, which
    needs it imported (kernels with no stand-in: a family whose kernels import on this machine)."""
    try:
        return contract.family_of(cfg, None)
    except FidevalError:
        return contract.family_of(cfg, load_vendor_code(folder, trust=trust).model)


class ReferenceRunner(LayerMajor):
    """One model, one device, optionally one rank of N, run by the vendor's code (``options``: a
    :class:`~fideval.model.runner.RunnerOptions`; its ``code``, ``trust_remote_code``, ``reference`` and
    ``reference_experts`` fields select the code, the trust, the driver's own options and its routed experts'
    path). The head: the driver's ``finish`` (float32 over every position, as the vendor computes it) with ``lm head``
    float32, or with ``bf16`` (``auto`` where it forms the same products, :meth:`_choose_head`) the driver's final
    norm (``head_input``) and its head's weight as bfloat16 operands with float32 sums and logits
    (fideval.model.execution.head): the vendor's products summed in another order."""

    def __init__(self, weights: WeightSource | str | Path, options, *, rank: int = 0, world: int = 1, group=None,
                 ledger: Ledger | None = None, timeline: Timeline | None = None):
        determinism.configure()
        self.options = opts = options
        self.output = getattr(opts, "output", "logits")
        if self.output not in ("logits", "hidden"):
            raise FidevalError(f"runner output {self.output!r} is not logits or hidden", hint="this is a bug in the caller")
        if self.output == "hidden" and "lm_head" in (opts.act_transform or {}):
            raise FidevalError("a hidden store cannot keep a run that quantizes the head's activations (its logits are not "
                               "the head applied to the stored states)", hint="write a logit store for this candidate")
        self.device = resolve_device(opts.device)
        self.dtype = opts.dtype
        self.ckpt = open_weights(weights)
        release = getattr(self.ckpt, "release", None)
        if release is not None:
            fp8_release.check(self.ckpt, release)  # before any compute
        self.driver = open_driver(self.ckpt, code=opts.code, trust=opts.trust_remote_code, device=self.device,
                                  dtype=self.dtype, rank=rank, world=world, group=group,
                                  weight_transform=opts.weight_transform,
                                  act_transform=check_act_transform(opts.act_transform),
                                  **{"experts": getattr(opts, "reference_experts", "vendor"), **dict(opts.reference or {})})
        self.rank, self.world, self.group = rank, world, group
        # loads copy on their own CUDA stream, beside the computing layer (the default stream would queue them behind it)
        self.side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._bf16_head: torch.Tensor | None = None
        self.head_mode = self._choose_head()
        self.micro_batch = max(1, int(opts.micro_batch))
        self.host_budget = opts.host_budget_bytes or DEFAULT_HOST_BUDGET
        self.ledger = ledger or Ledger()
        self.stats = {"load_s": 0.0, "wait_s": 0.0, "tokens": 0, "wall_s": 0.0, "chunks": 0}
        self.timeline = timeline if timeline is not None else Timeline(self.device, on=opts.profile)
        self.canary = None
        self.warming = False
        self.routes = self.forcer = None  # issue 42: routes recorded / forced at the vendor's Gate (gate_routes)
        if getattr(opts, "routes", False) or getattr(opts, "force_routes", None) is not None:
            from fideval.model.reference import gate_routes

            self.routing, self.routes, self.forcer = gate_routes.setup(self.driver, opts, getattr(self.ckpt, "dir", ""))

    @property
    def vocab_size(self) -> int:
        return int(self.driver.vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(self.driver.hidden_size)

    @property
    def weights_description(self) -> str:
        release = getattr(self.ckpt, "release", None)
        return fp8_release.describe(self.ckpt, release, self.dtype, self.device) + ", in the vendor's reference code"

    @property
    def head_collective(self) -> bool:
        """:meth:`export_head` gathers the head's rows over the ranks: every rank must call it."""
        return self.world > 1

    def export_head(self) -> tuple[torch.Tensor, dict]:
        """The vendor's head as its ``finish`` applies it -- ``F.linear(x.float(), W)`` with the float32 weight every
        driver keeps (V3's and V3.2's ColumnParallelLinear, V4.1's ParallelHead) -- its rows gathered over the ranks,
        on the CPU, and how: a hidden store's head (fideval.store.head), replayed in this run's head mode (float32 as
        the vendor computes it, or bf16: the same products, :meth:`_choose_head`). The states a hidden store keeps are
        the norm's output in the run's dtype (``head_input``)."""
        w = self.driver.head_weight().detach()
        if self.world > 1:
            import torch.distributed as dist

            parts = [torch.empty_like(w) for _ in range(self.world)]
            dist.all_gather(parts, w.contiguous(), group=self.group)
            w = torch.cat(parts, dim=0)
        w = w.to("cpu", torch.float32)[: self.vocab_size]
        info = {"lm_head": self.head_mode, "finish": None, "source": "head.weight (the reference code's)", "tied": False,
                "hidden_dtype": str(self.dtype).removeprefix("torch."), "hidden_size": int(w.shape[1])}
        return w, info

    def provenance(self) -> dict:
        """What the store manifest and report.json record of the code: folder, SHA-256 per file, kernels."""
        code = self.driver.code.provenance()
        out = {"implementation": "reference", "family": type(self.driver).__module__.rsplit(".", 1)[-1],
               "folder": code["folder"], "files": code["files"], "modules": code["kernels"],
               "kernels": dict(self.driver.kernels)}
        describe = getattr(self.driver, "describe", None)
        if callable(describe):  # the driver's own account of the model it runs (V4.1: schedule, storage dtypes)
            out["model"] = describe()
        return out

    def _choose_head(self) -> str:
        """The head's mode (fideval.model.execution.head): ``options.head``, or for ``auto`` ``bf16`` where it forms the
        vendor's float32 products -- a GPU, bfloat16 layers, no activation transform on the head, and the head's
        weights (as the driver applies them, after a candidate's transform) bfloat16 values -- else ``float32``. The
        bf16 mode keeps a bfloat16 copy of this rank's head rows (the driver's float32 ones stay for ``finish``).
        Under model parallel every rank takes the same mode."""
        from fideval.model.execution import head as head_math

        want = self.options.head
        if want not in head_math.MODES:
            raise FidevalError(f"lm head mode {want!r} is not known", hint=f"use one of {', '.join(head_math.MODES)}")
        if want == "float32":
            return "float32"
        why = head_math.unusable(self.device, self.dtype, self.options.act_transform)
        if why is None:
            w = self.driver.head_weight()  # loads the resident head (kept for the run)
            if not head_math.exact(w):
                why = "its weights (after the candidate's transform) are not bfloat16 values"
            else:
                self._bf16_head = w.detach().to(torch.bfloat16)
        mode = head_math.settle(want, why, self.device, self.world, self.group)
        if mode == "float32":
            self._bf16_head = None
        return mode

    def _logits(self, state) -> torch.Tensor:
        """Float32 logits over every position and the whole vocabulary: the driver's ``finish``, or (bf16 head) its
        final norm's output through the bfloat16 head rows, gathered over the ranks."""
        if self._bf16_head is None:
            return self.driver.finish(state)
        x = self.driver.head_input(state)
        if x.dtype != torch.bfloat16:
            raise FidevalError(f"the reference code's final norm returned {x.dtype}, not bfloat16: the bf16 head cannot "
                               "take it", hint="run with lm head float32")
        logits = torch.mm(x.reshape(-1, x.shape[-1]), self._bf16_head.t(), out_dtype=torch.float32)
        logits = logits.view(*x.shape[:-1], logits.shape[-1])
        if self.world > 1:
            import torch.distributed as dist

            parts = [torch.empty_like(logits) for _ in range(self.world)]
            dist.all_gather(parts, logits.contiguous(), group=self.group)
            logits = torch.cat(parts, dim=-1)
        return logits

    def _load(self, key: tuple) -> torch.nn.Module | None:
        """One prefetch unit: ``(chunk, "embed" | layer index | "head")``. The embedding and the head are the driver's
        to keep across chunks (``preload``; loaded here the first time, on the prefetch thread: the embedding's read
        leaves the compute thread, the head's overlaps the last layer's compute). On a GPU every load runs on the load
        stream and is complete on the device when this returns."""
        with torch.cuda.stream(self.side) if self.side is not None else nullcontext():
            mod = None
            if key[1] in ("embed", "head"):
                preload = getattr(self.driver, "preload", None)
                if callable(preload):
                    preload(key[1])
            else:
                mod = self.driver.load_layer(int(key[1]))
            if self.side is not None:
                ev = torch.cuda.Event()
                ev.record(self.side)
                ev.synchronize()  # the weights are on the device before the compute stream may read them
        if mod is None:
            return None
        if (self.routes is not None or self.forcer is not None) and int(key[1]) in self.routing.layers:
            from fideval.model.reference import gate_routes

            gate_routes.install(mod, int(key[1]), self.routing.gate, record=self.routes, force=self.forcer)
        self.ledger.track(key, mod)
        return mod

    def _after_compute(self) -> None:
        """Before a unit's weights go back: the load stream waits for what the compute stream has queued, so the
        next load's copies never land in memory the last layer's kernels still read (its blocks are the load stream's
        to reuse once freed)."""
        if self.side is not None:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.side.wait_event(ev)

    def _announce(self, rows: list[int] | None, length: int = 0, again: bool = False, *, chunk: bool = False) -> None:
        """The rows the next gate calls route (None: none; ``chunk``: a new chunk, routes not taken are dropped);
        ``again``: the canary's second pass, which is not recorded again but is forced again, as its first pass was."""
        for r in (self.routes, self.forcer):
            if r is not None and chunk:
                r.reset()
        if self.routes is not None:
            self.routes.current = None if rows is None or again else (rows, length)
        if self.forcer is not None:
            self.forcer.current = None if rows is None else (rows, length)

    def _chunk(self, tokens: np.ndarray, mbs: list[list[int]], ci: int, solo: set[int] = frozenset(),
               canary: int | None = None) -> Iterator[tuple[int, int, torch.Tensor]]:
        """One chunk layer by layer (``solo`` is the transformers runner's MoE-block composition: unused here, every
        micro-batch is its own forward); no timeline part is open across a ``yield``."""
        drv, tl = self.driver, self.timeline
        units = [(ci, "embed")] + [(ci, i) for i in range(drv.n_layers)] + [(ci, "head")]
        self.stats["chunks"] += 1
        with tl.part("setup"):
            pf = Prefetch(units, self._load, 1 if self.options.prefetch else 0, self.stats)

        def mb_part(j: int):
            return tl.part("canary", sticky=True) if j == canary else nullcontext()

        try:
            with torch.inference_mode():
                self._announce(None, chunk=True)
                with tl.part("load_wait"):
                    pf.get()  # the embedding
                states = []
                for j, mb in enumerate(mbs):
                    with mb_part(j), tl.part("embed"):
                        ids = torch.from_numpy(np.ascontiguousarray(tokens[mb], dtype=np.int64)).to(self.device)
                        states.append(drv.begin(ids))
                pf.release()
                for i in range(drv.n_layers):
                    with tl.part("load_wait"):
                        layer = pf.get()
                    if tl.on:
                        for name, part in (("attn", "attention"), ("ffn", None)):
                            sub = getattr(layer, name, None)
                            if sub is not None:
                                part = part or ("moe" if hasattr(sub, "experts") else "dense_mlp")
                                module_parts(sub, tl, part)
                    for j in range(len(states)):
                        self._announce(mbs[j], tokens.shape[1], j == canary)
                        with mb_part(j), tl.part("norms"):  # what attention and MLP parts leave
                            states[j] = drv.forward_layer(i, layer, states[j])
                    self._announce(None)
                    del layer
                    self._after_compute()
                    pf.release()
                with tl.part("load_wait"):
                    pf.get()  # the final norm and the head
                for j, mb in enumerate(mbs):
                    with mb_part(j), tl.part("head"):  # a hidden store's: the head's input (replicated over ranks)
                        logits = drv.head_input(states[j]) if self.output == "hidden" else self._logits(states[j])
                        states[j] = None
                    for r, row in enumerate(mb):
                        yield j, row, logits[r]
                pf.release()
        finally:
            pf.close()


def iter_logits(weights: WeightSource | str | Path, sequences, options, *, timeline: Timeline | None = None,
                skip: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`fideval.model.runner.iter_logits` for the reference backend (every rank under torchrun calls it)."""
    from fideval.model.execution import parallel

    rank, world, group = parallel.init_from_env(resolve_device(options.device))
    yield from ReferenceRunner(weights, options, rank=rank, world=world, group=group,
                               timeline=timeline).iter_logits(sequences, skip=skip)


class ConfigOnly:
    """A :class:`~fideval.model.weights.checkpoint.WeightSource` with the config and no tensors: what ``fideval validate``
    hands a driver (whose constructor reads no weight), so a model whose weights are not local yet is checked.
    ``config_only``: the driver checks and sizes, and joins or creates no process group (validate runs in one
    process whatever the model-parallel size it checks)."""

    config_only = True

    def __init__(self, folder: str | Path):

        from fideval.model.weights.fp8_release import detect

        self.dir = self.config_dir = Path(folder)
        cfg = self.dir / "config.json"
        try:
            self.config_dict = nesting.loads(cfg.read_text())
        except (OSError, ValueError) as e:
            raise FidevalError(f"{cfg} is not readable JSON ({type(e).__name__})", hint="fix or re-download config.json") from None
        self.release = detect(self.config_dict, cfg)

    def __contains__(self, key: str) -> bool:
        return False

    def info(self, key: str):
        raise FidevalError(f"{self.dir}: no weights are read here ({key!r})", hint="validate reads config.json only")

    read = info


def check(model_dir: str | Path, *, code: str | Path | None, trust: bool, world: int = 1,
          dtype: torch.dtype | str = torch.float32):
    """``fideval validate``'s check of a reference-backend config: everything :func:`open_driver` refuses, in
    seconds, from config.json and the code alone (no weight is read, none need be local). Returns the driver
    (on :class:`ConfigOnly`: what the verbs ask of the model before the run, :func:`sizing_config`)."""
    from fideval.model.device import resolve_dtype

    dtype = resolve_dtype(dtype) if isinstance(dtype, str) else dtype
    return open_driver(ConfigOnly(model_dir), code=code, trust=trust, device="cpu", world=world, dtype=dtype)


def sizing_config(driver, config: dict) -> dict:
    """What :mod:`fideval.model.sizing` and :mod:`fideval.model.flops` read for a reference-code model: the
    driver's ``sizing_config()`` where it has one (a family transformers does not know, DeepSeek-V4.1), else the
    checkpoint's config.json (transformers' key names: V3, V3.2)."""
    own = getattr(driver, "sizing_config", None)
    return own() if callable(own) else dict(config)
