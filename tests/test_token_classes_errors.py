"""Bad token-class input is one ``fideval: error:`` line naming the key and what to do, never a traceback.

A rule named for a template whose markers are not in it; a rule table naming a marker the tokenizer does not have
as a token; a rule name the table lacks; a config row with a broken marker pair (the config's own one line).
"""

from __future__ import annotations

import pytest
from cli_runner import run_fideval
from token_class_fixtures import QWEN3_TOKENS, make_tokenizer
from windows_fixtures import write_jsonl

CHAT = [{"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "reasoning_content": "2 + 3 = 5.", "content": "5"}]


def _run(tmp_path, tok, extra: str = ""):
    src = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CHAT}] * 40)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run: t\nmodel: {{path: {tok}, id: t/x}}\n"
                   f"domains:\n  - {{name: chat, kind: chat, source: {{type: local, path: {src}, messages_field: messages}}}}\n"
                   "windows: {window_tokens: 256, cut_tokens: 128, windows_per_domain: 1, seed: 0}\n" + extra)
    return run_fideval("windows", str(cfg), "--out", str(tmp_path / "w"))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("q"), "qwen3.jinja", QWEN3_TOKENS, "<|endoftext|>", "<|im_end|>",
                          [str(CHAT)] * 5)


@pytest.fixture(scope="module")
def qwen3_without_think(tmp_path_factory):
    """Qwen3's template on a tokenizer that lacks ``<think>`` and ``</think>`` as tokens (as Qwen2.5's does)."""
    return make_tokenizer(tmp_path_factory.mktemp("q2"), "qwen3.jinja",
                          [t for t in QWEN3_TOKENS if "think" not in t], "<|endoftext|>", "<|im_end|>", [str(CHAT)] * 5)


def test_a_named_rule_whose_markers_are_not_in_the_template(tmp_path, qwen3):
    line = _run(tmp_path, qwen3, "token_classes: {rules: deepseek}\n").error()
    assert "token_classes.rules: rule 'deepseek' does not fit" in line and "'<｜Assistant｜>' is not found" in line
    assert not (tmp_path / "w" / "eval-windows.json").exists()


def test_a_marker_the_tokenizer_lacks(tmp_path, qwen3_without_think):
    line = _run(tmp_path, qwen3_without_think).error()
    assert "token_classes.templates[chatml]: marker '<think>' is not a token of the tokenizer" in line


def test_the_same_tokenizer_passes_when_the_table_says_its_markers_are_text(tmp_path, qwen3_without_think):
    rows = ("token_classes:\n  templates:\n    - {name: qwen-text, match: ['<|im_start|>'], think: ['<think>', '</think>'],"
            " tool_call: ['<tool_call>', '</tool_call>'], marker_tokens: false}\n")
    r = _run(tmp_path, qwen3_without_think, rows)
    assert r.code == 0, r.stderr
    from fideval.formats import classes as fmt

    tc = fmt.read(tmp_path / "w" / fmt.FILE)
    assert tc.meta["rules"]["rule"]["name"] == "qwen-text" and (tc.classes & fmt.BIT["reasoning"]).any()


def test_a_rule_name_the_table_lacks(tmp_path, qwen3):
    line = _run(tmp_path, qwen3, "token_classes: {rules: llama9}\n").error()
    assert "no template rule named 'llama9'" in line and "chatml" in line


def test_a_broken_marker_pair_in_the_config(tmp_path, qwen3):
    line = _run(tmp_path, qwen3, "token_classes:\n  templates:\n    - {name: x, match: ['a'], think: ['<think>']}\n").error()
    assert "token_classes" in line and "two non-empty markers" in line


def test_validate_asks_the_same_question_in_seconds(tmp_path, qwen3):
    src = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CHAT}] * 40)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run: t\nmodel: {{path: {qwen3}, id: t/x}}\n"
                   f"domains:\n  - {{name: chat, kind: chat, source: {{type: local, path: {src}, messages_field: messages}}}}\n"
                   "windows: {window_tokens: 256, cut_tokens: 128, windows_per_domain: 1, seed: 0}\n"
                   "token_classes: {rules: deepseek}\n")
    r = run_fideval("validate", str(cfg))
    assert r.code != 0 and "Traceback" not in r.stderr
    assert "'token_classes'" in r.stderr + r.stdout and "rule 'deepseek' does not fit" in r.stderr + r.stdout
