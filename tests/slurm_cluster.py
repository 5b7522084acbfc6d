"""The one-node SLURM cluster of the tests (tools/slurm/cluster.py) as a session fixture, and the test profile.

``slurm`` starts munge, slurmctld and slurmd once per test process and stops them after the last test (nothing left
running: checked at teardown); where SLURM or munge is not installed, or the tests do not run as root, every test
that uses it is skipped with one reason. ``test_profile`` writes workflow/profiles/slurm with only what this one
node cannot honour changed: no account (none exists), the ``cpu`` partition for every rule, no GPUs, memory scaled to
the node, at most the node's CPUs per job, and the status from ``squeue`` (no slurmdbd, so plain ``sacct`` has no
data). Each rule's resources are then read back from the scheduler (`accounting`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"


def _cluster_module():
    spec = importlib.util.spec_from_file_location("fideval_slurm_cluster", ROOT / "tools" / "slurm" / "cluster.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


cluster = _cluster_module()


_SHARED = {"cluster": None, "users": 0}  # one cluster per test process, whichever modules import the fixture


@pytest.fixture(scope="session")
def slurm():
    """A running one-node cluster (``cluster.Cluster``); skipped where it cannot run.

    Each test module that imports this fixture gets its own session-scoped instance of it; they share one cluster,
    started by the first and stopped (nothing left running: checked) when the last is torn down."""
    reason = cluster.missing()
    if reason:
        pytest.skip(reason)
    if _SHARED["cluster"] is None:
        # a fixed node size, whatever the machine: 2 CPUs (CI's) and 16 GB (two of the largest job, the report's
        # 8 GB; declared to the scheduler, not enforced: no cgroups), so that no job waits for a node it can never get
        _SHARED["cluster"] = cluster.Cluster(cpus=2, mem_mb=16000).start()
    c = _SHARED["cluster"]
    _SHARED["users"] += 1
    try:
        yield c
    finally:
        _SHARED["users"] -= 1
        if _SHARED["users"] == 0:
            _SHARED["cluster"] = None
            pids = [p.pid for p in c._procs.values()]
            c.stop()
            left = cluster.alive(pids) + cluster.leftovers(c.conf)
            assert not left, f"processes of the test cluster still running after stop: {left}"


# Memory each rule asks for on the test node: the shipped profile's shape, values a 2-core CI machine can give.
MEM_MB = {"default": 1500, "selftest": 2100, "teacher_windows": 3100, "teacher_cuts": 3200, "score": 2900,
          "teacher_noise": 3300, "fused_windows": 3400, "fused_cuts": 3500}


def test_profile(dest: Path, cpus: int) -> tuple[Path, dict[str, dict]]:
    """workflow/profiles/slurm for the test node, written to ``dest``; and what it asks each rule for.

    Returns (profile folder, {rule: {"mem_mb", "runtime", "cpus", "partition"}}) for the rules the profile names;
    other rules get ``default`` unless the rule declares its own (the Snakemake precedence).
    """
    shipped = yaml.safe_load(PROFILE.read_text())
    prof = {k: v for k, v in shipped.items()}
    assert prof.pop("executor") == "slurm"
    prof["executor"] = "slurm"
    prof["slurm-no-account"] = True  # the test cluster has no accounts (the shipped profile names one to replace)
    prof["slurm-status-command"] = "squeue"  # no slurmdbd: squeue answers for MinJobAge (an hour)
    prof["slurm-init-seconds-before-status-checks"] = 1
    prof["slurm-keep-successful-logs"] = True
    default = {k: v for k, v in shipped["default-resources"].items() if k != "slurm_account"}
    default.update(slurm_partition=cluster.PARTITION, mem_mb=MEM_MB["default"], gpu=0)
    prof["default-resources"] = default
    asked = {"default": {"mem_mb": default["mem_mb"], "runtime": default["runtime"], "cpus": 1, "partition": cluster.PARTITION}}
    sets = {}
    for rule, res in shipped["set-resources"].items():
        res = dict(res, slurm_partition=cluster.PARTITION, gpu=0, mem_mb=MEM_MB[rule])
        if "cpus_per_task" in res:
            res["cpus_per_task"] = min(int(res["cpus_per_task"]), cpus)
        sets[rule] = res
        asked[rule] = {"mem_mb": res["mem_mb"], "runtime": res["runtime"], "cpus": res.get("cpus_per_task", 1),
                       "partition": cluster.PARTITION}
    prof["set-resources"] = sets
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return dest, asked


test_profile.__test__ = False  # a helper, not a test
