"""The ``llamacpp`` path: a GGUF candidate's weights as stored, and before each of its linears the activation rounding
llama.cpp's CPU backend applies for that tensor's GGML type (:mod:`fideval.quant.ggml_activations`).

The runner hooks activations by module class (``act_transform``: class -> fn, on the first input of every linear of the
class, the routed experts' gate/up and down inputs included, the lm head's hidden states), while a GGUF gives each tensor
its own type: llama-quantize's Q4_K_M puts ``attn_k``/``attn_v`` of an 8-expert MoE in Q8_0 (Q8_0 activations) beside a
Q4_K ``attn_q`` (Q8_K), all three reading the same hidden state. So a class's function picks the activation format by the
input's width (the tensor's ``ne[0]``, a ggml row) and, where tensors of one width disagree, by the linear it is called
for (its ``out_features``: a process-wide module forward pre-hook, :func:`_track`, notes the called module's
``out_features`` -- never the module, which it would keep alive --; torch
runs global pre-hooks before a module's own, so the runner's hook sees it). Q8_0 and Q8_1 count as one format (their
dequantized values are the same). Tensors that would still be ambiguous (same width and output size, different formats;
routed experts of one width) are refused in one line.

Not a matmul in llama.cpp's graph and so left alone: the token embedding (``get_rows``), norms, biases and routers
(F32 in llama-quantize's output).

MLA (DeepSeek-V2/V3, GLM-4.7-Flash: llama.cpp's ``deepseek2``) with the converter's split ``attn_k_b``/``attn_v_b``:
llama.cpp absorbs them (``build_attn`` with ``wv_b`` as ``v_mla``): per head, the scores are
``(wk_b^T q_nope) . c`` and the output ``wv_b (softmax . c)`` over the cached latent ``c``, so the two quantized matmuls
round ``q_nope`` (rows of ``qk_nope_head_dim``) and the per-head latent attention output (rows of ``kv_lora_rank``) --
neither is an input of a transformers linear (``kv_b_proj`` reads ``c``, which llama.cpp never multiplies by
``wkv_b``: left as it is). :func:`act_transform` therefore also recomputes the attention core of such a module
(:func:`_mla_output`): a process-wide forward hook keeps the module's own ``q``/``q_b`` and ``kv_a`` outputs during its
call and, where the path's ``attention`` function ran inside it, replaces the module's output with
``o_proj(concat_h wv_b_h r_v(P_h c))``, ``P_h = softmax(scale * (r_k(q_nope_h) . wk_b_h c + q_rot_h . k_rot))``
(``r_k``/``r_v``: the rounding of ``attn_k_b``'s / ``attn_v_b``'s activation type, float32 arithmetic, the module's
own rope function). ``o_proj`` runs a second time on the new input (its hooks round it as any ``o_proj`` input); the
first result is dropped. Not emulated: llama.cpp's F16 K cache (``c``, ``k_rot``), the query and the probabilities
rounded to F16 for the F16 dot products, flash attention's order (docs/quant.md measures what that leaves).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import torch

from fideval.errors import FidevalError
from fideval.quant.ggml_activations import act_type, quant_dequant
from fideval.quant.module_classes import is_quantized_tensor, module_class_of

EMBED = "model.embed_tokens.weight"
# the table's pseudo class of llama.cpp's absorbed MLA: {(attn_k_b's ne0, MLA_K): type, (attn_v_b's ne0, MLA_V): type}
MLA, MLA_K, MLA_V = "mla", 0, 1
DESCRIPTION = "ggml CPU (x86 AVX2 build): Q8_0 / Q8_1 / Q8_K / F16 by each tensor's GGML type"
_SAME = {"Q8_1": "Q8_0"}  # equal dequantized values
_CURRENT = threading.local()
_TRACKING: list = []


def _is_mla(module) -> bool:
    return hasattr(module, "kv_b_proj") and hasattr(module, "kv_lora_rank") and hasattr(module, "kv_a_proj_with_mqa")


def _track() -> None:
    """Register, once per process, the global forward pre-hook that notes the module being called (:data:`_CURRENT`)
    and, for MLA attention modules, the pre- and post-hooks of :func:`_mla_output` (which act only where a
    ``llamacpp`` ``attention`` function ran inside the module's call: other runs in the process are left as they are)."""
    if not _TRACKING:
        def note(module, args):
            # what is needed of the module, never the module itself: a reference kept here would keep the last
            # module called (a layer, the lm head: gigabytes at full size) alive after the runner drops it
            _CURRENT.out_features, _CURRENT.kind = getattr(module, "out_features", None), type(module).__name__
            if _is_mla(module):  # a new MLA call: which submodules' outputs to keep (ids only), nothing kept yet
                q = module.q_proj if getattr(module, "q_lora_rank", None) is None else module.q_b_proj
                _CURRENT.mla_call, _CURRENT.mla_kinds = {id(q): "q", id(module.kv_a_proj_with_mqa): "kv_a"}, None
                _CURRENT.mla_out = {}

        def keep(module, args, kwargs, output):
            call = getattr(_CURRENT, "mla_call", None)
            if call and id(module) in call:
                _CURRENT.mla_out[call[id(module)]] = output
                return None
            if call is None or not _is_mla(module):
                return None
            kinds, outs = _CURRENT.mla_kinds, _CURRENT.mla_out
            _CURRENT.mla_call, _CURRENT.mla_kinds, _CURRENT.mla_out = None, None, {}
            if kinds is None:  # no llamacpp attention function in this call (a teacher, another path)
                return None
            new = _mla_output(module, args, kwargs, outs, *kinds)
            return (new, *output[1:]) if isinstance(output, tuple) else new

        # marked: the reference code's grouped experts (fideval.model.reference.grouped_experts) leave global hooks
        # alone only where they are these, which act on nothing outside a llamacpp run's own modules
        note.fideval_tracking = keep.fideval_tracking = True
        _TRACKING.append(torch.nn.modules.module.register_module_forward_pre_hook(note))
        _TRACKING.append(torch.nn.modules.module.register_module_forward_hook(keep, with_kwargs=True))


def _mla_output(module, args, kwargs, outs: dict, k_kind: str, v_kind: str, variant: str) -> torch.Tensor:
    """The attention output of MLA module ``module`` as llama.cpp's absorbed graph computes it (module docstring),
    from the call's own ``q`` and ``kv_a`` outputs (``outs``)."""
    import inspect
    import sys

    bound = inspect.signature(type(module).forward).bind(module, *args, **kwargs).arguments
    x, extra = bound["hidden_states"], bound.get("kwargs") or {}
    cache = bound.get("cache", bound.get("past_key_values", extra.get("past_key_values")))
    if cache is not None or "q" not in outs or "kv_a" not in outs:
        raise FidevalError(f"path 'llamacpp': {type(module).__name__} was called with a KV cache or without its own "
                           "projections, so its absorbed MLA cannot be recomputed",
                           hint="score this build on weights-only")
    b, t = x.shape[:-1]
    h, nope, rope = module.num_heads, module.qk_nope_head_dim, module.qk_rope_head_dim
    r, vd = module.kv_lora_rank, module.v_head_dim
    q = outs["q"].view(b, t, h, nope + rope).transpose(1, 2)
    q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)
    kv_nope, k_rot = torch.split(outs["kv_a"], [r, rope], dim=-1)
    c = module.kv_a_layernorm(kv_nope).view(b, 1, t, r)
    k_rot = k_rot.view(b, 1, t, rope)
    fam = sys.modules[type(module).__module__]
    pe = bound.get("position_embeddings")
    if hasattr(fam, "apply_rotary_pos_emb_interleave") and getattr(module.config, "rope_interleave", False):
        q_rot, k_rot = fam.apply_rotary_pos_emb_interleave(q_rot, k_rot, *pe)
    elif hasattr(fam, "apply_rotary_pos_emb"):
        q_rot, k_rot = fam.apply_rotary_pos_emb(q_rot, k_rot, *pe)
    elif hasattr(fam, "apply_rotary_emb"):  # DeepSeek-V2: complex frequencies
        q_rot, k_rot = fam.apply_rotary_emb(q_rot, k_rot, pe.to(q_rot.device))
    else:
        raise FidevalError(f"path 'llamacpp': no rope function known for {type(module).__name__}",
                           hint="score this build on weights-only")
    w = module.kv_b_proj.weight.view(h, nope + vd, r)
    w_k, w_v = w[:, :nope].float(), w[:, nope:].float()
    k_nope = torch.einsum("hnr,bztr->bhtn", w_k, c.float())  # wk_b c, per head (z: the latent's single head)
    scores = (torch.matmul(quant_dequant(q_nope.float(), k_kind, variant), k_nope.transpose(2, 3))
              + torch.matmul(q_rot.float(), k_rot.float().transpose(2, 3))) * module.scaling
    mask = bound.get("attention_mask")
    if mask is None:
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    latent = torch.matmul(torch.softmax(scores, -1), c.float())  # [b, h, t, r]: softmax . c
    out = torch.einsum("hvr,bhtr->bthv", w_v, quant_dequant(latent, v_kind, variant)).reshape(b, t, h * vd)
    return module.o_proj(out.to(x.dtype))


def act_table(entries: Iterable[tuple[str, tuple[int, ...], str, list[tuple[str, int, str]]]], *, tied: bool = False,
              where: str = "GGUF") -> dict[str, dict[tuple[int, int | None], str]]:
    """``{module class: {(input width, output size or None): activation type}}`` from ``(hf name, hf shape, converter
    op, [(gguf name, ne0, ggml type)])`` per tensor (the output size of a 2-D linear, None for stacked experts);
    ``tied``: the embedding is also the lm head (a GGUF without ``output.weight``)."""
    table: dict[str, dict[tuple[int, int | None], tuple[str, str]]] = {}
    for hf, shape, op, parts in entries:
        cls = "lm_head" if tied and hf == EMBED else module_class_of(hf)
        if cls is None or not is_quantized_tensor(hf, shape):
            continue
        out = int(shape[0]) if len(shape) == 2 else None
        if op == "kv_b":  # llama.cpp's absorbed MLA (module docstring): kv_b_proj's input left as it is; the query's
            # nope part (attn_k_b's ne0) and the latent attention output (attn_v_b's ne0) rounded by their own types
            (kb, kb0, kbt), (vb, vb0, vbt) = parts
            for name, ne0, ty, which in ((kb, kb0, kbt, MLA_K), (vb, vb0, vbt, MLA_V)):
                kind, row = act_type(ty), table.setdefault(MLA, {})
                seen = row.get((int(ne0), which))
                if seen is not None and _SAME.get(seen[1], seen[1]) != _SAME.get(kind, kind):
                    raise FidevalError(f"{where}: path 'llamacpp': MLA tensors {seen[0]} ({seen[1]} activations) and "
                                       f"{name} ({kind}) differ between layers, and one absorbed attention is emulated "
                                       "for all of them", hint="score this build on weights-only")
                row.setdefault((int(ne0), which), (name, kind))
            parts = [("+".join(p for p, _, _ in parts), int(shape[-1]), "F32")]
        for name, ne0, ty in parts:
            kind, row = act_type(ty), table.setdefault(cls, {})
            seen = row.get((int(ne0), out))
            if seen is not None and _SAME.get(seen[1], seen[1]) != _SAME.get(kind, kind):
                raise FidevalError(f"{where}: path 'llamacpp': {cls} tensors {seen[0]} ({seen[1]} activations) and {name} "
                                   f"({kind}) have the same shape, so the runner cannot hook their inputs apart",
                                   hint="score this build on weights-only (per-tensor activation hooks are not built yet)")
            row.setdefault((int(ne0), out), (name, kind))
    result = {cls: {k: kind for k, (_, kind) in row.items()} for cls, row in table.items()}
    for cls, row in result.items():
        if cls == MLA:
            continue
        for w in {w for w, o in row if o is None}:  # stacked experts: told apart by width only
            if len({_SAME.get(k, k) for (w2, _), k in row.items() if w2 == w}) > 1:
                raise FidevalError(f"{where}: path 'llamacpp': {cls} inputs of width {w} enter tensors with different "
                                   "activation formats, and the experts' inputs are told apart by width only",
                                   hint="score this build on weights-only")
    return result


def act_transform(table: dict[str, dict[tuple[int, int | None], str]],
                  variant: str = "x86") -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The runner's ``act_transform``: per module class, ggml's rounding of an input by its width and, where the width
    alone is ambiguous, the called linear's output size (:func:`act_table`). With an ``mla`` entry the ``attention``
    function also marks each call of an MLA module for :func:`_track`'s hook (the absorbed attention, module docstring)."""

    def make(cls: str, row: dict[tuple[int, int | None], str],
             mla: tuple[str, str, str] | None) -> Callable[[torch.Tensor], torch.Tensor]:
        by_width: dict[int, set[str]] = {}
        for (w, _), k in row.items():
            by_width.setdefault(w, set()).add(_SAME.get(k, k))
        if any(len(ks) > 1 for ks in by_width.values()):
            _track()

        def f(x: torch.Tensor) -> torch.Tensor:
            w = int(x.shape[-1])
            kinds = by_width.get(w)
            if kinds is None:
                raise FidevalError(f"path 'llamacpp': a {cls} input of width {w} matches no GGUF tensor of the class",
                                   hint=f"widths known: {sorted(by_width)}; score this build on weights-only")
            if len(kinds) == 1:
                kind = next(iter(kinds))
            else:
                kind = row.get((w, getattr(_CURRENT, "out_features", None)))
                if kind is None:
                    raise FidevalError(f"path 'llamacpp': a {cls} input of width {w} enters a module "
                                       f"({getattr(_CURRENT, 'kind', None)}) no GGUF tensor of the class matches",
                                       hint="score this build on weights-only")
            if mla is not None:  # this attention call is an absorbed MLA: _track's hook recomputes its core
                _CURRENT.mla_kinds = mla
            return quant_dequant(x, kind, variant)

        f.ggml_table = dict(row)  # type: ignore[attr-defined]
        return f

    mla_row = table.get(MLA)
    mla = None
    if mla_row:
        kinds = {which: k for (_, which), k in mla_row.items()}
        mla = (kinds[MLA_K], kinds[MLA_V], variant)
        _track()
    return {cls: make(cls, row, mla if cls == "attention" else None) for cls, row in sorted(table.items())
            if cls != MLA and (any(k != "F32" for k in row.values()) or (cls == "attention" and mla is not None))}


def for_checkpoint(ckpt) -> dict[str, dict[tuple[int, int | None], str]]:
    """:func:`act_table` of a real GGUF (:class:`fideval.model.weights.gguf_checkpoint.GGUFCheckpoint`): its own types."""
    tied = "lm_head.weight" not in ckpt.logical and bool(ckpt.config_dict.get("tie_word_embeddings", False))
    entries = [(hf, lg.shape, lg.source.op, [(p, int(ckpt._tensors[p].shape[0]), ckpt.types[p]) for p in lg.parts])
               for hf, lg in ckpt.logical.items()]
    return act_table(entries, tied=tied, where=str(ckpt.dir))


def for_mix(spec) -> dict[str, dict[tuple[int, int | None], str]]:
    """:func:`act_table` of a ``gguf_mix`` emulation (:class:`fideval.quant.gguf_mix_spec.MixSpec`): the mix's plan.
    Tensors llama-quantize leaves unquantized keep the F32 the plan assumes for the conversion (the runner's own
    float weights)."""
    from fideval.quant.gguf_mixes import allows_quantization

    entries = [(hf, spec.shapes[hf], src.op, [(n, int(ne[0]), t if allows_quantization(n, ne, spec.arch) else "F32")
                                              for n, ne, t in parts])
               for hf, (src, parts) in spec.plan.items()]
    return act_table(entries, tied=spec.tied, where=f"gguf_mix {spec.mix}")


def summary(table: dict[str, dict[tuple[int, int | None], str]]) -> dict[str, dict[str, str]]:
    """score.json's record of the table: ``{class: {"<in>" or "<in>x<out>": type}}`` (the output size where the
    width alone does not decide); an absorbed MLA adds ``{"mla": {"q_nope <w>": type, "latent <w>": type}}``."""
    out = {}
    for cls, row in sorted(table.items()):
        if cls == MLA:  # {"q_nope <width>": type, "latent <width>": type}
            out[cls] = {f"{'q_nope' if which == MLA_K else 'latent'} {w}": k for (w, which), k in sorted(row.items())}
            continue
        kinds: dict[int, set[str]] = {}
        for (w, _), k in row.items():
            kinds.setdefault(w, set()).add(_SAME.get(k, k))
        rec = {}
        for (w, o), k in sorted(row.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            rec[str(w) if len(kinds[w]) == 1 else f"{w}x{o}"] = k
        out[cls] = rec
    return out
