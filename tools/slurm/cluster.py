"""A one-node SLURM cluster on localhost, for tests: munge, slurmctld and slurmd with one CPU partition.

It installs nothing (Debian: ``apt-get install --no-install-recommends slurmctld slurmd slurm-client munge``) and
touches nothing system-wide: the munge key, socket and seed, slurm.conf, the state and spool folders, pid files
and logs all live in one fresh folder, every daemon runs in the foreground as a child of this process (in a
process group of its own), and `stop()` cancels every job, ends the daemons by their ids and removes the folder.
Clients find the cluster through ``SLURM_CONF`` (slurm.conf names the munge socket) and through ``bin/``, first on
the ``PATH`` that `env()` returns: one wrapper per client (srun, sbatch, sacct...) that sets ``SLURM_CONF`` and runs
the real one. The wrappers are needed because snakemake-executor-plugin-slurm-jobstep (0.6.1) drops every ``SLURM_*``
variable but the job's ids before its inner ``srun``, which would then look for /etc/slurm/slurm.conf; on a real
cluster that file is where clients look, and the wrappers have no counterpart.

Accounting: no slurmdbd (it needs a MySQL/MariaDB server). ``AccountingStorageType=accounting_storage/none`` with
``JobCompType=jobcomp/filetxt``: slurmctld writes one completion record per finished job to ``jobcomp.txt``, which
``sacct --completion`` reads (state, partition, time limit, CPUs, elapsed; the record's TRES holds the memory, which
``sacct -c`` leaves empty: `Cluster.accounting` adds it). Plain ``sacct`` answers "Slurm accounting storage is
disabled", so clients that poll job states (snakemake's slurm plugin) use ``squeue``, which keeps finished jobs for
``MinJobAge`` (an hour here: longer than any test).

    python tools/slurm/cluster.py [--cpus N] [--mem-mb M]     # start, print SLURM_CONF, stop on Enter or Ctrl-C

Needs root (slurmd starts every job as its submitting user) and the Debian packages above.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "srun", "sinfo", "sacctmgr", "sshare")
PARTITION = "cpu"
NODE = "fideval-node"
MIN_JOB_AGE = 3600


class ClusterError(RuntimeError):
    """The cluster could not be started: one line saying why (the daemons' log tail follows it)."""


def missing() -> str | None:
    """Why a cluster cannot start here (one line), or None when it can."""
    gone = [p for p in DAEMONS + CLIENTS if _exe(p) is None]
    if gone:
        return (f"SLURM and munge are not installed ({', '.join(gone)} not found): "
                "apt-get install --no-install-recommends slurmctld slurmd slurm-client munge")
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (slurmd starts jobs as their submitting user)"
    return None


def _exe(name: str) -> str | None:
    """The program's path: on PATH, or in /usr/sbin (not on a plain user's PATH on Debian)."""
    sbin = Path("/usr/sbin", name)
    return shutil.which(name) or (str(sbin) if sbin.exists() else None)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ClusterError("cannot read MemTotal from /proc/meminfo")


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie, ended but not yet reaped, is not running)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def leftovers(conf: Path) -> list[int]:
    """Running processes that carry this cluster's ``SLURM_CONF`` (its daemons' children: slurmstepd, jobs)."""
    needle = f"SLURM_CONF={conf}".encode()
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if needle in (p / "environ").read_bytes().split(b"\0"):
                    pids.append(int(p.name))
            except OSError:
                continue
    return alive(pids)


class Cluster:
    """One node (``fideval-node``) in one partition (``cpu``, the default), on 127.0.0.1 and two free ports."""

    def __init__(self, cpus: int | None = None, mem_mb: int | None = None, root: Path | None = None):
        self.cpus = cpus or os.cpu_count() or 1
        self.mem_mb = mem_mb or _mem_mb() - 1024
        self._own_root = root is None
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="fideval-slurm-"))
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket.2"
        self.jobcomp = self.root / "jobcomp.txt"
        self._procs: dict[str, subprocess.Popen] = {}

    # -- configuration ---------------------------------------------------------------------------------------
    def _write_config(self) -> None:
        self.root.chmod(0o755)  # munged wants its socket's folders searchable by all (clients are any user)
        for d in ("munge", "state", "spool", "log"):
            (self.root / d).mkdir(mode=0o755, parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (self.root / "bin").mkdir(mode=0o755, exist_ok=True)
        for tool in CLIENTS:
            if _exe(tool):
                w = self.root / "bin" / tool
                w.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf}; export SLURM_CONF\nexec {_exe(tool)} "$@"\n')
                w.chmod(0o755)
        (self.root / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf
        host = socket.gethostname().split(".")[0]
        ctld_port, d_port = _free_ports(2)
        r = self.root
        self.conf.write_text("\n".join([
            "ClusterName=fideval-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            f"PlugStackConfig={r}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=5",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp}",
            f"MinJobAge={MIN_JOB_AGE}",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "KillWait=5",
            "InactiveLimit=0",
            f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.mem_mb} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def env(self) -> dict[str, str]:
        """The variables a client (sbatch, sacct, snakemake's slurm plugin) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf), "PATH": f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    # -- daemons ---------------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        try:
            self._procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 env=self._client_env(), start_new_session=True, cwd=self.root)
        finally:
            log.close()

    def _wait(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise ClusterError(f"{name} exited with status {p.returncode} while waiting for {what}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} not ready after {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.2)

    def client(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster."""
        r = subprocess.run(list(argv), capture_output=True, text=True, env=self._client_env(), timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def _node_idle(self) -> bool:
        r = self.client("sinfo", "--noheader", "-n", NODE, "-o", "%t", check=False)
        return r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc")

    def start(self, timeout: float = 60) -> Cluster:
        reason = missing()
        if reason:
            self.stop()  # removes the folder
            raise ClusterError(reason)
        self._write_config()
        m = self.root / "munge"
        try:
            self._spawn("munged", [_exe("munged"), "--foreground", f"--key-file={m}/munge.key", f"--socket={self.socket}",
                                   f"--pid-file={m}/munged.pid", f"--log-file={self.root}/log/munged.log",
                                   f"--seed-file={m}/munged.seed", "--num-threads=2"])
            self._wait("munged", self.socket.exists, timeout)
            self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait("slurmctld", lambda: self.client("scontrol", "ping", check=False).stdout.count("is UP") > 0, timeout)
            self._spawn("slurmd", [_exe("slurmd"), "-D", "-N", NODE, "-f", str(self.conf)])
            self._wait(f"node {NODE}", self._node_idle, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def logs(self, lines: int = 15) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                out.append(f"--- {f.name}\n" + "\n".join(tail))
        return "\n".join(out)

    def jobs(self) -> list[str]:
        """Ids of the jobs slurmctld holds that are not finished."""
        r = self.client("squeue", "--noheader", "-o", "%i", check=False)
        return r.stdout.split() if r.returncode == 0 else []

    def accounting(self) -> dict[str, dict[str, str]]:
        """Every job slurmctld still holds, by id: what ``sacct --completion`` reports (State, Partition, Timelimit,
        AllocCPUS, Elapsed) with the memory of the job's TRES from the same completion record (``sacct -c`` leaves
        ReqMem empty) and the job's comment from ``squeue`` (snakemake's slurm plugin writes ``rule_<name>...``)."""
        fields = ("JobIDRaw", "State", "Partition", "Timelimit", "AllocCPUS", "Elapsed")
        r = self.client("sacct", "--completion", "--parsable2", "--noheader", f"--format={','.join(fields)}")
        jobs = {}
        for line in r.stdout.splitlines():
            row = dict(zip(fields, line.split("|")))
            jobs[row["JobIDRaw"]] = row  # a requeued job's last record wins
        for line in self.jobcomp.read_text().splitlines() if self.jobcomp.exists() else []:
            kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
            tres = dict(t.split("=", 1) for t in kv.get("Tres", "").split(",") if "=" in t)
            if kv.get("JobId") in jobs:
                jobs[kv["JobId"]]["ReqMem"] = tres.get("mem", "")
        q = self.client("squeue", "--states=all", "--noheader", "--format=%i|%k")
        for line in q.stdout.splitlines():
            jid, comment = line.split("|", 1)
            if jid in jobs:
                jobs[jid]["Comment"] = comment
        return jobs

    def stop(self, timeout: float = 30) -> None:
        """Cancel every job, wait for them to end, stop slurmd, slurmctld and munged (by their ids), remove the folder."""
        try:
            if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
                self.client("scancel", "--full", "--user", str(os.geteuid()), check=False)
                deadline = time.monotonic() + timeout
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
            for name in reversed(DAEMONS):  # slurmd, slurmctld, munged
                p = self._procs.get(name)
                if p is None or p.poll() is not None:
                    continue
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            deadline = time.monotonic() + timeout  # slurmstepd and job processes end with their jobs
            while leftovers(self.conf) and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid in leftovers(self.conf):  # a job step that outlived scancel and its daemons
                os.kill(pid, signal.SIGKILL)
        finally:
            self._procs.clear()
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", type=int)
    ap.add_argument("--mem-mb", type=int)
    a = ap.parse_args(argv)
    try:
        with Cluster(a.cpus, a.mem_mb) as c:
            print(f"export SLURM_CONF={c.conf} PATH={c.root / 'bin'}:$PATH   # partition {PARTITION}, node {NODE}: "
                  f"{c.cpus} CPUs, {c.mem_mb} MB", flush=True)
            try:
                input("Enter stops the cluster\n")
            except (KeyboardInterrupt, EOFError):
                pass
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
