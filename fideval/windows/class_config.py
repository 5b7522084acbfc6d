"""The ``token_classes`` config section: the data-driven rules that tag each token with its classes.

Why a table and not code per model: what marks reasoning or a tool call is the chat template's business
(``<think>`` for Qwen3 and DeepSeek-R1, ``<｜tool▁call▁begin｜>`` for DeepSeek-V3, ``<tool_call>`` for Qwen), so a
new template needs a new row, not a new release. A row applies to a tokenizer whose chat template contains every
one of its ``match`` strings (``rules: auto``: the first such row), or is named (``rules: NAME``: then its match
strings must be in the template, or the stage stops). A template no row fits is still classified by message
(roles, template, turn starts, code, numerals, script), but no token is called reasoning, answer or tool call:
without the markers that would be a guess. Giving ``templates`` replaces the defaults below, which cover the
templates of the demo and the shipped configs (DeepSeek-V3/R1) and Qwen's ChatML.

Imports only pydantic, so ``fideval.config`` can hold it without a cycle.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"
ROLES = ("system", "user", "assistant", "tool")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _pair(v: list[str]) -> list[str]:
    if v and (len(v) != 2 or not all(v)):
        raise ValueError("give two non-empty markers [open, close], or none")
    return v


class TemplateRule(_Strict):
    name: str = Field(pattern=NAME_PATTERN, max_length=64, description="the row's name, recorded with the classes")
    match: list[str] = Field(min_length=1, description="strings that all occur in the chat templates this row is for")
    roles: dict[str, list[str]] = Field(
        default_factory=lambda: {"system": ["system", "developer"], "user": ["user"], "assistant": ["assistant"],
                                 "tool": ["tool", "ipython", "function"]},
        description="class -> the message roles that are of it (system, user, assistant, tool); a conversation "
        "with a role no class lists is 'unknown'")
    think: list[str] = Field(default_factory=list, description="[open, close] reasoning markers, or []")
    tool_call: list[str] = Field(default_factory=list, description="[open, close] tool-call markers, or []")
    marker_tokens: bool = Field(False, description="every marker that occurs in the chat template must be one token "
                                "of the tokenizer (true for templates whose markers are added tokens)")

    @field_validator("think", "tool_call")
    @classmethod
    def _markers(cls, v: list[str]) -> list[str]:
        return _pair(v)

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        bad = sorted(set(v) - set(ROLES))
        if bad:
            raise ValueError(f"roles: unknown class {bad[0]!r} (classes: {', '.join(ROLES)})")
        return v


DEFAULT_TEMPLATES = (
    TemplateRule(name="deepseek", match=["<｜Assistant｜>"], think=["<think>", "</think>"],
                 tool_call=["<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"], marker_tokens=True),
    TemplateRule(name="chatml", match=["<|im_start|>"], think=["<think>", "</think>"],
                 tool_call=["<tool_call>", "</tool_call>"], marker_tokens=True),
    TemplateRule(name="fideval-demo", match=["'<|' + message['role'] + '|>"], think=["<think>", "</think>"],
                 tool_call=["<tool_call>", "</tool_call>"]),
)


class TokenClassesConfig(_Strict):
    rules: str = Field("auto", description="'auto' (the first template row whose match strings are all in the chat "
                       "template) or a row's name (its match strings must be in the template)")
    turn_tokens: int = Field(4, ge=1, le=256, description="k: the first k content tokens of a message are 'turn_start'")
    code_domains: list[str] = Field(default_factory=lambda: ["code"],
                                    description="domains whose every content token is 'code' (besides fenced blocks)")
    templates: list[TemplateRule] = Field(default_factory=lambda: list(DEFAULT_TEMPLATES),
                                          description="the rule table; giving it replaces the defaults")

    @field_validator("templates")
    @classmethod
    def _unique(cls, v: list[TemplateRule]) -> list[TemplateRule]:
        names = [t.name for t in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"template rule names repeat: {dup}")
        return v
