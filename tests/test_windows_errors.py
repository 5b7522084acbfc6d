"""Every bad input to the windows stage is one error line (exit 2) naming the key or file at fault."""

from __future__ import annotations

import pytest
from cli_runner import run_fideval
from windows_fixtures import chat_docs, one_error_line, text_docs, write_config, write_jsonl


@pytest.fixture()
def docs(tmp_path):
    return write_jsonl(tmp_path / "a.jsonl", text_docs(1, 40))


def fail(args) -> str:
    code, _, err = run_fideval(*args)
    assert code == 2, err
    return one_error_line(err)


def local(path, **kw):
    return {"type": "local", "path": str(path), **kw}


def test_missing_file(tmp_path, tokenizer_dir):
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": local(tmp_path / "nope.jsonl")}])
    line = fail(["windows", cfg, "--out", tmp_path / "o"])
    assert "domains.a.source.path" in line and "nope.jsonl does not exist" in line


def test_missing_field(tmp_path, tokenizer_dir, docs):
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": local(docs, text_field="body")}])
    line = fail(["windows", cfg, "--out", tmp_path / "o"])
    assert "field 'body' does not exist" in line and "fields: id, text" in line


def test_too_few_tokens(tmp_path, tokenizer_dir, docs):
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": local(docs)}], windows={"windows_per_domain": 40})
    line = fail(["windows", cfg, "--out", tmp_path / "o"])
    assert "domains.a: too few tokens" in line and "of 40 windows" in line and "40 x 256 tokens asked" in line
    assert not (tmp_path / "o" / "eval-windows.json").exists()


def test_cut_must_divide_window(tmp_path, tokenizer_dir, docs):
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": local(docs)}], windows={"cut_tokens": 100})
    line = fail(["windows", cfg, "--out", tmp_path / "o"])
    assert "'windows': cut_tokens (100) must divide window_tokens (256)" in line


def test_unknown_config_key(tmp_path, tokenizer_dir, docs):
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": local(docs)}], windows={"window_size": 8})
    assert "unknown key 'windows.window_size'" in fail(["windows", cfg, "--out", tmp_path / "o"])


def test_empty_calibration(tmp_path, tokenizer_dir, docs):
    empty = tmp_path / "cal.jsonl"
    empty.write_text("\n")
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": local(docs)}],
                       screen={"calibration": [local(empty)]})
    line = fail(["windows", cfg, "--out", tmp_path / "o"])
    assert line == ("fideval: error: screen.calibration: the calibration sources yield no documents "
                    "(fix the calibration paths/fields, or remove screen.calibration to skip screening)")


def test_screen_verb_needs_built_windows(tmp_path, tokenizer_dir, docs):
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": local(docs)}])
    assert "no eval-windows.json in" in fail(["screen", cfg, "--windows", tmp_path / "none"])


def test_chat_without_template(tmp_path, tokenizer_dir):
    import json

    tc = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in tokenizer_dir.iterdir():
        if f.name != "chat_template.jinja":
            (bare / f.name).write_bytes(f.read_bytes())
    (bare / "tokenizer_config.json").write_text(json.dumps(tc))
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_docs(1, 5))
    cfg = write_config(tmp_path / "c.yaml", bare, [{"name": "c", "kind": "chat", "source": local(chat, messages_field="messages")}])
    assert "needs a chat template" in fail(["windows", cfg, "--out", tmp_path / "o"])


def test_missing_dataset_offline(tmp_path, tokenizer_dir, docs):
    """A Hub dataset id that cannot be reached (offline, the state of every test run) is one line."""
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": {
        "type": "hf", "id": "nobody-xyz/no-such-dataset", "revision": "main", "text_field": "text"}}])
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    p = run_fideval("windows", cfg, "--out", tmp_path / "o", env=env, fresh_process=True, timeout=120)  # read at import
    assert p.code == 2, p.stderr
    line = one_error_line(p.stderr)
    assert "domains.a.source" in line and "nobody-xyz/no-such-dataset" in line and "offline" in line


def test_missing_dataset_folder(tmp_path, tokenizer_dir):
    cfg = write_config(tmp_path / "c.yaml", tokenizer_dir, [{"name": "a", "source": {
        "type": "hf", "id": str(tmp_path / "gone"), "revision": "main"}}])
    assert "dataset folder" in fail(["windows", cfg, "--out", tmp_path / "o"])
