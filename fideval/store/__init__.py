"""The teacher-logit store: one safetensors shard per sequence, a SHA-256 manifest, an index (docs/formats-store.md)."""

from fideval.store.reader import StoreReader
from fideval.store.writer import StoreWriter

__all__ = ["StoreReader", "StoreWriter"]
