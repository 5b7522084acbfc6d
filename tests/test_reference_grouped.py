"""The reference code's routed experts grouped (``model.reference_experts: grouped``,
fideval/model/reference/grouped_experts.py) against the vendor's own MoE loop and its ``Transformer.forward``.

On the CPU the grouped path gives the vendor loop's bits in every configuration of the tiny fixtures: where the
vendor's linear is an ``F.linear`` (float weights; V3's FP8 weights with ``gemm_impl: bf16``) or its FP8/FP4 GEMM
has power-of-two scales (V3 UE8M0, V3.2, V4.1's E8M0 FP8 and FP4 experts), one ``torch._grouped_mm`` per
projection; with float32 block scales (V3 ``gemm_impl: fp8``) the vendor's own GEMM per expert on the sorted
rows. The loop's own micro-batch dependence is larger (docs/runner.md, 'Grouped experts'). Routing stays the
vendor's ``Gate`` called as a module: its forward hooks fire once per layer, and what they return is what the
experts take.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import ref_deepseek_v3 as rv3
import torch
from ref_deepseek_v32 import VENDOR as V32
from ref_deepseek_v32 import write_tiny_v32
from ref_deepseek_v41 import V41, write_tiny_v41

from fideval.errors import FidevalError

pytestmark = pytest.mark.usefixtures("one_thread")




@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    rv3.need_code()
    d = tmp_path_factory.mktemp("g3")
    return {"f32": rv3.build(d / "f32"), "fp8": rv3.build(d / "fp8", fp8=True),
            "fp8_ue8m0": rv3.build(d / "fp8u", fp8=True, ue8m0=True, seed=2)}


@pytest.fixture(scope="module")
def v32(tmp_path_factory):
    if not (V32 / "model.py").is_file():
        pytest.skip(f"vendor code not found at {V32}")
    d = tmp_path_factory.mktemp("g32")
    return {"float32": write_tiny_v32(d / "f32", dtype=torch.float32),
            "fp8": write_tiny_v32(d / "fp8", dtype=torch.bfloat16, fp8=True)}


@pytest.fixture(scope="module")
def v41(tmp_path_factory):
    if not (V41 / "model.py").is_file():
        pytest.skip(f"vendor code not found at {V41}")
    d = tmp_path_factory.mktemp("g41")
    return {k: write_tiny_v41(d / k, dtype=k) for k in ("fp8", "bf16")}


def _v32_driver(folder, dtype, **kw):
    from fideval.model.reference.code import load_vendor_code
    from fideval.model.reference.deepseek_v32 import STAND_INS, DeepseekV32Driver
    from fideval.model.weights.checkpoint import Checkpoint

    ck = Checkpoint(folder)
    code = load_vendor_code(folder / "inference", trust=True, stand_ins=STAND_INS, prefer_vendor=False)
    return DeepseekV32Driver(code, ck.config_dict, ck, dtype=dtype, **kw)


def _v41_driver(folder, **kw):
    from fideval.model.reference.code import load_vendor_code
    from fideval.model.reference.deepseek_v41 import DeepseekV41Driver
    from fideval.model.weights.checkpoint import Checkpoint

    ck = Checkpoint(folder)
    return DeepseekV41Driver(load_vendor_code(folder / "inference", trust=True), ck.config_dict, ck, **kw)


def _layers(d, toks, prepare=None):
    """The driver's contract by hand: the final state (``prepare(i, layer)`` on each layer first)."""
    st = d.begin(toks)
    for i in range(d.n_layers):
        layer = d.load_layer(i)
        if prepare is not None:
            prepare(i, layer)
        st = d.forward_layer(i, layer, st)
    return st


def _kld(a: torch.Tensor, b: torch.Tensor) -> float:
    la, lb = a.double().log_softmax(-1), b.double().log_softmax(-1)
    return float((la.exp() * (la - lb)).sum(-1).mean())


V3_CASES = [("f32", "bf16", torch.float32), ("fp8", "bf16", torch.bfloat16), ("fp8", "fp8", torch.float32),
            ("fp8", "fp8", torch.bfloat16), ("fp8_ue8m0", "fp8", torch.bfloat16)]


@pytest.mark.parametrize("kind,gemm,dtype", V3_CASES, ids=[f"{k}-{g}-{str(d)[6:]}" for k, g, d in V3_CASES])
def test_v3_grouped_against_the_vendors_forward(v3, kind, gemm, dtype):
    toks = rv3.tokens(2, 24)
    d = rv3.driver(v3[kind], dtype=dtype, gemm_impl=gemm, experts="grouped")
    h = _layers(d, toks)
    # float32 block scales under gemm_impl fp8: the vendor's GEMM per expert; else one grouped GEMM per projection
    how = "per expert on the sorted rows" if (kind, gemm) == ("fp8", "fp8") else "torch._grouped_mm"
    assert d.kernels["routed_experts"].startswith("grouped: ") and how in d.kernels["routed_experts"]
    loop = rv3.driver(v3[kind], dtype=dtype, gemm_impl=gemm)
    assert torch.equal(d.finish(h), loop.finish(_layers(loop, toks)))  # the loop's bits
    ours, ref = d.finish(h[:, -1]), d.vendor_logits(toks)  # the vendor's own Transformer.forward
    # its head is float32 in a float32 run only (in bf16 the vendor's Transformer keeps it in bf16)
    assert torch.equal(ours, ref) if dtype == torch.float32 else _kld(ours, ref) < 1e-3


@pytest.mark.parametrize("kind", ["float32", "fp8"])
def test_v32_grouped_against_the_vendors_forward(v32, kind):
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    toks = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(0))
    d = _v32_driver(v32[kind], dtype, experts="grouped")
    st = _layers(d, toks)
    assert "torch._grouped_mm" in d.kernels["routed_experts"]
    loop = _v32_driver(v32[kind], dtype)
    ref = loop.vendor_logits(toks)
    assert torch.equal(d.finish(st), loop.finish(_layers(loop, toks)))
    assert (d.finish(st)[:, -1] - ref).abs().max().item() <= 1e-6 * ref.abs().max().item()  # head over B*L rows
    assert torch.equal(d.vendor_logits(toks), ref)  # the grouped driver's own oracle is still the vendor's loop
    assert "forward" not in vars(d._vendor.layers[-1].ffn)


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_v41_grouped_against_the_vendors_forward(v41, kind):
    toks = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    d = _v41_driver(v41[kind], experts="grouped")
    st = _layers(d, toks)
    want = "act_quant + fp4_gemm" if kind == "fp8" else "F.linear"
    assert f"weights: {want} / {want}" in d.kernels["routed_experts"]
    ref = d.vendor_logits(toks)
    assert (d.finish(st)[:, -1] - ref).abs().max().item() <= 1e-6
    norm, head = d._head
    with torch.inference_mode():  # the final state through the vendor's collapse, norm and head: its bits
        assert torch.equal(head(norm(d.m.Block.hc_pre(None, st.h, st.pre_mix))).float(), ref)


def test_gate_hooks_fire_and_forced_routes_are_taken(v41):
    """A forward hook on the vendor's Gate sees every MoE call once and may replace its routes; the grouped
    experts take the replaced routes exactly as the vendor's loop does."""
    toks = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(3))
    out, calls = {}, {}
    for experts in ("vendor", "grouped"):
        d = _v41_driver(v41["fp8"], experts=experts)
        n = d.args.n_routed_experts

        def force(i, layer, experts=experts):
            def hook(mod, args, res):
                calls[experts] = calls.get(experts, 0) + 1
                return res[0], (res[1] + 1) % n  # every token to the next experts: still distinct per token
            layer.ffn.gate.register_forward_hook(hook)

        out[experts] = d.finish(_layers(d, toks, force))
    assert calls["vendor"] == calls["grouped"] == 6  # one per layer, not two
    assert torch.equal(out["vendor"], out["grouped"])
    plain = _v41_driver(v41["fp8"], experts="grouped")
    assert not torch.equal(plain.finish(_layers(plain, toks)), out["grouped"])  # the forcing changed something


def test_act_transform_and_expert_hooks(v3):
    """A quant spec's act_transform (pre-hooks on the experts' linears) is applied to the sorted rows: the loop's
    bits. A forward hook on an expert's linear is not a thing the grouped GEMM can call: that layer takes the
    vendor's loop (recorded), and the hook fires."""
    toks = rv3.tokens(2, 24, seed=5)

    def e4m3(x):  # row-wise, as quant specs' activation transforms are
        s = x.abs().amax(-1, keepdim=True).clamp_min(1e-6) / 448
        return (x / s).to(torch.float8_e4m3fn).to(x.dtype) * s

    act = {"routed_experts": e4m3}
    loop = rv3.driver(v3["f32"], act_transform=act)
    d = rv3.driver(v3["f32"], act_transform=act, experts="grouped")
    assert torch.equal(d.finish(_layers(d, toks)), loop.finish(_layers(loop, toks)))
    assert not torch.equal(loop.finish(_layers(loop, toks)), rv3.layer_by_layer(rv3.driver(v3["f32"]), toks))
    seen = []

    def hook_an_expert(i, layer):
        if hasattr(layer.ffn, "experts"):
            layer.ffn.experts[0].w2.register_forward_hook(lambda m, a, o: seen.append(i))

    g = rv3.driver(v3["f32"], experts="grouped")
    assert torch.equal(g.finish(_layers(g, toks, hook_an_expert)), rv3.layer_by_layer(rv3.driver(v3["f32"]), toks))
    assert seen and "vendor MoE.forward" in g.kernels["routed_experts"]


def test_bad_value_is_one_line(v3):
    from fideval.model.runner import RunnerOptions, make_runner

    with pytest.raises(FidevalError, match="neither vendor nor grouped") as e:
        rv3.driver(v3["f32"], experts="groupd")
    assert "\n" not in str(e.value)
    with pytest.raises(FidevalError, match="neither vendor nor grouped"):
        make_runner(v3["f32"], RunnerOptions(implementation="reference", trust_remote_code=True, reference_experts="x"))


def test_validate_refuses_a_bad_value_in_one_line(tmp_path):
    import yaml
    from cli_runner import run_fideval

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = yaml.safe_load(open(os.path.join(root, "configs", "demo.yaml")).read())
    data["model"]["reference_experts"] = "groupd"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    line = run_fideval("validate", tmp_path / "c.yaml").error()  # exit 2 and exactly one line
    assert "'model.reference_experts'" in line and "'vendor' or 'grouped'" in line


def _runner_logits(folder, dtype, mb, experts, reference=None, device="cpu"):
    from fideval.model.runner import RunnerOptions, make_runner

    toks = np.random.default_rng(0).integers(0, 512, size=(4, 24)).astype(np.int32)
    opts = RunnerOptions(implementation="reference", trust_remote_code=True, micro_batch=mb, dtype=dtype,
                         reference_experts=experts, reference=reference, device=device)
    return torch.from_numpy(np.stack([v.numpy() for _, v in sorted(make_runner(folder, opts).run(toks))]))


@pytest.mark.parametrize("family", ["v3-f32", "v3-fp8-gemm-fp8-f32", "v32-f32", "v32-fp8", "v41-fp8"])
def test_measured_against_the_loops_own_batch_dependence(v3, v32, v41, family):
    """The runner at micro-batch 4: grouped vs the loop, beside the loop at micro-batch 1 vs 4 (docs/runner.md)."""
    folder, dtype, ref = {"v3-f32": (v3["f32"], torch.float32, None),
                          "v3-fp8-gemm-fp8-f32": (v3["fp8"], torch.float32, {"gemm_impl": "fp8"}),
                          "v32-f32": (v32["float32"], torch.float32, None),
                          "v32-fp8": (v32["fp8"], torch.bfloat16, None),
                          "v41-fp8": (v41["fp8"], torch.bfloat16, None)}[family]
    loop4, loop1 = (_runner_logits(folder, dtype, mb, "vendor", ref) for mb in (4, 1))
    grouped = _runner_logits(folder, dtype, 4, "grouped", ref)
    batch, diff = (loop1 - loop4).abs().max().item(), (grouped - loop4).abs().max().item()
    print(f"{family}: loop mb1 vs mb4 max|d| {batch:.3g} KLD {_kld(loop1, loop4):.3g}; "
          f"grouped vs loop max|d| {diff:.3g} KLD {_kld(grouped, loop4):.3g}")
    assert diff == 0 and batch <= (5e-6 if dtype == torch.float32 else 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["v3-fp8-gemm-bf16", "v3-fp8-ue8m0", "v32-fp8", "v41-fp8"])
def test_on_cuda_grouped_stays_within_the_loops_own_batch_dependence(v3, v32, v41, family):
    """On CUDA the FP8/FP4 experts' stack is bf16 (filled an expert at a time) and the GEMMs are grouped bf16 ones,
    whose float32 sums run in another order than the loop's: not the loop's bits, but within what the loop itself
    moves between micro-batches 1 and 4 (or a bf16 rounding of the largest logit, where that is 0), and a KLD far
    below any build's."""
    folder, ref = {"v3-fp8-gemm-bf16": (v3["fp8"], None), "v3-fp8-ue8m0": (v3["fp8_ue8m0"], {"gemm_impl": "fp8"}),
                   "v32-fp8": (v32["fp8"], None), "v41-fp8": (v41["fp8"], None)}[family]
    loop4, loop1 = (_runner_logits(folder, torch.bfloat16, mb, "vendor", ref, "cuda") for mb in (4, 1))
    grouped = _runner_logits(folder, torch.bfloat16, 4, "grouped", ref, "cuda")
    batch, diff = (loop1 - loop4).abs().max().item(), (grouped - loop4).abs().max().item()
    print(f"cuda {family}: loop mb1 vs mb4 max|d| {batch:.3g} KLD {_kld(loop1, loop4):.3g}; "
          f"grouped vs loop max|d| {diff:.3g} KLD {_kld(grouped, loop4):.3g}")
    assert diff <= max(2 * batch, loop4.abs().max().item() * 2**-7) and _kld(grouped, loop4) < 1e-4


def _mp_worker(rank: int, world: int, folder: str, out: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(__file__))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        toks = rv3.tokens(2, 16, seed=9)
        res = {}
        for experts in ("vendor", "grouped"):
            d, kept = _v3_at(folder, rank, world, experts), []
            h = _layers(d, toks, lambda i, layer: kept.append(layer.ffn))
            res[experts] = d.finish(h)
        moes = [m for m in kept if hasattr(m, "experts")]
        res["slices"] = [(m.experts_start_idx, m.experts_end_idx) for m in moes]
        # the stacked weights are this rank's experts' own, in order
        res["own"] = all(all(a is b for a, b in zip(m._fideval_grouped_plan.experts,
                                                     m.experts[m.experts_start_idx:m.experts_end_idx]))
                         and len(m._fideval_grouped_plan.experts) == m.experts_end_idx - m.experts_start_idx
                         and m._fideval_grouped_plan.w1.weight.shape[0] == m.experts_end_idx - m.experts_start_idx
                         for m in moes)
        res["vendor_last"], res["ours_last"] = d.vendor_logits(toks), d.finish(h[:, -1])
        res["routed"] = d.kernels["routed_experts"]
        torch.save(res, f"{out}/r{rank}.pt")
        dist.barrier()  # every rank past its last collective before any tears the group down (gloo aborted a rank)
    finally:
        dist.destroy_process_group()


def _v3_at(folder, rank, world, experts):
    from pathlib import Path

    from fideval.model.reference.code import load_vendor_code
    from fideval.model.reference.deepseek_v3 import DeepseekV3Driver
    from fideval.model.weights.checkpoint import Checkpoint

    stand, prefer = DeepseekV3Driver.stand_ins(torch.device("cpu"))
    code = load_vendor_code(Path(folder) / "inference", trust=True, stand_ins=stand, prefer_vendor=prefer)
    ck = Checkpoint(folder)
    return DeepseekV3Driver(code, ck.config_dict, ck, rank=rank, world=world, experts=experts)


def test_model_parallel_2_keeps_each_ranks_expert_slice(v3, tmp_path):
    """N = 2 on gloo: each rank groups only its experts [lo, hi); the gathered logits equal the loop's at N = 2
    bit for bit, and the last position equals the vendor's own forward at N = 2."""
    import torch.multiprocessing as mp

    # spawn: a forked rank would inherit the one-process group V3.2's driver may have made in this process
    mp.start_processes(_mp_worker, args=(2, str(v3["f32"]), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    ranks = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    assert [r["slices"] for r in ranks] == [[(0, 4)] * 2, [(4, 8)] * 2]  # 8 experts over 2 ranks, 2 MoE layers
    for r in ranks:
        assert r["own"]
        assert torch.equal(r["grouped"], r["vendor"]) and torch.equal(r["grouped"], ranks[0]["grouped"])
        assert torch.equal(r["ours_last"], r["vendor_last"])
        assert r["routed"].startswith("grouped: torch._grouped_mm")


def test_the_stack_is_built_as_the_layer_loads(v3):
    """On the loading thread (the runner's prefetch thread, its load stream on a GPU), not in the first call: the
    first MoE call finds its plan; a layer whose experts carry hooks the grouped path cannot honour gets none."""
    from fideval.model.reference import grouped_experts as ge

    d = rv3.driver(v3["fp8"], dtype=torch.bfloat16, experts="grouped")
    i = d.args.n_dense_layers
    plan = getattr(d.load_layer(i).ffn, ge._PLAN)
    assert isinstance(plan, ge.Plan) and plan.w1.weight.dtype == torch.bfloat16  # the vendor's weight_dequant dtype
    assert plan.w1.weight.shape[0] == d.args.n_routed_experts
    assert not hasattr(d.load_layer(0).ffn, ge._PLAN)  # a dense layer


def test_with_gemm_bf16_the_experts_keep_only_the_stack_and_the_loop_gives_its_bits(v3):
    """V3's FP8 experts under gemm_impl bf16: each expert's weight becomes its bf16 slice of the stack (the FP8 copy is
    freed); the vendor's loop over such a layer (what a hooked layer falls back to) gives the untouched loop's bits."""
    from fideval.model.reference import grouped_experts as ge

    toks = rv3.tokens(2, 24)
    d = rv3.driver(v3["fp8"], dtype=torch.bfloat16, experts="grouped")
    i = d.args.n_dense_layers
    block = d.load_layer(i)
    stack = getattr(block.ffn, ge._PLAN).w1.weight
    e = block.ffn.experts[0]
    assert e.w1.weight.dtype == torch.bfloat16 and e.w1.weight.data_ptr() == stack[0].data_ptr()
    loop = rv3.driver(v3["fp8"], dtype=torch.bfloat16)
    assert loop.load_layer(i).ffn.experts[0].w1.weight.dtype == torch.float8_e4m3fn
    with torch.inference_mode():
        x = loop.begin(toks)
        for j in range(i):
            x = loop.forward_layer(j, loop.load_layer(j), x)
        got = d.forward_layer(i, ge.vendor_loop(block), x.clone())
        want = loop.forward_layer(i, loop.load_layer(i), x.clone())
    assert torch.equal(got, want)
