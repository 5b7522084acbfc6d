"""``fideval validate`` on reference-code configs for DeepSeek-V3.2-Exp and DeepSeek-V4.1-Flash (tiny releases of
tests/ref_deepseek_v32.py and tests/ref_deepseek_v41.py, ``inference/`` linked to the vendor's code): a good config
passes (model parallel 2 included: validate joins no process group); a missing code folder, code without the
family's classes, a config the vendor's ModelArgs cannot take, a model-parallel size that does not divide the
vocabulary or experts, and (V4.1) a float32 run are one line naming the key, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ref_deepseek_v32 as rv32
import ref_deepseek_v41 as rv41
import torch
import yaml
from cli_runner import run_fideval
from test_validate import CODE, refused

VENDOR = {"v32": rv32.VENDOR, "v41": rv41.V41}
DTYPE = {"v32": "float32", "v41": "bfloat16"}


def _model(fam: str, folder: Path, **config_edits) -> Path:
    if not (VENDOR[fam] / "model.py").is_file():
        pytest.skip(f"vendor code not at {VENDOR[fam]} (CI provides ../shared/reference-code)")
    if fam == "v32":
        folder = rv32.write_tiny_v32(folder, dtype=torch.float32)
    else:
        folder = rv41.write_tiny_v41(folder, dtype="bf16")
    if fam == "v32":  # the windows stage's tokenizer (V4.1's fixture has its own)
        rv41.write_tokenizer(folder, 512)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    cfg = {**json.loads((folder / "config.json").read_text()), **config_edits}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _config(tmp: Path, fam: str, model: Path, code: str | None = None, **teacher) -> Path:
    m = {"path": str(model), "id": f"test/{fam}", "implementation": "reference", "trust_remote_code": True}
    if code is not None:
        m["code"] = code
    windows = {"window_tokens": 256, "cut_tokens": 64, "windows_per_domain": 2, "separator": "none"}
    data = {"run": "v", "model": m, "domains": [CODE], "windows": windows,
            "teacher": {"dtype": DTYPE[fam], **teacher},
            "candidates": [{"name": "c", "quant": {"routed_experts": {"format": "mxfp4"}}}]}
    p = tmp / "c.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.fixture(scope="module", params=["v32", "v41"])
def fam_model(request, tmp_path_factory):
    return request.param, _model(request.param, tmp_path_factory.mktemp(f"val-{request.param}") / "model")


def test_a_good_config_passes_at_model_parallel_1_and_2(fam_model, tmp_path):
    fam, model = fam_model
    for n in (1, 2):
        r = run_fideval("validate", _config(tmp_path, fam, model, model_parallel=n), cwd=tmp_path)
        assert r.code == 0 and "ok (run 'v'" in r.stdout, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # nothing written


def test_code_folder_missing(fam_model, tmp_path):
    fam, model = fam_model
    refused(_config(tmp_path, fam, model, code=str(tmp_path / "nowhere")), "model.code", "nowhere does not exist")


def test_code_without_the_familys_classes(fam_model, tmp_path):
    fam, model = fam_model
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.py").write_text("class ModelArgs:\n    pass\n\nclass Block:\n    pass\n")
    line = refused(_config(tmp_path, fam, model, code=str(other)), "model.code", "does not define")
    assert ("Indexer" if fam == "v32" else "make_identity_pre_mix") in line


@pytest.mark.parametrize("fam,edit,needle", [
    ("v32", {"rms_norm_eps": 1e-5}, "the vendor's RMSNorm hard-codes 1e-6"),
    ("v41", {"compress_ratios": [0, 2]}, "compress_ratios has 2 entries for 6 layers"),
    ("v41", {"rope_scaling_kind": "ntk"}, "keys the vendor's ModelArgs does not take: rope_scaling_kind"),
])
def test_a_config_the_vendors_model_args_cannot_take(fam, edit, needle, tmp_path):
    model = _model(fam, tmp_path / "m", **edit)
    refused(_config(tmp_path, fam, model), "model.path", needle)


def test_a_model_parallel_size_that_does_not_divide(fam_model, tmp_path):
    fam, model = fam_model
    r = run_fideval("validate", _config(tmp_path, fam, model, model_parallel=3), cwd=tmp_path)
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "'teacher.model_parallel': " in r.stderr and "512" in r.stderr and "'model.path'" not in r.stderr


def test_v41_in_float32_is_refused(tmp_path):
    model = _model("v41", tmp_path / "m")
    p = _config(tmp_path, "v41", model)
    data = yaml.safe_load(p.read_text())
    data["teacher"]["dtype"] = "float32"
    p.write_text(yaml.safe_dump(data))
    refused(p, "teacher.dtype", "bfloat16 only", "set teacher.dtype: bfloat16")


def test_v41_engram_without_tokenizer_json_is_refused_before_anything_runs(tmp_path):
    """Engram hashes n-grams of the model's own tokenizer: a model folder without tokenizer.json is a one-line
    error when the driver is opened (what the verbs do before their output folder exists), not mid-run."""
    from fideval.errors import FidevalError
    from fideval.model.reference.runner import check

    model = _model("v41", tmp_path / "m")
    check(model, code=None, trust=True, dtype=torch.bfloat16)
    (model / "tokenizer.json").unlink()
    with pytest.raises(FidevalError, match="tokenizer.json not found") as e:
        check(model, code=None, trust=True, dtype=torch.bfloat16)
    assert "Engram hashes n-grams" in e.value.hint
    from test_model_teacher import _windows

    _windows(tmp_path / "w", vocab=512)
    r = run_fideval("teacher", "--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "never", "--device", "cpu",
                    "--dtype", "bfloat16", "--implementation", "reference", "--trust-remote-code")
    assert "tokenizer.json not found" in r.error() and not (tmp_path / "never").exists()
