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


@pytest.fixture
def one_thread():
    """torch on one thread for the test (the vendor code's bit-exactness checks: the summation order of one thread)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", autouse=True)
def _no_process_group_left_behind():
    """A reference driver may create a one-process torch.distributed group in the test process (DeepSeek-V3.2's
    indexer broadcasts even at N = 1); a module leaves none behind, so a later module's forked model-parallel
    workers can create their own."""
    yield
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
