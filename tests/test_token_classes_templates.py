"""Token classes of conversations rendered by real chat templates, against an independent computation.

Two real templates (``tests/token_class_fixtures.py``): Qwen3's, with reasoning markers and ``<tool_call>``
blocks, and DeepSeek-R1's, with tool calls in special tokens and reasoning dropped from history. For each, the
class of every token of every conversation is compared, bit for bit, with the classes computed from sentinel
spans and the tokenizer's offsets; then the windows stage is run end to end and its side file must hold the same
bits at the tokens' window positions, with separators as such.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from token_class_fixtures import DEEPSEEK_TOKENS, QWEN3_TOKENS, expected_bits, make_tokenizer

from fideval.config import TokenClassesConfig
from fideval.formats import classes as fmt
from fideval.formats.classes import BIT
from fideval.windows.encode import Encoder, load_tokenizer
from fideval.windows.tagging import Tagger

CHECKED = sum(BIT[n] for n in ("template", "system", "user", "assistant", "tool", "reasoning", "answer", "tool_call",
                               "turn_start", "numeral", "latin", "non_latin"))

QWEN3_CHATS = [
    [{"role": "system", "content": "You are a careful agent. Use tools when numbers are involved."},
     {"role": "user", "content": "What is the weather in Paris and in Tokyo today?"},
     {"role": "assistant", "reasoning_content": "Two cities, so two calls to get_weather.",
      "content": "Let me check both cities.",
      "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}},
                     {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京", "unit": "C"}}}]},
     {"role": "tool", "content": '{"temp": 21, "sky": "clear"}'},
     {"role": "tool", "content": '{"temp": 17, "sky": "rain"}'},
     {"role": "assistant", "reasoning_content": "Paris 21 clear, Tokyo 17 rain; answer in one line.",
      "content": "Paris: 21 °C and clear. Tokyo: 17 °C with rain."}],
    [{"role": "user", "content": "Привет! Сколько будет 12 * 12?"},
     {"role": "assistant", "reasoning_content": "12 times 12 is 144.", "content": "12 × 12 = 144."},
     {"role": "user", "content": "And 144 / 4?"},
     {"role": "assistant", "reasoning_content": "144 divided by 4 is 36.", "content": "It is 36."}],
]

DEEPSEEK_CHATS = [
    [{"role": "system", "content": "You can call tools."},
     {"role": "user", "content": "Convert 100 USD to EUR and to JPY."},
     {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "convert", "arguments": '{"amount": 100, "to": "EUR"}'}},
                     {"type": "function", "function": {"name": "convert", "arguments": '{"amount": 100, "to": "JPY"}'}}]},
     {"role": "tool", "content": '{"result": 92.4}'},
     {"role": "tool", "content": '{"result": 15630}'},
     {"role": "assistant", "content": "100 USD is 92.4 EUR or 15630 JPY."},
     {"role": "user", "content": "Спасибо. Which is larger in count?"},
     {"role": "assistant", "content": "<think>\nCompare 92.4 and 15630.\n</think>\n\nThe JPY amount, 15630."}],
]


def _corpus(chats: list[list[dict]]) -> list[str]:
    return [json.dumps(m, ensure_ascii=False) for chat in chats for m in chat] * 3


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("qwen3"), "qwen3.jinja", QWEN3_TOKENS, "<|endoftext|>",
                          "<|im_end|>", _corpus(QWEN3_CHATS))


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("deepseek"), "deepseek_r1.jinja", DEEPSEEK_TOKENS,
                          "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", _corpus(DEEPSEEK_CHATS))


def _tag(folder, chat: list[dict], cfg: TokenClassesConfig | None = None) -> tuple[Tagger, str, np.ndarray]:
    enc = Encoder(load_tokenizer(folder), "eos")
    tagger = Tagger(cfg or TokenClassesConfig(), enc.tok, chat=True)
    text = enc.render(chat)
    e = enc.encode(text)
    return tagger, text, tagger.tag(text, chat, "chat", e.offsets[:, 0], e.offsets[:, 1])


@pytest.mark.parametrize("name,chats,markers,rule", [
    ("qwen3", QWEN3_CHATS, ("<tool_call>", "</tool_call>"), "chatml"),
    ("deepseek", DEEPSEEK_CHATS, ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"), "deepseek"),
])
def test_every_token_matches_the_sentinel_computation(request, name, chats, markers, rule):
    folder = request.getfixturevalue(name)
    for chat in chats:
        tagger, text, got = _tag(folder, chat)
        assert tagger.rule is not None and tagger.rule.name == rule
        want_text, want = expected_bits(tagger_tok := load_tokenizer(folder), chat, markers, TokenClassesConfig().turn_tokens)
        assert want_text == text
        toks = tagger_tok.convert_ids_to_tokens(tagger_tok(text, add_special_tokens=False)["input_ids"])
        bad = [(k, toks[k], [n for n in fmt.NAMES if got[k] & BIT[n] & CHECKED], [n for n in fmt.NAMES if want[k] & BIT[n]])
               for k in range(len(toks)) if (got[k] & CHECKED) != want[k]]
        assert not bad, bad[:5]
        assert not (got & BIT["unknown"]).any()


def test_the_slices_the_issue_names_are_there(qwen3, deepseek):
    """Not vacuous: each template's conversations do hold reasoning (Qwen3), tool calls and tool outputs (both),
    template tokens and turn starts, and DeepSeek-R1 drops history's reasoning (no token of it is left)."""
    _, text, q = _tag(qwen3, QWEN3_CHATS[0])
    for n in ("reasoning", "tool_call", "tool", "template", "turn_start", "answer", "non_latin", "numeral", "structured"):
        assert (q & BIT[n]).any(), n
    assert "Two cities" in text and "get_weather" in text
    _, text, d = _tag(deepseek, DEEPSEEK_CHATS[0])
    assert "Compare 92.4" not in text and not (d & BIT["reasoning"]).any()
    for n in ("tool_call", "tool", "template", "answer"):
        assert (d & BIT[n]).any(), n


def test_a_conversation_the_template_rewrites_is_unknown_not_guessed(qwen3):
    """A conversation with a role the rule table does not list (and the template silently skips) cannot be
    classified: every token is ``unknown`` and none is given a role or called template."""
    chat = [{"role": "user", "content": "hi there"}, {"role": "robot", "content": "beep"}]
    _, _, bits = _tag(qwen3, chat)
    assert (bits & BIT["unknown"]).all()
    assert not (bits & (BIT["user"] | BIT["assistant"] | BIT["template"])).any()


def test_windows_side_file_holds_the_same_bits(tmp_path, qwen3):
    from cli_runner import run_fideval
    from windows_fixtures import write_jsonl

    rows = [{"messages": c} for c in QWEN3_CHATS] * 6
    src = write_jsonl(tmp_path / "chats.jsonl", rows)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run: t\nmodel: {{path: {qwen3}, id: t/qwen3}}\n"
                   f"domains:\n  - {{name: chat, kind: chat, source: {{type: local, path: {src}, messages_field: messages}}}}\n"
                   "windows: {window_tokens: 512, cut_tokens: 256, windows_per_domain: 2, seed: 0, separator: eos}\n")
    r = run_fideval("windows", str(cfg), "--out", str(tmp_path / "w"))
    assert r.code == 0, r.stderr
    tc = fmt.read(tmp_path / "w" / fmt.FILE)
    ew = json.loads((tmp_path / "w" / "eval-windows.json").read_text())
    assert tc.ids == [w["id"] for w in ew["windows"]] and tc.window_sha256 == [w["sha256"] for w in ew["windows"]]
    assert tc.meta["rules"]["rule"]["name"] == "chatml"
    from fideval.windows.layout import read_sequences

    seqs = read_sequences(tmp_path / "w" / "windows-512")
    tok = load_tokenizer(qwen3)
    for i, w in enumerate(ew["windows"]):
        for d in w["documents"]:
            line = d["source"]["line"]
            _, want = expected_bits(tok, rows[line - 1]["messages"], ("<tool_call>", "</tool_call>"), 4)
            a, b = d["tokens"]
            assert (tc.classes[i, a:b] & CHECKED).tolist() == want[: b - a].tolist()
            if b < 512:  # the EOS after the document
                assert tc.classes[i, b] == BIT["separator"] and seqs.tokens[i, b] == tok.eos_token_id


def test_content_blocks_are_unknown_not_template(qwen3):
    """Content given as a list of blocks is not located by this reader: its conversation is ``unknown``, not
    silently ``template`` (what an unlocated message would otherwise look like)."""
    tok = load_tokenizer(qwen3)
    tagger = Tagger(TokenClassesConfig(), tok, chat=True)
    text = "<|im_start|>user\nhello<|im_end|>\n"
    e = Encoder(tok, "eos").encode(text)
    bits = tagger.tag(text, [{"role": "user", "content": [{"type": "text", "text": "hello"}]}], "chat",
                      e.offsets[:, 0], e.offsets[:, 1])
    assert (bits & BIT["unknown"]).all() and not (bits & BIT["template"]).any()


def test_content_that_the_template_also_writes_is_unknown_not_guessed(qwen3):
    """A user message whose whole content is ``user`` is found first on the template's own ``<|im_start|>user``
    header; its text occurs again before the next message, so where it is cannot be told: ``unknown``. The same
    short content twice in a row is no such ambiguity and is located."""
    _, _, bits = _tag(qwen3, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "user"},
                              {"role": "assistant", "content": "ok"}])
    assert (bits & BIT["unknown"]).all()
    _, _, bits = _tag(qwen3, [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}])
    assert not (bits & BIT["unknown"]).any() and (bits & BIT["user"]).any() and (bits & BIT["answer"]).any()
