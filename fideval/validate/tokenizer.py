"""The tokenizer the windows stage will load (``model.tokenizer``, else the model folder), loaded with the
stage's own :func:`fideval.windows.encode.load_tokenizer` and wrapped in its :class:`Encoder`, so a missing
tokenizer, a separator without its BOS/EOS token, or a chat domain without a chat template is refused now; and a
tokenizer with more tokens (added tokens included) than the model's ``vocab_size``, whose ids past the embedding
the teacher would fail on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fideval.errors import FidevalError
from fideval.validate.findings import Findings

if TYPE_CHECKING:
    from fideval.config import Config
    from fideval.validate.model import Probe


# A Hub snapshot holds a tokenizer when it has one of these (what AutoTokenizer reads first).
HUB_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def _folder(cfg: Config, found: Findings):
    from fideval.config import is_hub, resolve_path
    from fideval.model_source import cached, tokenizer_source

    path, revision = tokenizer_source(cfg.model)
    if not is_hub(path):
        folder = resolve_path(path)
        return folder if folder.is_dir() else None  # check_files has named the missing folder
    for name in HUB_TOKENIZER_FILES:
        files = cached(path, revision, name)
        if files is not None:
            return files.folder
    if not cfg.model.tokenizer and cached(path, revision) is None:
        return None  # the whole model is not cached: its note covers the tokenizer
    found.notes.append(f"the tokenizer of {path}@{revision or 'main'} is not in the local Hub cache: "
                       "it is checked when the windows stage fetches it")
    return None


def check(cfg: Config, found: Findings, probe: Probe | None = None) -> None:
    from fideval.windows.encode import Encoder, load_tokenizer

    folder = _folder(cfg, found)
    if folder is None:
        return
    key = "model.tokenizer" if cfg.model.tokenizer else "model.path"
    try:
        tok = load_tokenizer(folder, cfg.model.trust_remote_code)
    except FidevalError as e:
        found.add(key, e)
        return
    vocab = probe.vocab_size if probe is not None else None
    if vocab is not None and len(tok) > vocab:  # len(): the base vocabulary and every added token
        found.add(key, f"the tokenizer in {folder} has {len(tok):,} tokens (added tokens included), more than the model's "
                  f"vocab_size of {vocab:,}: an id from {vocab:,} on has no row in the embedding or the logits",
                  hint="give the tokenizer this model was trained with (model.tokenizer)")
    try:
        enc = Encoder(tok, cfg.windows.separator)
    except FidevalError as e:
        found.add("windows.separator", e)
        return
    chats = [(f"domains.{d.name}.source.messages_field", d.source) for d in cfg.domains]
    chats += [(f"screen.calibration[{i}].messages_field", s) for i, s in enumerate(cfg.screen.calibration)]
    for where, source in chats:
        if source.messages_field:
            try:
                enc.check_chat()
            except FidevalError as e:
                found.add(where, e)
    from fideval.windows.tagging import Tagger

    try:  # the token-class rule the windows stage would pick: it fits the chat template, its markers are tokens
        Tagger(cfg.token_classes, tok, any(d.kind == "chat" or d.source.messages_field for d in cfg.domains))
    except FidevalError as e:
        found.add("token_classes", e)
