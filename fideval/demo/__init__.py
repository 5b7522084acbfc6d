"""The embedded demo: a 6-domain corpus, a calibration corpus, a 4,096-token BPE and a tiny DeepSeek-V3 model.

Everything under ``assets/`` is committed and reachable from configs as ``demo://<path>`` (see
``fideval/config.py``). The builders beside this file regenerate the assets deterministically, in order::

    python -m fideval.demo.build_corpus      # assets/corpus/*.jsonl, assets/calibration/*
    python -m fideval.demo.build_tokenizer   # assets/model/tokenizer*.json, special_tokens_map.json
    python -m fideval.demo.train_model       # assets/model/config.json, model.safetensors, TRAINING.json

Where each asset came from and under which licence is recorded in ``SOURCES.md``.
"""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
CORPUS_DIR = ASSETS / "corpus"
CALIBRATION_DIR = ASSETS / "calibration"
MODEL_DIR = ASSETS / "model"
DOMAINS = ("code", "legal", "prose", "math", "multilingual", "chat")
