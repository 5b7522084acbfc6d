"""DeepSeek-V4.1-Flash run through the vendor's own ``inference/model.py``, one ``Block`` at a time, every position.

The vendor's ``Transformer.forward`` embeds, expands the residual stream to ``hc_mult`` copies, runs each layer
(the Engram step first where the layer has one), collapses the copies with the last block's ``hc_pre`` and
returns the head at the last position only. This driver does the same with the vendor's own modules, layer
by layer, and keeps the head over every position. What the vendor threads through its layers is the state
here: the hyper-connection streams ``h`` [B, L, hc, D] and the next sublayer's ``pre_mix`` [B, L, hc], the
Engram hash ids (computed once per sequence, as its ``NgramHashState`` does) and the four slots of its
module-global ``shared_attn`` (compressed KV and index keys published by ``kv_source_layers``, top-k indices
by ``index_source_layers``, candidate blocks by ``candidate_source_layer``). A slot is carried only while a
later layer reads it, so memory stays per sequence; the vendor's global is set from the state before a block
runs and emptied after. Caches are sized for the micro-batch (B sequences of L tokens, start_pos 0) and
freshly allocated for every call, so one loaded layer serves several micro-batches.

The vendor computes in bfloat16 only (its kernels take bf16 activations: FP8 activation quantization in every
FP8/FP4 linear, the window KV kept FP8, compressed KV FP4); the head is float32, as the vendor keeps it.
DSpark (MTP) stages and the vision tower are not built: the evaluation is text only (the routers' VL bias is
loaded but unused). Engram tables stay in host memory (:class:`EngramRows`); only the rows a micro-batch
looks up go to the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from fideval.errors import FidevalError
from fideval.model.execution.hooks import check_act_transform
from fideval.model.execution.transforms import hook_inputs, linears
from fideval.model.reference import deepseek_v41_kernels, grouped_experts
from fideval.model.reference.code import VendorCode, require
from fideval.model.reference.deepseek_v41_weights import EngramRows, Loader, NameMap
from fideval.quant.module_classes import vendor_module_class

NEEDS = ("ModelArgs", "Block", "ParallelEmbedding", "ParallelHead", "RMSNorm", "Linear", "Transformer",
         "make_identity_pre_mix", "shared_attn", "precompute_freqs_cis")
KERNELS = ("act_quant", "fp4_act_quant", "fp8_gemm", "fp4_gemm", "sparse_attn", "hc_split_sinkhorn")
SLOTS = ("compress_kv", "index_k", "topk_idxs", "candidates")
# config.json keys a release may carry beside the vendor's ModelArgs fields
METADATA = {"architectures", "model_type", "torch_dtype", "dtype_", "transformers_version", "quantization_config",
            "auto_map", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "name_or_path"}

_VENDOR = threading.RLock()


def to_device(module: torch.nn.Module, device: torch.device) -> None:
    """``module.to(device)``, its FP4 tensors moved as bytes first: under deterministic mode torch fills every new tensor,
    and has no fill for ``float4_e2m1fn_x2`` on CUDA, so ``.to("cuda")`` of a block holding FP4 experts failed (an
    H100, 2026-12-07). A uint8 view of the same bytes is filled and copied like any byte tensor, then viewed back;
    nothing process-global (deterministic mode's fill flag) is touched while another thread computes."""
    for mod in module.modules():
        for table in (mod._parameters, mod._buffers):
            for t in table.values():
                if t is not None and t.dtype == torch.float4_e2m1fn_x2 and t.device != device:
                    t.data = t.data.view(torch.uint8).to(device).view(torch.float4_e2m1fn_x2)
    module.to(device)


@contextmanager
def vendor_dtype():
    """Run vendor code: torch's default dtype bf16 (the vendor builds and computes under
    ``set_dtype(torch.bfloat16)``; its GEMMs return the default dtype). The default dtype is process-global
    and the vendor's ``Block.__init__`` switches it to float32 for its hyper-connection parameters, so
    building a block on the prefetch thread while another computes would change what the other computes:
    vendor code runs under one lock. Only construction takes it on the prefetch thread; reading and
    placing the weights, the slow part, runs beside the computing layer.

    Deterministic mode's ``fill_uninitialized_memory`` (on under the runner's ``determinism.configure``) is off
    meanwhile: torch has no fill for ``float4_e2m1fn_x2``, the dtype of the vendor's FP4 expert weights, so
    ``torch.empty`` of them fails; every such tensor is overwritten from the checkpoint before it is read."""
    import torch.utils.deterministic as det

    with _VENDOR:
        prev, fill = torch.get_default_dtype(), det.fill_uninitialized_memory
        torch.set_default_dtype(torch.bfloat16)
        det.fill_uninitialized_memory = False
        try:
            yield
        finally:
            torch.set_default_dtype(prev)
            det.fill_uninitialized_memory = fill


def model_args(m, config: dict, world: int):
    """The vendor's ``ModelArgs`` from config.json (its keys are the fields), checked for what the vendor
    asserts only while building or running, so a bad config is one line before any weight is read."""
    fields = {f.name for f in dataclasses.fields(m.ModelArgs)}
    unknown = sorted(set(config) - fields - METADATA)
    if unknown:
        raise FidevalError(f"config.json has keys the vendor's ModelArgs does not take: {', '.join(unknown[:5])}",
                           hint="the reference code does not match this checkpoint (model.code)")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in fields}
    kw["max_batch_size"] = 1  # caches are re-sized per micro-batch
    try:
        a = m.ModelArgs(**kw)
        bad = _check(a, world)
    except (TypeError, ValueError, IndexError) as e:
        bad = f"({type(e).__name__}: {e})"
    if bad:
        raise FidevalError(f"config.json is not a DeepSeek-V4.1 configuration the vendor's code can run: {bad}",
                           hint="fix config.json or point model.code at the code for this model")
    return a


def _check(a, world: int) -> str | None:
    n, r = a.n_layers, a.compress_ratios
    if a.dtype not in ("fp8", "bf16") or a.expert_dtype not in ("fp4", None):
        return f"dtype {a.dtype!r} / expert_dtype {a.expert_dtype!r} (fp8|bf16, fp4|null)"
    if len(r) < n:
        return f"compress_ratios has {len(r)} entries for {n} layers"
    if a.n_shared_experts != 1:
        return "n_shared_experts must be 1"
    src = [i for i in a.kv_source_layers if i < n] + [i for i in a.index_source_layers if i < n]
    if any(r[i] <= 0 for i in src):
        return "a kv/index source layer has compress ratio 0"
    for i in range(n):
        if r[i] and not any(j <= i and r[j] == r[i] for j in a.kv_source_layers):
            return f"layer {i} reads compressed KV no earlier kv_source_layer of ratio {r[i]} publishes"
        if r[i] and not any(j <= i for j in a.index_source_layers):
            return f"layer {i} reads top-k indices no earlier index_source_layer publishes"
    if len(a.engram_layer_ids) != len(a.engram_num_embeddings):
        return "engram_layer_ids and engram_num_embeddings differ in length"
    for name in ("vocab_size", "n_routed_experts", "n_heads", "o_groups", "index_n_heads"):
        if getattr(a, name) % world:
            return f"{name} {getattr(a, name)} is not divisible by the world size {world}"
    return None


@dataclass
class V41State:
    """Between layers: the hc streams, the next block's pre_mix, the Engram hash ids while an Engram layer
    is still to come, and the shared-attention slots a later layer reads."""

    h: torch.Tensor
    pre_mix: torch.Tensor
    hashes: torch.Tensor | None
    shared: dict[str, torch.Tensor] = field(default_factory=dict)


class DeepseekV41Driver:
    """The :mod:`fideval.model.reference.driver` contract for DeepSeek-V4.1-Flash (``code`` imported with
    :func:`~fideval.model.reference.code.load_vendor_code`). ``dtype`` must be bfloat16 (or None): the vendor's
    kernels take nothing else. The vendor's collectives use the default process group, so with world > 1
    ``group`` must be ``dist.group.WORLD`` of an initialised group (gloo on CPU, NCCL on GPUs)."""

    def __init__(self, code: VendorCode, config: dict, weights, *, rank: int = 0, world: int = 1, group=None,
                 device: str | torch.device = "cpu", dtype: torch.dtype | None = torch.bfloat16,
                 weight_transform=None, act_transform=None, experts: str = "vendor"):
        require(code, NEEDS)
        if dtype not in (None, torch.bfloat16):
            raise FidevalError(f"the DeepSeek-V4.1 reference code computes in bfloat16 only, not {dtype}",
                               hint="set teacher.dtype: bfloat16 (--dtype bfloat16) for this model (its kernels take bf16 activations)")
        self.code, self.m, self.weights = code, code.model, weights
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self.args = model_args(self.m, config, world)
        if world > 1 and not getattr(weights, "config_only", False):  # a config check (validate) joins no group
            import torch.distributed as dist

            if not dist.is_initialized() or dist.get_world_size() != world or (group not in (None, dist.group.WORLD)):
                raise FidevalError(f"world size {world} needs the default process group of {world} ranks",
                                   hint="the vendor's collectives use the default group; start with torchrun")
        self.act = check_act_transform(act_transform)
        a, m = self.args, self.m
        m.world_size, m.rank = world, rank  # what Transformer.__init__ sets, before any module is built
        m.default_dtype = torch.float8_e4m3fn if a.dtype == "fp8" else torch.bfloat16
        fmt = (config.get("quantization_config") or {}).get("scale_fmt") if isinstance(config.get("quantization_config"), dict) else None
        if fmt is not None:
            m.scale_fmt = fmt
        self.names = NameMap.load(weights.config_dir)
        self.loader = Loader(weights, self.names, rank, world, weight_transform, m.Linear)
        eng = code.module("engram")
        self.layout = eng.EngramLayout.from_args(a)
        # each Block is built with empty Engram tables; the rows a micro-batch needs come from EngramRows
        self._build_layout = None if self.layout is None else dataclasses.replace(
            self.layout, num_embeddings=tuple(0 for _ in self.layout.num_embeddings))
        self.n_layers, self.vocab_size, self.hidden_size = a.n_layers, a.vocab_size, a.dim
        deepseek_v41_kernels.on_device(m, self.device, KERNELS)
        self._kernels = {k: getattr(m, k).__module__.removeprefix(code.package + ".") for k in KERNELS if hasattr(m, k)}
        self.grouped = (grouped_experts.Grouped("deepseek-v4.1", m, self._kernels)
                        if grouped_experts.check(experts) == "grouped" else None)  # else the vendor's loop
        self._keeps = _slot_keeps(a)
        self._last_engram = max((i for i in a.engram_layer_ids if i < a.n_layers), default=-1)
        self._embed = self._head = self._hash = None
        self._once = threading.Lock()
        if self.layout is not None and self._last_engram >= 0:  # tokenizer.json there and of this model: before any output
            self._resident("_hash", self._build_hash)

    @property
    def kernels(self) -> dict[str, str]:
        """Vendor kernel -> the module that computed it (``kernel_cpu``: Tenstorrent's torch port; ``kernel``: the
        vendor's tilelang), and per module class the path its transformed or decoded linears took so far."""
        paths = {f"linears: {c}": ", ".join(sorted(p)) for c, p in sorted(self.loader.paths.items())}
        return {**self._kernels, **paths}

    def sizing_config(self) -> dict[str, Any]:
        """What :mod:`fideval.model.flops` and :mod:`fideval.model.sizing` read, in transformers' key names (no
        transformers config exists for this family). An estimate, as for the families flops.py counts by their
        keys: the MoE (routed top-k, shared expert, router) and the head are exact; attention is counted as
        multi-query attention of ``n_heads`` x ``head_dim`` over every earlier key, where the vendor's low-rank
        q/o projections, window, compressed KV and top-k indexing cost less. Engram and the hyper-connection
        mixes are not counted."""
        a = self.args
        return {"model_type": "deepseek_v4.1", "hidden_size": a.dim, "vocab_size": a.vocab_size,
                "num_hidden_layers": a.n_layers, "num_attention_heads": a.n_heads, "num_key_value_heads": 1,
                "head_dim": a.head_dim, "intermediate_size": 0, "n_routed_experts": a.n_routed_experts,
                "moe_intermediate_size": a.moe_inter_dim, "n_shared_experts": a.n_shared_experts,
                "num_experts_per_tok": a.n_activated_experts, "first_k_dense_replace": 0}

    def describe(self) -> dict[str, Any]:
        """What report.json records of this driver (:func:`describe`)."""
        return describe(self)

    def _default_device(self):
        """The run's GPU as torch's default device while the vendor's code computes, as its own entry point sets it
        (``torch.set_default_device("cuda")``): the model makes tensors without a device (the sparse attention's
        top-k indices), which on the CPU default met CUDA operands (an H100, 2026-12-07). Nothing on a CPU."""
        return torch.device(self.device) if self.device.type != "cpu" else contextlib.nullcontext()

    # -- per-sequence setup ----------------------------------------------------------------------------
    def preload(self, part: str) -> None:
        """Load what every chunk reuses, on the runner's prefetch thread: ``embed`` (the embedding; the Engram hash
        module is built with the driver) or ``head`` (the final norm and the head). Only their construction takes the
        vendor lock (``_build_*``): reading and placing them runs beside the computing layer."""
        with torch.inference_mode():
            self._resident(*(("_embed", self._build_embed) if part == "embed" else ("_head", self._build_head)))

    def begin(self, tokens: torch.Tensor) -> V41State:
        with vendor_dtype(), self._default_device(), torch.inference_mode():
            tokens = tokens.to(self.device, torch.long)
            embed = self._resident("_embed", self._build_embed)
            h = embed(tokens.clone())
            hashes = None
            if self.layout is not None and self._last_engram >= 0:
                hs = self._resident("_hash", self._build_hash)
                hs.cache = torch.empty(tokens.shape, dtype=torch.int64, device=self.device)
                hashes = hs(tokens, 0, None)
            h = h.unsqueeze(2).repeat(1, 1, self.args.hc_mult, 1)
            return V41State(h, self.m.make_identity_pre_mix(h, self.args.hc_mult), hashes)

    # -- layers ----------------------------------------------------------------------------------------
    def load_layer(self, i: int) -> torch.nn.Module:
        with vendor_dtype():
            block = self.m.Block(i, self.args, self._build_layout)
        with torch.inference_mode():
            self.loader.fill(block, f"layers.{i}.", skip=("engram.embed",))
            self._hooks(block, f"layers.{i}.")
            to_device(block, self.device)
            if block.engram is not None:
                rows = self.layout.num_embeddings[block.engram.layer_hash_index]
                block.engram_rows = EngramRows(self.loader, f"layers.{i}.engram.embed.", rows)
            return self.grouped.install(block) if self.grouped is not None else block

    def routing(self):
        """Every layer is an MoE layer routed by its learned ``Gate`` (Engram's hashing picks table rows, not
        experts; the DSpark layers are not built): experts, top-k (:mod:`fideval.model.reference.gate_routes`)."""
        from fideval.model.reference.gate_routes import Routing

        a = self.args
        n_experts, top_k = a.get_moe_config(0)
        return Routing(tuple(range(a.n_layers)), n_experts, top_k, self.m.Gate)

    def forward_layer(self, i: int, block: torch.nn.Module, state: V41State) -> V41State:
        with vendor_dtype(), self._default_device(), torch.inference_mode():
            b, length = state.h.shape[:2]
            self._fresh_caches(block.attn, b, length)
            sa = self.m.shared_attn
            for k in SLOTS:
                setattr(sa, k, state.shared.get(k))
            try:
                h = state.h
                if block.engram is not None:
                    h = self._engram(block, h, state.hashes[:, :, block.engram.layer_hash_index, :])
                h, pre_mix = block(h, 0, state.pre_mix, None)
                shared = {k: getattr(sa, k) for k in SLOTS if getattr(sa, k) is not None and i in self._keeps[k]}
            finally:
                for k in SLOTS:
                    setattr(sa, k, None)
            return V41State(h, pre_mix, state.hashes if i < self._last_engram else None, shared)

    def head_input(self, state: V41State) -> torch.Tensor:
        """What :meth:`finish` hands the head: the final norm's output after the hc collapse (a hidden store keeps it)."""
        with vendor_dtype(), self._default_device(), torch.inference_mode():
            norm, _ = self._resident("_head", self._build_head)
            return norm(self.m.Block.hc_pre(None, state.h, state.pre_mix))

    def head_weight(self) -> torch.Tensor:
        """This rank's rows of the head as :meth:`finish` applies it (the vendor's ParallelHead: float32)."""
        return self._resident("_head", self._build_head)[1].weight

    def finish(self, state: V41State) -> torch.Tensor:
        """The last block's hc collapse (``Block.hc_pre`` uses nothing of its block), the final norm, and the
        head in float32 over every position, gathered over ranks by the vendor's ``ParallelHead``."""
        with vendor_dtype(), self._default_device(), torch.inference_mode():
            norm, head = self._resident("_head", self._build_head)
            h = self.m.Block.hc_pre(None, state.h, state.pre_mix)
            return head(norm(h), full_logits=True).float()

    # -- the parity oracle (tests) ---------------------------------------------------------------------
    def vendor_logits(self, tokens: torch.Tensor, prepare=None) -> torch.Tensor:
        """The vendor's own ``Transformer.forward`` (start_pos 0) on the same weights and hooks: float32 [B, V]
        (``prepare(model)``: a test's own hooks on the vendor's model before it runs)."""
        with vendor_dtype(), torch.inference_mode():  # built and filled on the CPU, run on the device
            b, length = tokens.shape
            a = dataclasses.replace(self.args, max_batch_size=b, max_seq_len=max(length, self.args.max_seq_len),
                                    dspark_block_size=0)
            model = self.m.Transformer(a, self._tokenizer() if self.layout is not None else None)
            self.loader.fill(model, "", skip=tuple(f"layers.{i}.engram.embed" for i in a.engram_layer_ids))
            for layer in model.layers:
                if layer.engram is not None:
                    emb = layer.engram.embed
                    rows = EngramRows(self.loader, f"layers.{layer.layer_id}.engram.embed.", emb.num_embeddings)
                    u, w, s = rows.owned(torch.arange(rows.lo, rows.hi))
                    wb = torch.zeros(emb.weight.shape, dtype=torch.uint8)  # +0.0 in e4m3; padding rows past the table
                    sb = torch.full(emb.scale.shape, 127, dtype=torch.uint8)  # 2^0 in e8m0
                    wb[: len(u)], sb[: len(u)] = w.view(torch.uint8), s.view(torch.uint8)
                    emb.weight.data, emb.scale.data = wb.view(emb.weight.dtype), sb.view(emb.scale.dtype)
            self._hooks(model, "")
            to_device(model, self.device)
            if prepare is not None:
                prepare(model)
            try:
                with self._default_device():
                    _, logits, _ = model(tokens.to(self.device, torch.long))
            finally:
                for k in SLOTS:
                    setattr(self.m.shared_attn, k, None)
            return logits.float()

    # -- helpers ---------------------------------------------------------------------------------------
    def _resident(self, attr: str, build):
        with self._once:
            if getattr(self, attr) is None:
                setattr(self, attr, build())
            return getattr(self, attr)

    def _build_embed(self):
        with vendor_dtype():
            emb = self.m.ParallelEmbedding(self.args.vocab_size, self.args.dim)
        self.loader.fill(emb, "embed.")
        return emb.to(self.device)

    def _build_head(self):
        a = self.args
        with vendor_dtype():
            norm, head = self.m.RMSNorm(a.dim, a.norm_eps), self.m.ParallelHead(a.vocab_size, a.dim, a.norm_eps, a.hc_eps)
        self.loader.fill(norm, "norm.")
        self.loader.fill(head, "head.")
        self._hooks(head, "head.")
        return norm.to(self.device), head.to(self.device)

    def _tokenizer(self):
        path = self.weights.config_dir / "tokenizer.json"
        if not path.is_file():
            raise FidevalError(f"{path} not found",
                               hint="Engram hashes n-grams of the model's own tokenizer; the model folder must hold it")
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_file=str(path))

    def _build_hash(self):
        try:
            hs = self.code.module("engram").NgramHashState(self.args, self.layout, self._tokenizer())
        except AssertionError as e:  # the vendor asserts (found, configured)
            found = e.args[0][0] if e.args and isinstance(e.args[0], tuple) else e
            raise FidevalError(f"tokenizer.json's compressed vocabulary has {found} entries, config.json's "
                               f"engram_compressed_vocab_size is {self.args.engram_compressed_vocab_size}",
                               hint="config.json and tokenizer.json are from different models") from None
        return hs.to(self.device)

    def _hooks(self, module: torch.nn.Module, prefix: str) -> None:
        """act_transform on the inputs of the vendor's linears by module class (an Expert's w1/w3 take its
        input, w2 the SwiGLU output; attention's wo_a is an einsum in the vendor's code, so no hook sees its
        input) and on the head's input."""
        targets = [("", module)] if isinstance(module, self.m.ParallelHead) else linears(module, self.m.Linear)
        hook_inputs(self.act, lambda name: vendor_module_class(f"{prefix}{name}.weight" if name else f"{prefix}weight"),
                    targets, keep_dtype=True)
        if prefix == "":  # the whole Transformer (oracle): its head too
            self._hooks(module.head, "head.")

    def _fresh_caches(self, attn, b: int, length: int) -> None:
        """Zeroed caches for B sequences of L tokens (the vendor's are sized max_batch_size x max_seq_len)."""
        def like(old, shape, fill=0.0):
            return torch.full(shape, fill, dtype=old.dtype, device=old.device)

        attn.window_kv_cache = like(attn.window_kv_cache, (b, attn.window_size, attn.head_dim))
        r = attn.compress_ratio
        if attn.is_kv_source:
            attn.compress_kv_cache = like(attn.compress_kv_cache, (b, length // r, attn.head_dim))
            c = attn.compressor
            if r > 1:
                c.kv_state = like(c.kv_state, (b, r, c.head_dim))
                c.score_state = like(c.score_state, (b, r, c.head_dim), -torch.inf)
        if attn.indexer is not None and attn.indexer.owns_k:
            k = attn.indexer.k_cache
            attn.indexer.k_cache = like(k, (b, length // r, k.shape[-1]))
        if attn.freqs_cis.shape[0] < length:
            a = self.args
            orig, theta = (a.original_seq_len, a.compress_rope_theta) if r else (0, a.rope_theta)
            attn.freqs_cis = self.m.precompute_freqs_cis(attn.rope_head_dim, length, orig, theta, a.rope_factor,
                                                         a.beta_fast, a.beta_slow).to(attn.freqs_cis.device)
            if attn.indexer is not None:
                attn.indexer.freqs_cis = None

    def _engram(self, block, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The vendor's Engram over a table holding only the rows this micro-batch looks up (this rank's
        share): ids become positions in that table, ids of other ranks fall outside it and are masked, as
        the vendor masks them, then all-reduced by its own embedding."""
        rows, emb = block.engram_rows, block.engram.embed
        u, w, s = rows.owned(ids)
        if len(u) == 0:  # the vendor indexes row 0 of a masked id: keep one row, never selected
            u = torch.tensor([-1])
            w = torch.zeros(1, emb.dim, dtype=torch.uint8).view(torch.float8_e4m3fn)
            s = torch.full((1, emb.dim // emb.block_size), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        u = u.to(ids.device)
        pos = torch.searchsorted(u, ids.contiguous()).clamp(max=len(u) - 1)
        local = torch.where(u[pos] == ids, rows.lo + pos, -1)
        emb.weight = torch.nn.Parameter(w.to(self.device), requires_grad=False)
        emb.scale = torch.nn.Parameter(s.to(self.device), requires_grad=False)
        emb.vocab_start_idx, emb.vocab_end_idx, emb.part_num_embeddings = rows.lo, rows.lo + len(u), len(u)
        try:
            return block.engram(h, local, None)
        finally:
            emb.weight = emb.scale = None


def _slot_keeps(a) -> dict[str, set[int]]:
    """For each shared slot, the layers after which it must be carried: a later layer reads it (one that does
    not write it itself, in the vendor's Attention/Indexer) before another layer overwrites it."""
    n, r, kv, ix = a.n_layers, a.compress_ratios, set(a.kv_source_layers), set(a.index_source_layers)
    cand = a.candidate_source_layer
    readers = {
        "compress_kv": [i for i in range(n) if r[i] and i not in kv],
        "index_k": [i for i in range(n) if r[i] and i in ix and i not in kv],
        "topk_idxs": [i for i in range(n) if r[i] and i not in ix],
        "candidates": [i for i in range(n) if r[i] and i in ix and 0 <= cand < i],
    }
    writers = {
        "compress_kv": [i for i in range(n) if r[i] and i in kv],
        "index_k": [i for i in range(n) if r[i] and i in kv and i in ix],
        "topk_idxs": [i for i in range(n) if r[i] and i in ix],
        "candidates": [cand] if 0 <= cand < n else [],
    }
    keeps = {}
    for k in SLOTS:
        nxt_r = [min((j for j in readers[k] if j > i), default=n) for i in range(n)]
        nxt_w = [min((j for j in writers[k] if j > i), default=n) for i in range(n)]
        keeps[k] = {i for i in range(n) if nxt_r[i] < n and nxt_r[i] <= nxt_w[i]}
    return keeps


def describe(driver: DeepseekV41Driver) -> dict[str, Any]:
    """What a run records of this driver (report.json): kernels and the model's shape."""
    a = driver.args
    return {"family": "deepseek-v4.1", "kernels": dict(driver.kernels), "n_layers": a.n_layers, "hc_mult": a.hc_mult,
            "compress_ratios": list(a.compress_ratios[: a.n_layers]), "engram_layer_ids": list(a.engram_layer_ids),
            "dtype": a.dtype, "expert_dtype": a.expert_dtype, "world": driver.world}
