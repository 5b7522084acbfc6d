"""No user file is ever unpickled, and no model code runs unless the config asks for it.

Two halves. A static guard parses every module under ``fideval/`` and refuses any call that can unpickle
(``torch.load``, ``pickle.load(s)``, ``np.load(..., allow_pickle=True)``, ``joblib``/``dill``/``pandas``
pickles, ``weights_only=False``) or that turns on remote code (``trust_remote_code=True`` written as a
literal) -- the checker is itself tested on planted snippets so it cannot pass vacuously. A dynamic half
plants pickles whose unpickling creates a marker folder (checked to work: the positive control unpickles
one on purpose) where checkpoints, shards, GGUF files and corpora are expected, runs the loaders, and
asserts they refuse the file and the marker never appears.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
from cli_runner import run_fideval
from faults_fixtures import HINT, error_line, plant_pickle, write_checkpoint

from fideval.errors import FidevalError

PACKAGE = Path(__file__).resolve().parent.parent / "fideval"

# dotted call targets that deserialize pickles (or run serialized code) whatever their arguments
UNPICKLING_CALLS = {
    "torch.load", "torch.serialization.load", "torch.jit.load", "torch.package.PackageImporter",
    "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "cPickle.load",
    "cPickle.loads", "dill.load", "dill.loads", "cloudpickle.load", "cloudpickle.loads", "joblib.load",
    "pandas.read_pickle", "marshal.load", "marshal.loads", "shelve.open", "numpy.lib.format.read_array",
}
PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``np.load`` -> ``numpy.load`` given ``import numpy as np``; None for anything not a plain name chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_calls(source: str, filename: str = "<snippet>") -> list[str]:
    """Every place in ``source`` that could unpickle a file or enable remote code, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {"np": "numpy", "pd": "pandas"}
    found = []
    for node in ast.walk(tree):  # aliases first, wherever the import sits (module or function level)
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.split(".")[0] in PICKLE_MODULES:
                    found.append(f"{filename}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if node.module.split(".")[0] in PICKLE_MODULES:
                found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if name in UNPICKLING_CALLS:
            found.append(f"{filename}:{node.lineno}: {name}()")
        if name in ("numpy.load", "numpy.lib.npyio.load") and _is_true(kw.get("allow_pickle", ast.Constant(False))):
            found.append(f"{filename}:{node.lineno}: {name}(allow_pickle=True)")
        if _is_true(kw.get("trust_remote_code", ast.Constant(False))):
            found.append(f"{filename}:{node.lineno}: trust_remote_code=True")
        wo = kw.get("weights_only")
        if isinstance(wo, ast.Constant) and wo.value is False:
            found.append(f"{filename}:{node.lineno}: weights_only=False")
    return found


PLANTED = {
    "torch.load": "import torch\nsd = torch.load(path)\n",
    "torch alias": "import torch as T\nT.load(p, map_location='cpu')\n",
    "from torch import load": "from torch import load\nload(p)\n",
    "weights_only=False": "import torch\ntorch.load(p, weights_only=False)\n",
    "pickle.loads": "import pickle\nobj = pickle.loads(data)\n",
    "pickle import alone": "import pickle\n",
    "from pickle import load": "from pickle import load as L\nL(f)\n",
    "np.load allow_pickle": "import numpy as np\nnp.load(p, allow_pickle=True)\n",
    "numpy.load allow_pickle": "import numpy\nnumpy.load(p, mmap_mode='r', allow_pickle=True)\n",
    "pandas.read_pickle": "import pandas as pd\npd.read_pickle(p)\n",
    "joblib": "import joblib\njoblib.load(p)\n",
    "trust_remote_code": "from transformers import AutoModel\nAutoModel.from_pretrained(d, trust_remote_code=True)\n",
    "in a function": "def f(p):\n    import torch\n    return torch.load(p)\n",
}
HARMLESS = {
    "safetensors": "from safetensors.torch import load_file\nload_file(p)\n",
    "np.load default": "import numpy as np\nnp.load(p)\nnp.load(p, allow_pickle=False)\n",
    "json.load": "import json\njson.load(f)\n",
    "trust_remote_code from config": "AutoTokenizer.from_pretrained(d, trust_remote_code=cfg.model.trust_remote_code)\n",
    "trust_remote_code=False": "AutoConfig.from_pretrained(d, trust_remote_code=False)\n",
    "torch without load": "import torch\ntorch.tensor([1.0])\n",
    "a word": "WORDS = ['pickle', 'torch.load']\n",
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_checker_catches_planted_calls(name):
    assert unsafe_calls(PLANTED[name]), name


@pytest.mark.parametrize("name", list(HARMLESS))
def test_checker_passes_harmless_code(name):
    assert unsafe_calls(HARMLESS[name]) == [], name


def test_no_module_in_fideval_can_unpickle_or_enable_remote_code():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 30  # the whole package is scanned, not an empty folder
    found = [hit for f in files for hit in unsafe_calls(f.read_text(encoding="utf-8"), str(f.relative_to(PACKAGE.parent)))]
    assert found == [], "\n".join(found)


# -- dynamic: planted pickles are refused, never executed ---------------------------------------------------
@pytest.mark.parametrize("torch_format", [False, True])
def test_positive_control_the_planted_pickle_really_detonates(tmp_path, torch_format):
    """Without this, 'the marker never appears' would prove nothing."""
    marker = tmp_path / "BOOM"
    path = plant_pickle(tmp_path / "evil.bin", marker, torch_format=torch_format)
    if torch_format:
        import torch

        torch.load(str(path), weights_only=False)  # the test, not fideval, opts into executing it
    else:
        pickle.loads(path.read_bytes())
    assert marker.is_dir()


@pytest.mark.parametrize("where", ["model.safetensors", "pytorch_model.bin", "model.safetensors+bin"])
def test_quant_inspect_refuses_pickled_checkpoints(tmp_path, where):
    marker = tmp_path / "BOOM"
    ckpt = write_checkpoint(tmp_path / "ckpt")
    if where == "model.safetensors":
        plant_pickle(ckpt / "model.safetensors", marker, torch_format=True)
    elif where == "pytorch_model.bin":
        (ckpt / "model.safetensors").unlink()
        plant_pickle(ckpt / "pytorch_model.bin", marker, torch_format=True)
    else:  # a real safetensors plus a pickle beside it: the pickle is simply never opened
        plant_pickle(ckpt / "pytorch_model.bin", marker, torch_format=True)
        plant_pickle(ckpt / "optimizer.pt", marker)
    code, out, err = run_fideval("quant", "inspect", "--model", ckpt, "--quant", "attention=mxfp4")
    if where == "model.safetensors+bin":
        assert code == 0 and "attention" in out, err
    else:
        error_line(code, err, "ckpt")
    assert not marker.exists()


def test_runner_checkpoint_refuses_pickles(tmp_path):
    """The runner's checkpoint reader (fideval/model/weights/checkpoint.py) reads safetensors only."""
    checkpoint = pytest.importorskip("fideval.model.weights.checkpoint")
    marker = tmp_path / "BOOM"
    ckpt = write_checkpoint(tmp_path / "ckpt")
    plant_pickle(ckpt / "model.safetensors", marker, torch_format=True)
    with pytest.raises(FidevalError) as e:
        checkpoint.Checkpoint(ckpt)
    assert "model.safetensors" in e.value.line() and HINT.search(e.value.line())
    (ckpt / "model.safetensors").unlink()
    plant_pickle(ckpt / "pytorch_model.bin", marker, torch_format=True)
    with pytest.raises(FidevalError) as e:
        checkpoint.Checkpoint(ckpt)
    assert str(ckpt) in e.value.line() and "safetensors" in e.value.line() and HINT.search(e.value.line())
    assert not marker.exists()


def test_tokenizer_loading_keeps_remote_code_off(tmp_path, monkeypatch):
    """The windows stage passes the config's trust_remote_code (default False) to transformers, never True."""
    import transformers

    from fideval.windows.encode import load_tokenizer

    seen = {}

    def fake(folder, **kw):
        seen.update(kw)
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(fake))
    (tmp_path / "tok").mkdir()
    with pytest.raises(FidevalError):
        load_tokenizer(tmp_path / "tok")
    assert seen.get("trust_remote_code") is False
