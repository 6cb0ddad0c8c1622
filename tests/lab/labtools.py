"""Helpers for the tests that run on the version lab (share/testlab/start).

A ``Lab`` is one Slurm version's cluster: a Debian root with its controller on the bridge's
host address and three compute hosts in their own network, UTS and mount namespaces. Commands
run chrooted into the root (as root or, through ``runuser``, as a lab user), on the controller
or inside one compute host's namespaces; everything here shells out to the real Slurm commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu.accounting.base import FINAL_STATES
from slurm_gpu.store import Store
from slurm_gpu.store.rows import StoredJob

REPO = Path(__file__).resolve().parents[2]
START_SCRIPT = REPO / "share" / "testlab" / "start"
LAB_DIR = Path(os.environ.get("LAB_DIR", "/var/lib/slurm-gpu-lab"))
#: The versions the lab runs (share/testlab/common.sh): node name prefix, port digit (x817
#: slurmctld, ..., x825 the SMTP sink the lab's mail program sends to).
VERSIONS = {"24.11": ("t", 7), "26.05": ("s", 8)}
PROJECT_BIN = "/opt/slurm-gpu/bin"
REPORTSEFF = "/opt/reportseff/bin/reportseff"
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class LabError(RuntimeError):
    """The lab is not usable, or a command in it failed."""


@dataclass(frozen=True)
class Lab:
    """One version's lab cluster."""

    version: str

    @property
    def root(self) -> Path:
        return LAB_DIR / self.version / "root"

    @property
    def nodes(self) -> tuple[str, ...]:
        prefix = VERSIONS[self.version][0]
        return tuple(f"{prefix}{i}" for i in (1, 2, 3))

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor = self.version.split(".")
        return int(major), int(minor)

    @property
    def smtp_port(self) -> int:
        """Where the lab's mail program sends mail (the tests' SMTP sink listens there)."""
        return VERSIONS[self.version][1] * 1000 + 825

    # ------------------------------------------------------------------------------------------
    def node_dir(self, node: str) -> Path:
        """The node's own directory, as the machine sees it (bind-mounted on the node)."""
        return self.root / "srv" / "nodes" / node

    def spool(self, node: str) -> Path:
        """The node's spool (``paths.spool_dir`` on that node)."""
        return self.node_dir(node) / "local" / "spool"

    def vgpu_dir(self, node: str) -> Path:
        return self.node_dir(node) / "local" / "vgpu"

    def hooks_log(self, node: str) -> Path:
        return self.node_dir(node) / "log" / "hooks.log"

    def slurmd_pid(self, node: str) -> int:
        return int((self.root / "run" / "slurm" / f"slurmd-{node}.pid").read_text().strip())

    # ------------------------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        node: str | None = None,
        input_text: str | None = None,
        timeout_s: float = 120.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the root (on the controller, or on ``node``: inside its namespaces)
        as root or ``user``, with a clean environment; raise ``LabError`` on failure when
        ``check``."""
        inner = [*argv]
        if user not in (None, "root"):
            assert user is not None
            inner = ["runuser", "-u", user, "--", *inner]
        full = ["chroot", str(self.root), "/usr/bin/env", "-i", f"PATH={PATH}", "LANG=C.UTF-8"]
        full += ["HOME=/root" if user in (None, "root") else f"HOME=/home/{user}", *inner]
        if node is not None:
            full = ["nsenter", "-t", str(self.slurmd_pid(node)), "-n", "-u", "-m", *full]
        proc = subprocess.run(
            full,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            cwd="/",
        )
        if check and proc.returncode != 0:
            raise LabError(
                f"[{self.version}] {' '.join(inner)} exited {proc.returncode}: "
                f"{proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def submit(self, script: str, user: str = "labuser1", args: Sequence[str] = ()) -> str:
        """Submit the batch script text as ``user`` (from its home); return the job id."""
        out = self.run(
            ["sbatch", "--parsable", f"--chdir=/home/{user}", "--output=/dev/null", *args],
            user=user,
            input_text=script,
        ).stdout.strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise LabError(f"sbatch printed {out!r}, not a job id")
        return job_id

    def squeue_state(self, job_id: str) -> str | None:
        proc = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
        if proc.returncode != 0:
            # A forgotten job id (MinJobAge after its end) is gone; any other failure
            # (slurmctld busy or restarting) is unknown, never "the job is gone".
            return None if "Invalid job id" in proc.stderr else "UNKNOWN"
        out = proc.stdout.split()
        return out[0] if out else None

    def sacct_state(self, job_id: str) -> str | None:
        out = self.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], check=False)
        words = out.stdout.split()
        return words[0] if words else None

    def wait_running(self, job_id: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (state := self.squeue_state(job_id)) != "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"[{self.version}] job {job_id} not running: {state}")
            time.sleep(0.3)

    def wait_done(self, job_id: str, timeout_s: float = 180.0) -> str:
        """Wait until the job ended, its epilogs ran and accounting has its final state."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            queued = self.squeue_state(job_id)
            if queued is None or queued in FINAL_STATES:
                accounted = self.sacct_state(job_id)
                if accounted in FINAL_STATES:
                    assert accounted is not None
                    return accounted
            time.sleep(0.5)
        raise TimeoutError(f"[{self.version}] job {job_id} not done after {timeout_s} s")

    def sacct_fields(self, job_id: str, fields: Sequence[str], step: str = "") -> dict[str, str]:
        """sacct's line of the job's allocation (or of ``JOBID.step``) as {field: value}."""
        want = f"{job_id}.{step}" if step else job_id
        proc = self.run(
            ["sacct", "-n", "-P", "--delimiter=|", "-j", job_id, "-o", ",".join(["JobID", *fields])]
        )
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if parts[0] == want:
                return dict(zip(fields, parts[1:], strict=True))
        raise LabError(f"[{self.version}] sacct has no line {want}: {proc.stdout!r}")

    def slurm_gpu(self, *args: str, node: str | None = None) -> subprocess.CompletedProcess[str]:
        """``slurm-gpu ARGS`` as root with the lab's configuration (/etc/slurm-gpu/config.toml)."""
        return self.run([f"{PROJECT_BIN}/slurm-gpu", *args], node=node, check=False, timeout_s=240)

    def ship_and_collect(self, job_id: str, nodes: Sequence[str]) -> dict[str, list[str]]:
        """Ship each node's sealed records to the inbox (a node timer's job), then collect the
        job on the controller; return the collector's JSON report."""
        for node in nodes:
            shipped = self.slurm_gpu("ship", node=node)
            if shipped.returncode != 0:
                raise LabError(f"ship on {node}: {shipped.stderr}")
        proc = self.slurm_gpu("collect", "--job", job_id, "--wait", "60", "--json")
        if proc.returncode != 0:
            raise LabError(f"collect exited {proc.returncode}: {proc.stderr}")
        report: dict[str, list[str]] = json.loads(proc.stdout.splitlines()[-1])
        return report

    def wait_record(self, job_id: str, node: str, timeout_s: float = 60.0) -> Path:
        path = self.spool(node) / job_id / f"{node}.record"
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"[{self.version}] no sealed record {path}")
            time.sleep(0.3)
        return path


def stored_job(lab: Lab, job_id: str) -> StoredJob:
    """The job as the lab's collector stored it (its SQLite store, read from the machine)."""
    url = f"sqlite:///{lab.root}/var/lib/slurm-gpu/slurm-gpu.db"
    with Store.open(url, migrate=False) as store:
        got = store.get_job(job_id)
    if got is None:
        raise LabError(f"[{lab.version}] job {job_id} is not in the store")
    return got


def ensure_labs() -> None:
    """Build (what changed) and start every lab; raise ``LabError`` when that fails. The
    project's wheel is built with this session's interpreter unless ``BUILD_PYTHON`` says."""
    env = {**os.environ, "BUILD_PYTHON": os.environ.get("BUILD_PYTHON") or sys.executable}
    proc = subprocess.run(
        [str(START_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False, env=env
    )
    if proc.returncode != 0:
        raise LabError(f"{START_SCRIPT} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
