"""Where the model's files are: a local checkpoint folder, a packaged demo asset, or a Hub repository.

``hf://ORG/NAME`` is fetched with ``huggingface_hub.snapshot_download`` at the config's revision (only the
config, safetensors and tokenizer files); the commit the revision resolved to is what gets recorded, so a
branch name in a config still yields a reproducible report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fideval.errors import FidevalError

MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.txt", "*.model"]


@dataclass(frozen=True)
class ModelFiles:
    folder: Path
    revision: str | None  # the resolved commit for Hub models; the config's revision otherwise


def locate(path: str, revision: str | None = None) -> ModelFiles:
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

        local = snapshot_download(repo_id=repo, revision=revision, allow_patterns=MODEL_FILES)
    except Exception as e:  # offline, unknown repo or revision: all one line for the user
        raise FidevalError(f"cannot fetch model {repo}@{revision or 'main'} ({type(e).__name__})",
                           hint="check the id and revision, log in for gated models, or download it and give a folder") from None
    folder = Path(local)
    return ModelFiles(folder, folder.name if len(folder.name) == 40 else revision)
