"""Helpers for the windows-stage tests: a tiny BPE tokenizer with a chat template, small corpora, configs.

Nothing here downloads anything: the tokenizer is trained on a few KB of generated text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega river stone cloud forest ember quartz lantern harbor meadow copper violet "
         "signal vector matrix kernel tensor prime orbit comet nebula saga fable").split()


def make_text(rng: np.random.Generator, n_words: int) -> str:
    """Random sentences over a small vocabulary with punctuation and case (so normalisation matters)."""
    out = []
    for i, w in enumerate(rng.choice(WORDS, size=n_words)):
        w = str(w)
        if rng.random() < 0.1:
            w = w.capitalize()
        if rng.random() < 0.08:
            w += rng.choice([",", ".", ";", "!"])
        out.append(w)
    return " ".join(out)


def make_tokenizer(folder: Path) -> Path:
    """Train a ~600-token byte-level BPE, wrap it as PreTrainedTokenizerFast with a chat template, save it
    with a minimal config.json (all the windows stage needs of a model folder)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = np.random.default_rng(123)
    corpus = [make_text(rng, 60) for _ in range(80)] + ["Hello, World! ünïcödé — «quotes» 123 +-*/"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(fast)}))
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def text_docs(seed: int, n: int, words: tuple[int, int] = (40, 120)) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"id": f"d{seed}-{i}", "text": make_text(rng, int(rng.integers(*words)))} for i in range(n)]


def chat_docs(seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"id": f"c{seed}-{i}", "messages": [{"role": "user", "content": make_text(rng, 30)},
                                                 {"role": "assistant", "content": make_text(rng, 50)}]}
            for i in range(n)]


def write_config(path: Path, model: Path, domains: list[dict], *, windows: dict | None = None,
                 screen: dict | None = None, extra: dict | None = None) -> Path:
    cfg = {"run": "t", "model": {"path": str(model), "id": "test/tiny"}, "domains": domains,
           "windows": {"window_tokens": 256, "cut_tokens": 64, "windows_per_domain": 3, "seed": 0,
                       "separator": "eos", **(windows or {})}}
    if screen is not None:
        cfg["screen"] = screen
    cfg.update(extra or {})
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def one_error_line(err: str) -> str:
    """The single ``fideval: error:`` line of stderr (progress lines may precede it); asserts there is one."""
    lines = [ln for ln in err.splitlines() if ln.startswith("fideval: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]
