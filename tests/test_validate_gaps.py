"""``fideval validate`` gaps closed (issue 40): what a stage would refuse or silently get wrong hours in, refused (or
noted) in seconds, each with the config key named:

(a) a window or cut longer than the model's positions; (b) a tokenizer with more tokens than the model's vocabulary;
(c) a safetensors index naming a shard that is not in the folder; (d) the disk estimate counting the noise floor's
stores; (e) a note when the design has too few windows for its intervals to say much.

Tiny Llama checkpoints whose vocabulary is the test tokenizer's (tests/conftest.py's ``tokenizer_dir``), so the
good configs pass and each case differs from one in one thing.
"""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import yaml
from cli_runner import run_fideval
from model_fixtures import build_config, configs

CODE = {"name": "code", "source": {"type": "local", "path": "demo://corpus/code.jsonl", "text_field": "text"}}
SHARD_HINT = "(download every shard listed in the index)"


def tokenizer_len(folder: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(folder)))


def tiny(folder: Path, tokenizer_dir: Path, vocab: int, **save_kw) -> Path:
    """A random tiny Llama (2,048 positions) with ``vocab`` rows, and the test tokenizer's files beside it."""
    cfg = configs()["llama"]
    cfg.vocab_size = vocab
    build_config(cfg, folder, **save_kw)
    for f in tokenizer_dir.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer_dir):
    tmp = tmp_path_factory.mktemp("gap-models")
    n = tokenizer_len(tokenizer_dir)
    return namedtuple("Models", "good small_vocab sharded vocab")(
        tiny(tmp / "good", tokenizer_dir, n), tiny(tmp / "small", tokenizer_dir, 96),
        tiny(tmp / "sharded", tokenizer_dir, n, max_shard_size="100KB"), n)


def config(tmp: Path, path: Path, *, windows: dict | None = None, **over) -> Path:
    data = {"run": "v", "model": {"path": str(path), "id": "t"}, "domains": [CODE],
            "windows": {"window_tokens": 256, "cut_tokens": 64, "windows_per_domain": 8, **(windows or {})}}
    data.update(over)
    p = tmp / "c.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def validate(cfg: Path):
    return run_fideval("validate", cfg, cwd=cfg.parent)


def passes(cfg: Path):
    r = validate(cfg)
    assert r.code == 0 and "ok (run 'v'" in r.stdout, r.stderr
    return r


# -- (a) lengths against the model's positions ------------------------------------------------------------------------
def test_window_longer_than_the_models_positions(models, tmp_path):
    cfg = config(tmp_path, models.good, windows={"window_tokens": 4096, "cut_tokens": 512})
    assert validate(cfg).error() == (
        f"fideval: error: {cfg}: 'windows.window_tokens': windows of 4,096 tokens are longer than the model's 2,048 "
        "positions (config.json max_position_embeddings) (lower windows.window_tokens to 2048 or less, or leave "
        "'windows' out of teacher.lengths)")
    # the teacher runs only the cuts: the windows' length is never computed
    passes(config(tmp_path, models.good, windows={"window_tokens": 4096, "cut_tokens": 512}, teacher={"lengths": ["cuts"]}))
    passes(config(tmp_path, models.good, windows={"window_tokens": 2048, "cut_tokens": 512}))  # exactly the limit


def test_cut_longer_than_the_models_positions(models, tmp_path):
    cfg = config(tmp_path, models.good, windows={"window_tokens": 4096, "cut_tokens": 4096}, teacher={"lengths": ["cuts"]})
    assert validate(cfg).error() == (
        f"fideval: error: {cfg}: 'windows.cut_tokens': cuts of 4,096 tokens are longer than the model's 2,048 positions "
        "(config.json max_position_embeddings) (lower windows.cut_tokens to 2048 or less, or leave 'cuts' out of "
        "teacher.lengths)")


def test_positions_extended_by_rope_scaling():
    """YaRN (or linear, dynamic) scaling extends the original length by its factor, as serving engines take it;
    llama3 scaling and a max_position_embeddings that already holds the factor (DeepSeek-V3) are read as given."""
    from fideval.validate.model import Probe, max_positions

    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert max_positions(Probe(config={"max_position_embeddings": 32768, "rope_scaling": yarn})) == (
        131072, "config.json max_position_embeddings with its rope scaling factor")
    v3 = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}
    assert max_positions(Probe(config={"max_position_embeddings": 163840, "rope_scaling": v3}))[0] == 163840
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert max_positions(Probe(config={"max_position_embeddings": 131072, "rope_scaling": llama3}))[0] == 131072
    assert max_positions(Probe(config={"text_config": {"max_position_embeddings": 4096}}))[0] == 4096
    assert max_positions(Probe(config={"vocab_size": 10})) is None


# -- (b) the tokenizer against the model's vocabulary --------------------------------------------------------------
def test_tokenizer_larger_than_the_models_vocabulary(models, tmp_path):
    cfg = config(tmp_path, models.small_vocab)
    assert validate(cfg).error() == (
        f"fideval: error: {cfg}: 'model.path': the tokenizer in {models.small_vocab} has {models.vocab:,} tokens "
        "(added tokens included), more than the model's vocab_size of 96: an id from 96 on has no row in the "
        "embedding or the logits (give the tokenizer this model was trained with (model.tokenizer))")
    # given as model.tokenizer, the key is that one; the tokenizer of the model's own size passes
    cfg = config(tmp_path, models.small_vocab, model={"path": str(models.small_vocab), "id": "t", "tokenizer": str(models.good)})
    assert validate(cfg).error().startswith(f"fideval: error: {cfg}: 'model.tokenizer': the tokenizer in {models.good} has")
    passes(config(tmp_path, models.good))


# -- (c) every shard the safetensors index names --------------------------------------------------------------------------
def test_index_naming_a_missing_shard(models, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(models.sharded, folder)
    passes(config(tmp_path, folder))
    (folder / "model-00002-of-00005.safetensors").unlink()
    (folder / "model-00004-of-00005.safetensors").unlink()
    cfg = config(tmp_path, folder)
    assert validate(cfg).error() == (
        f"fideval: error: {cfg}: 'model.path': {folder / 'model.safetensors.index.json'} names shard "
        f"'model-00002-of-00005.safetensors', which is missing or outside the folder (2 of 5 shards) {SHARD_HINT}")


def test_index_naming_a_shard_outside_the_folder(models, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(models.sharded, folder)
    shutil.move(folder / "model-00005-of-00005.safetensors", tmp_path / "elsewhere.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: ("../elsewhere.safetensors" if v == "model-00005-of-00005.safetensors" else v)
                           for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = config(tmp_path, folder)
    assert validate(cfg).error() == (
        f"fideval: error: {cfg}: 'model.path': {folder / 'model.safetensors.index.json'} names shard "
        f"'../elsewhere.safetensors', which is missing or outside the folder (1 of 5 shards) {SHARD_HINT}")


def test_candidate_build_with_a_missing_shard_was_already_refused(models, tmp_path):
    """A real safetensors build is opened by the checkpoint reader itself, which refused this before (its words)."""
    build = tmp_path / "build"
    shutil.copytree(models.sharded, build)
    (build / "model-00003-of-00005.safetensors").unlink()
    cfg = config(tmp_path, models.sharded, candidates=[{"name": "b", "checkpoint": str(build), "paths": ["weights-only"]}])
    assert validate(cfg).error() == (
        f"fideval: error: {cfg}: 'candidates.b.checkpoint': {build / 'model.safetensors.index.json'} names shard "
        f"'model-00003-of-00005.safetensors', which is missing or outside the folder {SHARD_HINT}")


# -- (d) the disk estimate counts the noise floor's stores -------------------------------------------------------------
def _free(monkeypatch, free: int) -> None:
    import fideval.validate.sizes as sizes

    monkeypatch.setattr(sizes.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 * free, 9 * free, free))


def test_noise_floor_stores_are_counted(models, tmp_path, monkeypatch):
    from fideval.validate.sizes import human

    each = 2 * 8 * 256 * models.vocab * 4  # two lengths x 2,048 rows x vocab x float32
    _free(monkeypatch, each * 3 // 2)  # room for the teacher's stores, not for the noise floor's as well
    logits = {"store": "logits"}  # the hidden default's sizes: tests/test_validate_store_kind.py
    r = passes(config(tmp_path, models.good, teacher=logits))
    assert f"teacher stores: 2 x 2,048 rows x {models.vocab:,} x 4 B = {human(each)}" in r.stdout
    noise = {"noise_floor": {"micro_batch": 2}}
    cfg = config(tmp_path, models.good, report=noise, teacher=logits)
    r = validate(cfg)
    assert r.error() == (
        f"fideval: error: {cfg}: 'teacher.lengths': the teacher and noise-floor stores need {human(2 * each)} more, and "
        f"{tmp_path} has {human(each * 3 // 2)} free (free space there, or lower windows.windows_per_domain or "
        "windows.window_tokens, or keep one length, or set teacher.store: hidden, or drop report.noise_floor)")
    assert (f"noise-floor stores (report.noise_floor): the same {human(each)} again; all logit stores {human(2 * each)}"
            in r.stdout)
    # a resumed run: what the noise floor's teacher already wrote counts as written
    shard = tmp_path / "results" / "v" / "teacher-noise" / "windows" / "code" / "shards" / "code-000.safetensors"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(bytes(each))
    passes(cfg)


# -- (e) small designs: a note, not a problem ------------------------------------------------------------------------
DOMAIN_NOTE = ("windows.windows_per_domain {per} is fewer than 8: each domain's intervals will be wide or unbounded (at 8 "
               "windows, the fewest measured, the default interval is 3.7-3.9 times the truth wide; fewer were not "
               "measured, and 1 window gives none) (docs/formats-report.md, 'Per-domain figures'; 16 windows per domain "
               "bring it to about 1.5 times)")
RUN_NOTE = ("the run has {total} windows ({domains} domains x {per}), fewer than 25: every quantile interval will have no "
            "upper bound (few_tail_windows: a tail from fewer than 25 effective windows), and the means' intervals are "
            "below the 32 windows their coverage was measured at (docs/formats-report.md, 'Measured coverage'; 64 "
            "windows hold the 93 % floor)")


def _domains(n: int) -> list[dict]:
    return [{"name": d, "source": {"type": "local", "path": f"demo://corpus/{d}.jsonl", "text_field": "text"}}
            for d in ("code", "legal", "prose", "math")[:n]]


def _notes(r) -> list[str]:
    return [ln.split(": note: ", 1)[1] for ln in r.stderr.splitlines() if ": note: " in ln]


@pytest.mark.parametrize("domains, per, notes", [
    (1, 2, [DOMAIN_NOTE.format(per=2), RUN_NOTE.format(total=2, domains=1, per=2)]),
    (3, 8, [RUN_NOTE.format(total=24, domains=3, per=8)]),
    (4, 7, [DOMAIN_NOTE.format(per=7)]),
    (4, 8, []),
])
def test_small_designs_are_noted(models, tmp_path, domains, per, notes):
    r = passes(config(tmp_path, models.good, domains=_domains(domains), windows={"windows_per_domain": per}))
    assert _notes(r) == notes


def test_the_run_threshold_is_the_reports_tail_bound():
    """Below the report's TAIL_WINDOWS effective windows a quantile has no upper bound: a run with fewer windows
    cannot reach it (the effective number of windows is at most their number), hence the same 25."""
    from fideval.stats.quantiles import TAIL_WINDOWS
    from fideval.validate.design import RUN_WINDOWS

    assert RUN_WINDOWS == TAIL_WINDOWS == 25


# -- the reliability table names every case above ------------------------------------------------------------------------
ROWS = ["validate: window longer than the model's positions", "validate: cut longer than the model's positions",
        "validate: tokenizer larger than the model's vocabulary", "validate: index names a missing shard",
        "validate: disk too small once the noise floor's stores count", "validate: few windows per domain or in the run"]


def test_reliability_table_lists_these_cases():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text()
    assert [r for r in ROWS if f"| {r} |" not in doc] == []
