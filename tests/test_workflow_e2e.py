"""End-to-end runs of the Snakemake workflow on a tiny config (issue 7): a second run has nothing to do;
deleting one teacher shard reruns only its length's jobs (one job a length runs every domain: issue 45); a run
killed with SIGKILL in several stages and started again ends with a report.json equal in every figure to an uninterrupted run.

Every run happens in a tmp_path working directory (`snakemake --snakefile <repo>/Snakefile --directory
<tmp>`): the includes resolve relative to the Snakefile, the stages read the tiny config given by
--configfile, and nothing is written into the repository. The oracle for "equal in every figure" is the
uninterrupted run itself: the pipeline is deterministic on the CPU (seeded windows and bootstrap, the same
float32 teacher path, float64 scoring), so its figures must match bit for bit, not within a tolerance.
Only the software's provenance (tool block, git commit) is left out of the comparison.

A SIGKILLed snakemake leaves its .snakemake/locks behind; the restarts run `--unlock` first, then
`--rerun-incomplete` (what workflow/profiles/ci sets). Set FIDEVAL_E2E_SEED to replay the kill points.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# one worker runs the whole module under pytest -n (--dist loadgroup): its module fixture is one workflow run
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("workflow_e2e")]

ROOT = Path(__file__).resolve().parent.parent
RUN = "e2e"
DOMAINS = ("code", "math")

# Provenance of the software, not figures: the tool block (version, git commit: the repository may gain a
# commit between two runs of this module) and the SHA-256 of score.json, which embeds that tool block. And the
# run's own timing profile (wall seconds, tokens/s, time per part): a measurement of the machine while the
# stage ran, recorded so that every real run reports its utilisation, which no two runs share; with it the
# SHA-256 of each teacher manifest file, which covers that profile (the shards' own hashes are compared).
VOLATILE = {"tool", "git_commit", "score_sha256", "profile", "manifest_sha256"}


def tiny_config(path: Path) -> Path:
    """A config one full run of which is 13 small jobs (the selftest among them): 2 demo domains x 2 windows of 256 tokens cut into
    2 x 128, both lengths, one weights-only MXFP4 candidate, no calibration screen, B = 200."""
    source = "{{type: local, path: demo://corpus/{}.jsonl, text_field: text}}"
    domains = "\n".join(f"  - name: {d}\n    source: {source.format(d)}" for d in DOMAINS)
    path.write_text(
        f"run: {RUN}\n"
        "model: {path: demo://model, id: fideval/demo-deepseek-v3-tiny}\n"
        f"domains:\n{domains}\n"
        "windows: {window_tokens: 256, cut_tokens: 128, windows_per_domain: 2, seed: 0}\n"
        "screen: {calibration: []}\n"
        "teacher: {device: cpu, lengths: [windows, cuts]}\n"
        "candidates:\n"
        "  - name: mxfp4\n"
        "    quant: {routed_experts: {format: mxfp4, recipe: rceil}}\n"
        "    paths: [weights-only]\n"
        "report: {resamples: 200, seed: 0, gates: {mean_kld_max: 1.0}}\n"
    )
    return path


def smk_args(workdir: Path, cfg: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
            "--directory", str(workdir), "--configfile", str(cfg), "--cores", "2", *args]


def smk(workdir: Path, cfg: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(smk_args(workdir, cfg, *args), capture_output=True, text=True, timeout=timeout)


def figures(obj):
    """report.json without the VOLATILE provenance keys (and the teacher manifests' file hashes, which cover
    their timing profiles).

    A candidate's `runs` lists the distinct software that scored its records: a store rescored after a
    commit landed adds a run that differs only in its tool block, so runs are compared as a set.
    """
    if isinstance(obj, dict):
        out = {k: figures(v) for k, v in obj.items() if k not in VOLATILE}
        if isinstance(out.get("teacher_manifests"), list):
            # a manifest file's own SHA-256 covers its meta.profile; the rest of its meta is compared
            out["teacher_manifests"] = [{k: v for k, v in m.items() if k != "sha256"} for m in out["teacher_manifests"]]
        if isinstance(out.get("runs"), list):
            out["runs"] = sorted({json.dumps(r, sort_keys=True) for r in out["runs"]})
        return out
    if isinstance(obj, list):
        return [figures(v) for v in obj]
    return obj


def report(workdir: Path) -> dict:
    return json.loads((workdir / f"reports/{RUN}/report.json").read_text())


def first_difference(a, b, where="") -> str | None:
    if type(a) is not type(b):
        return f"{where}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}/{k}: present in one report only"
            d = first_difference(a[k], b[k], f"{where}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (u, v) in enumerate(zip(a, b)):
            d = first_difference(u, v, f"{where}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{where}: {a!r} vs {b!r}"


def assert_same_figures(work: Path, baseline: Path, cfg: Path, scratch: Path) -> None:
    """report.json of `work` equals the uninterrupted run's in every figure."""
    reference = baseline
    if report(work)["provenance"]["tool"] != report(baseline)["provenance"]["tool"]:
        # The checkout gained a commit since the uninterrupted run (a report may name new provenance
        # fields): rebuild its report with today's code, from its own untouched windows, stores and records.
        reference = scratch / "reference"
        shutil.copytree(baseline, reference, symlinks=True)
        r = smk(reference, cfg, "--forcerun", "report")
        assert r.returncode == 0, r.stderr[-3000:]
    d = first_difference(figures(report(reference)), figures(report(work)))
    assert d is None, f"report.json differs from the uninterrupted run at {d}"


JOB = re.compile(r"^(?:local)?rule (\w+):$")


def planned_jobs(dry_run_output: str) -> set[tuple[str, tuple]]:
    """(rule, sorted wildcard items) of every job a `snakemake -n` would run."""
    jobs, rule, wildcards = set(), None, ()
    for line in dry_run_output.splitlines() + [""]:
        m = JOB.match(line.strip()) if not line.startswith(" ") else None
        if m or not line.strip():
            if rule:
                jobs.add((rule, wildcards))
            rule, wildcards = (m.group(1), ()) if m else (None, ())
        elif rule and line.strip().startswith("wildcards:"):
            items = line.split(":", 1)[1].split(",")
            wildcards = tuple(sorted(tuple(i.strip().split("=", 1)) for i in items))
    return jobs


# -- the uninterrupted run, shared by the tests ------------------------------------------------------------
@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> Path:
    # One config path for every working directory: the config is an input of most rules, and Snakemake's
    # "input set changed" trigger would rerun everything in a copied directory if its path differed.
    return tiny_config(tmp_path_factory.mktemp("config") / "tiny.yaml")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, cfg) -> Path:
    work = tmp_path_factory.mktemp("baseline")
    t0 = time.monotonic()
    r = smk(work, cfg)
    assert r.returncode == 0, r.stderr[-4000:]
    print(f"uninterrupted run: {time.monotonic() - t0:.1f} s")
    for name in ("report.json", "README.md", "results.html", "check.txt"):
        assert (work / f"reports/{RUN}/{name}").is_file(), name
    return work


def test_second_run_has_nothing_to_do(baseline, cfg):
    r = smk(baseline, cfg, "-n")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "Nothing to be done" in out, out[-3000:]
    assert planned_jobs(out) == set(), planned_jobs(out)


def test_snakemake_report_has_the_results_page(baseline, cfg, tmp_path):
    """`snakemake --report` shows the card's numbers (the results page) beside the plots, not plots alone."""
    import zipfile

    out = tmp_path / "report.zip"
    r = smk(baseline, cfg, "--report", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        (page,) = [n for n in names if n.endswith("results.html")]
        text = z.read(page).decode()
    rep = json.loads((baseline / f"reports/{RUN}/report.json").read_text())
    def g(x):  # as the card prints a bound: an unbounded side (few windows, flagged) is a dash
        return "—" if x is None else f"{x:.4g}"

    for res in rep["results"]:
        m = res["overall"]["mean_kld"]
        cell = f"<td>{res['path']}</td>\n<td>{g(m['estimate'])} [{g(m['ci'][0])}, {g(m['ci'][1])}]"
        # an interval without a bound carries the superscript mark of the note that says why (the card's notes)
        assert re.search(re.escape(cell) + "[⁰¹²³⁴⁵⁶⁷⁸⁹]*</td>", text), cell
    assert "integrity checks passed" in text and "<h2>How it was measured</h2>" in text
    # three plots a result set, and one of token classes where the windows tagged them (fideval.report.class_plots)
    classes = sum(1 for n in names if n.endswith(".png") and "/token-classes-" in n)
    assert classes in (0, len(rep["results"]))
    assert len([n for n in names if n.endswith(".png")]) == 3 * len(rep["results"]) + classes


def test_deleted_shard_reruns_only_its_dependents(baseline, cfg, tmp_path):
    """A deleted cuts shard reruns the cuts teacher job (every domain's cuts store: one job a length) and what reads it;
    the windows stores are not touched, and the figures are the uninterrupted run's."""
    work = tmp_path / "work"
    shutil.copytree(baseline, work, symlinks=True)  # copy2 keeps the mtimes Snakemake compares
    shards = sorted((work / f"results/{RUN}/teacher").glob("*/*/shards/*.safetensors"))
    assert len(shards) == 2 * (2 + 4), shards  # per domain: 2 windows + 2 x 2 cuts
    victim = work / f"results/{RUN}/teacher/cuts/code/shards/code-000.c0.safetensors"
    others = {p: p.stat().st_mtime_ns for p in shards if "/cuts/" not in str(p)}
    victim.unlink()

    r = smk(work, cfg, "-n")
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = planned_jobs(r.stdout + r.stderr)
    store = (("kind", "cuts"), ("run", RUN))
    expected = {
        ("teacher_cuts", (("run", RUN),)),
        ("score", tuple(sorted(store + (("candidate", "mxfp4"), ("path", "weights-only"))))),
        ("selfcheck", store),
        ("report", (("run", RUN),)),
        ("card", (("run", RUN),)),
        ("check", (("run", RUN),)),
        ("all", ()),
    }
    assert jobs == expected, f"planned {sorted(jobs)}"

    r = smk(work, cfg)
    assert r.returncode == 0, r.stderr[-4000:]
    assert victim.is_file()
    kept = {p: p.stat().st_mtime_ns for p in others}
    assert kept == others, "a store that does not depend on the deleted shard was rewritten"
    assert_same_figures(work, baseline, cfg, tmp_path)


# -- SIGKILL in the middle of each stage --------------------------------------------------------------------
def _missing(work: Path, rel: str) -> bool:
    return not (work / rel).exists()


def _windows(work: Path):
    outs = ["eval-windows.json", "index.parquet", "windows-256/tokens.safetensors",
            "cuts-128/tokens.safetensors"]
    outs = [f"results/{RUN}/windows/{o}" for o in outs]
    if (work / f"logs/{RUN}/windows.log").exists() and any(_missing(work, o) for o in outs):
        return (0.0, 1.0), lambda: any(_missing(work, o) for o in outs)
    return None


def _teacher(work: Path):
    # A store with some shards written and no manifest yet: the job is past its first sequence.
    for shard in (work / f"results/{RUN}/teacher").glob("*/*/shards/*.safetensors"):
        manifest = shard.parent.parent / "manifest.json"
        if not manifest.exists():
            return (0.0, 0.0), lambda m=manifest: not m.exists()
    return None


def _score(work: Path):
    for log in (work / f"logs/{RUN}/score").glob("*/*/*.log"):  # one job per candidate, path and length
        cand, path = log.parts[-3:-1]
        records = [work / f"results/{RUN}/records/{cand}/{path}/{log.stem}/{d}/records.parquet" for d in DOMAINS]
        if not all(r.exists() for r in records):
            return (0.0, 2.0), lambda rs=records: not all(r.exists() for r in rs)
    return None


def _report(work: Path):
    rep = work / f"reports/{RUN}/report.json"
    if (work / f"logs/{RUN}/report.log").exists() and not rep.exists():
        return (0.0, 0.5), lambda: not rep.exists()
    return None


STAGES = {"windows": _windows, "teacher": _teacher, "score": _score, "report": _report}


def _processes_in(work: Path) -> list[int]:
    """Processes whose working directory is inside `work` (jobs that escaped the killed process group)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if Path(os.readlink(p / "cwd")).is_relative_to(work):
                    pids.append(int(p.name))
            except OSError:
                continue
    return pids


def kill_in_stage(work: Path, cfg: Path, stage: str, rng: random.Random) -> None:
    """Start the workflow, SIGKILL its whole process group at a random point inside `stage`, and check that
    the stage really was in progress (its outputs incomplete) and that no job outlived the kill."""
    log = open(work / f"snakemake-{stage}.out", "w")
    proc = subprocess.Popen(smk_args(work, cfg, "--rerun-incomplete"), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 400
    try:
        while True:
            assert proc.poll() is None, f"run ended ({proc.returncode}) before stage {stage} was seen"
            assert time.monotonic() < deadline, f"stage {stage} never started"
            hit = STAGES[stage](work)
            if hit:
                (lo, hi), interrupted = hit
                time.sleep(rng.uniform(lo, hi))
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert interrupted(), f"the kill landed after stage {stage} had finished"
    t0 = time.monotonic()
    while _processes_in(work) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert not _processes_in(work), f"jobs outlived the SIGKILL of snakemake's group: {_processes_in(work)}"


def test_sigkill_in_each_stage_then_rerun_gives_the_same_report(baseline, cfg, tmp_path):
    seed = int(os.environ.get("FIDEVAL_E2E_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    work = tmp_path / "killed"
    work.mkdir()
    locks = []
    for stage in STAGES:  # windows, teacher, score, report: each restart picks up what the last left
        kill_in_stage(work, cfg, stage, rng)
        locks.append(len(list((work / ".snakemake/locks").glob("*"))))
        r = smk(work, cfg, "--unlock")  # a SIGKILLed snakemake leaves .snakemake/locks behind
        assert r.returncode == 0, r.stderr[-2000:]
    r = smk(work, cfg, "--rerun-incomplete")
    assert r.returncode == 0, f"seed {seed}: " + r.stderr[-4000:]
    print(f"seed {seed}: killed in {', '.join(STAGES)}, then completed; locks left: {locks}")
    assert_same_figures(work, baseline, cfg, tmp_path)
    r = smk(work, cfg, "-n")
    assert "Nothing to be done" in r.stdout + r.stderr, f"seed {seed}: " + (r.stdout + r.stderr)[-3000:]
