"""The demo's chat domain holds the slices the report shows: reasoning, tool calls, tool outputs, and every
conversation located (no ``unknown``), under the ``fideval-demo`` rule the default table picks for its template."""

from __future__ import annotations

import json

import numpy as np

from fideval.config import load_config
from fideval.demo import CORPUS_DIR, MODEL_DIR
from fideval.formats.classes import BIT
from fideval.windows.encode import Encoder, load_tokenizer
from fideval.windows.tagging import Tagger


def test_demo_chats_have_reasoning_and_tool_calls_and_are_all_located():
    cfg = load_config("configs/demo.yaml")
    enc = Encoder(load_tokenizer(MODEL_DIR), cfg.windows.separator)
    tagger = Tagger(cfg.token_classes, enc.tok, chat=True)
    assert tagger.rule is not None and tagger.rule.name == "fideval-demo"
    docs = [json.loads(line) for line in (CORPUS_DIR / "chat.jsonl").read_text(encoding="utf-8").splitlines()]
    agents = [d for d in docs if any(m["role"] == "tool" for m in d["messages"])]
    assert len(agents) == 40
    totals = {n: 0 for n in ("reasoning", "tool_call", "tool", "answer", "unknown")}
    for d in docs:
        text = enc.render(d["messages"])
        e = enc.encode(text)
        bits = tagger.tag(text, d["messages"], "chat", e.offsets[:, 0], e.offsets[:, 1])
        for n in totals:
            totals[n] += int(np.count_nonzero(bits & BIT[n]))
        if d in agents:  # each agent conversation's calls are JSON between the markers, tagged as such
            calls = text.count("<tool_call>")
            assert calls >= 2 and (bits & BIT["tool_call"]).any() and (bits & BIT["reasoning"]).any()
    assert totals["unknown"] == 0
    assert min(totals["reasoning"], totals["tool_call"], totals["tool"]) > 2_000, totals
