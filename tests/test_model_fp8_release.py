"""FP8 releases as the teacher (fideval.model.weights.fp8_release): fp8 weights and block scales read as released,
dequantized on the runner's device as each layer is materialised.

Oracles, none of them fideval's: transformers' own loading of the same release
(``FineGrainedFP8Config(dequantize=True)``) on the shapes it reads right (``aligned``, see fp8_fixtures), DeepSeek's
``weight_dequant`` block by block (``fp8_fixtures.ref_dequant``) everywhere, and the unquantized checkpoint of those
weights written by transformers' ``save_pretrained``.
"""

from __future__ import annotations

import json
import shutil

import fp8_fixtures as ff
import model_fixtures as mf
import numpy as np
import pytest
import torch
from cli_runner import run_fideval

from fideval.errors import FidevalError
from fideval.model.runner import Runner, RunnerOptions
from fideval.windows.layout import Sequences, length_dir, write_sequences

ARCHS = ("qwen3", "deepseek_v3")
TOKS = mf.tokens(ff.V, n=3, length=16)
DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return {(a, s): ff.build(a, s, root / f"{a}-{s}") for a in ARCHS for s in ff.SIZES}


@pytest.fixture(scope="module")
def plain(releases, tmp_path_factory):
    """The unquantized checkpoints of the releases' dequantized weights, bf16 and float32, made on first use."""
    root, made = tmp_path_factory.mktemp("plain"), {}

    def get(arch, size, dtype):
        key = (arch, size, dtype)
        if key not in made:
            made[key] = ff.dequantized(releases[arch, size], root / f"{arch}-{size}-{str(dtype)[6:]}", dtype)
        return made[key]

    return get


def _logits(weights, dtype, **kw) -> torch.Tensor:
    r = Runner(weights, RunnerOptions(micro_batch=3, dtype=dtype, **kw))
    return torch.stack([x for _, x in r.run(TOKS)])


def _layers(weights, dtype) -> dict[str, torch.Tensor]:
    """Every decoder layer's parameters as the runner materialises them."""
    a = Runner(weights, RunnerOptions(dtype=dtype)).adapter
    out = {}
    for i in range(a.n_layers):
        layer = a.meta_layer(i, dtype)
        mod = a.materialize(i, layer, a.read_layer(i, layer, None, pin=False), dtype, None, None)
        out.update({f"model.layers.{i}.{k}": v for k, v in mod.state_dict().items()})
    return out


def _fp8_weights(folder):
    from safetensors.torch import load_file

    sd = load_file(str(folder / "model.safetensors"))
    return {k: (v, sd[k + "_scale_inv"]) for k, v in sd.items() if v.dtype == torch.float8_e4m3fn}


# -- (a) against transformers' own FP8 loading --------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weights_and_logits_equal_transformers_fp8_loading(releases, arch, dtype):
    folder = releases[arch, "aligned"]
    model = ff.transformers_fp8(folder, dtype)
    theirs = model.state_dict()
    ours = _layers(folder, dtype)
    fp8 = _fp8_weights(folder)
    assert theirs[next(iter(fp8))].dtype == dtype  # transformers dequantizes to the dtype it is asked for
    for k, v in ours.items():  # every parameter of every layer, the fused experts included: same dtype, same bits
        assert v.dtype == theirs[k].dtype and torch.equal(v, theirs[k]), k
    assert any(".mlp.experts.gate_up_proj" in k for k in ours) == (arch == "deepseek_v3")
    with torch.no_grad():
        ref = model(torch.from_numpy(TOKS.astype(np.int64))).logits.float()
    got = _logits(folder, dtype)
    d = float((got - ref).abs().max())
    assert float(ref.abs().max()) > 1.0
    if dtype == torch.float32:
        assert d <= 1e-5  # measured 0.0 for both
    else:  # ours keeps the lm head in float32 (test_model_parity: 4 bf16 ulps of the largest logit)
        assert d <= 4 * 2.0**-8 * float(ref.abs().max())


# -- partial edge blocks: DeepSeek's weight_dequant block by block ------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_partial_edge_blocks_equal_deepseek_weight_dequant(releases, arch, dtype):
    folder = releases[arch, "edges"]
    fp8 = _fp8_weights(folder)
    assert any(q.shape[0] % 128 and q.shape[0] > 128 for q, _ in fp8.values())  # partial blocks after full ones
    assert any(q.shape[1] % 128 and q.shape[1] > 128 for q, _ in fp8.values())
    ours = _layers(folder, dtype)
    seen = 0
    for k, (q, s) in fp8.items():
        want = ff.ref_dequant(q, s, dtype)
        if ".mlp.experts." in k:  # per expert on disk, fused [E, 2I, H] gate_up / [E, H, I] down in the module
            i, e, part = k.split(".")[2], int(k.split(".")[5]), k.split(".")[6]
            fused = ours[f"model.layers.{i}.mlp.experts.{'down_proj' if part == 'down_proj' else 'gate_up_proj'}"]
            n = q.shape[0]
            got = fused[e, n:] if part == "up_proj" else fused[e, :n] if part == "gate_proj" else fused[e]
        else:
            got = ours[k]
        assert got.dtype == dtype and torch.equal(got, want), k
        seen += 1
    assert seen == len(fp8)


def test_row_ranges_of_a_matrix_widen_to_whole_blocks(releases):
    """The lm head's vocabulary split under model parallel reads rows [lo, hi) of a matrix: an fp8 one is read from
    the start of lo's block and sliced after dequantization."""
    folder = releases["qwen3", "edges"]
    a = Runner(folder).adapter
    key = "model.layers.0.mlp.up_proj.weight"  # [320, 192]
    full = a.cast(a.read(key), torch.float32)
    for lo, hi in ((100, 300), (128, 320), (0, 5), (250, 251)):
        assert torch.equal(a.cast(a.read(key, rows=(lo, hi)), torch.float32), full[lo:hi])


# -- (b) bit-identical to the unquantized checkpoint of the same weights ------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("size", ff.SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logits_bit_identical_to_the_dequantized_checkpoint(releases, plain, arch, size, dtype):
    """bf16 runs equal the bf16 checkpoint, float32 runs (which keep the float32 product) the float32 one."""
    copy = plain(arch, size, dtype)
    assert "quantization_config" not in json.loads((copy / "config.json").read_text())
    assert torch.equal(_logits(releases[arch, size], dtype), _logits(copy, dtype))


# -- (c) Kimi-K2 is DeepSeek-V3 ---------------------------------------------------------------------------------------
def test_kimi_k2_runs_as_deepseek_v3(releases, tmp_path):
    src = releases["deepseek_v3", "edges"]
    kimi = tmp_path / "kimi"
    shutil.copytree(src, kimi)
    cfg = json.loads((kimi / "config.json").read_text())
    cfg.update(model_type="kimi_k2", auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                                               "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"})
    (kimi / "config.json").write_text(json.dumps(cfg))
    r_kimi, r_ds = Runner(kimi), Runner(src)
    drop = ("model_type", "transformers_version", "_name_or_path")  # the folders differ
    assert {k: v for k, v in r_kimi.adapter.config.to_dict().items() if k not in drop} == \
        {k: v for k, v in r_ds.adapter.config.to_dict().items() if k not in drop}
    for dtype in DTYPES:
        assert torch.equal(_logits(kimi, dtype), _logits(src, dtype))


# -- (d) UE8M0 scales (DeepSeek-V3.1) -----------------------------------------------------------------------------------
def test_ue8m0_scales(tmp_path):
    folder = ff.build("deepseek_v3", "edges", tmp_path / "v31", ue8m0=True)
    fp8 = _fp8_weights(folder)
    assert all(torch.equal(s, torch.exp2(torch.log2(s).round())) for _, s in fp8.values())
    r = Runner(folder, RunnerOptions(dtype=torch.bfloat16))
    assert r.weights_description == "as released: FP8 E4M3, 128x128 block scales (UE8M0), dequantized to bfloat16 on cpu"
    ours = _layers(folder, torch.bfloat16)
    k = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    assert torch.equal(ours[k], ff.ref_dequant(*fp8[k], torch.bfloat16))
    copy = ff.dequantized(folder, tmp_path / "v31-bf16", torch.bfloat16)
    assert torch.equal(_logits(folder, torch.bfloat16), _logits(copy, torch.bfloat16))
    key = "model.layers.1.mlp.experts.5.down_proj.weight_scale_inv"

    def not_pow2(sd):
        s = sd[key].clone()
        s[0, 1] *= 1.5
        return {**sd, key: s}

    ff.edit(folder, not_pow2)
    with pytest.raises(FidevalError, match=rf"'{key}' holds a scale .* powers of two under scale_fmt ue8m0") as e:
        Runner(folder)
    assert "\n" not in str(e.value)


# -- (e) bad inputs: one line naming the tensor, nothing written ---------------------------------------------------------
def _windows(root):
    rng = np.random.default_rng(3)
    write_sequences(length_dir(root, "windows", 16),
                    Sequences(["code-000", "prose-000"], ["code", "prose"], rng.integers(0, ff.V, size=(2, 16)).astype(np.int32)))


def _drop_scale(sd):
    return {k: v for k, v in sd.items() if k != "model.layers.1.self_attn.q_b_proj.weight_scale_inv"}


def _short_scale(sd):
    k = "model.layers.2.mlp.experts.3.up_proj.weight_scale_inv"
    return {**sd, k: sd[k][:1].contiguous()}


def _nan_scale(sd):
    k = "model.layers.0.mlp.down_proj.weight_scale_inv"
    s = sd[k].clone()
    s[1, 0] = float("nan")
    return {**sd, k: s}


def _zero_scale(sd):
    k = "model.layers.2.mlp.shared_experts.gate_proj.weight_scale_inv"
    return {**sd, k: torch.zeros_like(sd[k])}


def _orphan_scale(sd):
    return {**sd, "model.layers.0.input_layernorm.weight_scale_inv": torch.ones(1, 1)}


BAD = {  # case -> (tensor edit, quantization_config edit, what the one line must name)
    "missing scale": (_drop_scale, None, ["'model.layers.1.self_attn.q_b_proj.weight'", "has no", "_scale_inv"]),
    "mis-shaped scale": (_short_scale, None, ["'model.layers.2.mlp.experts.3.up_proj.weight_scale_inv'", "shape [1, 2]", "[2, 2]"]),
    "block size does not tile": (None, {"weight_block_size": [96, 96]}, ["_scale_inv'", "weight_block_size [96, 96]"]),
    "NaN scale": (_nan_scale, None, ["'model.layers.0.mlp.down_proj.weight_scale_inv'", "nan", "finite and > 0"]),
    "zero scale": (_zero_scale, None, ["'model.layers.2.mlp.shared_experts.gate_proj.weight_scale_inv'", "0.0"]),
    "scale of a bf16 tensor": (_orphan_scale, None, ["'model.layers.0.input_layernorm.weight_scale_inv'", "bfloat16"]),
    "unknown quant_method": (None, {"quant_method": "awq"}, ["config.json", "quant_method 'awq'"]),
    "unknown fmt": (None, {"fmt": "e5m2"}, ["config.json", "quantization_config.fmt 'e5m2'"]),
    "static activations": (None, {"activation_scheme": "static"}, ["config.json", "activation_scheme 'static'"]),
    "no block size": (None, {"weight_block_size": None}, ["config.json", "weight_block_size None"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_release_is_one_line_and_writes_nothing(releases, tmp_path, case):
    tensors, qc, needles = BAD[case]
    folder = tmp_path / "m"
    shutil.copytree(releases["deepseek_v3", "edges"], folder)
    if tensors is not None:
        ff.edit(folder, tensors)
    if qc is not None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["quantization_config"].update(qc)
        (folder / "config.json").write_text(json.dumps(cfg))
    _windows(tmp_path / "w")
    msg = run_fideval("teacher", "--model", folder, "--windows", tmp_path / "w", "--out", tmp_path / "s",
                      "--device", "cpu", "--lengths", "windows").error()
    assert all(n in msg for n in needles), msg
    # no store: no manifest, no shard, no temp file; only the output lock taken before the model is opened
    assert [q.name for q in (tmp_path / "s").rglob("*")] == [".fideval.lock"]


def test_up_front_check_reads_every_scale_once(releases, monkeypatch):
    """The values check reads each file's scales with one pread per run of back-to-back tensors, not one read per
    tensor: safetensors groups tensors by dtype, then name, so the 72 float32 scales here form 3 runs (the float32
    e_score_correction_bias of the two MoE layers sit between them)."""
    import os

    from fideval.model.weights import fp8_release
    from fideval.model.weights.checkpoint import Checkpoint

    ck = Checkpoint(releases["deepseek_v3", "edges"])
    calls = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: calls.append(off) or real(fd, bufs, off))
    n = fp8_release.check(ck, ck.release)
    assert n == len(_fp8_weights(ck.dir)) == 72 and len(calls) == 3


# -- the teacher verb and its provenance --------------------------------------------------------------------------------
def test_teacher_store_records_the_weights(releases, plain, tmp_path):
    from fideval.store import StoreReader

    folder = releases["qwen3", "edges"]
    _windows(tmp_path / "w")
    for model, out, want in ((folder, "s", "as released: FP8 E4M3, 128x128 block scales, dequantized to float32 on cpu"),
                             (plain("qwen3", "edges", torch.bfloat16), "p", "as released: bfloat16")):
        res = run_fideval("teacher", "--model", model, "--windows", tmp_path / "w", "--out", tmp_path / out,
                          "--device", "cpu", "--lengths", "windows")
        assert res.code == 0, res.stderr
        teacher = json.loads(StoreReader(tmp_path / out).meta["teacher"])
        assert teacher["weights"] == want and teacher["dtype"] == "float32" and teacher["lm_head"] == "float32"
    store = StoreReader(tmp_path / "s")
    logits, ids = store.read("prose-000")
    r = Runner(folder)
    (_, ref), = r.run(ids[None].astype(np.int32), canary=False)
    assert np.array_equal(logits, ref.numpy())


# -- (f) candidates on an FP8 reference ---------------------------------------------------------------------------------
SPEC = {"routed_experts": {"format": "mxfp4"}, "attention": {"format": "mxfp4"}}


def test_emulated_mxfp4_candidate_starts_from_the_dequantized_release(releases, plain):
    """A quant spec quantizes the released weights as the runner dequantized them: bit-identical to the same spec
    on the unquantized checkpoint of those weights; bits are counted on the weights, scales folded into them."""
    from fideval.quant.inspect import class_shapes, inspect_model
    from fideval.quant.spec import compile_spec

    folder, copy = releases["deepseek_v3", "edges"], plain("deepseek_v3", "edges", torch.bfloat16)
    wt = compile_spec(SPEC).weight_transform
    emu = _logits(folder, torch.bfloat16, weight_transform=wt)
    assert torch.equal(emu, _logits(copy, torch.bfloat16, weight_transform=wt))
    assert float((emu - _logits(folder, torch.bfloat16)).abs().max()) > 1e-3  # the quantization is really there
    assert class_shapes(folder) == class_shapes(copy)
    a, b = inspect_model(folder, "routed_experts=mxfp4,attention=mxfp4"), inspect_model(copy, "routed_experts=mxfp4,attention=mxfp4")
    assert a["classes_present"] == b["classes_present"] == ["attention", "dense_mlp", "lm_head", "routed_experts", "shared_experts"]
    for cls in ("routed_experts", "attention"):  # quantized by the spec: the same tensors, the same bits
        assert a["per_class"][cls] == b["per_class"][cls]
    fp8 = _fp8_weights(folder)  # left alone: the release's fp8 bits, its 32-bit scales included
    dense = [(q.numel(), s.numel()) for k, (q, s) in fp8.items() if ".mlp." in k and ".experts." not in k and "shared" not in k]
    assert a["per_class"]["dense_mlp"]["bits"] == sum(8 * n + 32 * m for n, m in dense)
    assert b["per_class"]["dense_mlp"]["bpw"] == 16.0 and a["per_class"]["lm_head"]["bpw"] == 16.0  # bf16 as released


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_real_build_candidate_on_an_fp8_reference(releases, plain, dtype):
    """QuantizedCheckpoint takes an FP8 release as the reference (its config is the model's): the release itself
    as a real build (decoded on the CPU) gives the teacher's logits bit for bit, and a plain build those of that build."""
    from fideval.model.weights.quantized import QuantizedCheckpoint

    folder = releases["deepseek_v3", "edges"]
    teacher = _logits(folder, dtype)
    assert torch.equal(_logits(QuantizedCheckpoint(folder, folder), dtype), teacher)
    copy = plain("deepseek_v3", "edges", dtype)
    assert torch.equal(_logits(QuantizedCheckpoint(copy, folder), dtype), _logits(copy, dtype))


def test_a_reference_quantized_another_way_is_refused(releases, tmp_path):
    from fideval.model.weights.quantized import QuantizedCheckpoint

    ref = tmp_path / "ref"
    shutil.copytree(releases["qwen3", "aligned"], ref)
    cfg = json.loads((ref / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors"}
    (ref / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FidevalError, match=r"config.json: quantization_config.quant_method 'compressed-tensors' cannot be read"):
        QuantizedCheckpoint(releases["qwen3", "aligned"], ref)


# -- on a GPU: bytes to the device, dequantized there -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_dequantizes_on_the_device_bit_identical_to_the_cpu(releases, dtype):
    folder = releases["deepseek_v3", "edges"]
    r = Runner(folder, RunnerOptions(device="cuda", dtype=dtype))
    a = r.adapter
    layer = a.meta_layer(1, dtype)
    raw = a.read_layer(1, layer, None, pin=True, device=r.device, side_stream=r.side)
    packed = raw["mlp.experts.gate_up_proj"]
    assert packed.data.dtype == torch.float8_e4m3fn and packed.data.device.type == "cuda"  # fp8 bytes crossed PCIe
    gpu = {k: v.cpu() for k, v in a.materialize(1, layer, raw, dtype, None, None).state_dict().items()}
    cpu = {k[len("model.layers.1."):]: v for k, v in _layers(folder, dtype).items() if k.startswith("model.layers.1.")}
    assert gpu.keys() == cpu.keys() and all(torch.equal(gpu[k], cpu[k]) for k in cpu)
    assert r.weights_description.endswith(f"dequantized to {str(dtype)[6:]} on cuda")
    ref = mf.reference_logits(ff.dequantized(folder, folder.parent / f"cuda-{str(dtype)[6:]}", dtype), TOKS, dtype)
    got = torch.stack([x.cpu() for _, x in r.run(TOKS)])
    assert float((got - ref).abs().max()) <= (1e-4 if dtype == torch.float32 else 4 * 2.0**-8 * float(ref.abs().max()))
