"""The embedded demo: a 6-domain corpus, a calibration corpus, a 4,096-token BPE and a tiny DeepSeek-V3 model.

Everything under ``assets/`` is committed and reachable from configs as ``demo://<path>`` (see
``fideval/config.py``). The builders that regenerate the assets deterministically are not part of the
package; they live in ``tools/demo/`` of the repository and run in order::

    python tools/demo/build_corpus.py      # assets/corpus/*.jsonl, assets/calibration/*
    python tools/demo/build_tokenizer.py   # assets/model/tokenizer*.json, special_tokens_map.json
    python tools/demo/train_model.py       # assets/model/config.json, model.safetensors, TRAINING.json

Where each asset came from and under which licence is recorded in ``SOURCES.md``.
"""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
CORPUS_DIR = ASSETS / "corpus"
CALIBRATION_DIR = ASSETS / "calibration"
MODEL_DIR = ASSETS / "model"
DOMAINS = ("code", "legal", "prose", "math", "multilingual", "chat")
