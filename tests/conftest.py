"""Fixtures shared by the test modules.

The tests import their helper modules (``cli_runner``, ``windows_fixtures``, ``model_fixtures``, ...) by name:
pytest puts this folder on ``sys.path`` (rootdir-relative, no ``__init__.py``). Fixtures here are session-scoped
and read-only: a test that must change one copies it first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from windows_fixtures import make_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A ~600-token byte-level BPE with a chat template in a model folder (config.json + tokenizer files):
    all the windows stage and the config checks need of a model. Built once per test process."""
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer") / "model")
