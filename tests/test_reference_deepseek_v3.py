"""The DeepSeek-V3 reference driver against the vendor's own ``Transformer.forward`` (the parity oracle) and the
vendor's ``convert.py`` (the name map and per-rank cuts), on tiny releases (tests/ref_deepseek_v3.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import ref_deepseek_v3 as rv3
import torch
from safetensors.torch import load_file

from fideval.errors import FidevalError
from fideval.model.reference import deepseek_v3_names


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    rv3.need_code()
    d = tmp_path_factory.mktemp("v3")
    return {"f32": rv3.build(d / "f32"), "fp8": rv3.build(d / "fp8", fp8=True),
            "fp8_ue8m0": rv3.build(d / "fp8u", fp8=True, ue8m0=True, seed=2)}


def _vendor_convert():
    spec = importlib.util.spec_from_file_location("v3_vendor_convert", rv3.need_code() / "convert.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind,gemm", [("f32", "bf16"), ("fp8", "bf16"), ("fp8", "fp8"), ("fp8_ue8m0", "fp8")])
def test_layer_by_layer_equals_the_vendors_forward(releases, kind, gemm):
    drv = rv3.driver(releases[kind], gemm_impl=gemm)
    toks = rv3.tokens(2, 24)
    h = drv.begin(toks)
    for i in range(drv.n_layers):
        h = drv.forward_layer(i, drv.load_layer(i), h)
    ref = drv.vendor_logits(toks)
    assert ref.shape == (2, 512) and torch.isfinite(ref).all()
    # the same blocks, then the head on the vendor's [B, dim] input: bit-identical
    assert torch.equal(drv.finish(h[:, -1]), ref)
    # the head over every position is one [B*L, dim] GEMM: BLAS blocks it differently (measured <= 4 ulp)
    full = drv.finish(h)
    assert full.shape == (2, 24, 512) and full.dtype == torch.float32
    assert (full[:, -1] - ref).abs().max().item() <= 1e-6 * ref.abs().max().item()
    if kind.startswith("fp8"):
        assert drv.kernels["weight_dequant"] == "fideval.model.reference.deepseek_v3_kernels"
        assert drv.kernels["fp8_gemm"] == ("fideval.model.reference.deepseek_v3_kernels" if gemm == "fp8" else "unused (gemm_impl bf16)")


def test_every_position_is_the_vendors_forward_on_the_prefix(releases):
    """Position t of our logits is what the vendor computes on tokens[:, :t+1] (causality, rotary positions); the
    shapes of every GEMM differ from the full run's, so float32 rounding differs (bound: 5e-6 of the largest logit)."""
    drv = rv3.driver(releases["f32"])
    toks = rv3.tokens(1, 12, seed=4)
    full = rv3.layer_by_layer(drv, toks)
    for t in (0, 5, 11):
        ref = drv.vendor_logits(toks[:, :t + 1])
        assert (full[:, t] - ref).abs().max().item() <= 5e-6 * ref.abs().max().item()


def test_mapping_is_the_vendors_convert_mapping():
    assert deepseek_v3_names.MAPPING == _vendor_convert().mapping


@pytest.mark.parametrize("mp", [1, 2])
def test_rank_slices_equal_the_vendors_convert(releases, tmp_path, mp):
    """convert.py run on the release writes model{r}-mp{N}.safetensors; every tensor a rank's modules load
    equals it, and nothing convert writes is left unloaded but the routing bias the vendor's small Gate lacks."""
    _vendor_convert().main(str(releases["f32"]), str(tmp_path), 8, mp)
    for r in range(mp):
        want = load_file(str(tmp_path / f"model{r}-mp{mp}.safetensors"))
        drv = rv3.driver(releases["f32"]) if mp == 1 else _driver_at(releases["f32"], r, mp)
        got = {}
        for i in range(drv.n_layers):
            got.update({f"layers.{i}.{k}": v for k, v in drv.load_layer(i).state_dict().items() if not k.endswith("_cache")})
        got.update({f"embed.{k}": v for k, v in drv._load_embed().state_dict().items()})
        norm, head = drv._load_head()
        got.update({"norm.weight": norm.weight, "head.weight": head.weight})
        # the vendor's Gate has its routing bias only at dim 7168: convert writes it, the modules have no slot
        assert set(got) == {k for k in want if not k.endswith("ffn.gate.bias")}
        for k, v in got.items():
            v = want[k]
            assert torch.equal(got[k], v), k


def _driver_at(folder, rank, world):
    from fideval.model.reference.deepseek_v3 import DeepseekV3Driver
    from fideval.model.weights.checkpoint import Checkpoint

    code = rv3.driver(folder).code
    ckpt = Checkpoint(folder)
    return DeepseekV3Driver(code, ckpt.config_dict, ckpt, rank=rank, world=world)


def test_names_round_trip_every_vendor_parameter(releases):
    drv = rv3.driver(releases["fp8"])
    blk = drv.load_layer(1)
    for k in blk.state_dict():
        if not k.endswith("_cache"):
            hf = deepseek_v3_names.to_hf(f"layers.1.{k}")
            assert deepseek_v3_names.to_vendor(hf)[0] == f"layers.1.{k}"
    assert deepseek_v3_names.to_hf("layers.1.ffn.experts.3.w1.scale") == "model.layers.1.mlp.experts.3.gate_proj.weight_scale_inv"
    assert deepseek_v3_names.plan("layers.1.ffn.experts.3.w2.weight")[1] is None  # experts are owned whole, never cut
    assert deepseek_v3_names.plan("layers.1.ffn.shared_experts.w2.weight")[1] == 1


def test_kimi_k2_model_type_runs_the_same(releases, tmp_path):
    k2 = tmp_path / "k2"
    shutil.copytree(releases["f32"], k2, symlinks=True)
    cfg = json.loads((k2 / "config.json").read_text())
    cfg["model_type"] = "kimi_k2"
    (k2 / "config.json").write_text(json.dumps(cfg))
    toks = rv3.tokens(1, 8)
    a, b = rv3.driver(releases["f32"]), rv3.driver(k2)
    assert torch.equal(rv3.layer_by_layer(a, toks), rv3.layer_by_layer(b, toks))


@pytest.mark.parametrize("edit,message", [
    ({"rms_norm_eps": 1e-5}, "RMSNorm eps 1e-05"),
    ({"model_type": "llama"}, "model_type 'llama' is not DeepSeek-V3's"),
    ({"scoring_func": "tanh"}, "scoring_func 'tanh'"),
    ({"n_routed_experts": None}, "n_routed_experts is missing"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4, "mscale": 0.7, "mscale_all_dim": 1.0}},
     "YaRN mscale 0.7 != mscale_all_dim 1.0"),
])
def test_configs_the_reference_code_cannot_take_are_one_line_errors(releases, edit, message):
    from fideval.model.reference import deepseek_v3_args

    cfg = {**json.loads((releases["f32"] / "config.json").read_text()), **edit}
    with pytest.raises(FidevalError) as e:
        deepseek_v3_args.model_args(rv3.driver(releases["f32"]).m, cfg)
    assert message in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("world,what", [(3, "vocab_size = 512 does not divide over 3"), (16, "n_routed_experts = 8")])
def test_a_world_size_that_does_not_divide_is_a_one_line_error(releases, world, what):
    with pytest.raises(FidevalError) as e:
        _driver_at(releases["f32"], 0, world)
    assert what in e.value.message
