"""Per-architecture knowledge: which transformers modules to build and how on-disk keys map to them
(which parameters are routed experts, attention, ... is :mod:`fideval.quant.module_classes`).

The decoder layers are transformers' own modules (the reference implementation), built on the meta
device one at a time and filled with ``load_state_dict(assign=True)``. What an adapter adds is only
what the full model's ``forward`` and ``from_pretrained`` would otherwise do for us:

* the on-disk layout. transformers 5 fuses routed experts into 3-D parameters (``mlp.experts.gate_up_proj``
  [E, 2I, H] = per expert ``cat(gate_proj, up_proj)``, ``mlp.experts.down_proj`` [E, H, I]) and converts
  the per-expert layout on load; its ``save_pretrained`` writes the per-expert layout back
  (``mlp.experts.<e>.gate_proj.weight``, as on the Hub for DeepSeek-V3 and Qwen3-MoE; Mixtral's Hub
  layout is ``block_sparse_moe.experts.<e>.w1/w3/w2``). gpt-oss is stored fused. We accept all three.
* the model-level forward, per family (:mod:`fideval.model.families`, the table of what the runner runs and
  refuses): position ids ``arange(L)``, the rotary module (once, or per layer type), the mask of each layer
  type from transformers' own mask utilities, the embedding scale and the logits' finish.
* FP8 releases (:mod:`fideval.model.weights.fp8_release`): fp8 weights and their block scales are read as stored
  (per-expert ones stacked into the fused layout, scales alongside), moved to the device as
  :class:`~fideval.model.weights.fp8_release.Packed` and dequantized there in :meth:`Adapter.materialize`.
* config aliases: ``model_type`` names transformers does not know for an architecture it has (Kimi-K2's
  ``kimi_k2`` is DeepSeek-V3) get that architecture's config class built from the dict.
* a model-parallel rank keeps only experts [r*E/N, (r+1)*E/N) and passes the others to transformers'
  own expert-parallel sentinel (index == num_local_experts), which both its eager and grouped_mm
  expert paths skip.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fideval.errors import FidevalError
from fideval.model.execution.transforms import transform_weight
from fideval.model.families import FAMILIES, MASKS, REFUSED, REFUSED_SETTINGS, Family
from fideval.model.weights import fp8_release
from fideval.model.weights.checkpoint import WeightSource
from fideval.quant.module_classes import quantized_class

# model_type transformers does not know -> the one whose config class builds it (same architectures[0])
CONFIG_ALIASES = {"kimi_k2": "deepseek_v3"}

_PER_EXPERT = {  # fused target -> on-disk per-expert names (HF layout, then Mixtral's)
    "gate_up_proj": (("gate_proj", "up_proj"), ("w1", "w3")),
    "down_proj": (("down_proj",), ("w2",)),
}


def expert_range(rank: int, world: int, n_experts: int) -> tuple[int, int]:
    """DeepSeek's reference partition: rank r owns experts [r*E/N, (r+1)*E/N)."""
    if n_experts % world:
        raise FidevalError(f"model parallel N={world} does not divide the {n_experts} routed experts",
                           hint=f"choose N among the divisors of {n_experts}")
    per = n_experts // world
    return rank * per, (rank + 1) * per


def check_model_config(cfg: dict, where) -> str:
    """The architecture of config.json ``cfg`` if the runner can run it; else the one-line error
    :meth:`Adapter.load` raises (``where`` names the file). ``fideval validate`` calls this too. A
    ``quantization_config`` must be an FP8 release's (:func:`fideval.model.weights.fp8_release.detect`)."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch in REFUSED:
        raise FidevalError(f"{where}: architecture {arch!r} is refused: {REFUSED[arch]}",
                           hint="the runner could not reproduce transformers' forward exactly (docs/runner.md)")
    if arch not in FAMILIES:
        raise FidevalError(f"{where}: architecture {arch!r} is not supported", hint="supported: " + ", ".join(sorted(FAMILIES)))
    fp8_release.detect(cfg, where)
    return arch


def check_features(arch: str, config, where) -> None:
    """Refuse, in one line naming it, a feature of the built ``config`` the runner cannot reproduce exactly: a
    layer type no mask rule covers (:data:`~fideval.model.families.MASKS`), a switch in ``REFUSED_SETTINGS``."""
    family = FAMILIES[arch]
    for (model_type, key, value), feature in REFUSED_SETTINGS.items():
        if model_type == family.model_type and getattr(config, key, None) == value:
            raise FidevalError(f"{where}: {key}={value!r} ({feature}) is not supported by the layer-major runner",
                               hint="the runner could not reproduce transformers' forward exactly (docs/runner.md)")
    from transformers import masking_utils

    for t in sorted(set(getattr(config, "layer_types", None) or ())):
        if t not in MASKS:
            raise FidevalError(f"{where}: layer type {t!r} is not supported by the layer-major runner",
                               hint="known layer types: " + ", ".join(MASKS))
        if MASKS[t] is not None and not hasattr(masking_utils, MASKS[t]):
            import transformers

            raise FidevalError(f"{where}: layer type {t!r} needs transformers' {MASKS[t]}, which transformers "
                               f"{transformers.__version__} does not have", hint="upgrade transformers (tested with 5.25)")


def model_config(cfg: dict, config_dir, where):
    """transformers' config for config.json ``cfg`` read from ``config_dir`` (a real build's is its reference's):
    AutoConfig on the folder, or for an aliased ``model_type`` (:data:`CONFIG_ALIASES`) that architecture's config
    class on the dict, never the folder's remote code. ``quantization_config`` is dropped: fp8 weights are
    dequantized as they are read (fideval.model.weights.fp8_release)."""
    from transformers import AutoConfig

    try:
        alias = CONFIG_ALIASES.get(cfg.get("model_type"))
        if alias is not None:
            from transformers import CONFIG_MAPPING

            drop = ("model_type", "auto_map", "quantization_config")
            config = CONFIG_MAPPING[alias].from_dict({k: v for k, v in cfg.items() if k not in drop})
            config._name_or_path = str(config_dir)  # as from_pretrained sets it
        else:
            config = AutoConfig.from_pretrained(str(config_dir))
    except Exception as e:  # transformers raises many types for a bad config
        raise FidevalError(f"{where}: transformers cannot build the config ({type(e).__name__}: {str(e)[:120]})",
                           hint="check config.json") from None
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    return config


@dataclass
class Adapter:
    ckpt: WeightSource | None
    arch: str
    config: object
    modeling: types.ModuleType
    family: Family
    keep_fp32: tuple[str, ...]
    release: fp8_release.Release | None = None

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def load(cls, ckpt: WeightSource, attn_implementation: str | None = None) -> Adapter:
        return cls.from_config(ckpt.config_dict, ckpt.config_dir, ckpt.dir / "config.json", ckpt, attn_implementation)

    @classmethod
    def from_config(cls, cfg: dict, config_dir, where, ckpt: WeightSource | None = None,
                    attn_implementation: str | None = None) -> Adapter:
        """The adapter for config.json ``cfg`` (read from ``config_dir``; ``where`` is what errors name).
        Without ``ckpt`` it still builds meta layers (``fideval validate`` probes a model from config.json alone)."""
        arch = check_model_config(cfg, where)
        release = getattr(ckpt, "release", None)  # an FP8 release's format, or None: reads give floats
        if release is not None:
            fp8_release.check(ckpt, release)  # before any compute
        family = FAMILIES[arch]
        config = model_config(cfg, config_dir, where)
        check_features(arch, config, where)
        try:
            modeling = importlib.import_module(f"transformers.models.{family.package}.modeling_{family.package}")
            getattr(modeling, family.prefix + "DecoderLayer")
        except (ImportError, AttributeError):
            import transformers

            raise FidevalError(f"{where}: architecture {arch!r} is not in the installed transformers "
                               f"{transformers.__version__}", hint="upgrade transformers (tested with 5.25)") from None
        model_cls = getattr(modeling, arch)
        if attn_implementation is None:  # sdpa, with MLA's narrower values padded on a CPU (execution/cpu_attention.py)
            from fideval.model.execution import cpu_attention

            attn_implementation = cpu_attention.choose(modeling) if getattr(model_cls, "_supports_sdpa", False) else "eager"
        config._attn_implementation = attn_implementation
        # explicit: a layer built outside PreTrainedModel would fall back to eager experts; only where the model
        # class has experts whose implementation can be set (transformers refuses the setting elsewhere)
        can_set = getattr(model_cls, "_can_set_experts_implementation", None)
        if getattr(config, "_experts_implementation", None) in (None, "eager") and (can_set is None or can_set()):
            config._experts_implementation = "grouped_mm"
        keep = tuple(getattr(model_cls, "_keep_in_fp32_modules", None) or ()) + \
            tuple(getattr(model_cls, "_keep_in_fp32_modules_strict", None) or ())
        return cls(ckpt, arch, config, modeling, family, keep, release)

    def cls(self, suffix: str):
        return getattr(self.modeling, self.family.prefix + suffix)

    @property
    def n_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def meta_layer(self, i: int, dtype: torch.dtype) -> torch.nn.Module:
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype if dtype.is_floating_point else old)
        try:
            with torch.device("meta"):
                return self.cls("DecoderLayer")(self.config, i)
        finally:
            torch.set_default_dtype(old)

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, object]:
        """Rotary embeddings by layer type, as the model's forward computes them: one call for all layers, or
        one per layer type (Gemma 3's local and global bases)."""
        rotary = self.cls("RotaryEmbedding")(config=self.config).to(hidden.device)
        kinds = sorted({self.layer_type(i) for i in range(self.n_layers)})
        if self.family.rotary_by_type:
            return {k: rotary(hidden, position_ids, k) for k in kinds}
        pe = rotary(hidden, position_ids)
        return dict.fromkeys(kinds, pe)

    def embed(self, h: torch.Tensor) -> torch.Tensor:
        """The model's scaling of the looked-up embeddings (Gemma: sqrt(H) in the compute dtype; Granite: its
        ``embedding_multiplier``), else ``h``."""
        if self.family.embed == "sqrt_hidden":
            return h * torch.tensor(float(self.config.hidden_size) ** 0.5).to(h.dtype)
        if self.family.embed == "multiplier":
            return h * self.config.embedding_multiplier
        return h

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's last step on the logits (float32): Gemma's final soft-capping, Granite's ``logits_scaling``."""
        if self.family.head == "softcap" and getattr(self.config, "final_logit_softcapping", None) is not None:
            cap = self.config.final_logit_softcapping
            return torch.tanh(logits / cap) * cap
        if self.family.head == "divide":
            return logits / self.config.logits_scaling
        return logits

    def head_finish(self) -> dict | None:
        """:meth:`finish_logits` as data (a hidden store's head block, fideval.store.head): ``{"op": "softcap" | "divide",
        "value": ...}`` or None."""
        if self.family.head == "softcap" and getattr(self.config, "final_logit_softcapping", None) is not None:
            return {"op": "softcap", "value": float(self.config.final_logit_softcapping)}
        if self.family.head == "divide":
            return {"op": "divide", "value": float(self.config.logits_scaling)}
        return None

    def final_norm(self, weight: torch.Tensor) -> torch.nn.Module:
        eps = getattr(self.config, "rms_norm_eps", 1e-6)
        with torch.device("meta"):
            norm = self.cls("RMSNorm")(self.config.hidden_size, eps=eps)
        norm.load_state_dict({"weight": weight}, assign=True)
        return norm

    def n_routed_experts(self, layer: torch.nn.Module) -> int:
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        return int(experts.num_experts) if experts is not None else 0

    def masks(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, object]:
        """The masks the model's own forward builds, by layer type (None = sdpa's is_causal path, or a layer
        that takes none), from transformers' own mask utilities (:data:`~fideval.model.families.MASKS`)."""
        from transformers import masking_utils as mu

        params = inspect.signature(mu.create_causal_mask).parameters
        kw = {"config": self.config, "inputs_embeds": hidden, "attention_mask": None, "position_ids": position_ids}
        kw["cache" if "cache" in params else "past_key_values"] = None
        out = {}
        for kind in sorted({self.layer_type(i) for i in range(self.n_layers)}):
            fn = MASKS[kind]
            if fn is None:
                out[kind] = None
                continue
            f = getattr(mu, fn)
            accepted = inspect.signature(f).parameters
            extra = {k: v for k, v in self.family.mask_kw if k in accepted or "kwargs" in accepted}
            out[kind] = f(**kw, **extra)
        return out

    def layer_type(self, i: int) -> str:
        if self.family.sliding_all:  # the model's forward: one mask for all layers, whatever layer_types says
            return "sliding_attention" if getattr(self.config, "sliding_window", None) is not None else "full_attention"
        types_ = getattr(self.config, "layer_types", None)
        return types_[i] if types_ else "full_attention"

    # -- tensors -----------------------------------------------------------------------------------
    def top_keys(self) -> dict[str, str]:
        """On-disk keys of the embedding, final norm and lm head (tied embeddings fall back to the embedding)."""
        head = "lm_head.weight" if "lm_head.weight" in self.ckpt else "model.embed_tokens.weight"
        return {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": head}

    def _disk_key(self, i: int, name: str) -> str:
        key = f"model.layers.{i}.{name}"
        for mine, theirs in self.family.renames:  # transformers' conversion_mapping renames on load
            if key not in self.ckpt and mine in name:
                alt = f"model.layers.{i}.{name.replace(mine, theirs)}"
                if alt in self.ckpt:
                    return alt
        if key not in self.ckpt and name.startswith("mlp."):
            alt = f"model.layers.{i}.block_sparse_moe.{name[4:]}"  # Mixtral's Hub layout
            if alt in self.ckpt:
                return alt
        return key

    def read_layer(self, i: int, layer: torch.nn.Module, experts: tuple[int, int] | None, pin: bool,
                   device: torch.device | str = "cpu", side_stream=None) -> dict[str, torch.Tensor]:
        """Read layer ``i``'s tensors (only experts [lo, hi) when given) in the module's own key layout.

        Bytes land in pinned memory (when ``pin``), are copied to ``device`` (on ``side_stream``), and
        per-expert tensors are read straight into transformers' fused layout on the host.
        """
        expected = dict(layer.state_dict(keep_vars=True))
        out: dict[str, torch.Tensor] = {}

        def to_dev(t):
            if torch.device(device).type == "cpu":
                return t
            with torch.cuda.stream(side_stream) if side_stream is not None else _null():
                return t.to(device, non_blocking=True)

        n_exp = self.n_routed_experts(layer)
        for name in expected:
            m = re.fullmatch(r"mlp\.experts\.(gate_up_proj|down_proj)(_bias)?", name)
            key = self._disk_key(i, name)
            if m and n_exp:
                lo, hi = experts if experts is not None else (0, n_exp)
                if key in self.ckpt:
                    info = self.ckpt.info(key)
                    if not info.shape or info.shape[0] != n_exp:
                        raise FidevalError(f"{self.ckpt.dir}: tensor {key!r} has shape {list(info.shape)}, "
                                           f"expected {n_exp} experts along dim 0", hint="the checkpoint does not match config.json")
                    out[name] = to_dev(self.read(key, rows=(lo, hi), pin=pin))
                    continue
                if m.group(2):
                    raise FidevalError(f"{self.ckpt.dir}: tensor {key!r} is missing from the checkpoint", hint="re-download it")
                out[name] = to_dev(self._stack_experts(i, m.group(1), lo, hi, pin))
                continue
            if key not in self.ckpt and not expected[name].is_floating_point():
                continue
            out[name] = to_dev(self.read(key, pin=pin))
        return out

    def read(self, key: str, rows: tuple[int, int] | None = None, pin: bool = False):
        """One tensor as stored: an FP8 release's fp8 weight comes with its scales (:class:`fp8_release.Packed`)."""
        if self.release is not None and self.ckpt.info(key).dtype == fp8_release.FP8:
            return fp8_release.read_packed(self.ckpt, key, self.release, rows, pin)
        return self.ckpt.read(key, rows=rows, pin=pin)

    def cast(self, t, dtype: torch.dtype) -> torch.Tensor:
        """``t`` in ``dtype``: fp8 dequantized (one rounding from the float32 product), floats converted."""
        if isinstance(t, fp8_release.Packed):
            return t.dequantize(self.release, dtype)
        return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t

    def _stack_experts(self, i: int, fused: str, lo: int, hi: int, pin: bool):
        """Read per-expert tensors straight into one fused [hi-lo, rows, cols] buffer (no second copy); fp8
        experts' scales likewise into [hi-lo, scale rows of each part, scale cols] (a :class:`fp8_release.Packed`)."""
        for parts in _PER_EXPERT[fused]:
            keys = [[self._disk_key(i, f"mlp.experts.{e}.{p}.weight") for p in parts] for e in range(lo, hi)]
            if keys and keys[0][0] in self.ckpt:
                break
        else:
            raise FidevalError(f"{self.ckpt.dir}: layer {i} has neither fused 'mlp.experts.{fused}' nor per-expert "
                               f"'mlp.experts.<e>.{_PER_EXPERT[fused][0][0]}.weight' tensors",
                               hint="the checkpoint does not match config.json")
        first = [self.ckpt.info(k) for k in keys[0]]
        if any(len(f.shape) != 2 or f.shape[1:] != first[0].shape[1:] or f.dtype != first[0].dtype for f in first):
            raise FidevalError(f"{self.ckpt.dir}: layer {i} expert tensors {keys[0]} have mismatched shapes or dtypes",
                               hint="the checkpoint is corrupt or does not match config.json")
        rows = sum(f.shape[0] for f in first)
        pinned = pin and torch.cuda.is_available()
        buf = torch.empty((hi - lo, rows, first[0].shape[1]), dtype=first[0].dtype, pin_memory=pinned)
        packed = self.release is not None and first[0].dtype == fp8_release.FP8
        if packed:
            srows = [self.release.scale_shape(f.shape)[0] for f in first]
            sbuf = torch.empty((hi - lo, sum(srows), self.release.scale_shape(first[0].shape)[1]), dtype=torch.float32,
                               pin_memory=pinned)
        jobs = []
        for j, ks in enumerate(keys):
            off = soff = 0
            for p, (k, f) in enumerate(zip(ks, first)):
                if packed:
                    jobs.append((k + fp8_release.SUFFIX, sbuf[j, soff:soff + srows[p]]))
                    soff += srows[p]
                info = self.ckpt.info(k)
                if info.shape != f.shape or info.dtype != f.dtype:
                    raise FidevalError(f"{self.ckpt.dir}: tensor {k!r} has shape {list(info.shape)} ({info.dtype}), "
                                       f"expert {lo} has {list(f.shape)} ({f.dtype})",
                                       hint="the checkpoint is corrupt or does not match config.json")
                jobs.append((k, buf[j, off:off + f.shape[0]]))
                off += f.shape[0]
        from fideval.model.weights.reading import reader_pool

        for fut in [reader_pool().submit(self.ckpt.read, k, out=dst) for k, dst in jobs]:
            fut.result()  # re-raises a FidevalError from any read
        return fp8_release.Packed(buf, sbuf, tuple(f.shape[0] for f in first)) if packed else buf

    def materialize(self, i: int, layer: torch.nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                    experts: tuple[int, int] | None,
                    weight_transform: Callable | None) -> torch.nn.Module:
        """Check shapes, cast (dequantize fp8 on its device), apply ``weight_transform`` once, and fill the meta
        layer (assign=True)."""
        n_exp = self.n_routed_experts(layer)
        if n_exp and experts is not None and experts != (0, n_exp):
            self._shrink_experts(layer.mlp.experts, *experts)
        expected = dict(layer.state_dict(keep_vars=True))
        missing = [k for k in expected if k not in tensors and expected[k].is_floating_point()]
        if missing:
            raise FidevalError(f"{self.ckpt.dir}: tensor 'model.layers.{i}.{missing[0]}' is missing from the checkpoint",
                               hint="the checkpoint is incomplete or does not match config.json")
        for name, t in tensors.items():
            want = expected[name]
            if tuple(t.shape) != tuple(want.shape):
                raise FidevalError(f"{self.ckpt.dir}: tensor 'model.layers.{i}.{name}' has shape {list(t.shape)}, "
                                   f"config.json implies {list(want.shape)}", hint="the checkpoint does not match config.json")
            # float32 where the model keeps it: its _keep_in_fp32_modules, or a parameter its own constructor makes
            # float32 whatever the default dtype (HunYuan's router `wg`), which from_pretrained keeps float32 too
            target = torch.float32 if want.dtype == torch.float32 or any(k in name for k in self.keep_fp32) else dtype
            t = self.cast(t, target)
            cls_ = quantized_class(f"model.layers.{i}.{name}", t.shape, t.is_floating_point())
            if weight_transform is not None and cls_ is not None:
                t = self.transform(weight_transform, cls_, f"model.layers.{i}.{name}", t, layer, owned=True)
            tensors[name] = t
        layer.load_state_dict(tensors, strict=True, assign=True)
        return layer.eval()

    def transform(self, fn: Callable, cls_: str, name: str, t: torch.Tensor, layer=None, owned: bool = False) -> torch.Tensor:
        """``fn`` always sees weights as [..., out, in] (input dim last, the dim quantization blocks run along).

        ``owned``: ``t`` is this load's own fresh tensor, so a ``fn`` that takes ``out=`` (a compiled quant spec's)
        writes its result into it: a fused expert tensor (15 GB of DeepSeek-V3's ``gate_up_proj`` in bf16) is
        quantized in place instead of beside a second copy of itself on the device."""
        transposed = bool(cls_ == "routed_experts" and layer is not None and getattr(layer.mlp.experts, "is_transposed", False))
        x = t.transpose(-1, -2) if transposed else t
        y = transform_weight(fn, cls_, name, x, out=x if owned else None).to(t.dtype)
        return (y.transpose(-1, -2) if transposed else y).contiguous()

    @staticmethod
    def _shrink_experts(experts: torch.nn.Module, lo: int, hi: int) -> None:
        for pname, p in list(experts.named_parameters(recurse=False)):
            if p.shape and p.shape[0] == experts.num_experts:
                setattr(experts, pname, torch.nn.Parameter(torch.empty((hi - lo, *p.shape[1:]), dtype=p.dtype, device="meta"),
                                                           requires_grad=False))
        experts.num_experts = hi - lo
        experts._is_expert_parallel = True


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
