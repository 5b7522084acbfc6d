"""``fideval quant inspect`` on tiny transformers checkpoints saved with save_pretrained (headers only)."""

import json

import pytest
import torch
from cli_runner import run_fideval

from fideval.quant import compile_spec, module_class_of


def _deepseek():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                           num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32,
                           kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_group=1,
                           topk_group=1)
    return DeepseekV3ForCausalLM(cfg)


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0])
    return Qwen3MoeForCausalLM(cfg)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    out = {}
    for name, build in (("deepseek", _deepseek), ("qwen3moe", _qwen3_moe)):
        m = build()
        d = tmp_path_factory.mktemp(name)
        m.save_pretrained(d)
        out[name] = (d, dict(m.named_parameters()), {k: v.numel() for k, v in m.state_dict().items()})
        MODELS[name] = m
    return out


MODELS = {}


def test_mapping_covers_the_in_memory_module_tree(models):
    _, params, _ = models["deepseek"]
    classes = {n: module_class_of(n) for n in params}
    assert classes["model.layers.1.mlp.experts.gate_up_proj"] == "routed_experts"
    assert params["model.layers.1.mlp.experts.gate_up_proj"].dim() == 3
    assert {c for n, c in classes.items() if params[n].dim() >= 2} == {
        "routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head", None}
    assert all(c is None for n, c in classes.items() if "embed_tokens" in n or n.endswith(".mlp.gate.weight"))


def test_inspect_json_by_hand(models):
    d, params, sd = models["deepseek"]
    spec = "routed_experts=mxfp4:rceil,shared_experts=nvfp4,attention=fp8_block,dense_mlp=int4:asym/32"
    r = run_fideval("quant", "inspect", "--model", str(d), "--quant", spec, "--json")
    assert r.code == 0, r.stderr
    t = json.loads(r.stdout)
    pc = t["per_class"]
    assert t["base_dtype"] == "F32"
    assert t["classes_present"] == ["attention", "dense_mlp", "lm_head", "routed_experts", "shared_experts"]
    assert pc["routed_experts"]["bpw"] == 4.25 and pc["routed_experts"]["tensors"] == 12  # per expert on disk
    n_shared = sum(p.numel() for n, p in params.items() if ".shared_experts." in n)
    assert pc["shared_experts"]["bits"] == n_shared * 4.5 + 3 * 32
    assert pc["dense_mlp"]["bpw"] == 4 + 20 / 32
    assert pc["lm_head"]["bpw"] == 32 and pc["lm_head"]["format"] is None
    assert t["total"]["params"] == sum(sd.values())  # parameters and buffers (e_score_correction_bias)


def test_inspect_text_table(models):
    d, _, _ = models["qwen3moe"]
    r = run_fideval("quant", "inspect", "--model", str(d), "--quant", "routed_experts=gguf_q4_0")
    assert r.code == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("routed_experts"))
    assert line.split()[:3] == ["routed_experts", "gguf_q4_0", "ggml"] and line.split()[-1] == "4.5000"
    assert r.stdout.splitlines()[-1].startswith("total")


def test_inspect_errors(models):
    d, _, _ = models["qwen3moe"]
    r = run_fideval("quant", "inspect", "--model", str(d), "--quant", "shared_experts=nvfp4")
    assert "does not have" in r.error()
    r = run_fideval("quant", "inspect", "--model", str(d), "--quant", "attention=mxfp4/64")
    assert "group 64 is not allowed" in r.error()
    r = run_fideval("quant", "inspect", "--model", str(d / "nope"), "--quant", "attention=mxfp4")
    assert "not a folder" in r.error()


def test_inspect_error_is_one_line_from_the_real_cli(models):
    d, _, _ = models["deepseek"]
    p = run_fideval("quant", "inspect", "--model", d, "--quant", "attention=int4/64", fresh_process=True, timeout=120)
    assert p.code == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fideval: error: model.layers.")
    assert "block of 64 does not divide the last dimension 32" in lines[0]


@pytest.mark.parametrize("name", ["deepseek", "qwen3moe"])
def test_weight_transform_on_a_real_module_tree(models, name):
    """Apply the hooks to every parameter of a tiny transformers model the way the runner will: identity is
    bit-exact; a quantized spec touches exactly the listed classes' matrices and keeps logits finite."""
    m = MODELS[name]
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = m(ids).logits
        orig = {n: p.detach().clone() for n, p in m.named_parameters()}
        try:
            ident = compile_spec(None)
            for n, p in m.named_parameters():
                t = p.data
                assert ident.weight_transform(module_class_of(n), n, t) is t
            spec = compile_spec("routed_experts=mxfp4:rceil,attention=nvfp4,dense_mlp=gguf_q4_0")
            changed = set()
            for n, p in m.named_parameters():
                t = p.data
                new = spec.weight_transform(module_class_of(n), n, t)
                if new is not t:
                    changed.add(n)
                    p.data.copy_(new)
            out = m(ids).logits
        finally:
            for n, p in m.named_parameters():
                p.data.copy_(orig[n])
    want = {n for n, p in orig.items() if module_class_of(n) in ("routed_experts", "attention", "dense_mlp") and p.dim() >= 2}
    assert changed == want and any(".mlp.experts." in n for n in changed)
    assert torch.isfinite(out).all() and not torch.equal(out, ref)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert 1e-4 < rel < 0.5
