"""fideval.timing.accounting: parts that sum to the wall, utilisation against a GPU's peak, the verbs' line."""

from __future__ import annotations

import pytest

from fideval.timing import accounting


def test_summary_adds_other_so_the_parts_are_the_wall():
    p = accounting.summary(10.0, {"moe": 4.0, "attention": 3.0, "other": 99.0, "startup": 0.5}, device="NVIDIA H200",
                           tokens=20_000, model_flops=4.945e15, peak=989.0, hidden={"load": 0.98})
    assert list(p["parts"]) == ["startup", "attention", "moe", "other"]  # the documented order, other last
    assert p["parts"]["other"] == 2.5 and sum(p["parts"].values()) == 10.0 and p["other_fraction"] == 0.25
    assert p["tokens_per_s"] == 2000 and p["flop_utilisation"] == pytest.approx(0.5)
    assert accounting.summary(10.0, {}, device="cpu", tokens=5, model_flops=1e9, peak=None)["flop_utilisation"] is None
    assert accounting.summary(10.0, {}, device="x", model_flops=4.945e15, peak=989.0, world=2)["flop_utilisation"] == pytest.approx(0.25)


@pytest.mark.parametrize(("name", "dtype", "peak"), [("NVIDIA H200", "bfloat16", 989), ("NVIDIA H100 80GB HBM3", "torch.bfloat16", 989),
                                                      ("NVIDIA H100 PCIe", "bfloat16", 756), ("NVIDIA H100 80GB HBM3", "float32", 67),
                                                      ("NVIDIA A100-SXM4-80GB", "bfloat16", 312), ("NVIDIA L4", "bfloat16", None),
                                                      ("cpu", "float32", None)])
def test_peak_by_gpu_name(name, dtype, peak):
    assert accounting.peak_tflops(name, dtype) == peak


def test_hidden_share_and_line():
    assert accounting.hidden_share(10.0, 0.5) == 0.95 and accounting.hidden_share(0.0, 1.0) == 1.0
    assert accounting.hidden_share(1.0, 3.0) == 0.0
    p = accounting.summary(4.0, {"moe": 2.0, "head": 0.01}, device="NVIDIA H200", tokens=4000, model_flops=1.978e15, peak=989.0)
    assert accounting.line(p) == "1,000 tokens/s; model FLOP utilisation 50.0% of 989 TFLOP/s; 4.0 s: moe 50%, other 50%"
