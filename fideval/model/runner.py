"""Layer-major execution of a decoder-only causal LM: every sequence of a chunk goes through layer 0, then
layer 1, ... so each layer's weights are read from disk once per chunk, and only the current layer and
the one being prefetched are resident.

Why layer-major: a teacher checkpoint (DeepSeek-V3: 671 B parameters) does not fit one GPU, and a
sequence-major pass would re-read every weight for every sequence. Reading layer k+1 on a background
thread (into pinned memory, copied on a side CUDA stream) while layer k computes hides the disk and PCIe
time behind compute once a chunk holds enough tokens.

Numerics follow the model's own forward: transformers' decoder-layer modules, its rotary module, its
mask utilities, position ids ``arange(L)``; the final norm in the model dtype and the lm head in float32
(``F.linear`` on float32 inputs and weights), as a float32 ``from_pretrained`` model computes it.
A canary (the first micro-batch, same composition) runs again at the end of the run; its logits must be
bit-identical, and the verdict is kept in :attr:`Runner.canary`.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import nullcontext

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.model import determinism
from fideval.model import experts as experts_path
from fideval.model.adapters import Adapter, expert_range
from fideval.model.checkpoint import Checkpoint
from fideval.model.device import resolve_device
from fideval.model.module_classes import MODULE_CLASSES, module_class_of

DEFAULT_HOST_BUDGET = 4 << 30


class Ledger:
    """Bytes of weights resident now and at peak, per unit (embedding, layer i, head).

    A unit is counted from the moment its tensors are materialised until its module is garbage
    collected (a ``weakref.finalize`` on the module), so a leaked reference shows up as a unit that is
    never released rather than as a number we merely believe.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.now = self.peak = self.largest = 0
        self.units: dict[object, int] = {}
        self.added = self.released = 0

    def track(self, unit: object, module: torch.nn.Module) -> None:
        nbytes = sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))
        with self._lock:
            self.units[unit] = nbytes
            self.now += nbytes
            self.added += 1
            self.peak = max(self.peak, self.now)
            self.largest = max(self.largest, nbytes)
        weakref.finalize(module, self._release, unit)

    def _release(self, unit: object) -> None:
        with self._lock:
            self.now -= self.units.pop(unit, 0)
            self.released += 1


class _Prefetch:
    """Loads units in order on one thread; at most ``1 + depth`` units exist at once (current + prefetched)."""

    def __init__(self, units: list, load: Callable, depth: int, stats: dict):
        self._q: queue.Queue = queue.Queue()
        self._sem = threading.Semaphore(1 + depth)
        self._stop = False
        self._units, self._load, self._stats = units, load, stats
        self._thread = threading.Thread(target=self._run, name="fideval-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        for u in self._units:
            self._sem.acquire()
            if self._stop:
                return
            t0 = time.perf_counter()
            try:
                obj = self._load(u)
            except BaseException as e:  # handed to the consumer, which re-raises it
                self._q.put(e)
                return
            dt = time.perf_counter() - t0
            self._stats["load_s"] += dt
            self._stats.setdefault("unit_load_s", []).append(dt)
            self._q.put(obj)
            del obj

    def get(self):
        t0 = time.perf_counter()
        obj = self._q.get()
        dt = time.perf_counter() - t0
        self._stats["wait_s"] += dt
        self._stats.setdefault("unit_wait_s", []).append(dt)
        if isinstance(obj, BaseException):
            raise obj
        return obj

    def release(self) -> None:
        self._sem.release()

    def close(self) -> None:
        self._stop = True
        self._sem.release()
        self._sem.release()
        self._thread.join(timeout=60)
        while not self._q.empty():
            self._q.get_nowait()


_PHASES = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


class _Timer:
    """Adds a region's time to ``stats[key]``: CUDA events on a GPU (summed at ``Runner.finish_profile``)."""

    def __init__(self, stats: dict, key: str, device: torch.device):
        self.stats, self.key, self.cuda = stats, key, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
            self.stats.setdefault("_events", []).append((self.key, self.a, self.b))
        else:
            self.stats[self.key] = self.stats.get(self.key, 0.0) + time.perf_counter() - self.t0
        return False


class Runner:
    """One model, one device, optionally one rank of an N-way model-parallel group (see parallel.py)."""

    def __init__(self, model_dir, *, device="cpu", dtype: torch.dtype = torch.float32,
                 weight_transform: Callable | None = None, act_transform: dict | None = None, micro_batch: int = 1,
                 host_budget_bytes: int | None = None, device_budget_bytes: int | None = None,
                 rank: int = 0, world: int = 1, group=None, prefetch: bool = True, ledger: Ledger | None = None,
                 attn_implementation: str | None = None, experts_implementation: str | None = None,
                 mlp_tokens: int | None = None, profile: bool = False, checkpoint=None, lean_experts: bool = True):
        determinism.configure()
        self.device = resolve_device(device)
        self.dtype = dtype
        # checkpoint: a real quantized build (fideval.model.quantized) standing in for model_dir's weights
        self.ckpt = checkpoint if checkpoint is not None else Checkpoint(model_dir)
        self.adapter = Adapter.load(self.ckpt, attn_implementation)
        if experts_implementation:
            self.adapter.config._experts_implementation = experts_implementation
        self.weight_transform = weight_transform
        self.act_transform = dict(act_transform or {})
        bad = sorted(set(self.act_transform) - set(MODULE_CLASSES))
        if bad:
            raise ValueError(f"act_transform keys {bad} are not module classes {MODULE_CLASSES}")
        self.micro_batch = max(1, int(micro_batch))
        self.rank, self.world, self.group = rank, world, group
        self.prefetch = prefetch
        self.mlp_tokens = mlp_tokens  # None: call each decoder layer whole, per micro-batch
        self.lean_experts = lean_experts  # False: transformers' own grouped_mm experts forward (A/B in the bench)
        self.profile = profile
        self.ledger = ledger or Ledger()
        self.host_budget = host_budget_bytes or DEFAULT_HOST_BUDGET
        if device_budget_bytes is None and self.device.type == "cuda":
            device_budget_bytes = int(torch.cuda.mem_get_info(self.device)[0] * 0.35)
        self.device_budget = device_budget_bytes
        self.side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.stats = {"load_s": 0.0, "wait_s": 0.0, "tokens": 0, "wall_s": 0.0, "chunks": 0}
        self.canary: dict | None = None
        self._warmed = False
        self._mlp_warmed: set[type] = set()
        self.warming = False  # True while _warm_mlp runs (profilers leave that call out)
        self.experts: dict[int, tuple[int, int]] = {}
        for i in range(self.adapter.n_layers):  # meta layers cost nothing; N must divide every MoE layer's experts
            n_exp = self.adapter.n_routed_experts(self.adapter.meta_layer(i, dtype))
            if n_exp:
                self.experts[i] = expert_range(rank, world, n_exp)
        V = self.adapter.vocab_size
        bounds = np.linspace(0, V, world + 1).round().astype(int) if world > 1 else np.array([0, V])
        self.vocab_bounds = [(int(bounds[r]), int(bounds[r + 1])) for r in range(len(bounds) - 1)]

    @property
    def vocab_size(self) -> int:
        return self.adapter.vocab_size

    def finish_profile(self) -> dict:
        """Fold recorded CUDA events into seconds per region (synchronizes); ``moe_s_each``: every MoE block's
        milliseconds in run order (layer by layer), to see whether blocks slow down while a layer loads;
        ``attn_s_each``: the same for every micro-batch's attention."""
        events = self.stats.pop("_events", [])
        if events:
            torch.cuda.synchronize(self.device)
        for key, a, b in events:
            ms = a.elapsed_time(b)
            self.stats[key] = self.stats.get(key, 0.0) + ms / 1000
            if key in ("moe_s", "attn_s"):
                self.stats.setdefault(key + "_each", []).append(round(ms, 2))
        return self.stats

    # -- loading (runs on the prefetch thread) -----------------------------------------------------------
    def _load(self, key: tuple):
        """Materialise one unit (``(chunk, "embed" | layer index | "head")``) on the prefetch thread."""
        unit = key[1]
        stream_ctx = torch.cuda.stream(self.side) if self.side is not None else nullcontext()
        pin = self.device.type == "cuda"
        with stream_ctx:
            if unit == "embed":
                w = self._to_dev(self.ckpt.read(self.adapter.top_keys()["embed"], pin=pin)).to(self.dtype)
                if w.ndim != 2 or w.shape[0] < self.vocab_size:
                    raise FidevalError(f"{self.ckpt.dir}: embedding has shape {list(w.shape)}, config.json has vocab "
                                       f"{self.vocab_size}", hint="the checkpoint does not match config.json")
                mod = torch.nn.Embedding.from_pretrained(w, freeze=True)
            elif unit == "head":
                keys = self.adapter.top_keys()
                lo, hi = self.vocab_bounds[self.rank]
                w = self._to_dev(self.ckpt.read(keys["lm_head"], rows=(lo, hi), pin=pin)).to(torch.float32)
                if w.ndim != 2 or w.shape[1] != self.adapter.config.hidden_size:
                    raise FidevalError(f"{self.ckpt.dir}: {keys['lm_head']} has shape {list(w.shape)}, config.json implies "
                                       f"[{self.vocab_size}, {self.adapter.config.hidden_size}]", hint="the checkpoint does not match config.json")
                if self.weight_transform is not None:
                    w = self.adapter.transform(self.weight_transform, "lm_head", "lm_head.weight", w)
                norm_w = self._to_dev(self.ckpt.read(keys["norm"], pin=pin)).to(self.dtype)
                if tuple(norm_w.shape) != (self.adapter.config.hidden_size,):
                    raise FidevalError(f"{self.ckpt.dir}: model.norm.weight has shape {list(norm_w.shape)}, config.json implies "
                                       f"[{self.adapter.config.hidden_size}]", hint="the checkpoint does not match config.json")
                mod = torch.nn.Module()
                mod.norm = self.adapter.final_norm(norm_w)
                mod.lm_head = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
                mod.lm_head.load_state_dict({"weight": w}, assign=True)
            else:
                i = int(unit)
                layer = self.adapter.meta_layer(i, self.dtype)
                ex = self.experts.get(i) if self.world > 1 else None
                tensors = self.adapter.read_layer(i, layer, ex, pin=pin, device=self.device, side_stream=self.side)
                mod = self.adapter.materialize(i, layer, tensors, self.dtype, ex, self.weight_transform)
                del tensors
                self._install_hooks(mod, ex, i)
            mod.requires_grad_(False)
            if self.side is not None:
                ev = torch.cuda.Event()
                ev.record(self.side)
                ev.synchronize()  # pinned staging may be freed, weights are ready for the compute stream
        self.ledger.track(key, mod)
        return mod

    def _to_dev(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def _install_hooks(self, layer: torch.nn.Module, ex: tuple[int, int] | None, i: int) -> None:
        """act_transform on inputs of attention / shared / dense linears, and the routed experts' wrapper."""
        for name, mod in layer.named_modules():
            if isinstance(mod, torch.nn.Linear):
                cls_ = module_class_of(f"model.layers.{i}.{name}.weight")
                fn = self.act_transform.get(cls_) if cls_ else None
                if fn is not None:
                    mod.register_forward_pre_hook(lambda m, args, f=fn: (f(args[0]), *args[1:]))
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if experts is None:
            return
        fn = self.act_transform.get("routed_experts")
        world, group = self.world, self.group
        original = experts.forward
        # one rank, grouped_mm selected, a gated bias-free module: the same bits with less traffic (experts.py)
        lean = self._lean_path() and experts_path.supported(experts)
        if lean:
            original = lambda h, i, w: experts_path.forward(experts, h, i, w)  # noqa: E731
        if fn is not None:
            # the down projection's input exists only inside the experts' forward: transformers' grouped_mm
            # path (and experts.py) computes it in ``_apply_gate``, so we wrap that and call the grouped_mm path.
            from transformers.integrations.moe import grouped_mm_experts_forward

            gate = experts._apply_gate
            experts._apply_gate = lambda x: fn(gate(x))
            if not lean:
                original = lambda h, i, w: grouped_mm_experts_forward(experts, h, i, w)  # noqa: E731

        def forward(hidden, top_k_index, top_k_weights):
            if ex is not None:
                lo, hi = ex
                inside = (top_k_index >= lo) & (top_k_index < hi)
                top_k_index = torch.where(inside, top_k_index - lo, torch.full_like(top_k_index, hi - lo))
            if fn is not None:  # row-wise transform: same as transforming each expert's gathered copy
                hidden = fn(hidden)
            out = original(hidden, top_k_index, top_k_weights)
            if world > 1:
                import torch.distributed as dist

                part = out.to(torch.float32)
                dist.all_reduce(part, group=group)
                out = part.to(out.dtype)
            return out

        experts.forward = forward

    # -- execution -----------------------------------------------------------------------------------
    def iter_logits(self, sequences, *, skip: Callable[[str], bool] | None = None,
                    canary: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(seq_id, float32 [L, V])`` for each sequence not skipped, in input order."""
        keep = [k for k, sid in enumerate(sequences.ids) if skip is None or not skip(sid)]
        tokens = np.asarray(sequences.tokens)
        for k, logits in self.run(tokens, keep, canary=canary):
            yield sequences.ids[k], logits
        if self.canary is not None:
            self.canary["seq_id"] = sequences.ids[self.canary.pop("row")]

    def run(self, tokens: np.ndarray, rows: list[int] | None = None, canary: bool = True) -> Iterator[tuple[int, torch.Tensor]]:
        """Layer-major forward of ``tokens[rows]`` (int [n, L]); yields ``(row, logits float32 [L, V])``."""
        if tokens.ndim != 2:
            raise ValueError("tokens must be [n, L]")
        rows = list(range(tokens.shape[0])) if rows is None else list(rows)
        if tokens.size and (int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0):
            bad = int(tokens.max()) if int(tokens.max()) >= self.vocab_size else int(tokens.min())
            raise FidevalError(f"token id {bad} is outside the model's vocabulary of {self.vocab_size}",
                               hint="the windows were tokenized with another tokenizer than this model's")
        self.canary = None
        if not rows:
            return
        m, L, H = self.micro_batch, tokens.shape[1], int(self.adapter.config.hidden_size)
        per_seq = L * H * torch.empty((), dtype=self.dtype).element_size()
        per_chunk = max(m, (self.host_budget // max(per_seq, 1)) // m * m)
        chunks = [rows[a:a + per_chunk] for a in range(0, len(rows), per_chunk)]
        canary_rows = rows[:m] if canary else []
        first_digest: str | None = None
        t0 = time.perf_counter()
        for ci, chunk in enumerate(chunks):
            mbs = [chunk[a:a + m] for a in range(0, len(chunk), m)]
            extra = ci == len(chunks) - 1 and bool(canary_rows)
            if extra:
                mbs.append(canary_rows)
            # the canary's micro-batch is its own MoE block both times: block composition changes GEMM shapes, hence bits
            solo = {0, len(mbs) - 1} if extra or ci == 0 else set()
            for j, row, logits in self._chunk(tokens, mbs, ci, solo):
                if extra and j == len(mbs) - 1:
                    if row == canary_rows[0]:
                        end = determinism.digest(logits)
                        self.canary = {"row": row, "sha256_start": first_digest, "sha256_end": end,
                                       "identical": first_digest == end}
                    continue
                if canary and first_digest is None and row == canary_rows[0]:
                    first_digest = determinism.digest(logits)
                self.stats["tokens"] += L
                yield row, logits
        self.stats["wall_s"] += time.perf_counter() - t0

    def _chunk(self, tokens: np.ndarray, mbs: list[list[int]], ci: int,
               solo: set[int] = frozenset()) -> Iterator[tuple[int, int, torch.Tensor]]:
        dev, L = self.device, tokens.shape[1]
        n_layers = self.adapter.n_layers
        units = [(ci, "embed")] + [(ci, i) for i in range(n_layers)] + [(ci, "head")]
        self.stats["chunks"] += 1
        pf = _Prefetch(units, self._load, 1 if self.prefetch else 0, self.stats)
        H = int(self.adapter.config.hidden_size)
        n_tok = sum(len(mb) for mb in mbs) * L
        on_dev = dev.type == "cpu" or n_tok * H * torch.empty((), dtype=self.dtype).element_size() <= (self.device_budget or 0)
        try:
            with torch.no_grad(), self._attn_backends():
                self._warm_up()
                emb = pf.get()
                states: list[torch.Tensor | None] = []
                for mb in mbs:
                    ids = torch.from_numpy(np.ascontiguousarray(tokens[mb], dtype=np.int64)).to(dev)
                    h = emb(ids)
                    states.append(h if on_dev else h.to("cpu").pin_memory())
                del emb
                pf.release()
                pos = torch.arange(L, device=dev).unsqueeze(0)
                rotary = self.adapter.rotary(dev)
                sample = torch.empty((1, L, H), dtype=self.dtype, device=dev)
                pe = rotary(sample, pos)
                masks: dict[int, dict] = {}
                for i in range(n_layers):
                    layer = pf.get()
                    if self.side is not None:
                        for t in list(layer.parameters()) + list(layer.buffers()):
                            t.record_stream(torch.cuda.current_stream(dev))
                    kind = self.adapter.layer_type(i)
                    phased = self.mlp_tokens and all(hasattr(layer, a) for a in _PHASES)
                    for j, h in enumerate(states):
                        x = h if on_dev else h.to(dev, non_blocking=True)
                        if x.shape[0] not in masks:
                            masks[x.shape[0]] = self.adapter.masks(x, pos)
                        with self._timed("attn_s" if phased else "layer_s"):
                            if phased:  # the decoder layer's own first half: x + self_attn(input_layernorm(x))
                                a = layer.self_attn(hidden_states=layer.input_layernorm(x), attention_mask=masks[x.shape[0]][kind],
                                                    position_ids=pos, position_embeddings=pe)[0]
                                y = x + a
                                del a
                            else:
                                y = layer(x, attention_mask=masks[x.shape[0]][kind], position_ids=pos, position_embeddings=pe)
                        if on_dev:
                            states[j] = y
                        else:
                            h.copy_(y)
                        del x, y
                    if phased:
                        self._mlp_phase(layer, states, on_dev, solo)
                    del layer
                    pf.release()
                head = pf.get()
                lo, hi = self.vocab_bounds[self.rank]
                for j, mb in enumerate(mbs):
                    x = states[j] if on_dev else states[j].to(dev, non_blocking=True)
                    states[j] = None
                    x = head.norm(x).to(torch.float32)
                    fn = self.act_transform.get("lm_head")
                    if fn is not None:
                        x = fn(x)
                    logits = head.lm_head(x)
                    if self.world > 1:
                        logits = self._gather_vocab(logits)
                    for r, row in enumerate(mb):
                        yield j, row, logits[r]
                del head
                pf.release()
        finally:
            pf.close()

    def _lean_path(self) -> bool:
        """Whether routed experts modules take fideval.model.experts (those it supports): one rank, grouped_mm."""
        return (self.lean_experts and self.world == 1
                and getattr(self.adapter.config, "_experts_implementation", None) == "grouped_mm")

    def _warm_up(self) -> None:
        """Once per runner, while the prefetch thread loads the first units: compile the routed experts' Triton
        kernels (experts.warmup), so that no MoE block pays a just-in-time compile. Its wall time is
        ``stats["warmup_s"]`` (part of ``wall_s``)."""
        if self._warmed:
            return
        self._warmed = True
        k = getattr(self.adapter.config, "num_experts_per_tok", None)
        if not (self.experts and k and self.device.type == "cuda" and self._lean_path()):
            return
        t0 = time.perf_counter()
        experts_path.warmup(self.device, self.dtype, int(k), int(self.adapter.config.hidden_size))
        self.stats["warmup_s"] = self.stats.get("warmup_s", 0.0) + time.perf_counter() - t0

    def _warm_mlp(self, layer, x: torch.Tensor) -> None:
        """The first time a kind of MLP runs in this process, run it once on a few tokens and drop the result:
        CUDA loads kernels lazily and cuBLAS sets itself up on first use (measured on an H200: ~0.4 s inside the
        first DeepSeek-V3 MoE block, for the router GEMM, top-k, the index writes), which is start-up, not MLP
        work. Outputs never depend on it (kernel choice depends on shapes alone; the canary checks the bits).
        Its time is added to ``stats["warmup_s"]``."""
        self._mlp_warmed.add(type(layer.mlp))
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        self.warming = True
        try:
            z = layer.post_attention_layernorm(x.reshape(1, -1, x.shape[-1])[:, :64])
            y = layer.mlp(z)
            del z, y
        finally:
            self.warming = False
        torch.cuda.synchronize(self.device)
        self.stats["warmup_s"] = self.stats.get("warmup_s", 0.0) + time.perf_counter() - t0

    def _mlp_phase(self, layer, states: list, on_dev: bool, solo: set[int] = frozenset()) -> None:
        """The layer's second half, x + mlp(post_attention_layernorm(x)), over blocks of up to ``mlp_tokens``
        tokens spanning micro-batches: routed experts see ~k·T/E tokens each, enough for efficient GEMMs.
        Blocks are formed in input order, so their composition (and the bits) is the same every run."""
        j, n = 0, len(states)
        if n and self.device.type == "cuda" and type(layer.mlp) not in self._mlp_warmed:
            self._warm_mlp(layer, states[0] if on_dev else states[0].to(self.device, non_blocking=True))
        while j < n:
            g, tokens = [j], states[j].shape[0] * states[j].shape[1]
            while g[-1] + 1 < n and j not in solo and g[-1] + 1 not in solo and \
                    tokens + states[g[-1] + 1].shape[0] * states[g[-1] + 1].shape[1] <= self.mlp_tokens:
                g.append(g[-1] + 1)
                tokens += states[g[-1]].shape[0] * states[g[-1]].shape[1]
            xs = [states[k] if on_dev else states[k].to(self.device, non_blocking=True) for k in g]
            flat = torch.cat([x.reshape(-1, x.shape[-1]) for x in xs]).unsqueeze(0) if len(xs) > 1 else xs[0].reshape(1, -1, xs[0].shape[-1])
            with self._timed("norm_s"):  # the layer's own norm and residual add: not MLP work, timed apart
                z = layer.post_attention_layernorm(flat)
            with self._timed("moe_s" if hasattr(layer.mlp, "experts") else "mlp_s"):
                y = layer.mlp(z)
            del z
            with self._timed("norm_s"):
                y = flat + (y[0] if isinstance(y, tuple) else y)
            del flat, xs
            off = 0
            for k in g:
                size = states[k].shape[0] * states[k].shape[1]
                part = y[0, off:off + size].view(states[k].shape)
                if on_dev:
                    states[k] = part.clone() if len(g) > 1 else part
                else:
                    states[k].copy_(part)
                off += size
            del y
            j = g[-1] + 1

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

    def _timed(self, key: str):
        if not self.profile:
            return nullcontext()
        return _Timer(self.stats, key, self.device)

    def _gather_vocab(self, part: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        width = max(b - a for a, b in self.vocab_bounds)
        pad = torch.zeros((*part.shape[:-1], width), dtype=part.dtype, device=part.device)
        pad[..., :part.shape[-1]] = part
        bufs = [torch.empty_like(pad) for _ in range(self.world)]
        dist.all_gather(bufs, pad.contiguous(), group=self.group)
        return torch.cat([b[..., :hi - lo] for b, (lo, hi) in zip(bufs, self.vocab_bounds)], dim=-1)


def iter_logits(model_dir, sequences, *, device="cpu", dtype=torch.float32, weight_transform=None,
                act_transform=None, micro_batch=1, **runner_kw) -> Iterator[tuple[str, torch.Tensor]]:
    """The contract entry point: ``(seq_id, float32 [L, V])`` per sequence, layer by layer.

    Under torchrun (WORLD_SIZE > 1) every rank must call this; each yields the same, full logits.
    """
    from fideval.model.parallel import init_from_env

    rank, world, group = init_from_env(resolve_device(device))
    runner = Runner(model_dir, device=device, dtype=dtype, weight_transform=weight_transform,
                    act_transform=act_transform, micro_batch=micro_batch, rank=rank, world=world, group=group, **runner_kw)
    yield from runner.iter_logits(sequences)
