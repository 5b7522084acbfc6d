"""The quant spec's hooks in the reference-code path: weight transforms reach the vendor's Expert/MLP/Linear
weights and activation transforms the inputs of its linears, by module class (routed_experts, shared_experts,
attention, dense_mlp, lm_head), checked against the vendor's own forward with the test's own hooks placed on
the vendor's modules by name, on weights quantize-dequantized here."""

from __future__ import annotations

import re
import shutil

import pytest
import ref_deepseek_v3 as rv3
import torch
from safetensors.torch import load_file, save_file

from fideval.quant.activations import act_quant_e4m3
from fideval.quant.base import get_format

# vendor module names (the test's own reading of model.py) -> module class
CLASS_OF = [(r"^layers\.\d+\.attn\.", "attention"), (r"^layers\.\d+\.ffn\.experts\.", "routed_experts"),
            (r"^layers\.\d+\.ffn\.shared_experts\.", "shared_experts"), (r"^layers\.0\.ffn\.w\d$", "dense_mlp"),
            (r"^head$", "lm_head")]


def _cls(name: str) -> str | None:
    return next((c for pat, c in CLASS_OF if re.search(pat, name)), None)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    rv3.need_code()
    return rv3.build(tmp_path_factory.mktemp("hooks") / "f32")


def test_activation_hooks_reach_each_class_of_vendor_linear(model):
    seen: dict[str, set] = {}

    def recorder(cls):
        def f(x):
            seen.setdefault(cls, set()).add(tuple(x.shape[-1:]))
            return x
        return f

    classes = ("attention", "routed_experts", "shared_experts", "dense_mlp")
    drv = rv3.driver(model, act_transform={c: recorder(c) for c in classes})
    rv3.layer_by_layer(drv, rv3.tokens(1, 8))
    # input widths: attention wq_a/wkv_a 256, wq_b 128 (q_lora), wo 128 (heads*v); experts 256 and 128 (moe inter);
    # shared 256 and 128; dense 256 and 256 (inter)
    assert seen == {"attention": {(256,), (128,)}, "routed_experts": {(256,), (128,)},
                    "shared_experts": {(256,), (128,)}, "dense_mlp": {(256,)}}


@pytest.mark.parametrize("classes", [("routed_experts",), ("attention", "shared_experts", "dense_mlp")])
def test_serving_path_equals_the_vendor_forward_on_emulated_weights_and_activations(model, tmp_path, classes):
    from fideval.quant.spec import compile_spec

    spec = compile_spec({c: {"format": "mxfp4"} for c in classes})
    drv = rv3.driver(model, weight_transform=spec.weight_transform, act_transform=spec.act_transform)
    toks = rv3.tokens(2, 12, seed=5)
    h = drv.begin(toks)
    for i in range(drv.n_layers):
        h = drv.forward_layer(i, drv.load_layer(i), h)
    ours = drv.finish(h[:, -1])

    emu = tmp_path / "emu"  # the release with those classes' weights quantize-dequantized here
    shutil.copytree(model, emu, symlinks=True)
    sd = load_file(str(emu / "model.safetensors"))
    mx = get_format("mxfp4")
    wanted = {"attention": ".self_attn.", "routed_experts": ".mlp.experts.", "shared_experts": ".mlp.shared_experts.",
              "dense_mlp": "layers.0.mlp."}
    for k, v in sd.items():
        if v.ndim == 2 and k.endswith("proj.weight") or k.endswith("proj_with_mqa.weight"):
            if any(wanted[c] in k for c in classes):
                sd[k] = mx.quant_dequant(v, None, None)
    save_file(sd, str(emu / "model.safetensors"), metadata={"format": "pt"})

    def hooks(m):
        for name, mod in m.named_modules():
            if isinstance(mod, drv.m.Linear) and _cls(name) in classes:
                mod.register_forward_pre_hook(lambda _m, a: (act_quant_e4m3(a[0], 128, "fp32"), *a[1:]))

    ref = rv3.driver(emu).vendor_logits(toks, prepare=hooks)
    assert torch.equal(ours, ref)
    plain = rv3.driver(model).vendor_logits(toks)
    assert (ours - plain).abs().max() > 1e-3  # the build moved the logits
