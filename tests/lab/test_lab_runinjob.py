"""``PrologFlags=RunInJob`` (Slurm 24.05+) runs the prolog inside the job's cgroup: without care
the sampler it starts would be counted against the job, frozen and killed with it. On cgroup v1
the prolog moves the sampler out (slurm_gpu.hooks.jobcgroup) and logs that it did.

The lab is restarted with ``LAB_PROLOG_FLAGS=Alloc,RunInJob`` for the test and with its default
flags afterwards (share/testlab/start restarts slurmctld and the slurmds when slurm.conf
changes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labtools import START_SCRIPT, Lab, LabError, ensure_labs

from slurm_gpu.capture.spool import read_record


def _start(lab: Lab, flags: str | None) -> None:
    env = {**os.environ, "BUILD_PYTHON": os.environ.get("BUILD_PYTHON") or sys.executable}
    if flags:
        env["LAB_PROLOG_FLAGS"] = flags
    proc = subprocess.run(
        [str(START_SCRIPT), lab.version], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise LabError(f"start {lab.version} exited {proc.returncode}: {proc.stderr}")


@pytest.fixture
def run_in_job(lab: Lab) -> Iterator[Lab]:
    _start(lab, "Alloc,RunInJob")
    try:
        yield lab
    finally:
        ensure_labs()


def test_runinjob_sampler_is_moved_out_of_the_job_cgroup(run_in_job: Lab) -> None:
    lab = run_in_job
    conf = (lab.root / "etc" / "slurm" / "slurm.conf").read_text()
    assert "PrologFlags=Alloc,RunInJob" in conf
    job_id = lab.submit("#!/bin/bash\n#SBATCH --gres=gpu:1 --mem=200M --time=00:05:00\nsleep 8\n")
    lab.wait_running(job_id)
    node = lab.sacct_fields(job_id, ["NodeList"])["NodeList"]
    pid_file = lab.spool(node) / job_id / f"{node}.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, f"no sampler pid file {pid_file}"
        time.sleep(0.2)
    sampler = int(pid_file.read_text().split()[0])
    assert f"job_{job_id}" not in Path(f"/proc/{sampler}/cgroup").read_text()
    log = lab.hooks_log(node).read_text()
    assert f"job={job_id} " in log
    moved = [ln for ln in log.splitlines() if f"sampler {sampler} moved out" in ln]
    assert moved and "memory" in moved[0], log[-2000:]
    assert lab.wait_done(job_id) == "COMPLETED"
    record = read_record(str(lab.wait_record(job_id, node)))
    assert record.complete, record.notes
    assert record.host is not None and record.host.method == "cgroup1"
