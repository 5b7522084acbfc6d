"""Layer-major execution of a decoder-only causal LM: every sequence of a chunk goes through layer 0, then
layer 1, ... so each layer's weights are read from disk once per chunk, and only the current layer and
the one being prefetched are resident.

Why layer-major: a teacher checkpoint (DeepSeek-V3: 671 B parameters) does not fit one GPU, and a
sequence-major pass would re-read every weight for every sequence. Reading layer k+1 on a background
thread (into pinned memory, copied on a side CUDA stream) while layer k computes hides the disk and PCIe
time behind compute once a chunk holds enough tokens.

Numerics follow the model's own forward: transformers' decoder-layer modules, its rotary module, its
mask utilities, position ids ``arange(L)``; the final norm in the model dtype and the lm head in float32
(``F.linear`` on float32 inputs and weights), as a float32 ``from_pretrained`` model computes it -- or, in a
bf16 run on a GPU, the same bfloat16 operands on the tensor cores with float32 sums (fideval.model.execution.head).
A canary (the first micro-batch, same composition) runs again at the end of the run; its logits must be
bit-identical, and the verdict is kept in :attr:`Runner.canary`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.model.adapters import Adapter, expert_range
from fideval.model.device import resolve_device
from fideval.model.execution import determinism, hooks, parallel
from fideval.model.execution.head_loading import HeadLoading
from fideval.model.execution.prefetch import Ledger, Prefetch
from fideval.model.execution.throughput import MlpBlocks
from fideval.model.layer_major import LayerMajor, ModelRunner
from fideval.model.weights import fp8_release
from fideval.model.weights.checkpoint import WeightSource, open_weights
from fideval.timing.timeline import Timeline, module_parts

DEFAULT_HOST_BUDGET = 4 << 30
OUTPUTS = ("logits", "hidden")


@dataclass(frozen=True)
class RunnerOptions:
    """How a run computes. Budgets, ``prefetch`` and ``profile`` move time and memory, not bits (except that
    with ``mlp_tokens`` a token block never spans chunks, so ``host_budget_bytes`` bounds the blocks); every
    other field shapes the bits.

    ``weight_transform(module_class, name, tensor) -> tensor``, once per tensor as a layer is materialised (the
    embedding too, as class ``embedding``, which only a ``gguf_mix`` spec quantizes; one that takes ``out=`` is
    handed the load's own tensor as ``out`` and writes into it, so no second copy of a fused expert tensor exists);
    ``act_transform``: module class -> fn on that class's input activations (docs/runner.md);
    ``host_budget_bytes``: hidden states held per chunk (default 4 GiB); ``device_budget_bytes``: hidden
    states kept on the GPU between layers (default 35 % of its free memory), else pinned on the host;
    ``mlp_tokens``: the throughput mode (fideval.model.execution.throughput), None: whole layers per micro-batch;
    ``lean_experts`` False: transformers' own grouped_mm experts forward (an A/B in the bench);
    ``profile``: the run's time per part (fideval.timing.timeline's timeline) into ``Runner.stats``;
    ``implementation``: ``transformers`` (this module) or ``reference`` (the vendor's own code,
    fideval.model.reference.runner, from ``code`` relative to the model folder or absolute, which needs
    ``trust_remote_code``; ``reference``: the family driver's own options, e.g. ``{"gemm_impl": "fp8"}``);
    ``head``: the lm head's arithmetic, ``auto`` | ``float32`` | ``bf16`` (fideval.model.execution.head);
    ``routes``: record every MoE layer's routed expert ids and weights per position (``Runner.routes``,
    fideval.model.routes; bits unchanged; the throughput mode's blocks too); ``force_routes``: a route source
    (fideval.model.routes.FileRoutes / RecordedRoutes, by the runner's rows) whose routes the experts take instead
    of their router's (the route-controlled run);
    ``output``: ``logits`` (float32 ``[L, V]`` per sequence) or ``hidden`` (the final norm's output ``[L, H]`` in the
    layers' dtype, for a hidden store: the head is not loaded, :meth:`Runner.export_head` gives it once);
    ``reference_experts``: the reference code's routed experts, ``vendor`` (its per-expert loop) or ``grouped``
    (one GEMM per projection, fideval.model.reference.grouped_experts)."""

    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32
    micro_batch: int = 1
    weight_transform: Callable | None = None
    act_transform: dict | None = None
    host_budget_bytes: int | None = None
    device_budget_bytes: int | None = None
    prefetch: bool = True
    attn_implementation: str | None = None
    experts_implementation: str | None = None
    mlp_tokens: int | None = None
    lean_experts: bool = True
    profile: bool = False
    implementation: str = "transformers"
    code: str | None = None
    trust_remote_code: bool = False
    reference: dict | None = None
    head: str = "auto"
    routes: bool = False
    force_routes: Any = None
    output: str = "logits"
    reference_experts: str = "vendor"


@dataclass
class _Chunk:
    """One chunk's state between the steps of :class:`Runner` (per model under fideval.model.lockstep)."""

    tokens: np.ndarray
    mbs: list[list[int]]
    solo: set[int]
    canary: int | None
    on_dev: bool
    states: list = field(default_factory=list)
    masks: dict = field(default_factory=dict)
    pos: torch.Tensor | None = None
    pes: dict | None = None


class Runner(LayerMajor, HeadLoading):
    """One model, one device, optionally one rank of an N-way model-parallel group (see parallel.py).

    ``weights``: the reference checkpoint's folder, or any :class:`WeightSource` (a real quantized build,
    fideval.model.weights.quantized, standing in for the reference's weights). ``timeline``: the run's
    :class:`~fideval.timing.timeline.Timeline`, shared with the caller's own parts (store writes, scoring);
    by default one of the runner's own, on when ``options.profile``."""

    def __init__(self, weights: WeightSource | str | Path, options: RunnerOptions | None = None, *,
                 rank: int = 0, world: int = 1, group=None, ledger: Ledger | None = None,
                 timeline: Timeline | None = None):
        determinism.configure()
        self.options = opts = options or RunnerOptions()
        self.device = resolve_device(opts.device)
        self.dtype = opts.dtype
        self.ckpt = open_weights(weights)
        self.adapter = Adapter.load(self.ckpt, opts.attn_implementation)
        if opts.experts_implementation:
            self.adapter.config._experts_implementation = opts.experts_implementation
        self.act_transform = hooks.check_act_transform(opts.act_transform)
        self.micro_batch = max(1, int(opts.micro_batch))
        self.rank, self.world, self.group = rank, world, group
        self.ledger = ledger or Ledger()
        self.host_budget = opts.host_budget_bytes or DEFAULT_HOST_BUDGET
        budget = opts.device_budget_bytes
        if budget is None and self.device.type == "cuda":
            budget = int(torch.cuda.mem_get_info(self.device)[0] * 0.35)
        self.device_budget = budget
        self.side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.stats = {"load_s": 0.0, "wait_s": 0.0, "tokens": 0, "wall_s": 0.0, "chunks": 0}
        self.timeline = timeline if timeline is not None else Timeline(self.device, on=opts.profile)
        self.canary: dict | None = None
        self._warmed = False
        self.blocks = MlpBlocks(opts.mlp_tokens, self.device, self.stats, self.timeline) if opts.mlp_tokens else None
        self.experts: dict[int, tuple[int, int]] = {}
        for i in range(self.adapter.n_layers):  # meta layers cost nothing; N must divide every MoE layer's experts
            n_exp = self.adapter.n_routed_experts(self.adapter.meta_layer(i, self.dtype))
            if n_exp:
                self.experts[i] = expert_range(rank, world, n_exp)
        self.vocab_bounds = parallel.vocab_bounds(world, self.adapter.vocab_size)
        self.head_mode = self._choose_head()
        if opts.output not in OUTPUTS:
            raise FidevalError(f"runner output {opts.output!r} is not one of {', '.join(OUTPUTS)}", hint="this is a bug in the caller")
        self.output = opts.output
        if self.output == "hidden" and "lm_head" in self.act_transform:
            raise FidevalError("a hidden store cannot keep a run that quantizes the lm head's activations (its logits are "
                               "not the head applied to the stored states)", hint="write a logit store for this candidate")
        from fideval.model import routes

        a, moe = self.adapter, sorted(self.experts)
        n_experts = a.n_routed_experts(a.meta_layer(moe[0], self.dtype)) if moe else None
        self.routes, self.forcer = routes.setup(opts, moe, n_experts, getattr(a.config, "num_experts_per_tok", None),
                                                self.ckpt.dir)
        if self.forcer is not None:
            self.forcer.warming = lambda: self.warming

    @property
    def vocab_size(self) -> int:
        return self.adapter.vocab_size

    @property
    def hidden_size(self) -> int:
        return int(self.adapter.config.hidden_size)

    @property
    def weights_description(self) -> str:
        """What the weights are, for provenance: e.g. ``as released: FP8 E4M3, 128x128 block scales, dequantized
        to bfloat16 on cuda`` or ``as released: bfloat16`` (fideval.model.weights.fp8_release.describe)."""
        return fp8_release.describe(self.ckpt, self.adapter.release, self.dtype, self.device)

    @property
    def warming(self) -> bool:
        """True while the throughput mode's one-off warm-up call runs (profilers leave that call out)."""
        return self.blocks is not None and self.blocks.warming

    # -- loading (runs on the prefetch thread) -----------------------------------------------------------
    def _load(self, key: tuple, stored: dict | None = None):
        """Materialise one unit (``(chunk, "embed" | layer index | "head", ...)``) on the prefetch thread. ``stored``: a
        layer's tensors already read into host memory (fideval.model.lockstep, one read for several models): this
        runner copies them to its device -- on the CPU, clones the ones its weight transform writes into -- so
        nothing it casts or transforms is another model's."""
        unit = key[1]
        stream_ctx = torch.cuda.stream(self.side) if self.side is not None else nullcontext()
        with stream_ctx:
            if unit == "embed":
                mod = self._load_embed()
            elif unit == "head":
                mod = self._load_head()
            else:
                i = int(unit)
                layer = self.adapter.meta_layer(i, self.dtype)
                ex = self.experts.get(i) if self.world > 1 else None
                if stored is None:
                    tensors = self.adapter.read_layer(i, layer, ex, pin=self.device.type == "cuda", device=self.device,
                                                      side_stream=self.side)
                elif self.device.type == "cuda":
                    tensors = {n: t.to(self.device, non_blocking=True) for n, t in stored.items()}
                else:
                    own = self.options.weight_transform is not None
                    tensors = {n: t.clone() if own and isinstance(t, torch.Tensor) else t for n, t in stored.items()}
                mod = self.adapter.materialize(i, layer, tensors, self.dtype, ex, self.options.weight_transform)
                del tensors
                hooks.install(mod, i, self.act_transform, ex, self.world, self.group, self._lean_path(), record=self.routes,
                              force=self.forcer)
            mod.requires_grad_(False)
            if self.side is not None:
                ev = torch.cuda.Event()
                ev.record(self.side)
                ev.synchronize()  # pinned staging may be freed, weights are ready for the compute stream
        self.ledger.track(key, mod)
        return mod

    def _load_embed(self) -> torch.nn.Module:
        w = self._read(self.adapter.top_keys()["embed"], self.dtype)
        if w.ndim != 2 or w.shape[0] < self.vocab_size:
            raise FidevalError(f"{self.ckpt.dir}: embedding has shape {list(w.shape)}, config.json has vocab "
                               f"{self.vocab_size}", hint="the checkpoint does not match config.json")
        if self.options.weight_transform is not None:  # class "embedding": only a gguf_mix spec quantizes it
            w = self.adapter.transform(self.options.weight_transform, "embedding", "model.embed_tokens.weight", w, owned=True)
        return torch.nn.Embedding.from_pretrained(w, freeze=True)

    def _read(self, key: str, dtype: torch.dtype, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """One tensor onto the device (through pinned memory on a GPU), in ``dtype`` (fp8 dequantized there)."""
        t = self.adapter.read(key, rows=rows, pin=self.device.type == "cuda")
        return self.adapter.cast(t if self.device.type == "cpu" else t.to(self.device, non_blocking=True), dtype)

    def _chunk(self, tokens: np.ndarray, mbs: list[list[int]], ci: int, solo: set[int] = frozenset(),
               canary: int | None = None) -> Iterator[tuple[int, int, torch.Tensor]]:
        """One chunk, layer by layer; ``canary``: the index of the canary's micro-batch in ``mbs`` (its time is
        the timeline's ``canary`` part). No timeline part is open across a ``yield``. The steps (:meth:`begin`,
        :meth:`embed_step`, :meth:`layer_step`, :meth:`head_step`) are also what fideval.model.lockstep drives
        for several models from one read of each layer."""
        n_layers = self.adapter.n_layers
        units = [(ci, "embed")] + [(ci, i) for i in range(n_layers)] + [(ci, "head")]
        self.stats["chunks"] += 1
        with self.timeline.part("setup"):
            pf = Prefetch(units, self._load, 1 if self.options.prefetch else 0, self.stats)

        def get():
            with self.timeline.part("load_wait"):  # on a GPU: only the time the stream idled for want of the weights
                return pf.get()

        try:
            with torch.no_grad(), self._attn_backends():
                self.warm()
                c = self.begin(tokens, mbs, solo, canary)
                self.embed_step(c, get())
                pf.release()
                for i in range(n_layers):
                    self.layer_step(c, i, get())
                    pf.release()
                head = get()
                for j, mb in enumerate(mbs):
                    logits = self.head_step(c, head, j)
                    for r, row in enumerate(mb):
                        yield j, row, logits[r]
                del head
                pf.release()
        finally:
            pf.close()

    # -- one chunk in steps --------------------------------------------------------------------------------
    def warm(self) -> None:
        """Once per runner, while the prefetch thread loads the first units: the expert kernels' warm-up."""
        if not self._warmed:
            self._warmed = True
            if self.experts and self._lean_path() and self.device.type == "cuda":
                with self.timeline.part("warmup"):
                    hooks.warm_experts(self.adapter.config, self.device, self.dtype, self.stats)

    def begin(self, tokens: np.ndarray, mbs: list[list[int]], solo: set[int] = frozenset(),
              canary: int | None = None) -> _Chunk:
        """A chunk's state: its micro-batches' hidden states (on the GPU when they fit ``device_budget``)."""
        L, H = tokens.shape[1], self.hidden_size
        n_tok = sum(len(mb) for mb in mbs) * L
        if self.routes is not None:
            self.routes.reset()
        if self.forcer is not None:
            self.forcer.reset()
        on_dev = self.device.type == "cpu" or n_tok * H * torch.empty((), dtype=self.dtype).element_size() <= (self.device_budget or 0)
        return _Chunk(tokens, mbs, set(solo), canary, on_dev)

    def _mb_part(self, c: _Chunk, j: int):
        return self.timeline.part("canary", sticky=True) if j == c.canary else nullcontext()

    def embed_step(self, c: _Chunk, emb: torch.nn.Module) -> None:
        dev, tl, L, H = self.device, self.timeline, c.tokens.shape[1], self.hidden_size
        for j, mb in enumerate(c.mbs):
            with self._mb_part(c, j), tl.part("embed"):
                ids = torch.from_numpy(np.ascontiguousarray(c.tokens[mb], dtype=np.int64)).to(dev)
                h = self.adapter.embed(emb(ids))
                c.states.append(h if c.on_dev else h.to("cpu").pin_memory())
        with tl.part("setup"):
            c.pos = torch.arange(L, device=dev).unsqueeze(0)
            sample = torch.empty((1, L, H), dtype=self.dtype, device=dev)
            c.pes = self.adapter.position_embeddings(sample, c.pos)  # by layer type

    def layer_step(self, c: _Chunk, i: int, layer: torch.nn.Module) -> None:
        """Layer ``i`` over every micro-batch of the chunk (its MLP in token blocks in the throughput mode)."""
        dev, tl, pos = self.device, self.timeline, c.pos
        with tl.part("setup"):
            if self.side is not None:
                for t in list(layer.parameters()) + list(layer.buffers()):
                    t.record_stream(torch.cuda.current_stream(dev))
            kind = self.adapter.layer_type(i)
            phased = self.blocks is not None and self.adapter.family.halves and self.blocks.splits(layer)
            if tl.on and not phased:  # the layer's own forward: its attention and MLP calls are parts
                mlp = getattr(layer, "mlp", None)
                if hasattr(layer, "self_attn"):
                    module_parts(layer.self_attn, tl, "attention")
                if mlp is not None:
                    module_parts(mlp, tl, "moe" if hasattr(mlp, "experts") else "dense_mlp")
        for j, h in enumerate(c.states):
            with self._mb_part(c, j):
                with tl.part("states"):
                    x = h if c.on_dev else h.to(dev, non_blocking=True)
                if x.shape[0] not in c.masks:
                    with tl.part("setup"):
                        c.masks[x.shape[0]] = self.adapter.masks(x, pos)
                if self.routes is not None:  # the canary's second pass is not recorded again
                    self.routes.current = None if j == c.canary else (c.mbs[j], c.tokens.shape[1])
                if self.forcer is not None:  # ... but it is forced again, as its first pass was
                    self.forcer.current = (c.mbs[j], c.tokens.shape[1])
                if phased:
                    y = self.blocks.attention_half(layer, x, c.masks[x.shape[0]][kind], pos, c.pes[kind])
                else:
                    with tl.part("norms"):  # what the attention and MLP parts leave: norms, residual adds
                        y = layer(x, attention_mask=c.masks[x.shape[0]][kind], position_ids=pos, position_embeddings=c.pes[kind])
                with tl.part("states"):
                    if c.on_dev:
                        c.states[j] = y
                    else:
                        h.copy_(y)
                    del x, y
        if self.routes is not None:
            self.routes.current = None
        if self.forcer is not None:
            self.forcer.current = None
        if phased:
            at = self._routes_at(c) if self.routes is not None or self.forcer is not None else None
            self.blocks.mlp_half(layer, c.states, c.on_dev, c.solo, c.canary, at=at)

    def _routes_at(self, c: _Chunk) -> Callable[[list[int] | None], None]:
        """The throughput mode's blocks join whole micro-batches: a block's rows are theirs, in order (the canary's
        block, a block of its own, is forced again but not recorded again)."""
        def at(g: list[int] | None) -> None:
            cur = None if g is None else ([r for k in g for r in c.mbs[k]], c.tokens.shape[1])
            if self.routes is not None:
                self.routes.current = None if g is not None and c.canary in g else cur
            if self.forcer is not None:
                self.forcer.current = cur
        return at

    def head_step(self, c: _Chunk, head: torch.nn.Module, j: int) -> torch.Tensor:
        """Micro-batch ``j``'s float32 logits ``[m, L, V]``; its hidden state is dropped."""
        tl = self.timeline
        with self._mb_part(c, j):
            with tl.part("states"):
                x = c.states[j] if c.on_dev else c.states[j].to(self.device, non_blocking=True)
                c.states[j] = None
            with tl.part("head"):
                x = head.norm(x)
                if self.output == "hidden":  # replicated over the ranks: no gather
                    return x
                x = x if self.head_mode == "bf16" else x.to(torch.float32)
                fn = self.act_transform.get("lm_head")
                if fn is not None:
                    x = fn(x)
                logits = head.lm_head(x)
                if self.world > 1:
                    logits = parallel.gather_vocab(logits, self.vocab_bounds, self.group)
                return self.adapter.finish_logits(logits)

    def _lean_path(self) -> bool:
        """Whether routed experts modules take fideval.model.execution.experts (those it supports): one rank, grouped_mm."""
        return (self.options.lean_experts and self.world == 1
                and getattr(self.adapter.config, "_experts_implementation", None) == "grouped_mm")

    def _attn_backends(self):
        """On CUDA, let sdpa try cuDNN first: MLA's q/k head dim (192) differs from v's (128), which rules out
        flash attention, and without cuDNN sdpa falls back to the math path (scores materialised)."""
        if self.device.type != "cuda":
            return nullcontext()
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
            return sdpa_kernel(order, set_priority=True)
        except (ImportError, TypeError, AttributeError):
            return nullcontext()


def iter_logits(weights: WeightSource | str | Path, sequences, options: RunnerOptions | None = None, *,
                timeline: Timeline | None = None,
                skip: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The contract entry point: ``(seq_id, float32 [L, V])`` per sequence, layer by layer; ``timeline``: the
    caller's, to put the runner's parts beside its own (fideval.timing.timeline); ``skip``: sequences not to
    yield (:meth:`Runner.iter_logits`: a resumed run computes only the chunks that hold another).

    Under torchrun (WORLD_SIZE > 1) every rank must call this; each yields the same, full logits.
    """
    options = options or RunnerOptions()
    rank, world, group = parallel.init_from_env(resolve_device(options.device))
    yield from make_runner(weights, options, rank=rank, world=world, group=group,
                           timeline=timeline).iter_logits(sequences, skip=skip)


def make_runner(weights: WeightSource | str | Path, options: RunnerOptions, **kw) -> ModelRunner:
    """The runner ``options.implementation`` names: :class:`Runner` (transformers) or the reference code's."""
    if options.implementation == "reference":
        from fideval.model.reference.runner import ReferenceRunner

        return ReferenceRunner(weights, options, **kw)
    if options.implementation != "transformers":
        raise FidevalError(f"model.implementation {options.implementation!r} is not known",
                           hint="use transformers or reference")
    return Runner(weights, options, **kw)
