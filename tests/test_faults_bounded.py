"""Bounded readers (issue 40): every JSON/YAML document and GGUF metadata array fideval reads from outside is
nested at most ``MAX_DEPTH`` levels deep, a YAML config names no key twice, and config values are range-checked
where the config is parsed -- each refusal one line naming the file (and key), never a ``RecursionError``
traceback or a silently wrong value.

Each case runs the real entry point (``run_fideval``) and asserts the exact error line; a positive control
beside each bound shows the limit is where it says (64 levels pass, 65 do not).
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_runner import run_fideval
from faults_fixtures import make_store, safetensors_with_header, write_checkpoint

from fideval.errors import FidevalError
from fideval.formats.nesting import MAX_DEPTH

REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = REPO / "fideval" / "demo" / "assets" / "model"
YAML_HINT = "(a config is a few levels deep (docs/config.md); fix the file)"
DUP_HINT = "(keep one: YAML would silently keep the last)"


def deep_json(levels: int) -> str:
    """An object holding ``levels - 1`` nested arrays: ``levels`` levels in all."""
    return '{"a": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


def good_config(**over: Any) -> dict:
    data = {"run": "v", "model": {"path": "demo://model", "id": "t"},
            "domains": [{"name": "code", "source": {"type": "local", "path": "demo://corpus/code.jsonl", "text_field": "text"}}],
            "windows": {"window_tokens": 256, "cut_tokens": 64, "windows_per_domain": 2}}
    data.update(over)
    return data


def write(tmp: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def validate_error(cfg: Path) -> str:
    return run_fideval("validate", cfg, cwd=cfg.parent).error()


# -- 1. nesting depth: YAML configs ---------------------------------------------------------------------------------
def test_yaml_config_nested_100000_deep_is_one_line_not_a_recursion_error(tmp_path):
    p = write(tmp_path, "run: v\nx: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert validate_error(p) == f"fideval: error: {p}: line 2 is nested deeper than {MAX_DEPTH} levels {YAML_HINT}"


def test_yaml_block_nesting_is_refused_at_level_65_and_64_is_read(tmp_path):
    from fideval.config import read_yaml

    def block(levels: int) -> str:  # `levels` nested mappings, one a line, the innermost holding a scalar
        return "".join("  " * i + "k:\n" for i in range(levels - 1)) + "  " * (levels - 1) + "k: 1\n"

    ok = read_yaml(write(tmp_path, block(MAX_DEPTH), "ok.yaml"))
    for _ in range(MAX_DEPTH - 1):
        ok = ok["k"]
    assert ok == {"k": 1}
    p = write(tmp_path, block(MAX_DEPTH + 1))
    assert validate_error(p) == f"fideval: error: {p}: line {MAX_DEPTH + 1} is nested deeper than {MAX_DEPTH} levels {YAML_HINT}"


def test_yaml_depth_through_an_alias_and_a_recursive_alias(tmp_path):
    """An alias of a 40-deep node placed 30 deep is 70 levels: refused; an alias inside the node it names would
    be an infinite structure: refused (PyYAML builds it, and the config model would recurse on it)."""
    p = write(tmp_path, "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n")
    assert validate_error(p) == f"fideval: error: {p}: line 1 is nested deeper than {MAX_DEPTH} levels (through an alias) {YAML_HINT}"
    p = write(tmp_path, "run: v\nx: &a [1, *a]\n")
    assert validate_error(p) == (f"fideval: error: {p}: line 2: an alias makes 'x.1' contain itself "
                                 "(a config holds no recursive structure; remove the alias)")


# -- 2. duplicate keys in a YAML config --------------------------------------------------------------------------------
@pytest.mark.parametrize("text, line, key, first", [
    ("run: a\nmodel: {path: m, id: t}\nrun: b\n", 3, "run", 1),
    ("run: a\nwindows:\n  seed: 1\n  window_tokens: 256\n  seed: 2\n", 5, "windows.seed", 3),
    ("run: a\ndomains:\n  - name: code\n    name: math\n", 4, "domains.0.name", 3),
    ("run: a\nreport: {seed: 1, 'seed': 2}\n", 2, "report.seed", 2),  # quoted or not, one key
])
def test_a_key_given_twice_is_refused_naming_key_and_line(tmp_path, text, line, key, first):
    p = write(tmp_path, text)
    assert validate_error(p) == f"fideval: error: {p}: line {line}: key '{key}' is given twice (first on line {first}) {DUP_HINT}"


def test_yaml_semantics_otherwise_kept(tmp_path):
    """A merge key may still be overridden (that is what it is for); python tags stay refused (safe_load's tags)."""
    from fideval.config import read_yaml

    data = read_yaml(write(tmp_path, "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n"))
    assert data == yaml.safe_load("base: {x: 1, y: 2}\nc: {x: 3, y: 2}\n")
    p = write(tmp_path, "!!python/object/apply:os.system ['true']\n")
    assert validate_error(p) == f"fideval: error: {p}: line 1 is not valid YAML (fix the syntax)"


def test_snakemake_config_path_refuses_a_key_given_twice(tmp_path, monkeypatch):
    """The workflow's reader (fideval/run_config.py, several --configfile files merged) reads through the same loader."""
    from fideval.run_config import resolve

    monkeypatch.chdir(tmp_path)
    a = write(tmp_path, yaml.safe_dump(good_config()), "a.yaml")
    b = write(tmp_path, "report:\n  seed: 1\n  seed: 2\n", "b.yaml")
    with pytest.raises(FidevalError) as e:
        resolve([str(a), str(b)], {}, [])
    assert e.value.line() == f"b.yaml: line 3: key 'report.seed' is given twice (first on line 2) {DUP_HINT}"
    assert not (tmp_path / "results").exists()


# -- 1. nesting depth: JSON read from outside ----------------------------------------------------------------------------
def test_nesting_loads_bounds_json_and_turns_recursion_into_the_same_refusal():
    from fideval.formats import nesting

    assert nesting.depth(json.loads(deep_json(MAX_DEPTH))) == MAX_DEPTH
    assert nesting.loads(deep_json(MAX_DEPTH)) == json.loads(deep_json(MAX_DEPTH))
    for levels in (MAX_DEPTH + 1, 100_000):  # 100,000: json itself raises RecursionError
        with pytest.raises(json.JSONDecodeError) as e:  # a reader's existing JSON handler catches it
            nesting.loads(deep_json(levels))
        assert isinstance(e.value, nesting.TooDeep) and str(e.value) == f"nested deeper than {MAX_DEPTH} levels"


def test_typed_file_models_refuse_a_deep_document():
    from fideval.formats.model import Model, key, parse

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Doc(Model):
        meta: Any = key("anything")

    assert parse(Doc, {"meta": json.loads(deep_json(MAX_DEPTH - 1))}, "d.json").meta is not None
    with pytest.raises(FidevalError) as e:
        parse(Doc, {"meta": json.loads(deep_json(MAX_DEPTH))}, "d.json")
    assert e.value.line() == f"d.json is nested deeper than {MAX_DEPTH} levels (regenerate the file with this fideval)"


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 100_000])
def test_model_config_json_nested_deep_is_refused_by_validate(tmp_path, levels):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(deep_json(levels))
    p = write(tmp_path, yaml.safe_dump(good_config(model={"path": str(model), "id": "t", "tokenizer": str(DEMO_MODEL)})))
    assert validate_error(p) == (f"fideval: error: {p}: 'model.path': {model / 'config.json'} is nested deeper than "
                                 f"{MAX_DEPTH} levels (fix or re-download config.json)")


def test_safetensors_header_nested_deep_is_one_line(tmp_path):
    d = write_checkpoint(tmp_path / "ckpt")
    safetensors_with_header(d / "model.safetensors", deep_json(100_000).encode())
    r = run_fideval("quant", "inspect", "--model", d, "--quant", "attention=mxfp4")
    assert r.error() == (f"fideval: error: {d / 'model.safetensors'}: not a readable safetensors file (header is nested "
                         f"deeper than {MAX_DEPTH} levels) (the file is truncated or not safetensors; re-download the checkpoint)")


def test_store_shard_header_nested_deep_is_listed_by_verify(tmp_path):
    root = make_store(tmp_path / "store")
    sh = root / "shards" / "code-001.safetensors"
    raw, deep = sh.read_bytes(), deep_json(100_000).encode()
    n, deep = int.from_bytes(raw[:8], "little"), deep + b" " * (-(8 + len(deep)) % 8)
    sh.write_bytes(len(deep).to_bytes(8, "little") + deep + raw[8 + n:])
    r = run_fideval("verify", root)
    assert r.code == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{root}: shard shards/code-001.safetensors: header is nested deeper than {MAX_DEPTH} levels" in r.stderr.splitlines()


# -- 1. nesting depth: GGUF metadata arrays ------------------------------------------------------------------------------
def nested_gguf(path: Path, levels: int) -> Path:
    """A GGUF v3 file with no tensors and one metadata key: an array of arrays ... ``levels`` deep, of one uint32."""
    b = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 6) + b"x.deep" + struct.pack("<I", 9)
    b += struct.pack("<IQ", 9, 1) * (levels - 1) + struct.pack("<IQI", 4, 1, 7)
    path.write_bytes(b + b"\0" * (-len(b) % 32))
    return path


def test_gguf_metadata_arrays_nested_deep_are_one_line(tmp_path):
    from gguf import GGUFReader

    from fideval.quant.gguf_file import check_gguf_header

    ok = nested_gguf(tmp_path / "ok.gguf", MAX_DEPTH)
    check_gguf_header(ok)
    assert int(GGUFReader(str(ok)).fields["x.deep"].parts[-1][0]) == 7  # the positive control reads
    for levels in (MAX_DEPTH + 1, 3000):  # 3000: gguf-py's reader itself fails with RecursionError
        p = nested_gguf(tmp_path / f"m{levels}.gguf", levels)
        r = run_fideval("quant", "inspect", "--model", p)
        assert r.error() == (f"fideval: error: {p}: metadata key 'x.deep' nests arrays deeper than {MAX_DEPTH} levels "
                             "(no llama.cpp file does; the file is damaged or not from llama.cpp: re-download it)")


# -- 3. config value ranges, refused where the config is parsed ---------------------------------------------------------
@pytest.mark.parametrize("key, value, shown, message", [
    ("windows.seed", -1, "windows.seed", "Input should be greater than or equal to 0"),
    ("report.seed", -1, "report.seed", "Input should be greater than or equal to 0"),
    ("report.quantiles", [0.5, 1.0], "report.quantiles.1", "Input should be less than 1"),
    ("report.quantiles", [0, 0.5], "report.quantiles.0", "Input should be greater than 0"),
    ("report.quantiles", [".nan"], "report.quantiles.0", "Input should be a finite number"),
    ("score.cpu_check_tolerance", ".nan", "score.cpu_check_tolerance", "Input should be a finite number"),
    ("score.cpu_check_tolerance", ".inf", "score.cpu_check_tolerance", "Input should be a finite number"),
    ("report.gates.mean_kld_max", ".inf", "report.gates.mean_kld_max", "Input should be a finite number"),
    ("report.confidence", ".nan", "report.confidence", "Input should be a finite number"),
    ("domains.0.name", "d" * 65, "domains.0.name", "String should have at most 64 characters"),
    ("candidates.0.name", "c" * 65, "candidates.0.name", "String should have at most 64 characters"),
    ("run", "r" * 65, "run", "String should have at most 64 characters"),
])
def test_config_values_out_of_range_are_refused_naming_the_key(tmp_path, key, value, shown, message):
    data = good_config(candidates=[{"name": "c", "quant": {"attention": {"format": "mxfp4"}}}])
    parts, where = key.split("."), data
    for part in parts[:-1]:
        where = where[int(part)] if part.isdigit() else where.setdefault(part, {})
    where[parts[-1]] = value
    p = write(tmp_path, yaml.safe_dump(data).replace("'.nan'", ".nan").replace("'.inf'", ".inf"))  # YAML's NaN, infinity
    assert validate_error(p) == f"fideval: error: {p}: '{shown}': {message} (see docs/config.md)"


def test_config_bounds_pass_at_their_edges(tmp_path):
    from fideval.config import parse_config

    cfg = parse_config(good_config(windows={"seed": 0}, report={"seed": 0, "quantiles": [1e-9, 0.5, 1 - 1e-9]},
                                   score={"cpu_check_tolerance": 1e-300}, run="r" * 64))
    assert cfg.report.quantiles == [1e-9, 0.5, 1 - 1e-9] and cfg.windows.seed == 0 and len(cfg.run) == 64


# -- the reliability table names every case above ------------------------------------------------------------------------
ROWS = ["config: nested 100,000 deep (YAML)", "config: a key given twice", "config: recursive YAML alias",
        "config: negative seed", "config: quantile outside (0, 1)", "config: NaN or infinite tolerance",
        "config: name longer than 64 characters", "model config.json nested 100,000 deep",
        "checkpoint: safetensors header nested 100,000 deep", "store: shard header nested 100,000 deep",
        "gguf: metadata arrays nested 3,000 deep"]


def test_reliability_table_lists_these_cases():
    doc = (REPO / "docs" / "reliability.md").read_text()
    assert [r for r in ROWS if f"| {r} |" not in doc] == []
