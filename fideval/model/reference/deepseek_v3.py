"""DeepSeek-V3 (and Kimi-K2) in DeepSeek's own ``inference/model.py``, one ``Block`` at a time, every position.

The contract is :mod:`fideval.model.reference.driver`'s. What is this family's:

* ``ModelArgs`` from the release's config.json (:mod:`.deepseek_v3_args`); the module globals ``world_size``, ``rank``,
  ``block_size``, ``gemm_impl``, ``attn_impl`` and ``Linear.dtype`` / ``Linear.scale_fmt`` are set before a
  module is built or run (they are read at call time by ``ParallelEmbedding``, ``RowParallelLinear``, ``MoE``);
* a layer is ``Block(i, args)`` built on the meta device and filled with this rank's tensors, named and cut
  as the vendor's ``convert.py`` does (:mod:`.deepseek_v3_names`): FP8 weights stay FP8 with their scales attached as
  ``weight.scale`` (the vendor's ``linear`` dequantizes them, or runs ``fp8_gemm`` with ``gemm_impl="fp8"``),
  unless a weight transform quantizes that tensor: then it is dequantized (in float32, per block, as
  ``weight_dequant``), transformed and stored in the run dtype;
* the MLA caches (``kv_cache``/``pe_cache``, or ``k_cache``/``v_cache`` with ``attn_impl="naive"``) are
  replaced by zeros sized for the micro-batch before each call, and ``block(h, 0, freqs_cis, mask)`` runs
  with the vendor's causal mask;
* the head: the final ``RMSNorm`` in the run dtype, then the vendor's ``ColumnParallelLinear`` head with a
  float32 weight on a float32 input over every position, this rank's vocabulary rows all-gathered as
  ``Transformer.forward`` does.

The torch default dtype is the run dtype while vendor code runs (the vendor's ``weight_dequant`` and its
caches take it), restored afterwards (:func:`default_dtype`).
"""

from __future__ import annotations

import dataclasses
import threading
from contextlib import contextmanager

import torch

from fideval.errors import FidevalError
from fideval.model.execution.transforms import hook_inputs, linears, transform_weight
from fideval.model.reference import deepseek_v3_args, deepseek_v3_kernels, deepseek_v3_names, grouped_experts
from fideval.model.reference.code import VendorCode, require
from fideval.quant.module_classes import module_class_of, quantized_class

CLASSES = ("ModelArgs", "Transformer", "Block", "MLA", "MoE", "MLP", "Expert", "Gate", "Linear", "ColumnParallelLinear",
           "RowParallelLinear", "ParallelEmbedding", "RMSNorm", "precompute_freqs_cis")
SCALE = "_scale_inv"
_lock = threading.Lock()
_depth = [0, None]


@contextmanager
def default_dtype(dtype: torch.dtype):
    """``torch.set_default_dtype(dtype)`` while any caller is inside (the prefetch thread and the compute thread
    both may be), the previous default restored when the last leaves."""
    with _lock:
        if _depth[0] == 0:
            _depth[1] = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
        elif torch.get_default_dtype() != dtype:
            raise RuntimeError("two reference drivers with different dtypes run at once")
        _depth[0] += 1
    try:
        yield
    finally:
        with _lock:
            _depth[0] -= 1
            if _depth[0] == 0:
                torch.set_default_dtype(_depth[1])


class DeepseekV3Driver:
    """One rank's view of a DeepSeek-V3 release run through the vendor's modules (see the module docstring)."""

    @classmethod
    def stand_ins(cls, device: torch.device, dtype: torch.dtype | None = None) -> tuple[dict, bool]:
        """Kernel modules for :func:`~fideval.model.reference.code.load_vendor_code`: the torch stand-ins for
        ``kernel``; the vendor's Triton kernels preferred on a GPU only."""
        return {"kernel": deepseek_v3_kernels}, torch.device(device).type == "cuda"

    def __init__(self, code: VendorCode, config: dict, weights, *, rank: int = 0, world: int = 1, group=None,
                 device="cpu", dtype: torch.dtype = torch.float32, weight_transform=None, act_transform=None,
                 gemm_impl: str = "bf16", attn_impl: str = "absorb", experts: str = "vendor"):
        require(code, CLASSES)
        self.code, self.m, self.weights = code, code.model, weights
        where = str(getattr(weights, "config_dir", "")) + "/config.json" if getattr(weights, "config_dir", None) else "config.json"
        self.args = deepseek_v3_args.model_args(self.m, config, where)
        deepseek_v3_args.check_world(self.args, world, where)
        if gemm_impl not in ("bf16", "fp8") or attn_impl not in ("naive", "absorb"):
            raise FidevalError(f"gemm_impl {gemm_impl!r} / attn_impl {attn_impl!r} are not the reference code's",
                               hint="gemm_impl: bf16 | fp8; attn_impl: naive | absorb")
        self.rank, self.world, self.group = rank, world, group
        self.device, self.dtype = torch.device(device), dtype
        self.weight_transform, self.act_transform = weight_transform, dict(act_transform or {})
        self.gemm_impl, self.attn_impl = gemm_impl, attn_impl
        release = getattr(weights, "release", None)
        self.release = release
        if release is not None and release.block[0] != release.block[1]:
            raise FidevalError(f"{where}: weight_block_size {list(release.block)} is not square",
                               hint="the reference code has one block_size for both dimensions")
        self.block_size = release.block[0] if release is not None else 128
        self.scale_fmt = "ue8m0" if release is not None and release.ue8m0 else None
        self.n_layers, self.vocab_size, self.hidden_size = self.args.n_layers, self.args.vocab_size, self.args.dim
        n = self.args.n_routed_experts // world
        self.experts = (rank * n, (rank + 1) * n)
        src = code.kernels.get("kernel", "vendor")
        src = "vendor kernel.py (triton)" if src == "vendor" else src
        fp8 = release is not None
        self.kernels = {
            "weight_dequant": src if fp8 else "unused (no FP8 weights)",
            "act_quant": src if fp8 and gemm_impl == "fp8" else "unused (gemm_impl bf16)",
            "fp8_gemm": src if fp8 and gemm_impl == "fp8" else "unused (gemm_impl bf16)",
            "linear": "torch F.linear" + (" on weight_dequant's output" if fp8 and gemm_impl == "bf16" else ""),
            "attention": f"vendor MLA ({attn_impl}, torch einsum)",
        }
        self.grouped = (grouped_experts.Grouped("deepseek-v3", self.m, self.kernels)
                        if grouped_experts.check(experts) == "grouped" else None)  # else the vendor's loop
        self._embed = self._head = None
        self._freqs: torch.Tensor | None = None

    # -- vendor module state ---------------------------------------------------------------------------
    @contextmanager
    def _vendor(self):
        m = self.m
        with default_dtype(self.dtype):
            m.world_size, m.rank, m.block_size = self.world, self.rank, self.block_size
            m.gemm_impl, m.attn_impl = self.gemm_impl, self.attn_impl
            m.Linear.dtype, m.Linear.scale_fmt = self.dtype, self.scale_fmt
            yield

    def _build(self, fn):
        with self._vendor(), torch.device("meta"):
            return fn()

    # -- reading ---------------------------------------------------------------------------------------
    def _read(self, hf: str, dim: int | None) -> torch.Tensor:
        """This rank's slice of one release tensor, as stored (fp8 stays fp8)."""
        info = self.weights.info(hf)
        rows = deepseek_v3_names.rows_of(dim, info.shape[0] if info.shape else 0, self.rank, self.world)
        pin = self.device.type == "cuda"  # pinned: copied to the device beside the compute (the runner's load stream)
        t = self.weights.read(hf, rows=rows, pin=pin) if rows else self.weights.read(hf, pin=pin)
        return t if rows else deepseek_v3_names.rank_slice(t, dim, self.rank, self.world, hf)

    def _read_all(self, module: torch.nn.Module, prefix: str, linears: set[str]) -> dict:
        """Every release tensor ``module`` needs (fp8 weights with their scales), read on the checkpoint's reader
        pool at once: a DeepSeek-V3 MoE layer is 800 tensors of ~15 MB, too many to read one after another."""
        from fideval.model.weights.reading import reader_pool

        jobs = {}
        for name, _ in module.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if owner in linears and leaf == "scale":
                continue
            hf, dim = deepseek_v3_names.plan(prefix + name)
            jobs[hf] = dim
            if self.weights.info(hf).dtype == torch.float8_e4m3fn:
                jobs[hf + SCALE] = dim
        return {k: reader_pool().submit(self._read, k, d) for k, d in jobs.items()}

    def _fill(self, module: torch.nn.Module, prefix: str, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """Load every parameter of a freshly built (meta) vendor module from the release; ``prefix``: its vendor
        name in the whole ``Transformer`` (``layers.3.``, ``embed.``, ...); ``dtype``: floats' dtype (the run's)."""
        dtype = dtype or self.dtype
        linears = {n for n, mod in module.named_modules() if isinstance(mod, self.m.Linear)}
        sd: dict[str, torch.Tensor] = {}
        scales: dict[str, torch.Tensor] = {}
        reads = self._read_all(module, prefix, linears)
        for name, p in module.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if owner in linears and leaf == "scale":
                continue  # the vendor's fp8 scale parameter: filled with its weight below
            hf, dim = deepseek_v3_names.plan(prefix + name)
            t = reads[hf].result().to(self.device, non_blocking=True)
            if tuple(t.shape) != tuple(p.shape):
                raise FidevalError(f"{getattr(self.weights, 'dir', '')}: tensor {hf!r} gives {list(t.shape)} on rank "
                                   f"{self.rank}, the reference code expects {list(p.shape)}",
                                   hint="the checkpoint does not match config.json")
            cls_ = quantized_class(hf, t.shape, True)
            transform = self.weight_transform is not None and cls_ is not None and owner in linears
            if t.dtype == torch.float8_e4m3fn:
                if dim is not None and self.world > 1 and (self.weights.info(hf).shape[dim] // self.world) % self.block_size:
                    raise FidevalError(f"{hf}: its FP8 blocks of {self.block_size} do not split over {self.world} ranks",
                                       hint="choose a model-parallel size whose slices hold whole scale blocks")
                s = reads[hf + SCALE].result().to(self.device, non_blocking=True)
                if transform:
                    t = deepseek_v3_kernels.dequant_f32(t, s, self.block_size).to(dtype)
                else:
                    sd[name], scales[owner] = t, s.to(torch.float32)
                    continue
            elif leaf == "bias" and owner.endswith("gate"):
                t = t.to(torch.float32)  # the vendor keeps the routing bias in float32
            else:
                t = t.to(dtype)
            if transform:
                t = transform_weight(self.weight_transform, cls_, hf, t).to(dtype).contiguous()
            sd[name] = t
        module.load_state_dict(sd, strict=False, assign=True)
        for owner in linears:
            lin = module.get_submodule(owner) if owner else module
            if owner in scales:
                lin.scale = torch.nn.Parameter(scales[owner], requires_grad=False)
                lin.weight.scale = lin.scale  # how the vendor's linear() finds it
            else:
                lin.scale = None
        left = [n for n, p in module.named_parameters() if p.is_meta]
        if left:
            raise FidevalError(f"{getattr(self.weights, 'dir', '')}: no release tensor for {prefix}{left[0]}",
                               hint="the checkpoint does not match config.json")
        self._hooks(module, prefix)
        return module.requires_grad_(False).eval()

    def _hooks(self, module: torch.nn.Module, prefix: str) -> None:
        """The quant spec's activation transforms on the inputs of the vendor's linears, by module class."""
        hook_inputs(self.act_transform, lambda name: module_class_of(deepseek_v3_names.to_hf(f"{prefix}{name}".rstrip(".") + ".weight")),
                    linears(module, self.m.Linear))

    # -- the contract ----------------------------------------------------------------------------------
    def load_layer(self, i: int) -> torch.nn.Module:
        block = self._build(lambda: self.m.Block(i, self.args))
        with self._vendor():  # the grouped stack too: the vendor's weight_dequant writes the default dtype
            block = self._fill(block, f"layers.{i}.")
            return self.grouped.install(block) if self.grouped is not None else block

    def routing(self):
        """The MoE layers (those past the ``n_dense_layers`` dense ones), experts, top-k and the vendor's ``Gate``
        (:mod:`fideval.model.reference.gate_routes`)."""
        from fideval.model.reference.gate_routes import Routing

        a = self.args
        return Routing(tuple(range(a.n_dense_layers, a.n_layers)), a.n_routed_experts, a.n_activated_experts, self.m.Gate)

    def _load_embed(self) -> torch.nn.Module:
        """The vendor's ``ParallelEmbedding`` with this rank's vocabulary rows, loaded once and kept."""
        if self._embed is None:
            emb = self._build(lambda: self.m.ParallelEmbedding(self.args.vocab_size, self.args.dim))
            with self._vendor():
                self._embed = self._fill(emb, "embed.")
        return self._embed

    def preload(self, part: str) -> None:
        """Load what every chunk reuses, on the runner's prefetch thread: ``embed`` (the embedding) or ``head``
        (the final norm and the head)."""
        self._load_embed() if part == "embed" else self._load_head()

    def begin(self, tokens: torch.Tensor) -> torch.Tensor:
        self._load_embed()
        if tokens.shape[1] > self.args.max_seq_len:
            raise FidevalError(f"sequences of {tokens.shape[1]} tokens exceed the model's {self.args.max_seq_len}",
                               hint="use shorter windows")
        with torch.inference_mode(), self._vendor():
            return self._embed(tokens.to(self.device).clone())  # the vendor's embedding edits its input in place

    def _freqs_cis(self, L: int) -> torch.Tensor:
        if self._freqs is None:
            with self._vendor():
                self._freqs = self.m.precompute_freqs_cis(self.args).to(self.device)
        return self._freqs[:L]

    def forward_layer(self, i: int, module: torch.nn.Module, state: torch.Tensor) -> torch.Tensor:
        B, L = state.shape[:2]
        attn, a = module.attn, self.args
        with torch.inference_mode(), self._vendor():
            z = dict(dtype=self.dtype, device=self.device)
            if self.attn_impl == "naive":
                attn.k_cache = torch.zeros(B, L, attn.n_local_heads, attn.qk_head_dim, **z)
                attn.v_cache = torch.zeros(B, L, attn.n_local_heads, attn.v_head_dim, **z)
            else:
                attn.kv_cache = torch.zeros(B, L, a.kv_lora_rank, **z)
                attn.pe_cache = torch.zeros(B, L, a.qk_rope_head_dim, **z)
            mask = torch.full((L, L), float("-inf"), device=self.device).triu_(1) if L > 1 else None
            return module(state, 0, self._freqs_cis(L), mask)

    def _load_head(self):
        if self._head is None:
            def build():
                mod = torch.nn.Module()
                mod.norm = self.m.RMSNorm(self.args.dim)
                mod.head = self.m.ColumnParallelLinear(self.args.dim, self.args.vocab_size, dtype=torch.float32)
                return mod
            mod = self._build(build)
            with self._vendor():
                self._head = (self._fill(mod.norm, "norm."), self._fill(mod.head, "head.", torch.float32))
        return self._head

    def head_input(self, state: torch.Tensor) -> torch.Tensor:
        """What :meth:`finish` hands the head: the final norm's output (a hidden store keeps it)."""
        norm, _ = self._load_head()
        with torch.inference_mode(), self._vendor():
            return norm(state)

    def head_weight(self) -> torch.Tensor:
        """This rank's rows of the head as :meth:`finish` applies it (float32, the vendor's ``F.linear``)."""
        return self._load_head()[1].weight

    def finish(self, state: torch.Tensor) -> torch.Tensor:
        norm, head = self._load_head()
        with torch.inference_mode(), self._vendor():
            logits = head(norm(state).to(torch.float32))
            if self.world > 1:
                import torch.distributed as dist

                parts = [torch.empty_like(logits) for _ in range(self.world)]
                dist.all_gather(parts, logits.contiguous(), group=self.group)
                logits = torch.cat(parts, dim=-1)
        return logits

    # -- the parity oracle (tests) -----------------------------------------------------------------------
    def vendor_logits(self, tokens: torch.Tensor, prepare=None) -> torch.Tensor:
        """The vendor's own ``Transformer.forward`` on the same weights (every tensor as this driver reads it,
        FP8 weights with their scales as the vendor's loader leaves them): float32 [B, V], last position.
        ``prepare(model)``, when given, runs on the loaded model first (a test's own hooks)."""
        args = dataclasses.replace(self.args, max_batch_size=tokens.shape[0],
                                   dtype="fp8" if self.release is not None else "bf16", scale_fmt=self.scale_fmt)
        with self._vendor():
            model = self.m.Transformer(args)  # sets world_size / rank from torch.distributed, Linear.dtype from args
            model.to(self.device)
            self.m.block_size, self.m.gemm_impl, self.m.attn_impl = self.block_size, self.gemm_impl, self.attn_impl
            for name, mod in model.named_children():
                if name == "layers":
                    for i, blk in enumerate(mod):
                        self._fill_vendor(blk, f"layers.{i}.")
                elif name != "head":
                    self._fill_vendor(mod, f"{name}.")
            self._fill_vendor(model.head, "head.", torch.get_default_dtype())
            if prepare is not None:
                prepare(model)
            out = model(tokens.to(self.device))
        return out.to(torch.float32)

    def _fill_vendor(self, module, prefix: str, dtype: torch.dtype | None = None) -> None:
        """As ``generate.py``'s ``load_model`` copies the converted tensors in place (float tensors take the
        parameter's dtype: the vendor's model decides its own precision)."""
        with torch.no_grad():
            for name, p in module.named_parameters():
                hf, dim = deepseek_v3_names.plan(prefix + name)
                t = self._read(hf, dim)
                if hf.endswith(SCALE) or hf.endswith("e_score_correction_bias"):
                    t = t.to(torch.float32)
                elif t.dtype != torch.float8_e4m3fn:
                    t = t.to(dtype or self.dtype)
                p.data = t.to(self.device)
            for mod in module.modules():
                if isinstance(mod, self.m.Linear) and mod.scale is not None:
                    mod.weight.scale = mod.scale
