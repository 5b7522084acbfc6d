"""The one-node test cluster itself (tools/slurm/cluster.py): it says in one line why it cannot start, it runs a job
with the resources asked, and stopping it leaves nothing running and nothing on disk."""

from __future__ import annotations

import time

import pytest
from slurm_cluster import cluster, slurm  # noqa: F401  (slurm: the session fixture)


def test_without_the_packages_the_reason_is_one_line(monkeypatch):
    monkeypatch.setattr(cluster, "_exe", lambda name: None)
    reason = cluster.missing()
    assert reason and "\n" not in reason
    assert reason.startswith("SLURM and munge are not installed (munged, slurmctld, slurmd, sbatch")
    assert reason.endswith("apt-get install --no-install-recommends slurmctld slurmd slurm-client munge")
    c = cluster.Cluster()
    with pytest.raises(cluster.ClusterError, match="^SLURM and munge are not installed"):
        c.start()
    assert not c.root.exists()


def test_a_job_gets_what_it_asked_and_the_completion_record_says_so(slurm):  # noqa: F811
    r = slurm.client("sbatch", "--parsable", "--mem", "700", "-t", "3", "--cpus-per-task", "2", "--comment", "rule_probe",
                     "--wrap", "test -n \"$SLURM_JOB_ID\" && nproc", "-D", str(slurm.root))
    jid = r.stdout.strip()
    deadline = time.monotonic() + 60
    while jid in slurm.jobs():
        assert time.monotonic() < deadline, slurm.logs()
        time.sleep(0.2)
    job = slurm.accounting()[jid]
    assert (job["State"], job["Partition"], job["Timelimit"], job["AllocCPUS"], job["ReqMem"], job["Comment"]) == \
        ("COMPLETED", cluster.PARTITION, "3", "2", "700M", "rule_probe"), job


def test_stop_cancels_running_jobs_and_leaves_nothing_behind():
    reason = cluster.missing()
    if reason:
        pytest.skip(reason)
    c = cluster.Cluster(cpus=1, mem_mb=1000).start()
    daemons = [p.pid for p in c._procs.values()]
    try:
        jid = c.client("sbatch", "--parsable", "--mem", "100", "-t", "5", "--wrap", "sleep 300", "-D", str(c.root)).stdout.strip()
        deadline = time.monotonic() + 30
        while not cluster.leftovers(c.conf):  # the job's processes are up (they carry the cluster's SLURM_CONF)
            assert time.monotonic() < deadline, c.logs()
            time.sleep(0.2)
        assert c.jobs() == [jid]
    finally:
        c.stop()
    assert cluster.alive(daemons) == [] and cluster.leftovers(c.conf) == []
    assert not c.root.exists()
