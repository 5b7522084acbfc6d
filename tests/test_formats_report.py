"""report.json's model: a hand-written report read field by field, the demo report byte for byte, bad input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fideval.errors import FidevalError
from fideval.formats.model import dump, parse
from fideval.formats.report import Report
from fideval.report.schema import load_report

ROOT = Path(__file__).resolve().parent.parent
MEAN = {"estimate": 0.02, "ci": [0.01, 0.03], "method": "cluster-bca", "confidence": 0.95, "resamples": 10,
        "seed": 1, "clusters": 2, "rows": 6, "se": 0.004, "z0": 0.1, "acceleration": 0.0, "flags": []}
PART = {"records": "r/q4", "records_sha256": "a" * 64, "score_sha256": "b" * 64}
HAND = {
    "format": "fideval.report", "version": 1,
    "settings": {"resamples": 10, "seed": 1, "confidence": 0.95, "quantiles": [0.5], "quantile_method": "linear",
                 "clusters": 2, "domains": ["code"], "cluster": "window_id", "resampling": "r",
                 "methods": {"cluster-bca": "BCa"}, "mean": "m", "card_template": None},
    "provenance": {
        "reference": {"model_id": "org/m", "model_revision": "abc"}, "base_model": "org/m",
        "dataset": {"name": "fideval-windows", "windows_file_sha256": None, "sources": None,
                    "windows": [{"id": "code-000", "domain": "code", "token_sha256": None}],
                    "windows_without_rows": []},
        "tool": {"name": "fideval", "version": "0.1.0", "git_commit": None, "python": "3.11"},
        "config_hash": None, "teacher_stores": [], "teacher_manifests": [], "candidates": {},
        "inputs": [{"candidate": "q4", "path": "store", "length": 64, **PART}], "self_check_inputs": []},
    "results": [{"candidate": "q4", "path": "store", "length": 64, "rows": 6, "clusters": 2, "sequences": 2,
                 "inputs": [PART], "overall": {"mean_kld": MEAN}, "domains": {"code": {"rows": 6}},
                 "positions": [{"start": 0, "end": 16, "rows": 6, "mean_kld": MEAN}], "confidence_buckets": []}],
    "comparisons": {"builds": [], "paths": [], "lengths": []},
    "checks": [{"name": "cpu_check", "status": "pass", "detail": "ok", "max_rel_diff": 0.0}],
    "gates": {"mean_kld_max": None, "top1_min": 0.9},
    "plots": [{"file": "kld-cdf-q4-store-64.png", "kind": "kld-cdf", "candidate": "q4", "path": "store", "length": 64}],
}


def test_a_hand_written_report_reads_field_by_field_and_back():
    r = parse(Report, copy.deepcopy(HAND), "report.json")
    assert (r.settings.resamples, r.settings.domains, r.settings.card_template) == (10, ["code"], None)
    assert r.provenance.dataset.windows[0].id == "code-000" and r.provenance.inputs[0].length == 64
    res = r.results[0]
    assert (res.candidate, res.path, res.length, res.rows, res.sequences) == ("q4", "store", 64, 6, 2)
    assert res.inputs[0].score_sha256 == "b" * 64 and res.overall["mean_kld"]["ci"] == [0.01, 0.03]
    assert r.gates.top1_min == 0.9 and r.plots[0].kind == "kld-cdf" and r.checks[0]["max_rel_diff"] == 0.0
    assert dump(r) == HAND


def test_the_demo_report_round_trips_byte_for_byte():
    raw = (ROOT / "reports" / "demo" / "report.json").read_text(encoding="utf-8")
    again = json.dumps(dump(parse(Report, json.loads(raw), "report.json")), indent=2, sort_keys=True,
                       ensure_ascii=False, allow_nan=False) + "\n"  # as fideval.fsio.write_json writes
    assert again == raw


def test_a_version_2_report_round_trips_and_a_version_1_report_keeps_its_own_keys():
    v2 = copy.deepcopy(HAND) | {"version": 2, "noise_floor": [{"path": "store", "length": 64, "mean_kld": MEAN}]}
    v2["settings"] |= {"strata": "domain", "intervals": {"default": {"mean": "cluster-bootstrap-t-log"}}}
    v2["results"][0]["views"] = {"micro_macro": {}}
    r = parse(Report, copy.deepcopy(v2), "report.json")
    assert r.version == 2 and r.settings.strata == "domain" and r.noise_floor[0]["length"] == 64
    assert dump(r) == v2
    # read as version 1 (no version 2 keys): dumped again without them, not with nulls
    r1 = parse(Report, copy.deepcopy(HAND), "report.json")
    assert r1.noise_floor is None and r1.results[0].views is None
    assert dump(r1) == HAND and "noise_floor" not in dump(r1)


def test_an_older_report_without_the_later_keys_is_read():
    old = copy.deepcopy(HAND)
    for k in ("cluster", "resampling", "methods", "mean", "card_template"):
        del old["settings"][k]
    del old["results"][0]["sequences"], old["results"][0]["inputs"], old["provenance"]["inputs"]
    r = parse(Report, old, "report.json")
    assert r.settings.methods is None and r.results[0].inputs is None and r.provenance.inputs is None


def _break(edit):
    obj = copy.deepcopy(HAND)
    edit(obj)
    return obj


@pytest.mark.parametrize("edit, want", [
    (lambda o: o.pop("gates"), "missing key 'gates'"),
    (lambda o: o["settings"].pop("seed"), "missing key 'settings.seed'"),
    (lambda o: o["results"][0].pop("overall"), "missing key 'results[0].overall'"),
    (lambda o: o["results"][0].update(length="64"), "results[0]: 'length' is '64', expected integer"),
    (lambda o: o["settings"].update(quantiles=[0.5, "x"]), "'settings.quantiles[1]' is 'x', expected number"),
    (lambda o: o["plots"][0].pop("kind"), "missing key 'plots[0].kind'"),
    (lambda o: o["provenance"]["dataset"].update(windows={}), "provenance.dataset: 'windows' is {}, expected list"),
    (lambda o: o.update(version=5), "has report format version 5 (a newer fideval); this fideval reads version 1, 2, 3, 4"),
    (lambda o: o.update(version=0), "has report format version 0 (an older fideval)"),
    (lambda o: o.update(format="fideval.score"), "is not a fideval.report file (format 'fideval.score')"),
])
def test_bad_reports_are_one_line_naming_the_file_and_key(tmp_path, edit, want):
    p = tmp_path / "report.json"
    p.write_text(json.dumps(_break(edit)))
    with pytest.raises(FidevalError) as e:
        load_report(tmp_path)
    line = e.value.line()
    assert "\n" not in line and line.startswith(str(p)) and want in line, line
