"""Tokenizers with real chat templates, built offline, and the independent class computation the tests compare to.

The templates under ``tests/data/token_classes/`` are the ``chat_template`` values of real tokenizer_config.json
files, byte for byte: ``qwen3.jinja`` is Qwen3's (reasoning in ``<think>`` blocks, tools in ``<tool_call>``, earlier
reasoning dropped), ``deepseek_r1.jinja`` DeepSeek-R1's (tool calls in ``<｜tool▁call▁begin｜>`` special tokens,
reasoning dropped from history). The tokenizers are byte-level BPEs trained here on the test conversations, with
each template's marker strings as added tokens, as the real tokenizers have them (no Hub at test time).

**The independent computation.** Every piece of every message (content, reasoning_content, each tool call's name and arguments)
is wrapped in a pair of private-use sentinel characters unique to it; the conversation is rendered through the
template; the sentinels' positions give each piece's character span, and removing them must give back exactly
the rendering of the real conversation (so the sentinels changed nothing the template did). Each token's
offsets (the tokenizer's own offset mapping) then decide its classes by the format's definitions
(docs/formats-classes.md). Nothing here searches text for a message, which is what fideval does.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np

from fideval.formats.classes import BIT

DATA = Path(__file__).resolve().parent / "data" / "token_classes"
QWEN3_TOKENS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>"]
DEEPSEEK_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
                   "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                   "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                   "<｜tool▁output▁end｜>"]


def make_tokenizer(folder: Path, template: str, added: list[str], bos: str, eos: str, corpus: list[str]) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=[bos, eos] + [t for t in added if t not in (bos, eos)],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   additional_special_tokens=[t for t in added if t not in (bos, eos)])
    fast.chat_template = (DATA / template).read_text(encoding="utf-8")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(fast)}))
    return folder


def _sentinels(k: int) -> tuple[str, str]:
    return chr(0xF0000 + k), chr(0xF8000 + k)


def wrap(messages: list[dict]) -> tuple[list[dict], list[tuple[int, str, str]]]:
    """The conversation with each piece between its sentinels, and (message index, role, kind) per piece."""
    out, pieces = [], []

    def mark(s: str, i: int, role: str, kind: str) -> str:
        a, b = _sentinels(len(pieces))
        pieces.append((i, role, kind))
        return a + s + b

    for i, m in enumerate(messages):
        m2 = dict(m)
        if isinstance(m.get("reasoning_content"), str):
            m2["reasoning_content"] = mark(m["reasoning_content"], i, m["role"], "reasoning")
        if isinstance(m.get("content"), str) and "</think>" in m["content"]:  # templates drop what precedes it
            head, tail = m["content"].rsplit("</think>", 1)
            lead = tail[: len(tail) - len(tail.lstrip())]
            m2["content"] = head + "</think>" + lead + mark(tail.lstrip(), i, m["role"], "content")
        elif isinstance(m.get("content"), str) and m["content"]:
            m2["content"] = mark(m["content"], i, m["role"], "content")
        calls = []
        for c in m.get("tool_calls") or []:
            fn = dict(c["function"])
            fn["name"] = mark(fn["name"], i, m["role"], "tool_name")
            args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"], ensure_ascii=False)
            fn["arguments"] = mark(args, i, m["role"], "tool_call")
            calls.append({**c, "function": fn})
        if calls:
            m2["tool_calls"] = calls
        out.append(m2)
    return out, pieces


def spans(tok, messages: list[dict]) -> tuple[str, list[tuple[int, int, int, str, str]]]:
    """The rendered conversation and each located piece: (start, end, message, role, kind)."""
    wrapped, pieces = wrap(messages)
    raw = tok.apply_chat_template(wrapped, tokenize=False)
    text, found, opened = [], [], {}
    for ch in raw:
        o = ord(ch)
        if 0xF0000 <= o < 0xF8000:
            opened[o - 0xF0000] = len(text)
        elif 0xF8000 <= o < 0xF8000 + 0x8000:
            k = o - 0xF8000
            found.append((opened.pop(k), len(text), *pieces[k]))
        else:
            text.append(ch)
    rendered = "".join(text)
    assert rendered == tok.apply_chat_template(messages, tokenize=False), "the sentinels changed the rendering"
    return rendered, sorted(found)


def expected_bits(tok, messages: list[dict], tool_markers: tuple[str, str], turn_tokens: int) -> tuple[str, np.ndarray]:
    """Each token's classes by the definitions, from the sentinel spans and the tokenizer's offsets."""
    text, found = spans(tok, messages)
    offs = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    role_class = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
    regions = []  # the template's tool-call syntax: marker open .. close around located arguments
    pos = 0
    while (s := text.find(tool_markers[0], pos)) >= 0:
        e = text.find(tool_markers[1], s)
        e = len(text) if e < 0 else e + len(tool_markers[1])
        if any(k == "tool_call" and s <= a and b <= e for a, b, _, _, k in found):
            regions.append((s, e))
        pos = e
    out = np.zeros(len(offs), dtype=np.int64)
    for t, (s, e) in enumerate(offs):
        e = max(e, s + 1)
        hit = [p for p in found if p[0] < e and p[1] > s]
        outside = any(not any(a <= c < b for a, b, *_ in found) for c in range(s, min(e, len(text))))
        bits = BIT["template"] if outside else 0
        for a, b, _, role, kind in hit:
            bits |= BIT[role_class[role]]
            if kind == "reasoning":
                bits |= BIT["reasoning"]
            if kind in ("tool_call", "tool_name"):
                bits |= BIT["tool_call"]
            if role == "assistant" and kind == "content":
                inside = [c for c in range(max(a, s), min(b, e))]
                if any(not any(x <= c < y for x, y in regions) for c in inside):
                    bits |= BIT["answer"]
        if any(x < e and y > s for x, y in regions):
            bits |= BIT["tool_call"]
        if hit:
            piece = text[s:e]
            if any(c.isdecimal() for c in piece):
                bits |= BIT["numeral"]
            letters = [c for c in piece if c.isalpha()]
            if letters:
                latin = all(unicodedata.name(c, "").startswith("LATIN") for c in letters)
                bits |= BIT["latin"] if latin else BIT["non_latin"]
        out[t] = bits
    for i in sorted({p[2] for p in found}):
        mine = [(a, b) for a, b, m, _, _ in found if m == i]
        toks = [t for t, (s, e) in enumerate(offs) if any(a < max(e, s + 1) and b > s for a, b in mine)]
        out[toks[:turn_tokens]] |= BIT["turn_start"]
    return text, out
