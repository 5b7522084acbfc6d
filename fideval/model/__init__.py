"""The layer-by-layer reference runner: checkpoint reading, architecture adapters, layer-major execution,
model parallel and determinism (docs/runner.md). Imports only torch, numpy, safetensors at module level
(transformers inside functions), so it runs on the GPU machine without the workflow stack."""
