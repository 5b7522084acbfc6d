"""``fideval validate`` refuses, in seconds and with one line naming the key, what a stage would refuse hours
later: quant specs, module classes the model lacks, blocks that do not divide a tensor, architectures the
runner or transformers refuse, real builds their decoders refuse, a missing tokenizer or chat template, a
model-parallel N that does not split the experts, teacher stores larger than the free disk.

Every case runs the real entry point on a config that differs from a valid one in one key; the oracle for
each message is the component that would raise it later (the same words), and the key is the config's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_runner import run_fideval
from model_fixtures import build_config, configs

ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL = ROOT / "fideval" / "demo" / "assets" / "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HEX40 = "0123456789abcdef0123456789abcdef01234567"
CODE = {"name": "code", "source": {"type": "local", "path": "demo://corpus/code.jsonl", "text_field": "text"}}
CHAT = {"name": "chat", "kind": "chat", "source": {"type": "local", "path": "demo://corpus/chat.jsonl", "messages_field": "messages"}}


def with_tokenizer(folder: Path, src: Path = DEMO_MODEL) -> Path:
    for f in TOKENIZER_FILES:
        shutil.copy(src / f, folder / f)
    return folder


def build(name: str, folder: Path) -> Path:
    """A tiny random checkpoint with the demo tokenizer's vocabulary (4,096): validate refuses a tokenizer larger
    than the model's vocab_size."""
    cfg = configs()[name]
    cfg.vocab_size = 4096
    return build_config(cfg, folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny random checkpoints with the demo tokenizer: a dense Llama and a Qwen3-MoE (no shared experts)."""
    tmp = tmp_path_factory.mktemp("validate-models")
    return namedtuple("Models", "llama qwen3_moe tmp")(with_tokenizer(build("llama", tmp / "llama")),
                                                       with_tokenizer(build("qwen3_moe", tmp / "qwen3_moe")), tmp)


def config(tmp: Path, path: Path | str, **over) -> Path:
    data = {"run": "v", "model": {"path": str(path), "id": "test/tiny"}, "domains": [CODE],
            "windows": {"window_tokens": 256, "cut_tokens": 64, "windows_per_domain": 2},
            "candidates": [{"name": "c", "quant": {"attention": {"format": "mxfp4", "recipe": "rceil"}}}]}
    data.update(over)
    p = tmp / "c.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def validate(cfg: Path, **kw):
    return run_fideval("validate", cfg, cwd=cfg.parent, **kw)


def refused(cfg: Path, key: str, *needles: str) -> str:
    """The run's one error line: it names the config file and the key, and holds every needle."""
    line = validate(cfg).error()
    assert line.startswith(f"fideval: error: {cfg}: '{key}': "), line
    for n in needles:
        assert n in line, line
    return line


# -- the good configs --------------------------------------------------------------------------------------
def test_demo_config_still_passes_and_prints_the_store_size(tmp_path):
    r = run_fideval("validate", ROOT / "configs" / "demo.yaml", cwd=tmp_path)
    assert r.code == 0, r.stderr
    # 6 domains x 6 x 2048 tokens, hidden (the default store, issue 41): float32 states, the head once (hard-linked)
    assert ("teacher stores (hidden): 2 x 73,728 rows x 128 x 4 B + the head 4,096 x 128 x 4 B (lm_head.weight is F32), "
            "one file hard-linked into every store = 77.6 MB; as logits 2.42 GB") in r.stdout
    assert r.stdout.rstrip().endswith("ok (run 'demo', 6 domains, 3 candidates)")


def test_tiny_models_pass(models, tmp_path):
    for model in (models.llama, models.qwen3_moe):
        r = validate(config(tmp_path, model))
        assert r.code == 0 and "ok (run 'v'" in r.stdout, r.stderr


# -- 1. quant specs: the candidate stage's builder -----------------------------------------------------------
@pytest.mark.parametrize("module, part, needle", [
    ({"format": "mxfp5"}, "format", "unknown quant format 'mxfp5' (known formats: fp8_block,"),
    ({"format": "mxfp4", "recipe": "rciel"}, "recipe", "format mxfp4: unknown recipe 'rciel' (use one of floor, rceil)"),
    ({"format": "mxfp4", "group": 64}, "group", "format mxfp4: group 64 is not allowed (use 32)"),
])
def test_bad_quant_spec_names_the_key(models, tmp_path, module, part, needle):
    from fideval.errors import FidevalError
    from fideval.quant.spec import compile_spec

    with pytest.raises(FidevalError) as run:  # what the candidate stage would say
        compile_spec({"attention": module})
    assert needle in run.value.line()
    cand = [{"name": "mxfp4-experts", "quant": {"attention": module}}]
    refused(config(tmp_path, models.llama, candidates=cand), f"candidates.mxfp4-experts.quant.attention.{part}", run.value.line())


def test_block_that_does_not_divide_a_tensor_is_refused_before_the_run(tmp_path):
    """The demo model's q_b_proj takes q_lora_rank = 96 inputs: int4's group of 128 cannot block it, which the
    run would find only inside weight_transform, as it materialised that layer."""
    import torch

    from fideval.errors import FidevalError
    from fideval.quant.spec import compile_spec

    module = {"format": "int4", "group": 128}
    name = "model.layers.0.self_attn.q_b_proj.weight"
    with pytest.raises(FidevalError) as run:
        compile_spec({"attention": module}).weight_transform("attention", name, torch.zeros(192, 96))
    assert "block of 128 does not divide the last dimension 96 of a [192, 96] tensor" in run.value.message
    refused(config(tmp_path, "demo://model", candidates=[{"name": "c", "quant": {"attention": module}}]),
            "candidates.c.quant.attention.group", run.value.message.replace(" (attention)", ""))


# -- 2. module classes the model does not have -----------------------------------------------------------------
@pytest.mark.parametrize("which, cls, has", [
    ("llama", "routed_experts", "attention, dense_mlp, lm_head"),
    ("qwen3_moe", "shared_experts", "attention, lm_head, routed_experts"),
])
def test_module_class_the_model_lacks(models, tmp_path, which, cls, has):
    cand = [{"name": "c", "quant": {cls: {"format": "mxfp4"}}}]
    refused(config(tmp_path, getattr(models, which), candidates=cand), f"candidates.c.quant.{cls}",
            f"quant spec names module class(es) {cls} that this model does not have (the model has: {has})")


# -- 3. architectures --------------------------------------------------------------------------------------------
def _model_with_config(models, tmp_path, **edit) -> Path:
    folder = tmp_path / "m"
    shutil.copytree(models.llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(edit)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_architecture_the_runner_does_not_support(models, tmp_path):
    m = _model_with_config(models, tmp_path, architectures=["GPT2LMHeadModel"])
    refused(config(tmp_path, m), "model.path", f"{m / 'config.json'}: architecture 'GPT2LMHeadModel' is not supported",
            "supported: DeepseekV2ForCausalLM, DeepseekV32ForCausalLM, DeepseekV3ForCausalLM")


def test_config_transformers_cannot_build(models, tmp_path):
    m = _model_with_config(models, tmp_path, model_type="no-such-model")
    refused(config(tmp_path, m), "model.path", "transformers cannot build the config")


def test_quantized_reference_is_refused_as_the_teacher_refuses_it(models, tmp_path):
    m = _model_with_config(models, tmp_path, quantization_config={"quant_method": "awq"})
    refused(config(tmp_path, m), "model.path", "quantization_config.quant_method 'awq' cannot be read as released weights")


# -- 4. real builds: the classes that decode them ---------------------------------------------------------------
def _gguf(models, path: Path, arch: str) -> Path:
    from test_quant_real_gguf import write_llama_gguf

    return write_llama_gguf(models.llama, path, "Q8_0", arch=arch)


def _real(tmp_path, models, checkpoint, paths=("weights-only",)) -> Path:
    return config(tmp_path, models.llama, candidates=[{"name": "b", "checkpoint": str(checkpoint), "paths": list(paths)}])


def test_gguf_builds(models, tmp_path):
    good = _gguf(models, tmp_path / "good.gguf", "llama")
    assert validate(_real(tmp_path, models, good, ("serving", "weights-only"))).code == 0
    refused(_real(tmp_path, models, _gguf(models, tmp_path / "f.gguf", "falcon")), "candidates.b.checkpoint",
            "GGUF architecture 'falcon' is not supported")
    refused(_real(tmp_path, models, _gguf(models, tmp_path / "q2.gguf", "qwen2")), "candidates.b.checkpoint",
            "GGUF architecture 'qwen2' is not a build of the reference's 'LlamaForCausalLM'")
    (tmp_path / "junk.gguf").write_bytes(b"GGML" + bytes(40))
    refused(_real(tmp_path, models, tmp_path / "junk.gguf"), "candidates.b.checkpoint", "not a readable GGUF file")


def test_gguf_metadata_that_contradicts_the_reference(models, tmp_path):
    from test_quant_real_gguf import write_llama_gguf

    p = write_llama_gguf(models.llama, tmp_path / "eps.gguf", meta=lambda w: w.add_layer_norm_rms_eps(1e-5))
    refused(_real(tmp_path, models, p), "candidates.b.checkpoint",
            "GGUF llama.attention.layer_norm_rms_epsilon = 1e-05 but the reference config's rms_norm_eps = 1e-06")


def _folder_build(models, tmp_path, **edit) -> Path:
    folder = tmp_path / "build"
    shutil.copytree(models.llama, folder, dirs_exist_ok=True)
    cfg = json.loads((models.llama / "config.json").read_text())
    cfg.update(edit)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_safetensors_builds(models, tmp_path):
    refused(_real(tmp_path, models, _folder_build(models, tmp_path, quantization_config={"quant_method": "awq", "bits": 4})),
            "candidates.b.checkpoint", "quantization_config quant_method 'awq' is not supported")
    refused(_real(tmp_path, models, _folder_build(models, tmp_path, architectures=["Qwen2ForCausalLM"])),
            "candidates.b.checkpoint", "architecture 'Qwen2ForCausalLM' differs from the reference's 'LlamaForCausalLM'")
    refused(_real(tmp_path, models, _folder_build(models, tmp_path), ("serving",)), "candidates.b.paths",
            "quantizes no module class, so 'serving' equals 'weights-only' (score it on paths: [weights-only])")


# -- 5. tokenizer --------------------------------------------------------------------------------------------------
def test_model_folder_without_a_tokenizer(models, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(models.llama, bare, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
    refused(config(tmp_path, bare), "model.path", f"cannot load a tokenizer from {bare}")
    refused(config(tmp_path, models.llama, model={"path": str(models.llama), "id": "t", "tokenizer": str(bare)}),
            "model.tokenizer", f"cannot load a tokenizer from {bare}")


def test_chat_domain_needs_a_chat_template(models, tmp_path):
    m = tmp_path / "m"
    shutil.copytree(models.llama, m)
    tc = json.loads((m / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    (m / "tokenizer_config.json").write_text(json.dumps(tc))
    assert validate(config(tmp_path, m)).code == 0  # text domains need none
    refused(config(tmp_path, m, domains=[CODE, CHAT]), "domains.chat.source.messages_field", "a messages field needs a chat template")


# -- 6. model parallel ---------------------------------------------------------------------------------------------
def test_model_parallel_must_split_the_experts(tmp_path):
    refused(config(tmp_path, "demo://model", teacher={"model_parallel": 3}), "teacher.model_parallel",
            "model parallel N=3 does not divide the 8 routed experts (choose N among the divisors of 8)")
    assert validate(config(tmp_path, "demo://model", teacher={"model_parallel": 4})).code == 0


@pytest.mark.parametrize("teacher, needle", [
    ({"lm_head": "bf16", "dtype": "float32", "device": "cuda"}, "the layers compute in float32, not bfloat16"),
    ({"lm_head": "bf16", "dtype": "bfloat16", "device": "cpu"}, "it needs a GPU"),
])
def test_a_bf16_lm_head_the_teacher_would_refuse(tmp_path, teacher, needle):
    """The runner's own words (tests/test_model_head.py); auto, or bf16 on a GPU with bf16 layers, passes."""
    refused(config(tmp_path, "demo://model", teacher=teacher), "teacher.lm_head", "lm head bf16 cannot run here: " + needle)
    ok = validate(config(tmp_path, "demo://model", teacher={"lm_head": "bf16", "dtype": "bfloat16", "device": "cuda"}))
    assert ok.code == 0, ok.stderr


# -- 7. output size ----------------------------------------------------------------------------------------------
def _free(monkeypatch, free: int) -> None:
    import fideval.validate.sizes as sizes

    monkeypatch.setattr(sizes.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 * free, 9 * free, free))


def test_teacher_stores_larger_than_the_free_space(models, tmp_path, monkeypatch):
    # 1 domain x 2 windows x 256 tokens = 512 rows x vocab 4,096 x 4 B = 8,388,608 B per length, two lengths
    _free(monkeypatch, 12_000_000)
    logits = {"store": "logits"}  # V x 4 B a row (the hidden default's sizes: tests/test_validate_store_kind.py)
    line = refused(config(tmp_path, models.llama, teacher=logits), "teacher.lengths", "the teacher stores need 16.8 MB more",
                   f"and {tmp_path} has 12 MB free")
    assert "windows_per_domain" in line
    # a resumed run needs only what is not written yet; nearest existing parent of results/v/ is measured
    shard = tmp_path / "results" / "v" / "teacher" / "windows" / "code" / "shards" / "x.safetensors"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(bytes(8_388_608))
    r = validate(config(tmp_path, models.llama, teacher=logits))
    assert r.code == 0 and "teacher stores: 2 x 512 rows x 4,096 x 4 B = 16.8 MB" in r.stdout, r.stderr


# -- 8. several problems: one line each, then the count -----------------------------------------------------------
def test_several_problems_are_listed_then_counted(models, tmp_path):
    cand = [{"name": "a", "quant": {"routed_experts": {"format": "mxfp5"}}},
            {"name": "b", "quant": {"routed_experts": {"format": "mxfp4"}, "attention": {"format": "mxfp4", "recipe": "rciel"}}}]
    cfg = config(tmp_path, models.llama, candidates=cand, domains=[{**CODE, "source": {**CODE["source"], "path": "nope.jsonl"}}])
    r = validate(cfg)
    assert r.error() == f"fideval: error: {cfg}: 4 problems (listed above) (fix each key named above)"
    listed = [ln for ln in r.stderr.splitlines() if ln.startswith(f"{cfg}: '")]
    assert [ln.split("'")[1] for ln in listed] == ["domains.code.source.path", "candidates.a.quant.routed_experts.format",
                                                    "candidates.b.quant.attention.recipe", "candidates.b.quant.routed_experts"]


# -- 3 again: hf:// models in the local Hub cache ------------------------------------------------------------------
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3's config.json
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config", "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}


def hub_cache(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A Hub cache holding ``repo`` at commit HEX40 with refs/main, as huggingface_hub lays it out."""
    folder = root / f"models--{repo.replace('/', '--')}"
    snap = folder / "snapshots" / HEX40
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(HEX40)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    return root


def deepseek_cache(tmp_path: Path, **edit) -> Path:
    cfg = {**DEEPSEEK_V3, **edit}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    files = {"config.json": json.dumps(cfg).encode()} | {f: (DEMO_MODEL / f).read_bytes() for f in TOKENIZER_FILES}
    return hub_cache(tmp_path / "hub", "deepseek-ai/DeepSeek-V3", files)


def _in_cache(monkeypatch, cache: Path) -> None:
    """In this process huggingface_hub has read HF_HUB_CACHE already: point its constant at the fixture."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))


DEEPSEEK_STORES = "teacher stores: 2 x 1,048,576 rows x 129,280 x 4 B = 1.08 TB"  # 8 domains x 16 windows x 8,192
# the default store (issue 41)
DEEPSEEK_HIDDEN = ("teacher stores (hidden): 2 x 1,048,576 rows x 7,168 x 2 B + the head 129,280 x 7,168 x 2 B "
                   "(config.json dtype bfloat16), one file hard-linked into every store = 31.9 GB; as logits 1.08 TB")


def test_deepseek_v3_config_validates_with_its_model_in_the_hub_cache(tmp_path, monkeypatch):
    _in_cache(monkeypatch, deepseek_cache(tmp_path))
    _free(monkeypatch, 10**13)
    r = run_fideval("validate", ROOT / "configs" / "deepseek-v3-mxfp4.yaml", cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert DEEPSEEK_HIDDEN in r.stdout


def test_deepseek_v3_bf16_config_validates_in_seconds(tmp_path, monkeypatch):
    """The same model without its FP8 quantization_config (a bf16 conversion) passes every check: 61 meta
    layers, 256 experts split over model_parallel 4, the tokenizer, the 1.08 TB of stores."""
    _in_cache(monkeypatch, deepseek_cache(tmp_path, quantization_config=None))
    _free(monkeypatch, 10**13)
    t0 = time.perf_counter()
    r = run_fideval("validate", ROOT / "configs" / "deepseek-v3-mxfp4.yaml", cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert time.perf_counter() - t0 < 60
    assert DEEPSEEK_HIDDEN in r.stdout and "note:" not in r.stderr
    _free(monkeypatch, 10**10)
    data = yaml.safe_load((ROOT / "configs" / "deepseek-v3-mxfp4.yaml").read_text())
    data["teacher"]["model_parallel"] = 3
    data["candidates"][0]["quant"] = {"shared_experts": {"format": "mxfp4"}, "lm_head": {"format": "nvfp4", "group": 32}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(data))
    r = run_fideval("validate", tmp_path / "x.yaml", cwd=tmp_path)
    listed = [ln.split("'")[1] for ln in r.stderr.splitlines() if ln.startswith(f"{tmp_path / 'x.yaml'}: '")]
    assert listed == ["teacher.model_parallel", "candidates.mxfp4-experts.quant.lm_head.group", "teacher.lengths"], r.stderr
    assert "does not divide the 256 routed experts" in r.stderr and "need 31.9 GB more" in r.stderr



def test_hub_model_found_through_HF_HUB_CACHE_or_noted_when_absent(models, tmp_path):
    """A fresh process (huggingface_hub reads HF_HUB_CACHE at import): hf://test/tiny is checked from the cache,
    hf://test/absent is a note, not an error (the stage fetches it)."""
    files = {f.name: f.read_bytes() for f in models.llama.iterdir() if f.is_file()}
    cache = hub_cache(tmp_path / "hub", "test/tiny", files)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    ok = validate(config(tmp_path, "hf://test/tiny"), env=env, fresh_process=True)
    assert ok.code == 0 and "teacher stores (hidden): 2 x 512 rows x" in ok.stdout, ok.stderr
    cand = [{"name": "c", "quant": {"routed_experts": {"format": "mxfp4"}}}]
    bad = validate(config(tmp_path, "hf://test/tiny", candidates=cand), env=env, fresh_process=True)
    assert "'candidates.c.quant.routed_experts': quant spec names module class(es) routed_experts" in bad.error()
    absent = validate(config(tmp_path, "hf://test/absent"), env=env, fresh_process=True)
    assert absent.code == 0, absent.stderr
    assert "note: model hf://test/absent@main is not in the local Hub cache" in absent.stderr


def test_windows_stage_loads_the_tokenizer_validate_checked(tmp_path, monkeypatch):
    """A hf:// model's tokenizer: the windows stage fetches its tokenizer files (offline: from the cache) into
    the snapshot validate found, not the local path 'hf:/org/name' it once looked for."""
    import huggingface_hub.constants

    from fideval.config import load_config
    from fideval.model_source import cached, tokenizer_folder

    _in_cache(monkeypatch, deepseek_cache(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = load_config(ROOT / "configs" / "deepseek-v3-mxfp4.yaml")
    snapshot = tmp_path / "hub" / "models--deepseek-ai--DeepSeek-V3" / "snapshots" / HEX40
    assert cached(cfg.model.path, cfg.model.revision).folder == snapshot
    assert tokenizer_folder(cfg.model) == snapshot and (snapshot / "tokenizer.json").is_file()


def test_imatrix_candidate(models, tmp_path):
    from test_quant_imatrix import _legacy

    names = [f"blk.{i}.attn_{t}.weight" for i in range(2) for t in ("q", "k", "v", "output")]
    full = _legacy(tmp_path / "full.dat", {n: np.ones(64, np.float32) for n in names}, ncall=4)
    cand = {"name": "c", "quant": {"attention": {"format": "gguf_iq4_nl"}}, "imatrix": str(full)}
    assert validate(config(tmp_path, models.llama, candidates=[cand])).code == 0
    part = _legacy(tmp_path / "part.dat", {n: np.ones(64, np.float32) for n in names[:-1]}, ncall=4)
    refused(config(tmp_path, models.llama, candidates=[{**cand, "imatrix": str(part)}]), "candidates.c.imatrix",
            "the importance matrix has no entry for tensor 'blk.1.attn_output.weight'")
    refused(config(tmp_path, models.llama, candidates=[{**cand, "quant": {"attention": {"format": "gguf_q8_0"}}}]),
            "candidates.c.quant", "attention use(s) a format without importance weights")
    refused(config(tmp_path, models.llama, candidates=[{**cand, "imatrix": str(tmp_path / "gone.dat")}]),
            "candidates.c.imatrix", "imatrix file")
    real = {"name": "c", "checkpoint": str(full), "imatrix": str(full)}
    assert "imatrix applies to an emulated candidate" in validate(config(tmp_path, models.llama, candidates=[real])).error()


def test_gguf_mix_candidate(models, tmp_path):
    """A llama-quantize mix: its name, then an imatrix entry of the right size for every tensor it quantizes."""
    from test_quant_imatrix import _legacy

    from fideval.quant.gguf_mix_spec import MixSpec

    cand = {"name": "c", "quant": {"gguf_mix": "Q4_K_M"}}
    assert validate(config(tmp_path, models.llama, candidates=[cand])).code == 0
    refused(config(tmp_path, models.llama, candidates=[{**cand, "quant": {"gguf_mix": "Q4_K_X"}}]),
            "candidates.c.quant.gguf_mix", "unknown gguf mix 'Q4_K_X'")
    both = {**cand, "quant": {"gguf_mix": "Q4_K_M", "attention": {"format": "mxfp4"}}}
    assert "gguf_mix decides every tensor's type" in validate(config(tmp_path, models.llama, candidates=[both])).error()
    parts = [(n, ne) for _, ps in MixSpec("IQ4_XS", models.llama).plan.values() for n, ne, t in ps
             if len(ne) >= 2 and n != "token_embd.weight"]
    full = _legacy(tmp_path / "full.dat", {n: np.ones(ne[0], np.float32) for n, ne in parts}, ncall=4)
    im = {"name": "c", "quant": {"gguf_mix": "IQ4_XS"}, "imatrix": str(full)}
    assert validate(config(tmp_path, models.llama, candidates=[im])).code == 0
    part = _legacy(tmp_path / "part.dat", {n: np.ones(ne[0], np.float32) for n, ne in parts[1:]}, ncall=4)
    refused(config(tmp_path, models.llama, candidates=[{**im, "imatrix": str(part)}]), "candidates.c.imatrix",
            f"the importance matrix has no entry for tensor '{parts[0][0]}'")


def test_gguf_mix_imatrix_on_experts_split_over_ranks(models, tmp_path):
    from test_quant_imatrix import _legacy

    from fideval.quant.gguf_mix_spec import MixSpec

    parts = [(n, ne) for _, ps in MixSpec("IQ4_XS", models.qwen3_moe).plan.values() for n, ne, t in ps
             if len(ne) >= 2 and n != "token_embd.weight"]
    full = _legacy(tmp_path / "full.dat", {n: np.ones(ne[0] * (ne[2] if len(ne) > 2 else 1), np.float32)
                                           for n, ne in parts}, ncall=4)
    cand = {"name": "c", "quant": {"gguf_mix": "IQ4_XS"}, "imatrix": str(full)}
    assert validate(config(tmp_path, models.qwen3_moe, candidates=[cand])).code == 0
    refused(config(tmp_path, models.qwen3_moe, candidates=[cand], teacher={"model_parallel": 2}),
            "candidates.c.imatrix", "experts are split over 2 ranks")
