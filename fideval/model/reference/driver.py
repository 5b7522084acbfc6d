"""The contract between the reference-code runner and one model family's driver, and the registry.

A driver runs the vendor's own modules for every position, layer by layer, the way the vendor's
``Transformer.forward`` composes them (which returns the last position only). The runner
(:mod:`fideval.model.reference.runner`) owns chunking, micro-batches, prefetch, the canary, model-parallel
setup and the store; the driver owns everything that is the family's: the vendor ``ModelArgs`` built from
the checkpoint's config, the module globals set before building (``world_size``, ``rank``, dtype, scale
format), the HF-release -> vendor name map with per-rank slicing (what the vendor's ``convert.py`` does, on
load, with no converted copy written), and the state carried between layers (V3: ``h``; V3.2: ``(h,
residual)``; V4.1: hyper-connection streams plus the shared compressed-KV/indexer slots).

Contract (every method runs under ``torch.inference_mode``):

* ``Driver(code, config, weights, *, rank, world, group, device, dtype, weight_transform, act_transform)``
  -- ``code``: :class:`~fideval.model.reference.code.VendorCode`; ``config``: the checkpoint's config.json
  as a dict; ``weights``: a :class:`~fideval.model.weights.checkpoint.WeightSource` (HF release names; a real
  quantized build's decoded tensors under the same names); ``weight_transform(module_class, hf_name,
  tensor) -> tensor`` and ``act_transform`` (module class -> fn on that class's input activations), the
  quant spec's hooks (:mod:`fideval.quant.module_classes` names the classes; None: the reference itself).
  A config the vendor's ``ModelArgs`` rejects, a run dtype the vendor's code cannot compute in (V4.1:
  bfloat16 only), or a world size that does not divide the experts or the vocabulary, is a one-line
  :class:`~fideval.errors.FidevalError` here, before any weight is read. ``weights`` may be
  :class:`~fideval.model.reference.runner.ConfigOnly` (``weights.config_only``: ``fideval validate`` and the
  verbs' checks before their output exists): then check and size only, joining or creating no process group.
  Otherwise the driver sets up what its vendor code needs of torch.distributed: with ``world > 1`` the default
  process group exists (torchrun) and ``group`` is it or None; with ``world == 1`` a family whose code calls
  collectives unguarded (V3.2's indexer broadcast) creates a one-process group itself.
* optional classmethod ``stand_ins(device, dtype) -> (modules, prefer_vendor)``: what
  :func:`~fideval.model.reference.code.load_vendor_code` gets for this family's kernel modules (V3: torch
  stand-ins for ``kernel``, the vendor's Triton preferred on a GPU only; V3.2: for ``kernel`` and
  ``fast_hadamard_transform``, the vendor's tilelang preferred on a GPU in bfloat16 only); absent (V4.1, whose
  code imports its own ``kernel_cpu``): no stand-ins, vendor preferred.
  Keyword options past the contract's (V3: ``gemm_impl``, ``attn_impl``) come from ``RunnerOptions.reference``.
* ``n_layers``, ``vocab_size``, ``hidden_size`` (ints); ``kernels``: function -> what computed it (read again
  after a run: a driver may add what it learnt while loading, V4.1's per-class linear paths).
* optional ``sizing_config() -> dict``: what :mod:`fideval.model.sizing` and :mod:`fideval.model.flops` read, in
  transformers' key names, for a family transformers has no config of (V4.1); absent: the checkpoint's
  config.json (V3, V3.2). Optional ``describe() -> dict``: the model as report.json records it (V4.1).
* optional ``routing() -> gate_routes.Routing``: the MoE layers, their experts and top-k, and the vendor's ``Gate``
  class, whose output the runner's hooks record and force (:mod:`fideval.model.reference.gate_routes`); absent:
  routes are refused for the family.
* ``begin(tokens) -> state``: embedding (and any per-sequence setup: Engram n-gram ids, rotary tables,
  masks) for ``tokens`` int64 [B, L] on the device, positions 0..L-1.
* ``load_layer(i) -> module``: build layer ``i`` with the vendor's classes (on the meta device or small,
  then materialised) and load its weights (this rank's slice, transforms applied). Thread-safe: the runner
  calls it on a prefetch thread for layer i+1 while layer i computes.
* ``forward_layer(i, module, state) -> state``: the vendor's block on every position (start_pos 0, caches
  sized for B x L, freshly reset for each call).
* ``finish(state) -> logits``: final norm and the head in float32 over every position, full vocabulary on
  every rank (gathered as the vendor does): float32 [B, L, V]. ``head_input(state)``: what ``finish`` hands its
  head (the final norm's output); ``head_weight()``: this rank's head rows as ``finish`` applies them (the runner's
  bf16 head and a hidden store's head come from these two).
* optional ``preload(part)``: load what every chunk reuses -- ``embed`` (the embedding) or ``head`` (final norm
  and head) -- once, kept; the runner calls it on its prefetch thread (on a GPU, on its load stream).
* ``vendor_logits(tokens, prepare=None) -> logits`` (tests only): the vendor's own ``Transformer.forward`` on
  the same weights, float32 [B, V] at the last position -- the parity oracle (``prepare(model)``: a test's own
  hooks on the vendor's model before it runs).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import torch

from fideval.errors import FidevalError

# family -> "module:Class" of its driver
DRIVERS = {
    "deepseek-v3": "fideval.model.reference.deepseek_v3:DeepseekV3Driver",
    "deepseek-v3.2": "fideval.model.reference.deepseek_v32:DeepseekV32Driver",
    "deepseek-v4.1": "fideval.model.reference.deepseek_v41:DeepseekV41Driver",
}


class Driver(Protocol):
    n_layers: int
    vocab_size: int
    hidden_size: int
    kernels: dict[str, str]

    def begin(self, tokens: torch.Tensor) -> Any: ...

    def load_layer(self, i: int) -> torch.nn.Module: ...

    def forward_layer(self, i: int, module: torch.nn.Module, state: Any) -> Any: ...

    def finish(self, state: Any) -> torch.Tensor: ...


def family_of(config: dict, model_module) -> str:
    """The driver family for a checkpoint: config.json's model_type where it names one, else the vendor
    module's own shape (V4.1's released config.json has no model_type; its code defines hyper-connections)."""
    mt = config.get("model_type")
    by_type = {"deepseek_v3": "deepseek-v3", "kimi_k2": "deepseek-v3", "deepseek_v32": "deepseek-v3.2",
               "deepseek_v4": "deepseek-v4.1"}
    if mt in by_type:
        fam = by_type[mt]
    elif hasattr(model_module, "make_identity_pre_mix") or "hc_mult" in config:
        fam = "deepseek-v4.1"
    elif hasattr(model_module, "Indexer"):
        fam = "deepseek-v3.2"
    elif hasattr(model_module, "MLA") and hasattr(model_module, "Block"):
        fam = "deepseek-v3"
    else:
        raise FidevalError(f"no reference-code driver for model_type {mt!r}",
                           hint=f"reference-code drivers: {', '.join(DRIVERS)}; use model.implementation: transformers")
    # a model_type naming one family with code of another (e.g. V3 config, V3.2 code) is caught by the driver's
    # own class checks (code.require)
    return fam


def driver_class(family: str):
    mod, _, cls = DRIVERS[family].partition(":")
    return getattr(importlib.import_module(mod), cls)
