"""The Snakemake workflow: every shipped config and profile dry-runs, lint and snakefmt are clean."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
PROFILES = sorted(p.name for p in (ROOT / "workflow" / "profiles").iterdir() if p.is_dir())


def snakemake(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("profile", PROFILES)
def test_dry_run(config, profile, tmp_path):
    r = snakemake("-n", "--forceall", "--configfile", f"configs/{config}", "--workflow-profile", f"workflow/profiles/{profile}",
                  "--directory", str(ROOT), "--quiet", "rules")
    assert r.returncode == 0, r.stderr[-2000:]
    for rule in ("windows", "teacher_windows", "score", "report", "card", "check"):
        assert rule in r.stdout + r.stderr


def test_lint_clean():
    r = snakemake("--lint", "--cores", "1")
    assert r.returncode == 0 and "good condition" in r.stdout + r.stderr, r.stdout[-3000:]


def test_snakefmt_clean():
    r = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_snakefile_holds_no_logic():
    lines = [ln for ln in (ROOT / "Snakefile").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    allowed = ("from snakemake.utils import min_version", "min_version(", "configfile:", "include:", "rule all:",
               "input:", "final_outputs(),", "default_target: True")
    assert all(ln.strip().startswith(allowed) for ln in lines), lines


def test_every_rule_has_log_benchmark_and_calls_one_verb():
    text = "\n".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    rules = [chunk for chunk in text.split("\nrule")[1:]]
    assert len(rules) >= 6
    for chunk in rules:
        assert "log:" in chunk and "benchmark:" in chunk and "shell:" in chunk, chunk[:200]
        assert "run:" not in chunk and "script:" not in chunk
        shell = chunk.split("shell:", 1)[1]
        assert "fideval" in shell or "{params.launcher}" in shell


def test_rules_pass_the_files_they_declare():
    """The teacher rule hands the verb its declared token file and the report rule its declared records and
    eval-windows.json, so no verb globs a folder for what the rule meant (the demo config's dry run)."""
    r = snakemake("-n", "-p", "--forceall", "--directory", str(ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    shells = [ln.removeprefix("Shell command: ") for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("Shell command: ")]
    teacher = [s for s in shells if s.startswith("fideval teacher") and "/teacher-noise/" not in s]
    assert len(teacher) == 2  # one job a length runs every domain, each into its own store
    domains = " ".join(f"--domain {d}" for d in ("code", "legal", "prose", "math", "multilingual", "chat"))
    assert all(domains in s and " --out results/demo/teacher/" in s and s.split(" --out ")[1].split()[0].endswith("/{domain}")
               for s in teacher)
    assert all("--windows results/demo/windows/windows-2048/tokens.safetensors" in s for s in teacher if "/teacher/windows/" in s)
    assert all("--windows results/demo/windows/cuts-512/tokens.safetensors" in s for s in teacher if "/teacher/cuts/" in s)
    (report,) = [s.split() for s in shells if s.startswith("fideval report")]
    given = {opt: [report[i + 1] for i, a in enumerate(report) if a == opt] for opt in ("--windows", "--records", "--self-check")}
    assert given["--windows"] == ["results/demo/windows/eval-windows.json"]
    # mxfp4 on serving and weights-only, each also with the teacher's routes forced; mxfp6 and mxfp8 on weights-only
    assert len(given["--records"]) == (4 + 1 + 1) * 2 * 6 and len(given["--self-check"]) == 2 * 6
    assert sum("+teacher-routes/" in r for r in given["--records"]) == 2 * 2 * 6
    forced = [s for s in shells if s.startswith("fideval score") and "--path serving+teacher-routes" in s]
    assert len(forced) == 2  # a length each; the verb reads the path's suffix as --teacher-routes
    (compare,) = [s for s in shells if s.startswith("fideval compare")]
    assert compare.startswith("fideval compare reports/demo/report.json --path weights-only --length 2048")
    (card,) = [s for s in shells if s.startswith("fideval card")]
    assert "--comparison reports/demo/family/comparison.json" in card
    assert all(f.endswith("/records.parquet") for f in given["--records"] + given["--self-check"])


# issue 45: one job per (rule, length[, candidate, path]) runs every domain (it was 78, one a domain): 18 for the one
# build on two paths; with its two route-controlled paths (issue 42), two more builds on one path and the comparison
# of the three (issue 43): 18 + 2 x 4 score jobs + 1 = 27
DEMO_JOBS = 27


def test_the_demo_is_a_few_jobs_of_the_right_size():
    """The demo's dry run plans at most DEMO_JOBS jobs: windows, selftest, report, compare, card, check, `all`, and per
    length one teacher, one noise-floor teacher, one self-check, one noise-floor score and one score per candidate
    path (a route-controlled path included)."""
    r = snakemake("-n", "--forceall", "--directory", str(ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    (total,) = {int(ln.split()[1]) for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("total ")}  # the job stats
    assert total <= DEMO_JOBS, (r.stdout + r.stderr)[-3000:]


def test_the_noise_floor_rules_run_only_when_the_config_asks(tmp_path):
    """report.noise_floor: the teacher again with another micro-batch into teacher-noise/, scored against the
    reference as 'noise-floor', each records file handed to the report as --noise-floor; without it, none."""
    demo = (ROOT / "configs" / "demo.yaml").read_text()
    assert "  noise_floor: {micro_batch: 2}\n" in demo  # the demo runs it (its report and card show the floor)
    cfg = tmp_path / "plain.yaml"
    cfg.write_text(demo.replace("  noise_floor: {micro_batch: 2}\n", ""))
    r = snakemake("-n", "-p", "--forceall", "--directory", str(ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    shells = [ln.removeprefix("Shell command: ") for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("Shell command: ")]
    noise = [s for s in shells if "/teacher-noise/" in s and s.startswith("fideval teacher")]
    assert len(noise) == 2 and all("--micro-batch 2" in s for s in noise)  # one job a length, every domain
    scored = [s for s in shells if s.startswith("fideval score") and "--name noise-floor" in s]
    assert len(scored) == 2 and all("--candidate results/demo/teacher-noise/" in s for s in scored)
    (report,) = [s.split() for s in shells if s.startswith("fideval report")]
    floor = [report[i + 1] for i, a in enumerate(report) if a == "--noise-floor"]
    assert len(floor) == 2 * 6 and all(f.startswith("results/demo/records/noise-floor/store/") for f in floor)
    plain = snakemake("-n", "-p", "--forceall", "--directory", str(ROOT), "--configfile", str(cfg))
    assert "teacher-noise" not in plain.stdout + plain.stderr and "--noise-floor" not in plain.stdout + plain.stderr


BAD_CONFIG = """run: bad
model: {path: demo://model, id: fideval/demo-deepseek-v3-tiny}
domains:
  - name: code
    source: {type: local, path: demo://corpus/code.jsonl, text_field: text}
windows: {window_tokens: 256, cut_tokens: 128, windows_per_domain: 2}
teacher: {device: cpu}
candidates:
  - name: mxfp4-experts
    quant: {routed_experts: {format: mxfp5}}
"""


def test_a_bad_config_stops_the_run_before_any_job(tmp_path):
    """onstart runs `fideval validate` once the DAG is built and before the first job: a config the candidate
    stage would refuse stops the run in seconds with validate's one line, and nothing is run or written.
    A dry run stays a dry run (snakemake skips onstart there), so `snakemake -n` costs no validation."""
    from fideval.errors import FidevalError
    from fideval.quant.base import get_format

    try:
        get_format("mxfp5")
    except FidevalError as e:
        # the config named relative to the working directory (--directory), where the stages run
        expected = f"fideval: error: bad.yaml: 'candidates.mxfp4-experts.quant.routed_experts.format': {e.line()}"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(BAD_CONFIG)
    run = ("--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(cfg), "--cores", "1")
    t0 = time.monotonic()
    r = snakemake(*run)
    took = time.monotonic() - t0
    out = (r.stdout + r.stderr).splitlines()
    assert r.returncode != 0, out[-20:]
    assert [ln for ln in out if ln.startswith("fideval: error:")] == [expected], out[-20:]
    assert took < 60, f"{took:.0f} s"
    assert not any((tmp_path / d).exists() for d in ("results", "logs", "benchmarks", "reports"))
    assert not any((tmp_path / ".snakemake" / "metadata").iterdir())  # no job started
    dry = snakemake("-n", *run)
    assert dry.returncode == 0 and "fideval: error:" not in dry.stdout + dry.stderr, dry.stderr[-2000:]


def _shells(r: subprocess.CompletedProcess) -> list[str]:
    return [ln.removeprefix("Shell command: ") for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("Shell command: ")]


def test_configfile_is_the_config_the_stages_read(tmp_path):
    """--configfile X runs X (Snakemake lists the Snakefile's own configfile last; it must not win)."""
    r = snakemake("-n", "-p", "--forceall", "--configfile", "configs/deepseek-v3-mxfp4.yaml", "--directory", str(ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    (check,) = [s for s in _shells(r) if s.startswith("fideval check")]
    assert check.startswith("fideval check reports/deepseek-v3-mxfp4/report.json --config configs/deepseek-v3-mxfp4.yaml ")


def test_config_overrides_are_honoured(tmp_path):
    """`--config run=mytest` is the config the stages read: merged into results/mytest/config.yaml, which every
    rule passes; an unchanged rerun leaves that file alone (so nothing reruns)."""
    import yaml

    run = ("-n", "-p", "--forceall", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(ROOT / "configs/demo.yaml"), "--config", "run=mytest")
    r = snakemake(*run)
    assert r.returncode == 0, r.stderr[-2000:]
    shells = _shells(r)
    (check,) = [s for s in shells if s.startswith("fideval check")]
    assert check.startswith("fideval check reports/mytest/report.json --config results/mytest/config.yaml ")
    assert all("results/demo" not in s and "reports/demo" not in s for s in shells)
    written = tmp_path / "results/mytest/config.yaml"
    want = yaml.safe_load((ROOT / "configs/demo.yaml").read_text()) | {"run": "mytest"}
    assert yaml.safe_load(written.read_text()) == want
    stamp = written.stat().st_mtime_ns
    assert snakemake(*run).returncode == 0 and written.stat().st_mtime_ns == stamp


@pytest.mark.parametrize(("args", "line"), [
    (("--config", "runn=x"), "configs/demo.yaml with --config runn=x: unknown key 'runn'"),
    (("--config", "windows={cut_tokens: 500}"), "configs/demo.yaml with --config windows={cut_tokens: 500}: 'windows'"),
    (("--configfile", "TYPO"), "TYPO.yaml: unknown key 'teacher.devcie'"),
])
def test_config_problems_are_one_short_line(args, line, tmp_path):
    """A typo in a config file or an override is one line naming it (it used to be 1,122 lines of schema)."""
    typo = tmp_path / "TYPO.yaml"
    typo.write_text((ROOT / "configs/demo.yaml").read_text().replace("teacher:\n", "teacher:\n  devcie: cpu\n", 1))
    args = tuple(str(typo) if a == "TYPO" else a for a in args)
    if "--configfile" not in args:
        args = ("--configfile", str(ROOT / "configs/demo.yaml"), *args)
    r = snakemake("-n", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), *args)
    out = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode != 0 and len(out) <= 2, out[-20:]
    assert out[-1].startswith("fideval: error: ") and line in out[-1] and "'fideval schema'" in out[-1], out
    assert not (tmp_path / "results").exists()
