"""Agent conversations for the demo's chat domain: tool calls, tool results and reasoning spans.

Why: the report slices fidelity by token class (docs/formats-classes.md), and a demo whose chat domain has no
tool call or reasoning token would show those slices empty. The demo tokenizer's chat template prints each
message verbatim (``<|role|>\\ncontent<|end|>``), so the conversations carry their structure inline, as
Hermes-style agent data does: reasoning between ``<think>`` and ``</think>``, each call as a JSON object between
``<tool_call>`` and ``</tool_call>``, a tool's output as a ``tool`` message (its text as the tool returns it). The
``fideval-demo`` row of the default ``token_classes`` table names these markers.

Why the tool outputs are plain text and the system prompt one sentence: the demo model is trained on the corpus
before these conversations were added, and JSON-escaped copies of its texts are text it never saw; a window made
mostly of them fell below the report's teacher top-1 sanity range (0.20, ``teacher_top1_range``) on the demo.

Every fact is computed, not made up: the math problems are the math domain's generator's (``problem``), the
calculator's results exact, a docs lookup returns the real
docstring of a standard-library function of the demo's code sources, a licence search a real paragraph.
Deterministic from the ``random.Random`` it is given; appended after the template conversations, so those stay
byte for byte what they were.
"""

from __future__ import annotations

import json
import random
import re

TOOLS = [
    {"name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}},
    {"name": "lookup_docs", "description": "Return the docstring of a function or class of the Python standard library.",
     "parameters": {"type": "object", "properties": {"module": {"type": "string"}, "name": {"type": "string"}},
                    "required": ["module", "name"]}},
    {"name": "search_licence", "description": "Return a paragraph of a licence text that mentions a topic.",
     "parameters": {"type": "object", "properties": {"licence": {"type": "string"}, "topic": {"type": "string"}},
                    "required": ["licence", "topic"]}},
]


def _system(rng: random.Random) -> str:
    names = ", ".join(t["name"] for t in rng.sample(TOOLS, k=len(TOOLS)))
    return (f"You are a helpful assistant with tools: {names}. Think inside <think></think> before you act. To "
            "call a tool, write a JSON object with its name and arguments between <tool_call> and </tool_call>.")


def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def _math(rng: random.Random, problem) -> list[dict]:
    """A word problem of the math domain's generator; the reasoning works it, the calculator checks the last step."""
    q, sol = problem(rng).split("\nSolution:\n")
    *steps, answer = sol.split("\n")
    expr, result = steps[-1].rsplit("=", 1)
    expr, result = expr.split(":")[-1].strip(), result.strip().rstrip(".")
    work = "\n".join(["Let's work it out."] + steps[:-1]) if len(steps) > 1 else "Let's work it out."
    return [
        {"role": "user", "content": q},
        {"role": "assistant", "content": f"<think>\n{work}\n</think>\n\n" + _call("calculator", {"expression": expr})},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": f"<think>\nThe calculator gives {result}.\n</think>\n\n{steps[-1]}\n{answer}"},
    ]


def _docs(rng: random.Random, funcs: list[tuple[str, str, str, str]]) -> list[dict]:
    mod, name, doc, _ = rng.choice(funcs)
    return [
        {"role": "user", "content": rng.choice([f"What is `{name}` in {mod} for?", f"Explain {mod}.{name} briefly."])},
        {"role": "assistant", "content": f"<think>\nI should read the documentation of {mod}.{name} rather than "
                                         f"guess.\n</think>\n\n" + _call("lookup_docs", {"module": mod, "name": name})},
        {"role": "tool", "content": doc},
        {"role": "assistant", "content": f"<think>\nThe docstring answers it; quote its first sentence.\n</think>\n\n"
                                         f"`{mod}.{name}`: {doc}"},
    ]


def _licence(rng: random.Random, licences: dict[str, list[str]]) -> list[dict]:
    name = rng.choice(sorted(licences))
    topic = rng.choice(["warranty", "patent", "distribution", "modification", "termination"])
    key = {"warranty": "warrant", "distribution": "distribut", "modification": "modif", "termination": "terminat"}[topic] \
        if topic != "patent" else "patent"
    paras = [p for p in licences[name] if key in p.lower()] or licences[name]
    para = rng.choice(paras)
    return [
        {"role": "user", "content": f"Does the {name} licence say anything about {topic}?"},
        {"role": "assistant", "content": f"<think>\nSearch the {name} text for {topic}.\n</think>\n\n"
                                         + _call("search_licence", {"licence": name, "topic": topic})},
        {"role": "tool", "content": para},
        {"role": "assistant", "content": f"<think>\nThe paragraph is about {topic}; quote it and add no legal "
                                         f"advice.\n</think>\n\nThe {name} text says:\n\n{para}"},
    ]


def agent_docs(rng: random.Random, n: int, funcs: list[tuple[str, str, str, str]], licence_texts: dict[str, str],
               problem, seed: int) -> list[dict]:
    """``n`` agent conversations: a system prompt listing the tools, then two or three tool-using exchanges."""
    licences = {k: [p.strip() for p in re.split(r"\n\s*\n", v) if 200 < len(p.strip()) < 1200]
                for k, v in licence_texts.items()}
    licences = {k: v for k, v in licences.items() if v}
    docs = []
    for _ in range(n):
        messages = [{"role": "system", "content": _system(rng)}]
        kinds = [rng.choice(["math", "docs", "licence"]) for _ in range(rng.randint(2, 3))]
        for kind in kinds:
            messages += {"math": lambda: _math(rng, problem), "docs": lambda: _docs(rng, funcs),
                         "licence": lambda: _licence(rng, licences)}[kind]()
        docs.append({"source": f"generated by tools/demo/agent_chats.agent_docs: tool calls and reasoning over the "
                               f"code/legal/math sources, exchanges {', '.join(kinds)}, seed {seed}", "messages": messages})
    return docs
