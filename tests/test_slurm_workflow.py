"""The workflow through a real SLURM scheduler (issue 45): a one-node cluster (tests/slurm_cluster.py), the shipped
profile's shape (workflow/profiles/slurm), snakemake-executor-plugin-slurm.

One small config has every rule kind (windows, selftest, teacher, score, selfcheck, the noise floor's teacher and
score, report, card, check) and runs its model at ``teacher.model_parallel: 2``: every model job is torchrun over two
gloo ranks inside its SLURM allocation (the workflow's launcher line inside the plugin's srun step). It runs once
locally (``--cores 2``) and once through SLURM, where the first teacher job is cancelled with ``scancel`` once it has
written a shard and Snakemake (``restart-times: 1`` in the profile) resubmits it. The tests then read both runs:
the same bytes, every rule's resources as the scheduler recorded them, the cancelled job and its resubmission.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from slurm_cluster import cluster, slurm, test_profile  # noqa: F401  (slurm: the session fixture)
from test_workflow_e2e import VOLATILE, figures

# one worker runs the whole module under pytest -n (--dist loadgroup): its module fixture is one workflow run
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

ROOT = Path(__file__).resolve().parent.parent
RUN = "slurm"
DOMAINS = ("code", "math")
MP = 2


def mp_config(path: Path) -> Path:
    """2 demo domains x 2 windows of 256 tokens cut into 2 x 128, the cuts only, model parallel 2, the noise floor,
    one weights-only MXFP4 candidate, no calibration screen, B = 200: 10 jobs."""
    source = "{{type: local, path: demo://corpus/{}.jsonl, text_field: text}}"
    domains = "\n".join(f"  - name: {d}\n    source: {source.format(d)}" for d in DOMAINS)
    path.write_text(
        f"run: {RUN}\n"
        "model: {path: demo://model, id: fideval/demo-deepseek-v3-tiny}\n"
        f"domains:\n{domains}\n"
        "windows: {window_tokens: 256, cut_tokens: 128, windows_per_domain: 2, seed: 0}\n"
        "screen: {calibration: []}\n"
        f"teacher: {{device: cpu, lengths: [cuts], model_parallel: {MP}}}\n"
        "candidates:\n"
        "  - name: mxfp4\n"
        "    quant: {routed_experts: {format: mxfp4, recipe: rceil}}\n"
        "    paths: [weights-only]\n"
        "report: {resamples: 200, seed: 0, noise_floor: {micro_batch: 2}, gates: {mean_kld_max: 1.0}}\n"
    )
    return path


def smk_args(workdir: Path, cfg: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(cfg), *args]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> Path:
    return mp_config(tmp_path_factory.mktemp("slurm-config") / "mp.yaml")


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, cfg):
    """The same config outside SLURM (`snakemake --cores 2`), started before the SLURM run and beside it: its jobs
    fill the SLURM run's waits (scheduling, status polls), and neither run's bytes depend on the other's load."""
    work = tmp_path_factory.mktemp("local")
    log = open(work.parent / "local-snakemake.out", "w+")
    proc = subprocess.Popen(smk_args(work, cfg, "--cores", "2"), stdout=log, stderr=subprocess.STDOUT)
    yield work, proc, log, time.monotonic()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def local(local_run, on_slurm) -> Path:
    work, proc, log, t0 = local_run
    rc = proc.wait(timeout=900)
    log.seek(0)
    text = log.read()
    assert rc == 0, text[-4000:]
    took = re.findall(r"^Elapsed time: (.*)$", text, re.M) or [f"done within {time.monotonic() - t0:.0f} s"]
    print(f"local run (beside the SLURM run): {took[-1]}")
    return work


class Canceller(threading.Thread):
    """Cancels the first teacher job once its store has a shard and no manifest (the job is mid-teacher)."""

    def __init__(self, c, work: Path):
        super().__init__(daemon=True)
        self.c, self.work, self.cancelled, self.done = c, work, None, threading.Event()

    def _teacher_job(self) -> str | None:
        for log in (self.work / ".snakemake/slurm_logs/rule_teacher_cuts").glob("*/*.log"):
            return log.stem
        return None

    def run(self) -> None:
        teacher = self.work / f"results/{RUN}/teacher/cuts"
        while not self.done.is_set():
            jid = self._teacher_job()
            if jid and any(not (s.parent.parent / "manifest.json").exists() for s in teacher.glob("*/shards/*.safetensors")):
                self.c.client("scancel", jid)
                self.cancelled = jid
                return
            time.sleep(0.05)


@pytest.fixture(scope="module")
def on_slurm(tmp_path_factory, cfg, slurm, local_run):  # noqa: F811
    """The config through SLURM with the test profile; the first teacher job cancelled mid-run."""
    work = tmp_path_factory.mktemp("on-slurm")
    profile, asked = test_profile(tmp_path_factory.mktemp("profile") / "slurm", slurm.cpus)
    env = {**os.environ, **slurm.env()}
    watcher = Canceller(slurm, work)
    watcher.start()
    t0 = time.monotonic()
    try:
        r = subprocess.run(smk_args(work, cfg, "--workflow-profile", str(profile)), capture_output=True, text=True,
                           timeout=1200, env=env)
    finally:
        watcher.done.set()
        watcher.join()
    took = time.monotonic() - t0
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:] + "\n" + slurm.logs()
    print(f"SLURM run: {took:.1f} s; cancelled job {watcher.cancelled}")
    out = r.stdout + r.stderr
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", out)  # this run's jobs (the cluster is shared)
    acct = slurm.accounting()
    assert submitted and set(submitted) <= set(acct), (submitted, sorted(acct))
    return {"work": work, "out": out, "asked": asked, "cancelled": watcher.cancelled,
            "jobs": {jid: acct[jid] for jid in submitted}}


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# Timing of the selftest (seconds each side took), beside test_workflow_e2e.VOLATILE (provenance, timing profiles).
TIMING = {"oracle_s", "runner_s"}


def _head_content(p: Path) -> str:
    """A head.safetensors' content: its header parsed (keys sorted) and its tensor bytes.

    The file's own bytes are not reproducible across processes: fideval/store/head.py writes it with safetensors'
    save_file, whose header lists the metadata keys in hash-map order (safetensors 0.8.0: `format`/`version` either
    way round in two runs of one config). Its SHA-256 then enters every shard's header, the index, the manifest
    and score.json; `products` compares those through this content digest instead."""
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    return _sha(json.dumps(header, sort_keys=True).encode() + raw[8 + n:])


def products(work: Path) -> dict[str, object]:
    """Every file under results/ and reports/ (locks, plots and the HTML/Markdown pages aside): JSON as its figures,
    parquet as its rows, the rest as SHA-256 of its bytes. A SHA-256 of one of these files, wherever another names
    it, is replaced by the digest of that file's content so compared: a head file's header order (`_head_content`)
    and a JSON file's provenance (the git commit, which may move between the two runs) change the file's SHA-256
    and nothing else."""
    import pyarrow.parquet as pq

    files = [p for top in ("results", "reports") for p in sorted((work / top).rglob("*"))
             if p.is_file() and p.name != ".fideval.lock" and p.suffix not in (".html", ".md", ".png")]
    names = {}  # a file's SHA-256 -> its content digest, as other files name it

    def named(text: str) -> str:
        for sha, what in names.items():
            text = text.replace(sha, what)
        return text

    def json_figures(p: Path):
        obj = json.loads(named(p.read_text()))
        if isinstance(obj.get("meta"), dict):
            obj["meta"] = {k: v for k, v in obj["meta"].items() if k not in VOLATILE}
        if (obj.get("candidate_info") or {}).get("source") == "store":
            obj.pop("candidate_sha256")  # a digest over the candidate store's identity, its head file's SHA-256 in it
        return figures({k: v for k, v in obj.items() if k not in TIMING})

    out = {}
    # heads first, then shards (their headers name the head), then the files that name shards and heads
    for p in sorted(files, key=lambda p: (p.name != "head.safetensors", p.parent.name != "shards", p.suffix == ".json")):
        rel = str(p.relative_to(work))
        if p.name == "head.safetensors":
            out[rel] = "head:" + _head_content(p)
        elif p.suffix == ".json":
            out[rel] = json_figures(p)
        elif p.suffix == ".parquet":
            out[rel] = "rows:" + _sha(named(json.dumps(pq.read_table(p).to_pylist(), sort_keys=True, default=str)).encode())
        else:
            out[rel] = "bytes:" + _sha(named(p.read_bytes().decode("latin-1")).encode("latin-1"))
        digest = out[rel] if isinstance(out[rel], str) else "json:" + _sha(json.dumps(out[rel], sort_keys=True).encode())
        names[_sha(p.read_bytes())] = digest
    return dict(sorted(out.items()))


def test_stores_and_records_are_the_local_runs_bytes(on_slurm, local):
    got, want = products(on_slurm["work"]), products(local)
    assert sorted(got) == sorted(want)
    shards = [f for f in want if f.endswith(".safetensors") and "/shards/" in f]
    assert len(shards) == 2 * 2 * 2 * 2  # teacher and noise floor x 2 domains x 2 windows x 2 cuts
    records = [f for f in want if f.endswith("records.parquet")]
    assert len(records) == 3 * 2, records  # the candidate, the self-check, the noise floor x 2 domains
    for f in records:  # the per-token records: the very bytes
        assert (on_slurm["work"] / f).read_bytes() == (local / f).read_bytes(), f
    differ = [f for f in want if got[f] != want[f]]
    assert not differ, f"differs from the local run: {differ}"


def _rule(comment: str) -> str:
    m = re.match(r"rule_(\w+?)(?:_wildcards_.*)?$", comment)
    assert m, comment
    return m.group(1)


def test_sacct_shows_each_rules_resources_as_the_profile_asked(on_slurm):
    """`sacct --completion` (and its completion record's TRES for memory): every job in the cpu partition with the
    time limit, CPUs and memory that the profile's set-resources give its rule, or the rule's own declaration."""
    declared = {}  # rule -> resources as snakemake printed them when submitting
    for block in on_slurm["out"].split("\nrule ")[1:]:
        name = block.split(":", 1)[0]
        m = re.search(r"^\s+resources: (.*)$", block, re.M)
        if m:
            declared[name] = dict(kv.split("=", 1) for kv in m.group(1).split(", ") if "=" in kv)
    rules = {}
    for jid, job in on_slurm["jobs"].items():
        rules.setdefault(_rule(job["Comment"]), []).append(job)
    assert set(rules) == {"windows", "selftest", "teacher_cuts", "score", "selfcheck", "teacher_noise", "score_noise",
                          "report", "card", "check"}, rules
    asked = on_slurm["asked"]
    seen = []
    for rule, jobs in sorted(rules.items()):
        for job in jobs:
            want = asked.get(rule) or {"mem_mb": int(declared[rule]["mem_mb"]), "runtime": int(declared[rule]["runtime"]),
                                       "cpus": int(declared[rule].get("cpus_per_task", 1)), "partition": cluster.PARTITION}
            got = {"mem_mb": int(job["ReqMem"].rstrip("M")), "runtime": int(job["Timelimit"]), "cpus": int(job["AllocCPUS"]),
                   "partition": job["Partition"]}
            assert got == want, f"{rule}: the scheduler recorded {got}, the profile asked {want}"
            seen.append(f"{rule} {job['JobIDRaw']} {job['State']} mem={job['ReqMem']} time={job['Timelimit']} "
                        f"cpus={job['AllocCPUS']} elapsed={job['Elapsed']}")
    assert {r for r in asked if r != "default"} & set(rules) == {"selftest", "teacher_cuts", "score", "teacher_noise"}
    print("\n".join(seen))


def test_a_cancelled_teacher_job_is_resubmitted_and_nothing_is_lost(on_slurm):
    """The teacher job cancelled mid-store is CANCELLED in the accounting; Snakemake resubmits it (restart-times: 1)
    and no other job runs twice; the run ends with every product (the bytes: the first test)."""
    jid = on_slurm["cancelled"]
    assert jid, "no teacher job was seen mid-store"
    jobs = on_slurm["jobs"]
    assert jobs[jid]["State"].startswith("CANCELLED"), jobs[jid]
    by_rule = {}
    for j in jobs.values():
        by_rule.setdefault(_rule(j["Comment"]), []).append(j)
    teacher = sorted(by_rule["teacher_cuts"], key=lambda j: int(j["JobIDRaw"]))
    assert [j["State"].split()[0] for j in teacher] == ["CANCELLED", "COMPLETED"], teacher
    assert all(len(js) == 1 and js[0]["State"] == "COMPLETED" for r, js in by_rule.items() if r != "teacher_cuts"), by_rule
    log = (on_slurm["work"] / f"logs/{RUN}/teacher/cuts.log").read_text()
    assert all(f"/teacher/cuts/{d}:" in log for d in DOMAINS), log[-2000:]


def test_model_parallel_teacher_ran_as_torchrun_ranks_in_its_allocation(on_slurm):
    """The teacher job's command is torchrun over 2 ranks, run inside the job's srun step; its stores record
    model_parallel 2 (their bytes equal the same run outside SLURM: the first test)."""
    work = on_slurm["work"]
    (log,) = [p for p in (work / ".snakemake/slurm_logs/rule_teacher_cuts").glob("*/*.log") if p.stem != on_slurm["cancelled"]]
    text = log.read_text()
    assert f"torchrun --standalone --nproc-per-node {MP} -m fideval teacher" in text, text[-3000:]
    for d in DOMAINS:
        meta = json.loads((work / f"results/{RUN}/teacher/cuts/{d}/manifest.json").read_text())["meta"]
        teacher = meta["teacher"] if isinstance(meta["teacher"], dict) else json.loads(meta["teacher"])
        assert teacher["model_parallel"] == MP, teacher
