"""DeepSeek-V3.2-Exp through its vendor's ``inference/model.py``, layer by layer over every position.

The vendor's ``Transformer.forward`` is ``h, residual = embed(tokens), None``; ``h, residual = layer(h, residual,
start_pos, freqs_cis, mask)`` per ``Block``; ``h, _ = norm(h, residual)``; the FP32 head on the last position,
all-gathered over ranks. This driver runs those same modules in that order (the state between layers is
``(h, residual)``: V3.2's blocks hand the un-normalised residual stream on and fuse the add into the next
RMSNorm) and applies the head to every position. Each ``Block`` (its MLA, the DSA ``Indexer`` and the MLP/MoE)
is built by the vendor's classes on the meta device with the module globals set first (``world_size``,
``rank``, ``block_size``, ``Linear.dtype``, ``Linear.scale_fmt``, torch's default dtype), then its parameters
are read from the HF release (:mod:`.deepseek_v32_names`: convert.py's renames and per-rank slices, on load).

What the vendor's code needs and gets here (all recorded in :attr:`DeepseekV32Driver.kernels`):

* ``kernel`` (tilelang) and ``fast_hadamard_transform`` (CUDA): on a CPU the torch stand-ins of
  :mod:`.deepseek_v32_kernels`; on CUDA the vendor's own where they import.
* ``Indexer.forward`` calls ``dist.broadcast`` whatever the world size: with no process group the driver
  creates a one-process one (gloo on CPU, NCCL on CUDA; a file store in a temp dir).
* ``rotate_activation`` asserts bf16 input; a float32 run replaces it (for float32 inputs only) with its
  own body minus the assert. bf16 runs use the vendor's function.
* FP8 releases run as the vendor runs them: FP8 weights with their 128x128 scales in the vendor's
  ``Linear`` (``act_quant`` + ``fp8_gemm``). A quant spec's ``weight_transform`` sees each weight dequantized
  to float32 (whole, before the rank's slice); a tensor it changes is loaded as a float weight (the vendor's
  ``linear`` then takes ``F.linear``), one it returns unchanged stays FP8 as released.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import threading

import torch

from fideval.errors import FidevalError
from fideval.model.execution.transforms import hook_inputs, linears, transform_weight
from fideval.model.reference import deepseek_v32_args as margs
from fideval.model.reference import deepseek_v32_kernels, grouped_experts
from fideval.model.reference.code import VendorCode, require
from fideval.model.reference.deepseek_v32_names import to_hf
from fideval.quant.module_classes import module_class_of, quantized_class

FP8 = torch.float8_e4m3fn
BLOCK = 128
NEEDED = ("ModelArgs", "Transformer", "Block", "MLA", "Indexer", "MoE", "Expert", "MLP", "Gate", "Linear", "RMSNorm",
          "ParallelEmbedding", "ColumnParallelLinear", "precompute_freqs_cis", "rotate_activation")
STAND_INS = {"kernel": deepseek_v32_kernels, "fast_hadamard_transform": deepseek_v32_kernels}

_LOCK = threading.RLock()  # module globals + default dtype while a vendor module is built
_DEFAULT = {"n": 0, "saved": None, "dtype": None}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype (the vendor's activation dtype: its embedding, ``fp8_gemm`` output, masks) set for
    the duration; re-entrant and shared by threads that ask for the same dtype (the prefetch thread builds a
    layer while the main thread computes one)."""
    with _LOCK:
        if _DEFAULT["n"] and _DEFAULT["dtype"] != dtype:
            raise RuntimeError(f"reference runs in {dtype} and {_DEFAULT['dtype']} at once in one process")
        if _DEFAULT["n"] == 0:
            _DEFAULT["saved"], _DEFAULT["dtype"] = torch.get_default_dtype(), dtype
            torch.set_default_dtype(dtype)
        _DEFAULT["n"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEFAULT["n"] -= 1
            if _DEFAULT["n"] == 0:
                torch.set_default_dtype(_DEFAULT["saved"])


def ensure_process_group(device: torch.device) -> str | None:
    """The one-process group the vendor's indexer broadcasts on, created when none exists (returns its
    backend; None when a group was already there)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return None
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.FileStore(tempfile.mkdtemp(prefix="fideval-pg-") + "/store", 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    return backend


def _float32_rotate(model) -> None:
    """Let float32 activations through the vendor's ``rotate_activation`` (it asserts bf16): the same Hadamard
    call without the assert; bf16 input still goes to the vendor's own function."""
    if getattr(model.rotate_activation, "__fideval__", False):
        return
    vendor = model.rotate_activation

    def rotate_activation(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16:
            return vendor(x)
        from fast_hadamard_transform import hadamard_transform

        return hadamard_transform(x, scale=x.size(-1) ** -0.5)

    rotate_activation.__fideval__ = True
    model.rotate_activation = rotate_activation


class DeepseekV32Driver:
    """The driver contract of :mod:`fideval.model.reference.driver` for DeepSeek-V3.2-Exp."""

    @classmethod
    def stand_ins(cls, device: torch.device, dtype: torch.dtype | None = None) -> tuple[dict, bool]:
        """Kernel modules for :func:`~fideval.model.reference.code.load_vendor_code`: the torch stand-ins of
        :mod:`.deepseek_v32_kernels` for ``kernel`` (tilelang) and ``fast_hadamard_transform``; the vendor's own preferred
        on CUDA in bfloat16 only (its tilelang ``act_quant`` is compiled for bf16 input, ``fp8_gemm`` writes bf16)."""
        return dict(STAND_INS), torch.device(device).type == "cuda" and dtype in (None, torch.bfloat16)

    def __init__(self, code: VendorCode, config: dict, weights, *, rank: int = 0, world: int = 1, group=None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16, weight_transform=None,
                 act_transform: dict | None = None, experts: str = "vendor"):
        require(code, NEEDED)
        if dtype not in (torch.bfloat16, torch.float32):
            raise FidevalError(f"the DeepSeek-V3.2-Exp reference code runs in bfloat16 or float32, not {dtype}",
                               hint="set model.dtype to bfloat16 or float32")
        self.code, self.m, self.weights = code, code.model, weights
        self.rank, self.world, self.group = rank, world, group
        self.device, self.dtype = torch.device(device), dtype
        self.fp8 = getattr(weights, "release", None) is not None
        if self.fp8 and tuple(weights.release.block) != (BLOCK, BLOCK):
            raise FidevalError(f"weight_block_size {list(weights.release.block)}: the vendor's code reads 128x128 scales",
                               hint="the reference code runs DeepSeek's FP8 releases as released")
        self.args = margs.model_args(self.m, config, fp8=self.fp8)
        margs.check_world(self.args, world, self.fp8)
        self.weight_transform, self.act_transform = weight_transform, dict(act_transform or {})
        self.n_layers, self.vocab_size, self.hidden_size = self.args.n_layers, self.args.vocab_size, self.args.dim
        self.kernels = dict(code.kernels)
        if not getattr(weights, "config_only", False):  # a config check (validate) joins or makes no group
            backend = ensure_process_group(self.device)
            if backend is None and world == 1:
                self.kernels["process_group"] = "existing (the indexer broadcasts on it)"
            elif backend is not None:
                if world != 1:
                    raise FidevalError(f"model-parallel world size {world} but no torch.distributed group",
                                       hint="start the run with torchrun so that the ranks join one group")
                self.kernels["process_group"] = f"one-process {backend} group created by the driver (the indexer broadcasts)"
        if dtype == torch.float32:
            _float32_rotate(self.m)
            self.kernels["rotate_activation"] = "vendor's body without its bf16 assert (float32 run)"
        else:
            self.kernels["rotate_activation"] = "vendor"
        self.kernels["linear"] = ("vendor fp8: act_quant + fp8_gemm (FP8 release as released)" if self.fp8
                                  else f"vendor F.linear in {str(dtype).removeprefix('torch.')}")
        self._top: dict[str, torch.nn.Module] = {}
        self._freqs: torch.Tensor | None = None
        self._vendor = None
        self.grouped = (grouped_experts.Grouped("deepseek-v3.2", self.m, self.kernels)
                        if grouped_experts.check(experts) == "grouped" else None)  # else the vendor's loop

    # -- building and loading -------------------------------------------------------------------------------
    def _set_globals(self) -> None:
        m = self.m
        m.world_size, m.rank, m.block_size = self.world, self.rank, BLOCK
        m.Linear.dtype = FP8 if self.fp8 else self.dtype
        m.Linear.scale_fmt = self.args.scale_fmt

    def _build(self, make):
        with _LOCK, default_dtype(self.dtype), torch.device("meta"):
            self._set_globals()
            return make()

    def _read(self, hf: str, dim: int | None, shape: tuple[int, ...], whole: bool) -> torch.Tensor:
        """``hf`` (rows of this rank's share of ``dim``; the whole tensor when ``whole``), its shape checked."""
        full = tuple(self.weights.info(hf).shape)
        want = tuple(s * self.world if d == dim else s for d, s in enumerate(shape))
        if full != want:
            raise FidevalError(f"{self.weights.dir}: tensor {hf!r} has shape {list(full)}, config.json implies {list(want)}",
                               hint="the checkpoint does not match config.json")
        if dim is None or self.world == 1 or whole:
            return self.weights.read(hf)
        part = full[dim] // self.world
        lo = self.rank * part
        if dim == 0:
            return self.weights.read(hf, rows=(lo, lo + part))
        return self.weights.read(hf).narrow(dim, lo, part).contiguous()

    def _slice(self, t: torch.Tensor, dim: int | None) -> torch.Tensor:
        if dim is None or self.world == 1:
            return t
        part = t.shape[dim] // self.world
        return t.narrow(dim, self.rank * part, part).contiguous()

    def _param(self, t: torch.Tensor, dtype: torch.dtype) -> torch.nn.Parameter:
        return torch.nn.Parameter(t.to(self.device).to(dtype), requires_grad=False)

    def _fill(self, module: torch.nn.Module, prefix: str) -> None:
        """Every parameter of ``module`` (vendor names under ``prefix``) from the checkpoint, this rank's share."""
        from fideval.quant.fp8 import dequant_blocks

        m = self.m
        for mod_name, mod in list(module.named_modules()):
            own = [(n, p) for n, p in mod.named_parameters(recurse=False) if n != "scale"]
            for pname, p in own:
                vname = f"{prefix}{mod_name + '.' if mod_name else ''}{pname}"
                hf, dim = to_hf(vname)
                cls_ = quantized_class(hf, p.shape, True)
                fn = self.weight_transform if cls_ is not None else None
                stored = self.weights.info(hf).dtype
                t = self._read(hf, dim, tuple(p.shape), whole=fn is not None)
                s = None
                if stored == FP8:
                    s = self._read(hf + "_scale_inv", dim, tuple(getattr(mod, "scale", p).shape) if p.dtype == FP8
                                   else tuple(-(-x // BLOCK) for x in p.shape), whole=fn is not None)
                if fn is not None:
                    full = dequant_blocks(t, s, (BLOCK, BLOCK), torch.float32) if s is not None else t.to(torch.float32)
                    y = transform_weight(fn, cls_, hf, full)
                    if y is full:  # untouched: as released
                        t, s = self._slice(t, dim), (self._slice(s, dim) if s is not None else None)
                    else:
                        t, s = self._slice(y, dim), None
                if p.dtype == FP8 and s is not None:
                    setattr(mod, pname, self._param(t, FP8))
                    mod.scale = self._param(s, torch.float32)
                    mod.weight.scale = mod.scale
                    continue
                if s is not None:  # an fp8 tensor into a float parameter: DeepSeek's weight_dequant
                    t = dequant_blocks(t, s, (BLOCK, BLOCK), torch.float32)
                if t.dtype == FP8:
                    raise FidevalError(f"{self.weights.dir}: tensor {hf!r} is FP8 without scales", hint="re-download the checkpoint")
                target = (self.dtype if p.dtype == FP8 else p.dtype)
                setattr(mod, pname, self._param(t, target))
                if isinstance(mod, m.Linear) and getattr(mod, "scale", None) is not None and mod.weight.dtype != FP8:
                    mod.scale = None  # a transformed weight: the vendor's linear takes F.linear
        if isinstance(module, m.Block) and isinstance(module.ffn, m.MoE) and module.ffn.gate.bias is None:
            self._check_gate_bias(prefix)

    def _check_gate_bias(self, prefix: str) -> None:
        """The vendor's ``Gate`` keeps ``e_score_correction_bias`` only at dim 7168; elsewhere it must be absent or zero."""
        hf = "model." + prefix.replace("ffn", "mlp") + "mlp.gate.e_score_correction_bias"
        if hf in self.weights and bool(self.weights.read(hf).ne(0).any()):
            raise FidevalError(f"{self.weights.dir}: {hf!r} is non-zero, but the vendor's Gate has a bias only at "
                               f"dim 7168 (this model: {self.args.dim})",
                               hint="the reference code would ignore it; use model.implementation: transformers")

    def _hooks(self, module: torch.nn.Module, prefix: str) -> None:
        """``act_transform`` on the inputs of the vendor's linears (experts' w1/w3 and w2, attention, MLPs, head)."""
        hook_inputs(self.act_transform, lambda name: module_class_of(to_hf(f"{prefix}{name}.weight")[0]),
                    linears(module, self.m.Linear))

    def load_layer(self, i: int) -> torch.nn.Module:
        block = self._build(lambda: self.m.Block(i, self.args))
        self._fill(block, f"layers.{i}.")
        self._hooks(block, f"layers.{i}.")
        self.reset_caches(block, 0, 0)  # no meta buffers left: the module can be moved; forward_layer sizes them
        return (self.grouped.install(block) if self.grouped is not None else block).eval()

    def routing(self):
        """The MoE layers (those past the ``n_dense_layers`` dense ones), experts, top-k and the vendor's ``Gate``
        (:mod:`fideval.model.reference.gate_routes`)."""
        from fideval.model.reference.gate_routes import Routing

        a = self.args
        return Routing(tuple(range(a.n_dense_layers, a.n_layers)), a.n_routed_experts, a.n_activated_experts, self.m.Gate)

    def _top_module(self, name: str) -> torch.nn.Module:
        with _LOCK:
            if name not in self._top:
                a = self.args
                make = {"embed": lambda: self.m.ParallelEmbedding(a.vocab_size, a.dim), "norm": lambda: self.m.RMSNorm(a.dim),
                        "head": lambda: self.m.ColumnParallelLinear(a.dim, a.vocab_size, dtype=torch.float32)}[name]
                mod = self._build(make)
                self._fill(mod, f"{name}.")
                if name == "head":
                    self._hooks(mod, "head")
                self._top[name] = mod.eval()
            return self._top[name]

    # -- running --------------------------------------------------------------------------------------------
    def freqs_cis(self, length: int) -> torch.Tensor:
        """The vendor's rotary table (its ``precompute_freqs_cis``, YaRN decided as its ``Transformer`` does)."""
        if length > self.args.max_seq_len:
            raise FidevalError(f"sequence of {length} tokens is longer than the model's {self.args.max_seq_len}",
                               hint="use shorter windows")
        with _LOCK:
            if self._freqs is None:
                self._freqs = self.m.precompute_freqs_cis(self.args).to(self.device)
        return self._freqs[:length]

    def preload(self, part: str) -> None:
        """Load what every chunk reuses, on the runner's prefetch thread: ``embed`` (the embedding) or ``head``
        (the final norm and the head)."""
        for name in (("embed",) if part == "embed" else ("norm", "head")):
            self._top_module(name)

    def begin(self, tokens: torch.Tensor):
        with torch.inference_mode(), default_dtype(self.dtype):
            self._set_globals()
            return self._top_module("embed")(tokens.to(self.device)), None

    def reset_caches(self, block: torch.nn.Module, bsz: int, length: int) -> None:
        """The block's KV, rope and indexer caches for ``bsz`` x ``length`` positions, zeroed (start_pos 0)."""
        attn, a, dev = block.attn, self.args, self.device
        attn.kv_cache = torch.zeros(bsz, length, a.kv_lora_rank, dtype=self.dtype, device=dev)
        attn.pe_cache = torch.zeros(bsz, length, a.qk_rope_head_dim, dtype=self.dtype, device=dev)
        attn.indexer.k_cache = torch.zeros(bsz, length, a.index_head_dim, dtype=FP8, device=dev)
        attn.indexer.k_scale_cache = torch.zeros(bsz, length, a.index_head_dim // BLOCK, dtype=torch.float32, device=dev)
        attn.dequant_wkv_b = None

    def forward_layer(self, i: int, module: torch.nn.Module, state):
        h, residual = state
        bsz, length = h.shape[:2]
        with torch.inference_mode(), default_dtype(self.dtype):
            self._set_globals()
            self.reset_caches(module, bsz, length)
            mask = torch.full((length, length), float("-inf"), device=self.device).triu_(1) if length > 1 else None
            return module(h, residual, 0, self.freqs_cis(length), mask)

    def head_input(self, state) -> torch.Tensor:
        """What :meth:`finish` hands the head: the final norm's output (a hidden store keeps it)."""
        h, residual = state
        with torch.inference_mode(), default_dtype(self.dtype):
            self._set_globals()
            h, _ = self._top_module("norm")(h, residual)
            return h

    def head_weight(self) -> torch.Tensor:
        """This rank's rows of the head as :meth:`finish` applies it (float32, the vendor's ``F.linear``)."""
        return self._top_module("head").weight

    def finish(self, state) -> torch.Tensor:
        h, residual = state
        with torch.inference_mode(), default_dtype(self.dtype):
            self._set_globals()
            h, _ = self._top_module("norm")(h, residual)
            logits = self._top_module("head")(h.float())
            if self.world > 1:
                import torch.distributed as dist

                parts = [torch.empty_like(logits) for _ in range(self.world)]
                dist.all_gather(parts, logits.contiguous(), group=self.group)
                logits = torch.cat(parts, dim=-1)
            return logits.float()

    def vendor_logits(self, tokens: torch.Tensor, prepare=None) -> torch.Tensor:
        """Tests only: the vendor's own ``Transformer.forward`` over these modules and weights (last position).
        Its ``Transformer`` is built once (the vendor's constructor sets the module globals from
        torch.distributed), its layers replaced by :meth:`load_layer`'s and its caches sized for ``tokens``;
        ``prepare(model)``: a test's own hooks on it before it runs."""
        bsz, length = tokens.shape
        if self._vendor is None:
            with _LOCK, default_dtype(self.dtype), torch.device(self.device):
                model = self.m.Transformer(dataclasses.replace(self.args, max_batch_size=1, n_layers=0))
            model.embed, model.norm, model.head = (self._top_module(n) for n in ("embed", "norm", "head"))
            model.layers = torch.nn.ModuleList(grouped_experts.vendor_loop(self.load_layer(i)) for i in range(self.n_layers))
            self._vendor = model
        for layer in self._vendor.layers:
            self.reset_caches(layer, bsz, length)
        if prepare is not None:
            prepare(self._vendor)
        with default_dtype(self.dtype):
            self._set_globals()
            return self._vendor.forward(tokens.to(self.device)).float()
