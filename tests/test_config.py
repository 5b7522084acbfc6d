"""The typed config: one-line errors naming the key, and the schema Snakemake validates against."""

import json
from pathlib import Path

import pytest
import yaml
from cli_runner import run_fideval

from fideval.config import json_schema, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


def base() -> dict:
    return yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_demo_config_parses():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.run == "demo"
    assert [d.name for d in cfg.domains] == ["code", "legal", "prose", "math", "multilingual", "chat"]
    assert cfg.windows.window_tokens % cfg.windows.cut_tokens == 0


def test_committed_schema_is_generated_from_the_model():
    committed = json.loads((ROOT / "workflow" / "schemas" / "config.schema.json").read_text())
    assert committed == json.loads(json.dumps(json_schema())), "run: fideval schema --out workflow/schemas/config.schema.json"


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (lambda d: d["windows"].update(windw_tokens=5), "unknown key 'windows.windw_tokens'"),
        (lambda d: d.pop("model"), "missing key 'model'"),
        (lambda d: d["windows"].update(window_tokens=2048, cut_tokens=500), "cut_tokens (500) must divide window_tokens (2048)"),
        (lambda d: d["windows"].update(window_tokens=-1), "'windows.window_tokens'"),
        (lambda d: d["domains"].append(dict(d["domains"][0])), "domain names repeat"),
        (lambda d: d["candidates"][0].update(checkpoint="x.gguf"), "exactly one of quant"),
        (lambda d: d.update(strict=True), "model.revision must be a 40-hex commit"),
    ],
)
def test_bad_config_gives_one_line_naming_the_key(tmp_path, mutate, expected):
    data = base()
    mutate(data)
    message = run_fideval("validate", write(tmp_path, data)).error()  # exit 2 and exactly one line
    assert expected in message


def test_missing_file_is_named(tmp_path):
    data = base()
    data["domains"][0]["source"]["path"] = str(tmp_path / "nope.jsonl")
    line = run_fideval("validate", write(tmp_path, data)).error()
    assert "domains.code.source.path" in line and "does not exist" in line


def test_parse_rejects_non_mapping():
    with pytest.raises(Exception, match="must be a mapping"):
        parse_config(["a", "b"])


def test_docs_config_md_is_generated_from_the_model():
    from fideval.config import markdown_reference

    assert (ROOT / "docs" / "config.md").read_text() == markdown_reference(), "run: fideval schema --format markdown --out docs/config.md"
