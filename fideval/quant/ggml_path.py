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
(F32 in llama-quantize's output). DeepSeek's split ``attn_k_b``/``attn_v_b`` (MLA absorbed into the query and the
output, over an F16 latent cache) is a different graph from transformers' ``kv_b_proj``: its input is left as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import torch

from fideval.errors import FidevalError
from fideval.quant.ggml_activations import act_type, quant_dequant
from fideval.quant.module_classes import is_quantized_tensor, module_class_of

EMBED = "model.embed_tokens.weight"
DESCRIPTION = "ggml CPU (x86 AVX2 build): Q8_0 / Q8_1 / Q8_K / F16 by each tensor's GGML type"
_SAME = {"Q8_1": "Q8_0"}  # equal dequantized values
_CURRENT = threading.local()
_TRACKING: list = []


def _track() -> None:
    """Register, once per process, the global forward pre-hook that notes the module being called (:data:`_CURRENT`)."""
    if not _TRACKING:
        def note(module, args):
            # what is needed of the module, never the module itself: a reference kept here would keep the last
            # module called (a layer, the lm head: gigabytes at full size) alive after the runner drops it
            _CURRENT.out_features, _CURRENT.kind = getattr(module, "out_features", None), type(module).__name__

        _TRACKING.append(torch.nn.modules.module.register_module_forward_pre_hook(note))


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
        if op == "kv_b":  # llama.cpp's absorbed MLA: not transformers' kv_b_proj input (module docstring): left as it is
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
        for w in {w for w, o in row if o is None}:  # stacked experts: told apart by width only
            if len({_SAME.get(k, k) for (w2, _), k in row.items() if w2 == w}) > 1:
                raise FidevalError(f"{where}: path 'llamacpp': {cls} inputs of width {w} enter tensors with different "
                                   "activation formats, and the experts' inputs are told apart by width only",
                                   hint="score this build on weights-only")
    return result


def act_transform(table: dict[str, dict[tuple[int, int | None], str]],
                  variant: str = "x86") -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The runner's ``act_transform``: per module class, ggml's rounding of an input by its width and, where the width
    alone is ambiguous, the called linear's output size (:func:`act_table`)."""

    def make(cls: str, row: dict[tuple[int, int | None], str]) -> Callable[[torch.Tensor], torch.Tensor]:
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
            return quant_dequant(x, kind, variant)

        f.ggml_table = dict(row)  # type: ignore[attr-defined]
        return f

    return {cls: make(cls, row) for cls, row in sorted(table.items()) if any(k != "F32" for k in row.values())}


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
    width alone does not decide)."""
    out = {}
    for cls, row in sorted(table.items()):
        kinds: dict[int, set[str]] = {}
        for (w, _), k in row.items():
            kinds.setdefault(w, set()).add(_SAME.get(k, k))
        rec = {}
        for (w, o), k in sorted(row.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            rec[str(w) if len(kinds[w]) == 1 else f"{w}x{o}"] = k
        out[cls] = rec
    return out
