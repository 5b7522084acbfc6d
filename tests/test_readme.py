"""README.md's file tree stays true: every module of the package and every rule file is listed."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_module_is_in_the_readme_tree():
    readme = (ROOT / "README.md").read_text()
    modules = [p.relative_to(ROOT).as_posix() for p in (ROOT / "fideval").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py") and "demo" not in p.parts and "commands" not in p.parts]
    missing = [m for m in modules if m not in readme]
    assert not missing, f"add to README's file tree: {missing}"
    for rules in (ROOT / "workflow" / "rules").glob("*.smk"):
        assert rules.relative_to(ROOT).as_posix() in readme


def test_readme_names_the_two_setup_commands():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install "torch==2.13.0" -e ".[test]" && snakemake --cores all' in readme
    assert "python -m pytest -q -n 2" in readme
    assert "python -m pytest -q -n 2" in (ROOT / ".ci" / "run").read_text()
