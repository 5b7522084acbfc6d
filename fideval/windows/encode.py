"""The tokenizer side of the windows stage: load it, fingerprint it, render chats, encode with offsets.

The tokenizer comes from ``model.tokenizer`` (or the model folder) through ``AutoTokenizer``, the same
object the teacher's tokenizer would be. A chat is rendered with the tokenizer's own chat template
(``apply_chat_template(messages, tokenize=False)``) and the rendered string is then encoded like any
text, without adding special tokens (the template writes its own). Encoding keeps each token's character
end offset so a truncated document can record exactly which characters it contributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import nesting


def load_tokenizer(folder: Path, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    if not folder.is_dir():
        raise FidevalError(f"tokenizer folder {folder} does not exist", hint="set model.path or model.tokenizer")
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as e:
        if (folder / "tokenizer.json").is_file() and _not_transformers_config(folder):
            # a model only its vendor's code runs (DeepSeek-V4.1-Flash: config.json holds the vendor's ModelArgs,
            # ``dtype: fp8``, which AutoTokenizer's config read fails on): the tokenizer files alone
            from transformers import PreTrainedTokenizerFast

            try:
                return PreTrainedTokenizerFast.from_pretrained(str(folder))
            except Exception:  # noqa: BLE001 -- reported as the first failure below
                pass
        raise FidevalError(f"cannot load a tokenizer from {folder} ({type(e).__name__})",
                           hint="the folder needs tokenizer.json / tokenizer_config.json") from None


def _not_transformers_config(folder: Path) -> bool:
    """config.json names no transformers ``model_type`` (unreadable or absent counts as not one either)."""

    try:
        return "model_type" not in nesting.loads((folder / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return True


def tokenizer_sha256(folder: Path) -> str | None:
    from fideval.fsio import sha256_file

    p = folder / "tokenizer.json"
    return sha256_file(p) if p.is_file() else None


@dataclass(frozen=True)
class Encoded:
    ids: np.ndarray  # int32 token ids of the document
    char_ends: np.ndarray  # int64: characters of the text covered by the first k tokens = char_ends[k-1]
    offsets: np.ndarray | None = None  # int64 [n, 2]: each token's own [start, end) characters (token classes)
    classes: np.ndarray | None = None  # int32 [n]: each token's class bits (fideval.formats.classes), when tagged


class Encoder:
    """Renders, encodes and decodes for one tokenizer and one separator rule.

    ``separator`` (``windows.separator``): ``eos`` appends the EOS token after every document, ``bos``
    puts BOS before every document, ``bos_eos`` does both, ``none`` joins documents directly.
    """

    def __init__(self, tok: Any, separator: str = "eos"):
        self.tok = tok
        need_bos, need_eos = separator in ("bos", "bos_eos"), separator in ("eos", "bos_eos")
        if need_bos and tok.bos_token_id is None:
            raise FidevalError(f"windows.separator '{separator}' needs a BOS token, and the tokenizer has none",
                               hint="use separator: eos or none")
        if need_eos and tok.eos_token_id is None:
            raise FidevalError(f"windows.separator '{separator}' needs an EOS token, and the tokenizer has none",
                               hint="use separator: bos or none")
        self.prefix = [int(tok.bos_token_id)] if need_bos else []
        self.suffix = [int(tok.eos_token_id)] if need_eos else []

    def check_chat(self) -> None:
        """A messages field is rendered with the tokenizer's chat template: refuse a tokenizer without one."""
        if not getattr(self.tok, "chat_template", None):
            raise FidevalError(f"a messages field needs a chat template, and the tokenizer "
                               f"{getattr(self.tok, 'name_or_path', '') or ''} has none",
                               hint="use a tokenizer with chat_template or a text field")

    def render(self, messages: list) -> str:
        self.check_chat()
        try:
            return self.tok.apply_chat_template(messages, tokenize=False)
        except Exception as e:
            raise FidevalError(f"the chat template failed on a conversation ({type(e).__name__}: {str(e)[:120]})") from None

    def encode(self, text: str) -> Encoded:
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        ends = offsets[:, 1]
        return Encoded(ids=ids, char_ends=np.maximum.accumulate(ends) if ends.size else ends, offsets=offsets)

    def ids(self, text: str) -> np.ndarray:
        return np.asarray(self.tok(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=np.int64)

    def decode(self, ids: np.ndarray) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
