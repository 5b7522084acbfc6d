"""Quant spec compilation: parsing, validation errors, the runner hooks, bits accounting, and the one
parameter-name -> module-class mapping (checked on real transformers module trees)."""

import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant import act_quant_e4m3, check_spec_classes, compile_spec, module_class_of, parse_spec, quant_dequant
from fideval.quant.spec import resolve_spec


def test_module_class_mapping_on_hf_names():
    table = {
        "model.layers.1.mlp.experts.gate_up_proj": "routed_experts",  # fused in memory [E, out, in]
        "model.layers.1.mlp.experts.3.down_proj.weight": "routed_experts",  # per expert on disk
        "model.layers.1.mlp.shared_experts.up_proj.weight": "shared_experts",  # DeepSeek
        "model.layers.1.mlp.shared_expert.up_proj.weight": "shared_experts",  # Qwen2-MoE style
        "model.layers.0.self_attn.kv_b_proj.weight": "attention",
        "model.layers.0.self_attn.q_norm.weight": "attention",  # rank 1: never quantized, counted in class
        "model.layers.0.mlp.gate_proj.weight": "dense_mlp",
        "model.layers.0.mlp.down_proj.weight": "dense_mlp",
        "lm_head.weight": "lm_head",
        "model.layers.1.mlp.gate.weight": None,  # router
        "model.layers.1.mlp.gate.e_score_correction_bias": None,
        "model.layers.1.mlp.shared_expert_gate.weight": None,
        "model.layers.1.mlp.router.weight": None,
        "model.embed_tokens.weight": None,
        "model.norm.weight": None,
        "model.layers.0.input_layernorm.weight": None,
    }
    for name, cls in table.items():
        assert module_class_of(name) == cls, name


def test_parse_spec_and_errors():
    assert parse_spec("routed_experts=mxfp4:rceil, attention=fp8_block,dense_mlp=int4:asym/64") == {
        "routed_experts": {"format": "mxfp4", "recipe": "rceil", "group": None},
        "attention": {"format": "fp8_block", "recipe": None, "group": None},
        "dense_mlp": {"format": "int4", "recipe": "asym", "group": 64},
    }
    for bad, msg in [("mxfp4", "has no '='"), ("attention=int4/x", "not a positive integer"),
                     ("attention=int4,attention=int8", "twice"), (" , ", "empty")]:
        with pytest.raises(FidevalError, match=msg):
            parse_spec(bad)


def test_resolve_spec_errors_are_one_line():
    cases = [({"experts": {"format": "mxfp4"}}, "unknown module class 'experts'"),
             ({"attention": {"format": "fp7"}}, "unknown quant format 'fp7'"),
             ({"attention": {"format": "mxfp4", "recipe": "ceil"}}, "unknown recipe 'ceil'"),
             ({"attention": {"format": "nvfp4", "group": 32}}, "group 32 is not allowed"),
             ({"attention": {"format": "int4", "bits": 4}}, "expected keys")]
    for spec, msg in cases:
        with pytest.raises(FidevalError, match=msg) as ei:
            resolve_spec(spec)
        assert "\n" not in str(ei.value)


def test_pydantic_quant_spec_is_accepted():
    from fideval.config import ModuleQuant, QuantSpec

    q = QuantSpec(routed_experts=ModuleQuant(format="mxfp4", recipe="rceil"), attention=ModuleQuant(format="fp8_block"))
    r = resolve_spec(q)
    assert set(r) == {"routed_experts", "attention"}
    assert (r["routed_experts"].recipe, r["routed_experts"].group) == ("rceil", 32)
    assert (r["attention"].recipe, r["attention"].group) == ("fp32", 128)


def test_identity_spec_is_bit_exact_identity():
    w = torch.randn(8, 64)
    for spec in (None, {}, {"routed_experts": None}):
        c = compile_spec(spec)
        assert c.is_identity and c.act_transform == {}
        for cls in ("routed_experts", "attention", "lm_head"):
            assert c.weight_transform(cls, "x.weight", w) is w


def test_weight_transform_rules():
    c = compile_spec("routed_experts=mxfp4:rceil,attention=fp8_block:ue8m0")
    fused = torch.randn(4, 64, 96)  # [E, out, in]
    y = c.weight_transform("routed_experts", "model.layers.1.mlp.experts.gate_up_proj", fused)
    assert y.shape == fused.shape
    for k in range(4):  # blocks run along the input dim of each expert, as for the 2-D per-expert weight
        assert torch.equal(y[k], quant_dequant(fused[k], "mxfp4", "rceil"))
    norm = torch.randn(64)
    assert c.weight_transform("attention", "model.layers.0.self_attn.q_norm.weight", norm) is norm
    bias = torch.randn(4, 128)  # gpt-oss fused expert bias: rank 2 but never quantized
    assert c.weight_transform("routed_experts", "model.layers.0.mlp.experts.gate_up_proj_bias", bias) is bias
    w = torch.randn(64, 64)
    assert c.weight_transform("dense_mlp", "model.layers.0.mlp.up_proj.weight", w) is w  # not in spec
    assert torch.equal(c.weight_transform("attention", "a.weight", w), quant_dequant(w, "fp8_block", "ue8m0"))
    with pytest.raises(FidevalError, match=r"^model\.x\.weight \(routed_experts\): format mxfp4: block of 32"):
        c.weight_transform("routed_experts", "model.x.weight", torch.randn(4, 48))


def test_act_transform_covers_quantized_classes():
    c = compile_spec({"routed_experts": {"format": "nvfp4"}, "lm_head": {"format": "int8", "group": 64}})
    assert set(c.act_transform) == {"routed_experts", "lm_head"}
    x = torch.randn(3, 256) * 10
    assert torch.equal(c.act_transform["lm_head"](x), act_quant_e4m3(x, 128, "fp32"))
    c8 = compile_spec("attention=fp8_block", act_scale="ue8m0")
    assert torch.equal(c8.act_transform["attention"](x), act_quant_e4m3(x, 128, "ue8m0"))


def test_bits_accounting_by_hand():
    c = compile_spec("routed_experts=mxfp4,attention=fp8_block,shared_experts=nvfp4")
    t = c.bits({
        "routed_experts": [(4, 64, 64)],  # 16384 * 4.25
        "attention": [(64, 64), (64,)],  # 4096*8 + one tile's fp32 scale; the norm at 16 bits
        "shared_experts": [(32, 64)],  # 2048 * 4.5 + 32 (tensor scale)
        None: [(128, 64)],  # embeddings at 16
    })
    pc = t["per_class"]
    assert pc["routed_experts"]["bpw"] == 4.25
    assert pc["attention"]["bits"] == 4096 * 8 + 32 + 64 * 16
    assert pc["shared_experts"]["bits"] == 2048 * 4.5 + 32
    assert pc["other"]["bpw"] == 16 and pc["other"]["format"] is None
    total_bits = 16384 * 4.25 + 4096 * 8 + 32 + 64 * 16 + 2048 * 4.5 + 32 + 128 * 64 * 16
    assert t["total"]["params"] == 16384 + 4096 + 64 + 2048 + 8192
    assert t["total"]["bpw"] == pytest.approx(total_bits / t["total"]["params"], rel=1e-15)
    named = c.bits({"routed_experts": {"e.gate_up_proj": (4, 64, 64), "e.gate_up_proj_bias": (4, 64)}})
    assert named["per_class"]["routed_experts"]["bits"] == 16384 * 4.25 + 256 * 16


def test_check_spec_classes():
    check_spec_classes("routed_experts=mxfp4", {"routed_experts", "attention"})
    with pytest.raises(FidevalError, match="shared_experts that this model does not have") as ei:
        check_spec_classes("routed_experts=mxfp4,shared_experts=nvfp4", {"routed_experts", "attention", "dense_mlp"})
    assert "\n" not in str(ei.value)


def test_weight_transform_writes_into_out():
    """out= (the runner's own tensor): the same bits as a fresh result, written there; identity copies."""
    c = compile_spec({"routed_experts": "mxfp4"})
    x = torch.randn(3, 64, 128).bfloat16()
    name = "model.layers.1.mlp.experts.gate_up_proj"
    fresh = c.weight_transform("routed_experts", name, x)
    own = x.clone()
    assert c.weight_transform("routed_experts", name, own, out=own) is own and torch.equal(own, fresh)
    assert not torch.equal(fresh, x)
    other = torch.empty_like(x)
    assert c.weight_transform("attention", "model.layers.1.self_attn.q_proj.weight", x, out=other) is other
    assert torch.equal(other, x)  # not quantized: the tensor as it is
