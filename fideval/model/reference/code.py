"""Finding, trusting and importing a model's reference code (``<model>/inference/`` or a configured path).

Importing vendor code is running code from the model repository, so it needs the same explicit trust as
``trust_remote_code``. The folder is imported as a private package (its name derived from the folder's
content hash, so two copies never share module state) whose ``model`` module is the vendor's
``model.py``. Vendor files import their kernels either relatively (``from .kernel_cpu import ...``) or
as a top-level module (DeepSeek-V3: ``from kernel import ...``, which imports triton/tilelang): a
``stand_ins`` mapping supplies modules for such top-level names (torch implementations of the same
functions) when the real module cannot be imported or a CPU run needs them. What computed each kernel is
recorded in :attr:`VendorCode.kernels`; the SHA-256 of every file in :attr:`VendorCode.files`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from fideval.errors import FidevalError

DEFAULT_CODE_DIR = "inference"
_HASHED = (".py", ".json", ".txt", ".md")


def resolve_code_dir(model_dir: str | Path, code: str | Path | None = None) -> Path:
    """The reference-code folder: ``code`` relative to the model folder (default ``inference``) or absolute."""
    p = Path(code) if code is not None else Path(DEFAULT_CODE_DIR)
    folder = p if p.is_absolute() else Path(model_dir) / p
    if not folder.is_dir():
        raise FidevalError(f"reference code folder {folder} does not exist",
                           hint="set model.code to the folder holding the vendor's model.py (relative to the model "
                                "folder, or an absolute path)")
    if not (folder / "model.py").is_file():
        raise FidevalError(f"reference code folder {folder} has no model.py",
                           hint="model.code must name the vendor's inference/ folder (the one with model.py)")
    return folder.resolve()


def file_hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every code/config file under ``folder`` (relative POSIX path -> hex), sorted by path."""
    out = {}
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.suffix in _HASHED and "__pycache__" not in f.parts:
            out[f.relative_to(folder).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@dataclass
class VendorCode:
    """An imported reference-code folder. ``model``: the vendor's ``model`` module; ``files``: path ->
    SHA-256; ``kernels``: top-level kernel module name -> ``"vendor"`` or the stand-in's module name."""

    folder: Path
    package: str
    model: types.ModuleType
    files: dict[str, str]
    kernels: dict[str, str] = field(default_factory=dict)

    def module(self, name: str) -> types.ModuleType:
        """Another module of the vendor package (``engram``, ``kernel_cpu``...)."""
        return importlib.import_module(f"{self.package}.{name}")

    def provenance(self) -> dict:
        """What report.json records of the code (docs/runner.md)."""
        return {"folder": str(self.folder), "files": dict(self.files), "kernels": dict(self.kernels)}


def load_vendor_code(folder: str | Path, *, trust: bool, stand_ins: dict[str, types.ModuleType] | None = None,
                     prefer_vendor: bool = True) -> VendorCode:
    """Import ``folder``'s ``model.py`` as a private package.

    ``stand_ins``: top-level module name -> module. With ``prefer_vendor`` a stand-in is used only when the
    real module (the vendor's own file in ``folder`` or an installed package) fails to import; without it
    (a CPU run: triton imports but its kernels need a GPU) the stand-in always replaces it. Sibling files
    are aliased under their top-level names only while ``model.py`` imports; a stand-in for an installed
    package (``fast_hadamard_transform``, imported inside a function) stays in ``sys.modules``."""
    folder = Path(folder).resolve()
    if not trust:
        raise FidevalError(f"running the reference code in {folder} needs explicit trust",
                           hint="set model.trust_remote_code: true (it runs the model repository's own Python code)")
    files = file_hashes(folder)
    choice = "".join(f"{n}={m.__name__};" for n, m in sorted((stand_ins or {}).items())) + f"vendor={prefer_vendor}"
    digest = hashlib.sha256(("".join(f"{k}:{v};" for k, v in files.items()) + choice).encode()).hexdigest()[:16]
    package = f"fideval_vendor_{digest}"
    if package in sys.modules and getattr(sys.modules[package], "__fideval_code__", None) is not None:
        return sys.modules[package].__fideval_code__
    kernels: dict[str, str] = {}
    init = folder / "__init__.py"
    if init.exists():
        spec = importlib.util.spec_from_file_location(package, init, submodule_search_locations=[str(folder)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[package] = pkg
        spec.loader.exec_module(pkg)
    else:  # a plain folder: a package with no code of its own
        pkg = types.ModuleType(package)
        pkg.__path__ = [str(folder)]
        sys.modules[package] = pkg
    # top-level imports of sibling files (``from kernel import ...``) resolve to this package's modules,
    # aliased only while model.py imports, so two vendor folders with a ``kernel.py`` never meet
    text = (folder / "model.py").read_text(encoding="utf-8", errors="replace")
    siblings = {m for m in re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", text, re.M) if (folder / f"{m}.py").is_file()}
    aliases: dict[str, types.ModuleType] = {}
    for name in sorted(siblings | set(stand_ins or {})):
        local = name in siblings
        chosen = None
        if prefer_vendor or name not in (stand_ins or {}):
            try:
                chosen = importlib.import_module(f"{package}.{name}" if local else name)
                kernels[name] = "vendor"
            except Exception as e:  # noqa: BLE001 -- no triton/tilelang/GPU: the stand-in, if any, computes it
                if name not in (stand_ins or {}):
                    sys.modules.pop(package, None)
                    raise FidevalError(f"the reference code's {name}.py in {folder} does not import: {type(e).__name__}: {e}",
                                       hint="install what the vendor's requirements.txt names, or run on the machine it targets") from None
        if chosen is None:
            chosen = stand_ins[name]
            kernels[name] = chosen.__name__
        if local:
            aliases[name] = chosen
        else:
            sys.modules[name] = chosen  # vendor code may import it lazily, inside a function
    saved = {n: sys.modules.get(n) for n in aliases}
    sys.modules.update(aliases)
    try:
        model = importlib.import_module(f"{package}.model")
    except FidevalError:
        raise
    except Exception as e:  # noqa: BLE001 -- vendor code failing to import is the user's input
        sys.modules.pop(package, None)
        raise FidevalError(f"the reference code in {folder} does not import: {type(e).__name__}: {e}",
                           hint="check model.code and the packages the vendor's requirements.txt names") from None
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    code = VendorCode(folder, package, model, files, kernels)
    pkg.__fideval_code__ = code
    return code


def require(code: VendorCode, names: tuple[str, ...]) -> None:
    """One-line error when the vendor module lacks classes/functions a driver uses."""
    missing = [n for n in names if not hasattr(code.model, n)]
    if missing:
        raise FidevalError(f"{code.folder / 'model.py'} does not define {', '.join(missing)}",
                           hint="model.code must point at the vendor's reference code for this model family")
