"""Every family of fideval.model.families beyond the first seven, against transformers' own full-model forward
(the oracle), on tiny random configs that exercise its layer types; and what the runner refuses, in one line."""

from __future__ import annotations

import json

import family_fixtures as ff
import model_fixtures as mf
import pytest
import torch

from fideval.errors import FidevalError
from fideval.model import families
from fideval.model.adapters import Adapter
from fideval.model.runner import Runner, RunnerOptions

NAMES = list(ff.configs())
# the layer types each tiny config must exercise (so a mask rule is really tested, not just present)
LAYER_TYPES = {
    "mistral": {"sliding_attention"}, "gemma2": {"sliding_attention", "full_attention"},
    "gemma3_text": {"sliding_attention", "full_attention"}, "qwen2_moe": {"sliding_attention", "full_attention"},
    "dots1": {"sliding_attention", "full_attention"}, "llama4_text": {"chunked_attention", "full_attention"},
    "qwen3_next": {"linear_attention", "full_attention"}, "minimax": {"linear_attention", "full_attention"},
    "deepseek_v32": {"indexed_attention"},
}
RENAMED = {"indexed_attention": "deepseek_sparse_attention"}  # transformers 5.17's name for DeepSeek-V3.2's layers


def _build(name, folder, **kw):
    return mf.build_config(ff.configs()[name], folder, **kw)


def _max_diff(out: dict, ref: torch.Tensor) -> float:
    return max(float((out[k] - ref[k]).abs().max()) for k in range(ref.shape[0]))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each family's checkpoint and the oracle's logits, built once for the module's tests."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = _build(name, tmp_path_factory.mktemp(name) / name)
            toks = mf.tokens(mf.COMMON["vocab_size"], n=3, length=24)
            cache[name] = folder, toks, mf.reference_logits(folder, toks)
        return cache[name]
    return get


def test_every_new_family_has_a_fixture():
    first_seven = {"llama", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss"}
    import importlib.util

    installed = {f.model_type for f in families.FAMILIES.values()
                 if importlib.util.find_spec(f"transformers.models.{f.package}") is not None}
    want = installed - first_seven  # a transformers without a family (5.17 may lack some) cannot test it
    assert want == set(NAMES)
    assert set(mf.configs()) == first_seven


@pytest.mark.parametrize("name", NAMES)
def test_float32_parity(built, name):
    folder, toks, ref = built(name)
    runner = Runner(folder, RunnerOptions(micro_batch=2))
    kinds = {runner.adapter.layer_type(i) for i in range(runner.adapter.n_layers)}
    want = LAYER_TYPES.get(name, {"full_attention"})
    assert want <= kinds or {RENAMED.get(t, t) for t in want} <= kinds, kinds
    out = dict(runner.run(toks))
    assert sorted(out) == [0, 1, 2]
    assert float(ref.abs().max()) > 1.0  # logits are not degenerate
    assert _max_diff(out, ref) <= 1e-5
    assert runner.canary["identical"]


@pytest.mark.parametrize("name", NAMES)
def test_mlp_over_token_blocks(built, name):
    """The throughput mode: families whose layers are not two plain halves run whole layers. Blocks of other
    shapes than the oracle's batch change GEMM and scan shapes, so the bound is relative (qwen3_next's chunked
    delta rule: 2.3e-5 at |logit| 6, and 0 at the oracle's own composition)."""
    folder, toks, ref = built(name)
    out = dict(Runner(folder, RunnerOptions(micro_batch=1, mlp_tokens=48)).run(toks))
    assert _max_diff(out, ref) <= 1e-5 * float(ref.abs().max())
    same = dict(Runner(folder, RunnerOptions(micro_batch=3, mlp_tokens=72)).run(toks))
    assert _max_diff(same, ref) <= 1e-5


@pytest.mark.parametrize(("name", "change"), [
    ("gemma2", {"head": None}), ("gemma3_text", {"embed": None}), ("gemma3_text", {"head": None}),
    ("granitemoe", {"embed": None}), ("granitemoe", {"head": None}), ("minimax", {"halves": True}),
])
def test_each_family_step_is_needed(built, monkeypatch, name, change):
    """The oracle catches a missing step: without its family's embedding scale, logit finish, rotary per layer type
    or whole-layer rule, the runner is far off (the failure mode of adding a table row alone)."""
    import dataclasses

    folder, toks, ref = built(name)
    arch = next(a for a, f in families.FAMILIES.items() if f.model_type == name)
    monkeypatch.setitem(families.FAMILIES, arch, dataclasses.replace(families.FAMILIES[arch], **change))
    opts = RunnerOptions(micro_batch=1, mlp_tokens=48) if "halves" in change else RunnerOptions(micro_batch=2)
    assert _max_diff(dict(Runner(folder, opts).run(toks)), ref) > 1e-3


def _config(tmp_path, **cfg):
    d = tmp_path / "m"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _refusal(d) -> str:
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(FidevalError) as e:
        Adapter.from_config(cfg, d, d / "config.json")
    msg = str(e.value)
    assert "\n" not in msg and str(d / "config.json") in msg
    return msg


def test_refused_architecture_names_the_feature(tmp_path):
    d = _config(tmp_path, architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4")
    assert "hyper-connections" in _refusal(d)
    d = _config(tmp_path, architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3")
    assert "multimodal" in _refusal(d)


def test_unknown_architecture_lists_the_supported(tmp_path):
    msg = _refusal(_config(tmp_path, architectures=["FalconMambaForCausalLM"], model_type="falcon_mamba"))
    assert "not supported" in msg and "Qwen3NextForCausalLM" in msg


def test_unknown_layer_type_is_refused_in_one_line(tmp_path, monkeypatch):
    """A layer type no mask rule covers (transformers' config validator lets only its own names through, so the
    rule for linear attention is taken away to stand for a type a newer transformers adds)."""
    folder = _build("qwen3_next", tmp_path / "q")
    monkeypatch.delitem(families.MASKS, "linear_attention")
    with pytest.raises(FidevalError) as e:
        Runner(folder)
    assert "layer type 'linear_attention' is not supported" in str(e.value) and "\n" not in str(e.value)


def test_refused_setting_names_it(tmp_path):
    folder = _build("gemma3_text", tmp_path / "g")
    mf.set_config(folder, use_bidirectional_attention=True)
    with pytest.raises(FidevalError, match="use_bidirectional_attention=True .bidirectional attention."):
        Runner(folder)


def test_docs_family_table_is_generated_from_the_table():
    text = families.DOC.read_text()
    assert families.render(text) == text, "docs/runner.md is stale: run python -m fideval.model.families"
    for arch in list(families.FAMILIES) + list(families.REFUSED):
        assert f"`{arch}`" in text


def test_experts_implementation_is_set_explicitly(tmp_path):
    """Layers built outside PreTrainedModel read the config's experts implementation: grouped_mm is set where the
    model class takes the setting (its routed experts), left alone where transformers refuses it (Gemma 2, Llama 4)."""
    for name, want in (("qwen2_moe", "grouped_mm"), ("olmoe", "grouped_mm"), ("glm4_moe", "grouped_mm"),
                       ("gemma2", None), ("llama4_text", None)):
        cfg = ff.configs()[name].to_dict()
        arch = next(a for a, f in families.FAMILIES.items() if f.model_type == name)
        d = _config(tmp_path / name, **{**cfg, "architectures": [arch]})
        got = getattr(Adapter.from_config(cfg | {"architectures": [arch]}, d, d / "config.json").config,
                      "_experts_implementation", None)
        assert got == want if want else got in (None, "eager"), (name, got)


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_layers_keep_the_dtypes_from_pretrained_gives(built, name):
    """A bf16 run materialises each parameter in the dtype transformers' from_pretrained(dtype=bfloat16) gives it:
    bfloat16, or float32 where the module's own constructor makes it so (HunYuan's router ``wg``: cast to bf16 it
    routed in bf16, 0.0207 from transformers at |logit| 3.6 where it is now 0.0093); ``_keep_in_fp32_modules``
    (which transformers applies only to fp16) stay float32 by the runner's documented choice."""
    from transformers import AutoModelForCausalLM

    folder, _, _ = built(name)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    want = {n.split(".layers.0.", 1)[1]: t.dtype for n, t in [*hf.named_parameters(), *hf.named_buffers()] if ".layers.0." in n}
    runner = Runner(folder, RunnerOptions(dtype=torch.bfloat16))
    layer = runner._load((0, 0))
    got = {n: t.dtype for n, t in layer.state_dict().items() if t.is_floating_point()}
    keep = runner.adapter.keep_fp32
    differ = {n: (got[n], want.get(n)) for n in got if n in want and got[n] != want[n] and not any(k in n for k in keep)}
    assert not differ


@pytest.mark.parametrize("name", ["gemma2", "qwen3_next", "glm4_moe", "hunyuan_v1_moe"])
def test_bfloat16_difference(built, name):
    """bf16 layers vs transformers in bf16: a few bf16 ulps of the largest logit (our lm head is float32)."""
    folder, toks, _ = built(name)
    ref = mf.reference_logits(folder, toks, torch.bfloat16)
    out = dict(Runner(folder, RunnerOptions(micro_batch=3, dtype=torch.bfloat16)).run(toks))
    assert _max_diff(out, ref) <= 4 * 2.0**-8 * float(ref.abs().max())


MOE_FAMILIES = ["qwen2_moe", "olmoe", "deepseek_v2", "glm4_moe", "ernie4_5_moe", "granitemoe", "hunyuan_v1_moe", "dots1",
                "minimax_m2", "glm4_moe_lite", "llama4_text", "qwen3_next", "minimax", "deepseek_v32"]


@pytest.mark.slow
def test_model_parallel_two_ranks_match_one(tmp_path):
    """N = 2 (gloo, CPU) gives the N = 1 logits within tests/test_model_parallel.py's bound for every MoE family;
    the families whose experts are no ``mlp.experts`` module (Granite, Llama 4) replicate them (same logits).
    Qwen3-Next's chunked delta rule amplifies the reassociated expert sums (and the workers' one thread): it is
    held to the throughput test's relative bound, 1e-5 x max |logit| (measured 2.1e-5 at |logit| 6)."""
    import numpy as np
    import torch.multiprocessing as mp
    from test_model_parallel import BOUND, _worker

    folders = [_build(n, tmp_path / n) for n in MOE_FAMILIES]
    toks = mf.tokens(mf.COMMON["vocab_size"], n=3, length=16)
    single = [np.stack([v.numpy() for _, v in sorted(Runner(f, RunnerOptions(micro_batch=2)).run(toks))]) for f in folders]
    mp.start_processes(_worker, args=(2, [str(f) for f in folders], toks, str(tmp_path)),
                       nprocs=2, join=True, start_method="fork")
    for j, ref in enumerate(single):
        a, b = (np.load(tmp_path / f"r{r}-m{j}.npy") for r in range(2))
        assert np.array_equal(a, b)
        bound = 1e-5 * float(np.abs(ref).max()) if MOE_FAMILIES[j] == "qwen3_next" else BOUND
        assert float(np.abs(a - ref).max()) <= bound, (MOE_FAMILIES[j], float(np.abs(a - ref).max()))


@pytest.mark.parametrize("name", NAMES)
def test_sizing_counts_the_layers_transformers_builds(name):
    """fideval.model.flops' layer parameters (what the GPU sizing budgets for a resident layer) against the
    parameters of transformers' own decoder layers: within 20 % for every family (attention is counted as standard:
    MiniMax's lightning-attention layers are the farthest, 18 % under), and MoE FLOPs counted for MoE families."""
    import importlib

    from fideval.model.flops import flops_per_token, layer_params

    cfg = ff.configs()[name]
    fam = next(f for f in families.FAMILIES.values() if f.model_type == name)
    modeling = importlib.import_module(f"transformers.models.{fam.package}.modeling_{fam.package}")
    with torch.device("meta"):
        real = [sum(p.numel() for p in getattr(modeling, fam.prefix + "DecoderLayer")(cfg, i).parameters())
                for i in range(cfg.num_hidden_layers)]
    est = layer_params(cfg)
    assert all(abs(e - r) <= 0.2 * r for e, r in zip(est, real, strict=True)), (est, real)
    assert (flops_per_token(cfg, 16)["moe"] > 0) == (name in MOE_FAMILIES)


def _cuda_reference(folder, toks, dtype):
    """transformers' own full forward on the GPU, TF32 off (the runner's setting), float32 logits on the host: the
    whole batch, and each sequence alone (how much the oracle itself moves with the batch's composition)."""
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval().to("cuda")
    ids = torch.from_numpy(toks.astype("int64")).to("cuda")
    with torch.no_grad():
        out = model(ids).logits.float().cpu()
        alone = torch.cat([model(ids[i:i + 1]).logits.float().cpu() for i in range(len(ids))])
    del model
    torch.cuda.empty_cache()
    return out, alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_parity_float32_and_bfloat16(built, name):
    """On the GPU, against transformers' own forward on the same GPU: float32 within 1e-5 (as on the CPU), and
    the bf16 path within 4 bf16 ulps of the largest logit (our lm head is float32, transformers' is bf16).

    The bound holds at the oracle's own batch (micro-batch 3: its three sequences in one call, the same GEMM
    shapes). At micro-batch 2 a GPU's GEMMs round differently, as transformers' own do between a batch of 1 and of
    3; there the bound is the larger of the above and twice transformers' own batch dependence, measured here
    (qwen3_next float32 on an H100: 3.9e-5 at micro-batch 2, 0 at 3, transformers' own 3.8e-5; docs/runner.md)."""
    folder, toks, _ = built(name)
    seen = []  # both dtypes measured and printed before any assertion: a failure says by how much, in each
    for dtype, bound in ((torch.float32, lambda ref: 1e-5), (torch.bfloat16, lambda ref: 4 * 2.0**-8 * float(ref.abs().max()))):
        ref, alone = _cuda_reference(folder, toks, dtype)
        out = {k: v.cpu() for k, v in Runner(folder, RunnerOptions(device="cuda", micro_batch=2, dtype=dtype)).run(toks)}
        same = {k: v.cpu() for k, v in Runner(folder, RunnerOptions(device="cuda", micro_batch=3, dtype=dtype)).run(toks)}
        d, exact, own = _max_diff(out, ref), _max_diff(same, ref), float((alone - ref).abs().max())
        print(f"{name} {dtype}: max |delta logit| at the oracle's batch (micro-batch 3) {exact:.3g} (bound {bound(ref):.3g}, "
              f"largest logit {float(ref.abs().max()):.3g}); at micro-batch 2 {d:.3g} (bound {max(bound(ref), 2 * own):.3g}); "
              f"transformers alone vs batched {own:.3g}")
        seen.append((str(dtype), exact, bound(ref), d, max(bound(ref), 2 * own)))
    assert all(e <= b and d <= b2 for _, e, b, d, b2 in seen), (name, seen)
