"""A model folder's lm head, read for replay: the tensor a hidden store names when the store was published without its
``head.safetensors`` (fideval.store.head checks it against the store's content digest before any row is replayed)."""

from __future__ import annotations

from pathlib import Path

import torch


def model_head(model: str | Path, revision: str | None = None) -> tuple[torch.Tensor, str]:
    """``(weight [V, H] float32, where it came from)``: the lm head (a tied model's embedding) of the checkpoint at
    ``model`` (a folder, or ``hf://ORG/NAME`` in the local Hub cache or fetched), FP8 releases dequantized as the runner
    reads them. A store computed with a quantized head names that head's values; this reads the folder's as stored."""
    from fideval.model.adapters import Adapter
    from fideval.model.weights.checkpoint import open_weights
    from fideval.model_source import locate

    files = locate(str(model), revision)
    adapter = Adapter.load(open_weights(files.folder))
    key = adapter.top_keys()["lm_head"]
    w = adapter.cast(adapter.read(key, rows=(0, adapter.vocab_size)), torch.float32)
    return w, f"{files.folder}:{key}"
