"""Where the model's files are: a local checkpoint folder, a packaged demo asset, or a Hub repository.

``hf://ORG/NAME`` is fetched with ``huggingface_hub.snapshot_download`` at the config's revision (only the
config, safetensors and tokenizer files, and the reference code under ``inference/``); the commit the revision
resolved to is what gets recorded, so a branch name in a config still yields a reproducible report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fideval.errors import FidevalError

# inference/*: the vendor's reference code (model.implementation: reference), fetched as files, run only under trust
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.txt", "*.model", "inference/*"]
TOKENIZER_FILES = [p for p in MODEL_FILES if p not in ("*.safetensors", "inference/*")]  # the windows stage needs no weights


@dataclass(frozen=True)
class ModelFiles:
    folder: Path
    revision: str | None  # the resolved commit for Hub models; the config's revision otherwise


def locate(path: str, revision: str | None = None, patterns: list[str] = MODEL_FILES) -> ModelFiles:
    from fideval.config import is_hub, resolve_path

    if not is_hub(path):
        folder = resolve_path(path)
        if not (folder / "config.json").is_file():
            raise FidevalError(f"{folder} is not a checkpoint folder (no config.json)",
                               hint="point model.path at a Hugging Face layout folder or hf://ORG/NAME")
        return ModelFiles(folder, revision)
    repo = str(path).removeprefix("hf://").strip("/")
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id=repo, revision=revision, allow_patterns=patterns)
    except Exception as e:  # offline, unknown repo or revision: all one line for the user
        raise FidevalError(f"cannot fetch model {repo}@{revision or 'main'} ({type(e).__name__})",
                           hint="check the id and revision, log in for gated models, or download it and give a folder") from None
    folder = Path(local)
    return ModelFiles(folder, folder.name if len(folder.name) == 40 else revision)


def cached(path: str, revision: str | None = None, filename: str = "config.json") -> ModelFiles | None:
    """Where ``hf://ORG/NAME`` at ``revision`` already lies in the local Hub cache (HF_HUB_CACHE / HF_HOME),
    judged by its ``filename``; None when that file is not there. Never touches the network."""
    from huggingface_hub import try_to_load_from_cache

    repo = str(path).removeprefix("hf://").strip("/")
    try:
        hit = try_to_load_from_cache(repo, filename, revision=revision or "main")
    except Exception:  # a malformed repo id or revision: the stage's own fetch reports it
        return None
    if not isinstance(hit, str):
        return None
    folder = Path(hit).parent
    return ModelFiles(folder, folder.name if len(folder.name) == 40 else revision)


def tokenizer_source(model) -> tuple[str, str | None]:
    """(path, revision) of the tokenizer a config's ``model`` names: ``model.tokenizer``, else the model's own."""
    return (model.tokenizer, None) if model.tokenizer else (model.path, model.revision)


def tokenizer_folder(model) -> Path:
    """The local folder holding the tokenizer of a config's ``model`` (a Hub model's tokenizer files are fetched
    without its weights)."""
    from fideval.config import is_hub, resolve_path

    path, revision = tokenizer_source(model)
    return locate(path, revision, TOKENIZER_FILES).folder if is_hub(path) else resolve_path(path)
