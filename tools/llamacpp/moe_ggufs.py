"""Write the MoE (and dense) GGUF fixtures with llama.cpp's own converter (run once, by hand; CI has no llama.cpp).

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36   # vendors llama.cpp
    tar xzf llama_cpp_python-0.3.36.tar.gz
    python tools/llamacpp/moe_ggufs.py --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp

For each architecture a tiny random-weight Hugging Face model is saved with ``save_pretrained`` (float16, to keep
the fixtures small) and converted by ``convert_hf_to_gguf.py``'s own model class (``--outtype q8_0``), imported
from the llama.cpp tree with its vendored gguf-py: tensor names, stacking of experts, the DeepSeek kv_b split, the
llama Q/K permutation and every metadata key are the converter's. One thing is replaced: ``set_vocab``. The
converter identifies a BPE tokenizer by hashing its output on a fixed text and refuses any it does not know, and a
tiny model has no published tokenizer; the vocabulary is no part of what fideval compares, so the fixtures carry
``vocab_size`` placeholder tokens instead (and Gemma3, whose converter cuts ``token_embd`` to the tokenizer's
size, gets a ``tokenizer.json`` of that many tokens in the temporary folder). The dense families (Mistral, Phi3,
Gemma2, Gemma3; GraniteMoe too) sit beside the MoE ones so tests/test_gguf_moe.py's oracle takes them all.

The DeepSeek-V3 model has ``hidden_size`` 256 so that its rows hold whole 256-element super-blocks: after the
conversion, the tensors llama-quantize's Q4_K_M would make Q4_K (attention and expert gate/up rows of 256) are
re-encoded as Q4_K with fideval's byte-exact K-quant encoder (checked against llama.cpp's own quantizer in
tests/test_quant_llamacpp_vectors.py) from the converter's Q8_0 values' source floats, and the file is rewritten
with gguf-py's ``GGUFWriter`` (metadata and the other tensors byte for byte). Output, under
``tests/data/llamacpp/moe/<name>/``: ``config.json``, ``model.safetensors`` (the reference) and ``model.gguf``;
for the models in :data:`FUSED` also ``model-qkv.gguf``, written with ``--fuse-qkv``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "llamacpp" / "moe"


def configs() -> dict[str, object]:
    import transformers as tf

    small = dict(vocab_size=64, hidden_size=64, num_attention_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 max_position_embeddings=256)
    return {
        "deepseek_v3": tf.DeepseekV3Config(**{**small, "hidden_size": 256, "num_attention_heads": 2, "rms_norm_eps": 1e-5},
                                           intermediate_size=32,
                                           moe_intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2,
                                           n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
                                           topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
                                           qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                                           routed_scaling_factor=2.5),
        "deepseek_v2": tf.DeepseekV2Config(**small, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                           num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
                                           num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=None,
                                           kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32),
        # norm_topk_prob as Qwen3-MoE releases have it (llama.cpp's qwen3moe graph always normalises)
        "qwen3_moe": tf.Qwen3MoeConfig(**small, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                       num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, head_dim=16,
                                       norm_topk_prob=True),
        "qwen2_moe": tf.Qwen2MoeConfig(**small, intermediate_size=64, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2,
                                       num_experts=4, num_experts_per_tok=2),
        "mixtral": tf.MixtralConfig(**small, intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2,
                                    num_local_experts=4, num_experts_per_tok=2),
        "gpt_oss": tf.GptOssConfig(**small, intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2,
                                   num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=8),
        # OLMoE: the converter writes rms eps 1e-5 whatever config.json says (OLMoE's own value)
        "olmoe": tf.OlmoeConfig(**{**small, "rms_norm_eps": 1e-5}, intermediate_size=32, num_hidden_layers=2,
                                num_key_value_heads=2, num_experts=4, num_experts_per_tok=2),
        "dots1": tf.Dots1Config(**small, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                n_group=1, topk_group=1, first_k_dense_replace=1, head_dim=16, routed_scaling_factor=2.5),
        "ernie4_5_moe": tf.Ernie4_5_MoeConfig(**small, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                              num_key_value_heads=2, moe_num_experts=4, moe_num_shared_experts=1,
                                              num_experts_per_tok=2, moe_layer_start_index=1, moe_layer_interval=1,
                                              head_dim=16),
        "minimax_m2": tf.MiniMaxM2Config(**small, intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2,
                                         num_local_experts=4, num_experts_per_tok=2, head_dim=16, rotary_dim=8),
        "glm4_moe_lite": tf.Glm4MoeLiteConfig(**small, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                              num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
                                              num_experts_per_tok=2, mlp_layer_types=["dense", "sparse"], q_lora_rank=32,
                                              kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32),
        "glm4_moe": tf.Glm4MoeConfig(**small, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                     num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                     n_group=1, topk_group=1, first_k_dense_replace=1, head_dim=16),
        # dense families (llama.cpp writes Mistral as llama; Phi3 fused qkv/gate_up; Gemma norms stored +1)
        "mistral": tf.MistralConfig(**small, intermediate_size=64, num_hidden_layers=2, num_key_value_heads=2,
                                    head_dim=16, sliding_window=None),
        "phi3": tf.Phi3Config(**small, intermediate_size=64, num_hidden_layers=2, num_key_value_heads=2,
                              partial_rotary_factor=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "gemma2": tf.Gemma2Config(**{**small, "tie_word_embeddings": True}, intermediate_size=64, num_hidden_layers=2,
                                  num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2),
        "gemma3": tf.Gemma3TextConfig(**{**small, "tie_word_embeddings": True}, intermediate_size=64,
                                      num_hidden_layers=2, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                                      sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "granitemoe": tf.GraniteMoeConfig(**small, intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2,
                                          num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=12.0,
                                          residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=6.0,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2),
        # llama.cpp's llama4 graph fixes chunk size, no-rope layers and attention temperature: transformers' defaults
        "llama4": tf.Llama4TextConfig(**small, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=2,
                                      num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
                                      interleave_moe_layer_step=1, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    }


# written into config.json as the published models' configs have them (transformers' classes drop these keys, and
# llama.cpp's converter falls back to softmax routing without scoring_func)
EXTRA = {name: {"scoring_func": "sigmoid"} for name in ("deepseek_v3", "glm4_moe", "glm4_moe_lite", "dots1", "minimax_m2")}


def save_reference(name: str, folder: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs()[name], dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    model.to(torch.float16).save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(EXTRA.get(name, {}))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for junk in ("generation_config.json",):
        (folder / junk).unlink(missing_ok=True)
    if name == "gemma3":  # Gemma3Model.modify_tensors cuts token_embd to the tokenizer's size (not kept in the fixture)
        vocab = {f"<t{i}>": i for i in range(cfg["vocab_size"])}
        (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
    return folder


def convert(llama_cpp: Path, folder: Path, out: Path, outtype: str = "q8_0", fuse_qkv: bool = False,
            merges: tuple[str, ...] = (), add_bos: bool | None = None) -> None:
    """``convert_hf_to_gguf.py folder --outtype <outtype> --outfile out`` (with ``--fuse-qkv`` when asked), with
    placeholder tokens for the vocabulary, ``merges`` as its BPE merges and, unless None, ``add_bos`` recorded."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import gguf
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    hparams = ModelBase.load_hparams(folder, False)
    cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT))

    class Converter(cls):
        model_arch = cls.model_arch

        def set_vocab(self):
            n = self.hparams["vocab_size"]
            self.gguf_writer.add_tokenizer_model("gpt2")
            self.gguf_writer.add_tokenizer_pre("default")
            self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
            self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
            self.gguf_writer.add_token_merges(list(merges))
            if add_bos is not None:
                self.gguf_writer.add_add_bos_token(add_bos)

    with torch.inference_mode():
        ftype = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "f32": gguf.LlamaFileType.ALL_F32}[outtype]
        Converter(folder, ftype, out, eager=True, fuse_qkv=fuse_qkv).write()


# also written with the converter's --fuse-qkv, as model-qkv.gguf (its --fuse-gate-up-exps takes none of the
# architectures here: gguf-py lists ffn_gate_up_exps for qwen3next, gemma4, mistral4...)
FUSED = ("qwen3_moe", "mixtral")
# llama.cpp names (after the layer) that Q4_K_M makes Q4_K where a row holds whole 256-element super-blocks
Q4_K_TENSORS = ("attn_q_a.weight", "attn_kv_a_mqa.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                "ffn_gate_shexp.weight", "ffn_up_shexp.weight")


def requantize_q4_k(llama_cpp: Path, folder: Path, q8: Path, out: Path) -> None:
    """``q8`` with :data:`Q4_K_TENSORS` re-encoded as Q4_K from the converter's f16 output (llama-quantize's
    input), written to ``out``."""
    import gguf

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from gguf_rewrite import rewrite_gguf

    from fideval.quant.gguf_ktypes import gguf_k_encode

    f16 = out.with_name("f16.gguf")
    convert(llama_cpp, folder, f16, "f16")
    src = {t.name: t for t in gguf.GGUFReader(str(f16)).tensors}
    new = {}
    for name, t in src.items():
        if name.split(".", 2)[-1] in Q4_K_TENSORS and t.tensor_type == gguf.GGMLQuantizationType.F16:
            x = torch.from_numpy(t.data.astype("float32"))
            new[name] = (gguf_k_encode(x, "q4_k").numpy(), gguf.GGMLQuantizationType.Q4_K)
    assert new, "no tensor took Q4_K"
    rewrite_gguf(q8, out, tensors=new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py/)")
    ap.add_argument("--only", nargs="*", default=None, help="these models (default: all)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = ap.parse_args()
    for name in args.only or list(configs()):
        dest = args.out / name
        with tempfile.TemporaryDirectory() as tmp:
            ref = save_reference(name, Path(tmp) / "ref")
            convert(args.llama_cpp.resolve(), ref, Path(tmp) / "q8.gguf")
            if name == "deepseek_v3":
                requantize_q4_k(args.llama_cpp.resolve(), ref, Path(tmp) / "q8.gguf", Path(tmp) / "model.gguf")
            else:
                shutil.move(Path(tmp) / "q8.gguf", Path(tmp) / "model.gguf")
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            for f in ("config.json", "model.safetensors"):
                shutil.copy(ref / f, dest / f)
            shutil.copy(Path(tmp) / "model.gguf", dest / "model.gguf")
            if name in FUSED:
                convert(args.llama_cpp.resolve(), ref, dest / "model-qkv.gguf", fuse_qkv=True)
        print(name, {p.name: p.stat().st_size for p in sorted(dest.iterdir())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
