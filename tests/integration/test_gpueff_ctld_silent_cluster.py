"""``gpueff`` on a running job while slurmctld does not answer: accounting still knows the job.

Seen from outside: with slurmctld stopped (restarted, failing over) ``gpueff`` on the owner's
running job took 18 s, and 20 s with it hung, before printing the report that accounting
alone gives: ``squeue``, asked first, keeps retrying the controller that long. The fixture
hangs the real slurmctld (SIGSTOP) once accounting shows the job started, and resumes it
afterwards. Each test starts its own ``squeue`` just before ``gpueff`` and checks that it is
still waiting when ``gpueff`` has answered: an order, not a timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import slurmtools


def _gpueff(user: str, *args: str) -> subprocess.CompletedProcess[str]:
    gpueff = slurmtools.venv_python().parent / "gpueff"
    cfg = str(slurmtools.slurm_gpu_config_path())
    return slurmtools.run_as(
        user, [str(gpueff), "--config", cfg, "--no-color", *args], check=False, timeout_s=120
    )


def _ctld_pid() -> int:
    return int((slurmtools.tc_root() / "run" / "slurmctld.pid").read_text().strip())


def _started_in_accounting(job: str) -> bool:
    res = slurmtools.run_as(
        None, ["sacct", "--noheader", "-X", "-P", "-o", "State", "-j", job], check=False
    )
    return res.stdout.strip() == "RUNNING"


@pytest.fixture(scope="module")
def running_job() -> Iterator[str]:
    out = f"--chdir={slurmtools.user_dir('sgtest1')}"
    job = slurmtools.submit(
        "#!/bin/sh\nsleep 300\n", "sgtest1", (out, "--gres=gpu:1", "--mem=100M", "--time=6")
    )
    try:
        deadline = time.monotonic() + 120
        while not _started_in_accounting(job):
            assert time.monotonic() < deadline, f"job {job} not started in accounting"
            time.sleep(0.5)
        time.sleep(4)  # the sampler's first live summary
        yield job
    finally:
        slurmtools.run_as(None, ["scancel", job], check=False)


@pytest.fixture()
def silent_controller() -> Iterator[subprocess.Popen[bytes]]:
    """slurmctld stopped, and an ``squeue`` of the caller's waiting on it."""
    pid = _ctld_pid()
    os.kill(pid, signal.SIGSTOP)
    squeue = None
    try:
        squeue = subprocess.Popen(
            ["runuser", "-u", "sgtest1", "--", "squeue", "--noheader"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        yield squeue
    finally:
        os.kill(pid, signal.SIGCONT)
        if squeue is not None:
            squeue.kill()
            squeue.wait()


def _answered_first(
    user: str, job: str, squeue: subprocess.Popen[bytes]
) -> subprocess.CompletedProcess[str]:
    """``gpueff JOB`` as ``user``, checked to answer while ``squeue`` still waits."""
    res = _gpueff(user, job)
    assert squeue.poll() is None, "gpueff waited as long as squeue for the stopped controller"
    return res


def test_the_owner_sees_the_running_job_from_accounting(
    running_job: str, silent_controller: subprocess.Popen[bytes]
) -> None:
    res = _answered_first("sgtest1", running_job, silent_controller)
    assert res.returncode == 0, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith(f"Job {running_job} ") and first.endswith("RUNNING"), res.stdout
    assert "gpus 1" in res.stdout and "sgtest1" in res.stdout, res.stdout


def test_another_user_is_refused_without_waiting_either(
    running_job: str, silent_controller: subprocess.Popen[bytes]
) -> None:
    res = _answered_first("sgtest2", running_job, silent_controller)
    assert res.returncode == 4, res.stdout + res.stderr
    assert "sgtest1" not in res.stdout + res.stderr and "Traceback" not in res.stderr
