"""Bits and module classes of a release stored in its reference code's own layout (DeepSeek-V4.1-Flash: FP8 e4m3
linears with E8M0 ``.scale`` blocks, FP4 e2m1 experts packed two per byte in I8 tensors), against the tensors'
own bytes read with safetensors: a packed byte is two parameters, a scale is part of its weight's bits, not a
parameter of its class."""

from __future__ import annotations

import math

import pytest
import torch
from ref_deepseek_v41 import MISSING, V41, write_tiny_v41
from safetensors import safe_open

from fideval.quant.inspect import class_shapes, inspect_model, release_bits, weight_shapes
from fideval.quant.module_classes import module_class_of
from fideval.quant.spec import compile_spec

pytestmark = pytest.mark.skipif(not (V41 / "model.py").is_file(), reason=MISSING)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    folder = write_tiny_v41(tmp_path_factory.mktemp("layout") / "fp8", dtype="fp8")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    return folder, tensors


def _by_class(tensors: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per module class [parameters, stored bits] of the quantized weights, from the bytes on disk: an I8 weight
    with an E8M0 scale packs two FP4 values a byte; every scale's bytes count towards its weight."""
    out: dict[str, list[float]] = {}
    for k, t in tensors.items():
        sc = k[: -len("weight")] + "scale"
        if not k.endswith(".weight") or sc not in tensors or tensors[sc].dtype != torch.float8_e8m0fnu:
            continue
        params = t.numel() * (2 if t.dtype == torch.int8 else 1)
        row = out.setdefault(module_class_of(k), [0, 0.0])
        row[0] += params
        row[1] += 8 * (t.numel() * t.element_size() + tensors[sc].numel() * tensors[sc].element_size())
    return out


def test_scales_are_not_weights_and_packed_fp4_counts_two_per_byte(release):
    folder, tensors = release
    shapes = weight_shapes(folder)
    assert not any(k.endswith(".scale") and k[:-5] + "weight" in tensors for k in shapes)
    w1 = "layers.1.ffn.experts.0.w1.weight"
    assert tensors[w1].dtype == torch.int8 and shapes[w1] == ((64, 128), "F4_E2M1")
    assert shapes["layers.1.attn.wq_b.weight"] == ((256, 64), "F8_E4M3")
    bits = release_bits(folder)
    assert bits[w1] == 8 * (64 * 64 + 64 * 4)  # 4,096 packed bytes + 256 E8M0 scales


def test_the_release_itself_is_counted_from_its_bytes(release):
    """No spec (the reference as released): each class's bits per weight is its bytes on disk over its logical
    parameters — 4.25 for the FP4 experts (4 bits + an 8-bit scale per 32), 8 + 8/1024 for 32x32-block FP8."""
    folder, tensors = release
    want = _by_class(tensors)
    table = compile_spec(None).bits(class_shapes(folder), stored=release_bits(folder))["per_class"]
    assert want["routed_experts"][1] / want["routed_experts"][0] == 4.25
    assert table["routed_experts"]["params"] == want["routed_experts"][0]
    assert table["routed_experts"]["bpw"] == 4.25
    assert table["shared_experts"]["bpw"] == pytest.approx(want["shared_experts"][1] / want["shared_experts"][0],
                                                           rel=1e-12)
    assert math.isclose(table["shared_experts"]["bpw"], 8 + 8 / 1024)


def test_quant_inspect_sees_the_fp4_experts(release):
    """``fideval quant inspect`` and the score path agree: the packed experts are routed_experts (they used to be
    invisible to inspect, an I8 tensor not being floating), and an MXFP4 spec costs them 4.25 bits."""
    folder, tensors = release
    table = inspect_model(folder, "routed_experts=mxfp4")
    assert "routed_experts" in table["classes_present"] and table["base_dtype"] == "BF16"
    row = table["per_class"]["routed_experts"]
    assert (row["params"], row["bpw"]) == (_by_class(tensors)["routed_experts"][0], 4.25)
