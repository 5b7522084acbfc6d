"""score.json's and manifest.json's models: hand-written files read field by field and back, bad input."""

from __future__ import annotations

import copy
import json

import pytest

from fideval.errors import FidevalError
from fideval.formats.model import dump, parse
from fideval.formats.score import ScoreSummary
from fideval.store.manifest import read_manifest

SCORE = {"format": "fideval.score", "version": 1, "candidate": "q4", "path": "store", "length": 64, "rows": 126,
         "teacher": {"store": "t", "model_id": "org/m", "model_revision": "abc", "manifest_sha256": None, "kind": "logits",
                     "lossy": "llama.cpp uint16 log-probs", "settings_sha256": "4" * 64, "shards": {"code-000": "0" * 64},
                     "head_sha256": None},
         "cpu_check": {"rows_checked": 4, "max_rel_diff": 1e-14, "tolerance": 2e-12, "every": 1000, "worst": None},
         "self_check": None, "nonfinite_rows": 0, "on_nonfinite": "fail", "device": "cpu", "kernel": "torch",
         "figures": ["kld"], "records": "records.parquet", "candidate_info": None, "tool": {"name": "fideval"},
         "lossy_rule": "llama.cpp uint16 log-prob encoding applied to the candidate",
         "profile": {"wall_s": 2.0, "parts": {"read_back": 0.5, "scoring": 1.25, "other": 0.25}, "other_fraction": 0.125,
                     "device": "cpu", "tokens": None, "tokens_per_s": None, "model_flops": None, "peak_tflops": None,
                     "flop_utilisation": None, "hidden": None},
         "records_sha256": "2" * 64, "sequences": {"code-000": "3" * 64}, "candidate_sha256": None}
ENTRY = {"file": "shards/code-000.safetensors", "sha256": "0" * 64, "bytes": 100, "rows": 8, "tokens": 8,
         "row_start": 0, "window_id": "code-000", "domain": "code"}
MANIFEST = {"format": "fideval.store", "version": "1",
            "meta": {"model_id": "org/m", "model_revision": "abc", "tokenizer_sha256": "1" * 64, "vocab_size": "16",
                     "kind": "logits"},
            "shards": {"code-000": ENTRY}}


def test_score_json_reads_field_by_field_and_back():
    s = parse(ScoreSummary, copy.deepcopy(SCORE), "score.json")
    assert (s.candidate, s.length, s.teacher.model_id, s.cpu_check.every, s.self_check) == ("q4", 64, "org/m", 1000, None)
    assert dump(s) == SCORE
    thin = parse(ScoreSummary, {"format": "fideval.score", "version": 1, "candidate": "a", "path": "p", "length": None},
                 "score.json")
    assert thin.rows is None and thin.cpu_check is None and thin.lossy_rule is None  # a score.json from before lossy_rule


def test_the_manifest_reads_field_by_field_and_back(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    m = read_manifest(tmp_path)
    assert m.meta["vocab_size"] == "16" and m.shards["code-000"].rows == 8 and m.shards["code-000"].domain == "code"
    assert dump(m) == MANIFEST


def _edit(obj, edit):
    obj = copy.deepcopy(obj)
    edit(obj)
    return obj


@pytest.mark.parametrize("edit, want", [
    (lambda o: o.pop("candidate"), "missing key 'candidate'"),
    (lambda o: o["cpu_check"].pop("tolerance"), "missing key 'cpu_check.tolerance'"),
    (lambda o: o.update(rows="126"), "'rows' is '126', expected integer"),
    (lambda o: o["profile"]["parts"].update(scoring="1 s"), "profile.parts: 'scoring' is '1 s', expected number"),
    (lambda o: o.update(length=0), "length 0 is not a positive integer"),
    (lambda o: o.update(version=2), "has score format version 2 (a newer fideval); this fideval reads version 1"),
    (lambda o: o.update(format="fideval.report"), "is not a fideval.score file (format 'fideval.report')"),
])
def test_bad_score_json_is_one_line_naming_the_key(edit, want):
    with pytest.raises(FidevalError) as e:
        parse(ScoreSummary, _edit(SCORE, edit), "d/score.json")
    line = e.value.line()
    assert "\n" not in line and line.startswith("d/score.json") and want in line, line


@pytest.mark.parametrize("edit, want", [
    (lambda o: o.pop("meta"), "missing key 'meta'"),
    (lambda o: o["shards"]["code-000"].pop("rows"), "missing key 'shards.code-000.rows'"),
    (lambda o: o["shards"]["code-000"].update(bytes=1.5), "shards.code-000: 'bytes' is 1.5, expected integer"),
    (lambda o: o["shards"]["code-000"].update(sha256="X"), "shards.code-000: 'sha256' is not 64 lower-case hex digits"),
    (lambda o: o.update(version="3"), "has store version '3' (a newer fideval); this fideval reads version 1, 2"),
    (lambda o: o.update(format="fideval.logits"), "is not a fideval.store file (format 'fideval.logits')"),
])
def test_bad_manifests_are_one_line_naming_the_file_and_key(tmp_path, edit, want):
    (tmp_path / "manifest.json").write_text(json.dumps(_edit(MANIFEST, edit)))
    with pytest.raises(FidevalError) as e:
        read_manifest(tmp_path)
    line = e.value.line()
    assert "\n" not in line and line.startswith(str(tmp_path / "manifest.json")) and want in line, line
