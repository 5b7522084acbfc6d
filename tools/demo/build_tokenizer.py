"""Train the demo's byte-level BPE tokenizer (4,096 tokens exactly) on the demo corpus and save it in HF layout.

Why byte-level: every string, in any script, round-trips, so the multilingual domain never meets an
unknown token. Why digits split one by one: the math domain's numbers then share four-token pieces
instead of thousands of rare merges, which a 4,096-token vocabulary cannot afford. Why no post-processor
(``tokenizer(text)`` adds no BOS/EOS): the windows stage decides where document separators go; chat
conversations get their ``<|bos|>`` from the chat template, as with real chat models.

Run after ``build_corpus``: ``python tools/demo/build_tokenizer.py``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fideval import fsio
from fideval.demo import CORPUS_DIR, DOMAINS, MODEL_DIR

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
BOS, EOS, PAD = SPECIAL_TOKENS[:3]
# One role marker per turn, the turn closed by <|end|>; a generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def render_chat(messages: list[dict]) -> str:
    """The chat template applied without transformers (identical output; used to feed the BPE trainer)."""
    body = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
    return BOS + body


def read_domain(domain: str, corpus_dir: Path = CORPUS_DIR) -> list[dict]:
    with open(corpus_dir / f"{domain}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def document_text(doc: dict) -> str:
    """The string a document is tokenized from: its text, or its rendered conversation."""
    return render_chat(doc["messages"]) if "messages" in doc else doc["text"]


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [document_text(d) for domain in DOMAINS for d in read_domain(domain)]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"BPE ended with {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}")
    return tok


def save(tok, out: Path = MODEL_DIR) -> None:
    """Save via transformers' own writer into a temp folder, then move each file in atomically."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        fsio.write_bytes(out / "tokenizer.json", (Path(tmp) / "tokenizer.json").read_bytes())
    # Written by hand (not by save_pretrained) so the file is the same under transformers 4.x and 5.x and
    # carries the chat template inline, where every version looks for it.
    fsio.write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "additional_special_tokens": SPECIAL_TOKENS[3:], "model_max_length": 2048,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE})
    fsio.write_json(out / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
                                                      "additional_special_tokens": SPECIAL_TOKENS[3:]})


def main() -> None:
    tok = train_tokenizer()
    save(tok)
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(MODEL_DIR)
    for domain in DOMAINS:
        n = sum(len(t(document_text(d), add_special_tokens=False)["input_ids"]) for d in read_domain(domain))
        print(f"{domain:13s} {n:7d} tokens")
    print("tokenizer.json sha256", fsio.sha256_file(MODEL_DIR / "tokenizer.json"))


if __name__ == "__main__":
    main()
