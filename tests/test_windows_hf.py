"""The Hugging Face ``datasets`` path, exercised offline on a local dataset folder (data files that
``load_dataset(folder)`` understands), including revision resolution in a cloned (git) dataset repo."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from cli_runner import run_fideval
from windows_fixtures import one_error_line, text_docs, write_config, write_jsonl

from fideval.windows.layout import read_sequences


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout.strip()


def dataset_repo(tmp_path, docs):
    repo = tmp_path / "ds"
    write_jsonl(repo / "data" / "train.jsonl", docs)
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "data")
    return repo


@pytest.mark.parametrize("streaming", [True, False])
def test_local_dataset_folder_matches_the_same_jsonl(tmp_path, tokenizer_dir, hf_cache, streaming):
    docs = text_docs(1, 80)
    repo = dataset_repo(tmp_path, docs)
    hf = {"name": "a", "source": {"type": "hf", "id": str(repo), "split": "train", "revision": "main",
                                  "text_field": "text", "streaming": streaming}}
    lc = {"name": "a", "source": {"type": "local", "path": str(repo / "data" / "train.jsonl"), "text_field": "text"}}
    for name, dom in (("hf", hf), ("local", lc)):
        cfg = write_config(tmp_path / f"{name}.yaml", tokenizer_dir, [dom])
        code, _, err = run_fideval("windows", cfg, "--out", tmp_path / name)
        assert code == 0, err
    a, b = (read_sequences(tmp_path / n / "windows-256") for n in ("hf", "local"))
    assert np.array_equal(a.tokens, b.tokens)  # same rows in the same order -> same windows
    rec = json.loads((tmp_path / "hf" / "eval-windows.json").read_text())
    src = rec["windows"][0]["documents"][0]["source"]
    commit = git(repo, "rev-parse", "HEAD")
    assert src["dataset"] == str(repo) and src["split"] == "train" and src["revision"] == commit
    assert docs[src["row"]]["id"] == src["doc_id"]
    assert rec["domains"]["a"]["source"]["resolved"] == {"revision": "main", "commit": commit, "note": None}


def test_revision_that_does_not_resolve(tmp_path, tokenizer_dir, hf_cache):
    repo = dataset_repo(tmp_path, text_docs(1, 10))
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": {
        "type": "hf", "id": str(repo), "revision": "v9-missing", "text_field": "text"}}])
    code, _, err = run_fideval("windows", cfg, "--out", tmp_path / "o")
    assert code == 2
    assert one_error_line(err) == (f"fideval: error: domains.a.source.revision: 'v9-missing' does not resolve in the "
                                   f"dataset repository {repo} (give a branch, tag or commit that exists)")


def test_field_missing_in_dataset_rows(tmp_path, tokenizer_dir, hf_cache):
    repo = dataset_repo(tmp_path, text_docs(1, 10))
    shutil.rmtree(repo / ".git")
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": {
        "type": "hf", "id": str(repo), "revision": "main", "text_field": "content"}}])
    code, _, err = run_fideval("windows", cfg, "--out", tmp_path / "o")
    assert code == 2
    line = one_error_line(err)
    assert "domains.a.source: field 'content' does not exist in the rows of" in line and "fields: id, text" in line


def test_missing_split(tmp_path, tokenizer_dir, hf_cache):
    repo = dataset_repo(tmp_path, text_docs(1, 10))
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": {
        "type": "hf", "id": str(repo), "revision": "main", "split": "validation"}}])
    code, _, err = run_fideval("windows", cfg, "--out", tmp_path / "o")
    assert code == 2 and "domains.a.source.split" in one_error_line(err) and "'validation'" in err


def test_hub_revision_that_does_not_resolve(tmp_path, tokenizer_dir, monkeypatch):
    """The Hub answers 'no such revision' (simulated: tests never reach the network) -> one line."""
    import huggingface_hub
    from huggingface_hub.errors import RevisionNotFoundError

    from fideval.windows import sources

    def no_such_revision(self, repo_id, revision=None, **kw):
        e = RevisionNotFoundError.__new__(RevisionNotFoundError)
        Exception.__init__(e, f"404: revision {revision} not found")
        raise e

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", no_such_revision)
    monkeypatch.setattr(sources, "_RESOLVED", {})
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": {
        "type": "hf", "id": "org/ds", "revision": "v0-nope", "text_field": "text"}}])
    code, _, err = run_fideval("windows", cfg, "--out", tmp_path / "o")
    assert code == 2
    assert one_error_line(err) == ("fideval: error: domains.a.source.revision: 'v0-nope' does not resolve for dataset "
                                   "org/ds (give a branch, tag or commit that exists)")
