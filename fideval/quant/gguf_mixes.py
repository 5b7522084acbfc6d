"""llama-quantize's named mixes (``Q4_K_M``, ``Q5_K_M``, ``Q3_K_M``, ``IQ4_XS``, ``Q8_0`` ...): which GGML type each
tensor of a GGUF gets, as llama.cpp decides it.

Transcribed from ``src/llama-quant.cpp`` of the llama.cpp that llama-cpp-python 0.3.36 vendors
(``llama_tensor_get_type``, ``llama_tensor_get_type_impl``, ``tensor_type_fallback``,
``tensor_allows_quantization``, ``init_quantize_state_counters``), for llama-quantize's defaults (no
``--pure``, ``--tensor-type``, ``--output-tensor-type``, ``--token-embedding-type``, ``--leave-output-tensor``).
Why it is a stateful walk and not a table: the rule for ``attn_v`` counts the ``attn_v``-like tensors
(``attn_v``, ``attn_qkv``, ``attn_kv_b``) *in the order llama.cpp visits them* (by layer number, then name:
``weight_name_comparer``), and a dense model's ``ffn_down`` takes its layer from a counter as well (an MoE's from
the name); ``use_more_bits(i, n)`` then gives more bits to the first and last eighth of the layers and every
third layer between. A mix also depends on the model: ``n_expert`` (8 experts bump ``attn_v``/``attn_k`` to
Q8_0), ``n_gqa`` (>= 4 bumps ``attn_v`` for Q2_K, IQ4_XS...), the architecture (falcon), a 70B llama, whether
the output shares the token embedding (no ``output.weight``: ``token_embd`` is then treated as the output,
Q6_K), and whether an importance matrix is given. Last, a type whose block does not divide the row length
(``ne[0]``, the input dimension) falls back: Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
IQ4_XS -> IQ4_NL, and to F16 when even 32 does not divide it.

Only the mixes whose types fideval emulates are offered (:data:`MIXES`); the i-quant mixes below IQ4 need an
importance matrix and types fideval does not encode. Oracle: llama-quantize itself, on tiny converted models
(``tools/llamacpp/mix_vectors.py`` -> ``tests/data/llamacpp/mix_vectors.json``, ``tests/test_quant_gguf_mixes.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fideval.errors import FidevalError

# mix (llama-quantize's name) -> its default type (llama_ftype_get_default_type)
MIXES = {
    "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0",
    "Q2_K": "Q2_K", "Q2_K_S": "Q2_K", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K",
    "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K",
    "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "MXFP4_MOE": "MXFP4", "F16": "F16", "BF16": "BF16", "F32": "F32",
}
BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "IQ4_NL": 32, "MXFP4": 32,
         "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256, "F16": 1, "BF16": 1, "F32": 1}
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}
_NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                  "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                  "indexer.q_proj.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
                  "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
                  *(f"time_mix_{k}.weight" for k in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2",
                                                    "g1", "g2", "decay_w1", "decay_w2", "lerp_fused")))
_GLM5_NEXT_KEEP = ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
                   "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
                   "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight")
_BLK = re.compile(r"^blk\.(-?\d+)\.")
_70B_LAYERS = {"llama": 80, "qwen2": 80, "olmo": 80, "deci": 80, "jais2": 68}  # models/<arch>.cpp: LLM_TYPE_70B


@dataclass(frozen=True)
class MixModel:
    """What llama-quantize reads from the model besides tensor names and shapes (GGUF metadata keys
    ``general.architecture``, ``<arch>.block_count``, ``<arch>.expert_count``, ``<arch>.attention.head_count``,
    ``<arch>.attention.head_count_kv``; layer 0's head counts)."""

    arch: str
    n_layer: int
    n_expert: int = 0
    n_head: int = 1
    n_head_kv: int = 1

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        if self.n_layer != _70B_LAYERS.get(self.arch):
            return False
        return self.arch != "llama" or self.n_head != self.n_head_kv  # an 80-layer llama with MHA is the 65B


def category(name: str) -> str:
    """``tensor_get_category``: substring tests in llama.cpp's order."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def n_dims(ne: Sequence[int]) -> int:
    """``ggml_n_dims``: trailing dimensions of 1 do not count."""
    ne = list(ne) + [1] * (4 - len(ne))
    return next((i + 1 for i in range(3, 0, -1) if ne[i] > 1), 1)


def allows_quantization(name: str, ne: Sequence[int], arch: str) -> bool:
    """``tensor_allows_quantization`` with llama-quantize's defaults."""
    if n_dims(ne) < 2 or not name.endswith("weight"):
        return False
    if any(k in name for k in _NOT_QUANTIZED) or name in ("position_embd.weight", "token_types.weight"):
        return False
    return not (arch == "glm5-next" and any(k in name for k in _GLM5_NEXT_KEEP))


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(name: str, ncols: int, t: str) -> str:
    if ncols % BLOCK[t] == 0:
        return t
    out = FALLBACK.get(t, t)  # a 32-block type has nowhere smaller to go: F16 below
    return out if ncols % BLOCK[out] == 0 else "F16"


class _Walk:
    """One pass of llama-quantize over a model's tensors: the counters of ``quantize_state_impl``."""

    def __init__(self, mix: str, model: MixModel, names: Iterable[str], has_imatrix: bool):
        self.ftype, self.m, self.has_imatrix = mix, model, has_imatrix
        cats = [category(n) for n in names]
        self.n_attention_wv = sum(c in ("attn_v", "attn_qkv", "attn_kv_b") for c in cats)
        self.tied = "output" not in cats
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0

    def _layer(self, counter: int, name: str) -> int:
        """``layer_info``: an MoE's layer comes from the name (its experts are not in layer order), else the counter."""
        if max(1, self.m.n_expert) == 1:
            return counter
        m = _BLK.match(name)
        if not m:
            raise FidevalError(f"gguf mix: cannot tell the layer of {name}", hint="llama-quantize refuses it too")
        i = int(m.group(1))
        if not 0 <= i < self.m.n_layer:
            raise FidevalError(f"gguf mix: layer {i} of {name} is outside [0, {self.m.n_layer})",
                               hint="llama-quantize refuses it too")
        return i

    def choose(self, name: str, ne: Sequence[int], t: str) -> str:  # noqa: C901 (llama.cpp's chain, kept as one)
        """``llama_tensor_get_type_impl`` for one tensor (``t`` the mix's default type), counters advanced."""
        f, m, cat, n_layer = self.ftype, self.m, category(name), self.m.n_layer
        if m.arch == "glm5-next" and any(k in name for k in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
            return t if t in ("F32", "BF16", "F16") else "Q8_0"
        if cat == "output" or (self.tied and cat == "token_embd"):
            if f == "MXFP4_MOE" or m.arch == "falcon" or ne[0] % BLOCK[t]:
                return "Q8_0"
            return t if t == "Q8_0" else "Q6_K"
        if f == "MXFP4_MOE":
            experts = m.arch != "bailingmoe3" or cat in ("ffn_up", "ffn_gate", "ffn_down")
            return "MXFP4" if len(ne) > 2 and ne[2] > 1 and experts else "Q8_0"
        if cat == "token_embd":
            return t
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            i, n = self.i_attention_wv, self.n_attention_wv
            if f == "Q2_K":
                t = "Q4_K" if m.n_gqa >= 4 else "Q3_K"
            elif f == "Q2_K_S" and m.n_gqa >= 4:
                t = "Q4_K"
            elif f == "Q3_K_M":
                t = "Q5_K" if i < 2 else "Q4_K"
            elif f == "Q3_K_L":
                t = "Q5_K"
            elif f in ("IQ4_NL", "IQ4_XS") and m.n_gqa >= 4:
                t = "Q5_K"
            elif f in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
                t = "Q6_K"
            elif f == "Q4_K_S" and i < 4:
                t = "Q5_K"
            if m.is_70b and t in ("Q3_K", "Q4_K"):
                t = "Q5_K"
            if m.n_expert == 8:
                t = "Q8_0"
            self.i_attention_wv += 1
        elif cat == "attn_k":
            if m.n_expert == 8:
                t = "Q8_0"
        elif cat == "ffn_down":
            i = self._layer(self.i_ffn_down, name)
            falcon = m.arch == "falcon"
            if f == "Q2_K":
                t = "Q3_K"
            elif f == "Q2_K_S":
                t = "Q4_K" if i < n_layer // 8 else t
            elif f == "Q3_K_M":
                t = ("Q5_K" if i < n_layer // 16 else
                     "Q4_K" if not falcon or _use_more_bits(i, n_layer) else "Q3_K")
            elif f == "Q3_K_L":
                t = "Q4_K" if falcon else "Q5_K"
            elif f == "Q4_K_M":
                if falcon:
                    t = "Q6_K" if i < n_layer // 16 else "Q5_K" if _use_more_bits(i, n_layer) else "Q4_K"
                elif _use_more_bits(i, n_layer):
                    t = "Q6_K"
            elif i < n_layer // 8 and f in ("IQ4_NL", "IQ4_XS") and not self.has_imatrix:
                t = "Q5_K"
            elif f == "Q5_K_M" and _use_more_bits(i, n_layer):
                t = "Q6_K"
            elif f == "Q4_K_S" and not falcon and i < n_layer // 8:
                t = "Q5_K"
            elif f in ("Q4_0", "Q5_0") and self.has_imatrix and i < n_layer // 8:
                t = "Q4_1" if f == "Q4_0" else "Q5_1"
            self.i_ffn_down += 1
        elif cat == "attn_output":
            if m.arch != "falcon":
                if m.n_expert == 8:
                    if f in ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"):
                        t = "Q5_K"
                else:
                    t = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(f, t)
            elif f == "Q3_K_L":
                t = "Q4_K"
        elif cat == "ffn_gate":
            self._layer(self.i_ffn_gate, name)  # only IQ3_XS (not offered) changes the type; the check still runs
            self.i_ffn_gate += 1
        elif cat == "ffn_up":
            self._layer(self.i_ffn_up, name)
            self.i_ffn_up += 1
        return t


def _order(name: str) -> tuple[int, str]:
    """``weight_name_comparer``: by ``blk.N.`` (-1 for tensors outside the blocks), then by name."""
    m = _BLK.match(name)
    return (int(m.group(1)) if m else -1, name)


def mix_types(mix: str, model: MixModel, tensors: Iterable[tuple[str, Sequence[int], str]], *,
              has_imatrix: bool = False) -> dict[str, str]:
    """The GGML type llama-quantize gives each tensor for ``mix``.

    ``tensors``: ``(gguf name, ne, source type)``, ``ne`` in ggml order (``ne[0]`` the row length, the input
    dimension; gguf-py's ``ReaderTensor.shape``). A tensor llama-quantize does not quantize (norms, biases,
    routers, 1-D tensors) keeps its source type."""
    key = mix.upper()
    if key not in MIXES:
        raise FidevalError(f"unknown gguf mix {mix!r}", hint=f"use one of {', '.join(MIXES)}")
    tensors = sorted(((n, tuple(int(d) for d in ne), s) for n, ne, s in tensors), key=lambda x: _order(x[0]))
    walk = _Walk(key, model, (n for n, _, _ in tensors), has_imatrix)
    default = MIXES[key]
    out = {}
    for name, ne, src in tensors:
        if not allows_quantization(name, ne, model.arch):
            out[name] = src
        elif BLOCK[default] == 1:  # F16/BF16/F32: not a quantized type, no rule, no fallback
            out[name] = default
        else:
            out[name] = _fallback(name, ne[0], walk.choose(name, ne, default))
    return out


def matching_mixes(model: MixModel, tensors: Iterable[tuple[str, Sequence[int], str]]) -> list[str]:
    """The mixes (with or without an importance matrix) under which llama-quantize would have given every tensor of a
    build the type it has: ``tensors`` as in :func:`mix_types`, with each tensor's type *in the build* (a tensor
    llama-quantize leaves alone keeps its type, so only the quantized ones decide). Several mixes can match a
    small model (e.g. Q2_K and Q3_K_S when every row falls back to Q4_0); none matches a hand-mixed build."""
    tensors = [(n, tuple(int(d) for d in ne), t) for n, ne, t in tensors]
    have = {n: t for n, _, t in tensors}
    return [mix for mix in MIXES if any(mix_types(mix, model, tensors, has_imatrix=im) == have for im in (False, True))]


def gguf_mix_inputs(path) -> tuple[MixModel, list[tuple[str, tuple[int, ...], str]]]:
    """What llama-quantize reads from a GGUF file: the :class:`MixModel` metadata and ``(name, ne, type)`` per tensor."""
    from fideval.quant.gguf_file import _reader

    r = _reader(path)

    def field(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return int(v[0]) if isinstance(v, list) else v

    arch = field("general.architecture")
    if arch is None:
        raise FidevalError(f"{path}: no general.architecture in its metadata", hint="a GGUF written by llama.cpp's converter has it")
    n_head = field(f"{arch}.attention.head_count", 1)
    model = MixModel(arch=str(arch), n_layer=int(field(f"{arch}.block_count", 0)), n_expert=int(field(f"{arch}.expert_count", 0)),
                     n_head=int(n_head), n_head_kv=int(field(f"{arch}.attention.head_count_kv", n_head)))
    return model, [(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name) for t in r.tensors]
