"""The stores a scorer opens: a teacher store (logits, or hidden states replayed through their head: fideval.store.replay)
and a candidate store, from a folder or ``hf://datasets/...``."""

from __future__ import annotations

from pathlib import Path

from fideval.store.hub import resolve_store
from fideval.store.reader import StoreReader, open_rows
from fideval.store.replay import HiddenStore


def open_store(spec: str | Path, head_from: str | Path | None = None) -> StoreReader | HiddenStore:
    """The store at ``spec`` as the rows a scorer reads. A hidden store's head is its own ``head.safetensors``; where the
    store was published without it, ``head_from`` (a model folder or ``hf://ORG/NAME``) gives it, checked against the
    store's digest of the head's content."""
    root = resolve_store(spec)
    model_head = origin = None
    if head_from is not None and StoreReader(root).kind == "hidden":
        from fideval.model.weights.head_source import model_head as read_head

        model_head, origin = read_head(head_from)
    return open_rows(root, model_head=model_head, head_origin=origin)
