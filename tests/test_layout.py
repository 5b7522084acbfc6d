"""The package's shape holds: stages import downward only, no import circle inside model/, quant/ or score/, model/
stays small at its top level, and the seams the stages share are declared (docs/runner.md's file table).

The import graph is read from the source with ``ast`` (every import, in functions too, except those under
``if TYPE_CHECKING:``, which never run), so a helper import added inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "fideval"
# the stages in the order data flows through them; a module may import its own stage or a lower one
LEVEL = {"formats": 0, "timing": 0, "windows": 1, "quant": 1, "store": 1, "stats": 1, "model": 2, "score": 3,
         "report": 4, "validate": 5, "commands": 6}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _type_only(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_only(tree)
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                if t.startswith("fideval"):
                    r = _resolve(t, mods)
                    if r and r != m:
                        graph[m].add(r)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package():
    assert _cycles(import_graph()) == []


def test_no_stage_imports_a_later_one():
    climbs = []
    for m, targets in import_graph().items():
        stage = m.split(".")[1] if m.count(".") else None
        for t in targets:
            ts = t.split(".")[1] if t.count(".") else None
            if stage in LEVEL and ts in LEVEL and LEVEL[ts] > LEVEL[stage]:
                climbs.append(f"{m} -> {t}")
    assert not climbs, climbs


def test_model_is_small_at_its_top_level():
    top = sorted(p.name for p in (PKG / "model").glob("*.py"))
    assert len(top) <= 15, top


def _functions(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("rel", ["model/teacher.py", "model/teacher_pass.py", "score/fused.py"])
def test_the_teacher_pass_has_no_long_function(rel):
    long = [(n, k) for n, k in _functions(PKG / rel) if k > 100]
    assert not long, long


def test_fused_imports_no_private_name_of_another_module():
    tree = ast.parse((PKG / "score" / "fused.py").read_text())
    private = [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names if a.name.startswith("_")]
    assert not private, private


def test_both_runners_are_model_runners():
    """The protocol the stages use lists what each backend has (a backend missing a member fails here, not mid-run)."""
    from fideval.model.layer_major import ModelRunner
    from fideval.model.reference.runner import ReferenceRunner
    from fideval.model.runner import Runner

    members = [n for n in vars(ModelRunner) if not n.startswith("_")] + list(ModelRunner.__annotations__)
    for cls in (Runner, ReferenceRunner):
        instance_attrs = _init_attributes(cls)
        missing = [n for n in set(members) if not hasattr(cls, n) and n not in instance_attrs]
        assert not missing, (cls.__name__, missing)


def _init_attributes(cls) -> set[str]:
    """Attributes a class's ``__init__`` assigns on ``self`` (read from its source)."""
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in ([t] if not isinstance(t, ast.Tuple) else t.elts)
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_the_format_table_names_every_format_its_modules_define():
    """fideval.quant.base.FORMATS names the module of each format (imported on first use): each named module's
    DEFINES holds exactly the formats the table gives it, under their own names."""
    from fideval.quant.base import FORMATS, Format, get_format

    by_module: dict[str, set[str]] = {}
    for name, module in FORMATS.items():
        by_module.setdefault(module, set()).add(name)
    for module, names in by_module.items():
        defined = importlib.import_module(module).DEFINES
        assert all(isinstance(f, Format) for f in defined)
        assert {f.name for f in defined} == names, module
    assert all(get_format(n).name == n for n in FORMATS)
    # every Format instance of the quant package is in the table: none is defined and left unreachable
    for p in (PKG / "quant").glob("*.py"):
        mod = importlib.import_module(f"fideval.quant.{p.stem}")
        for v in vars(mod).values():
            if isinstance(v, Format):
                assert v.name in FORMATS, (p.name, v.name)
