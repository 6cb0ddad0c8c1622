"""``gpueff`` on a running job while slurmdbd is down: the controller still knows the job.

slurmctld queues what it tells slurmdbd, so while slurmdbd is down (restarted, upgraded,
working off a backlog) ``sacct`` fails or lags while ``squeue`` shows the job running. The
fixture stops the real slurmdbd, submits and starts a GPU job without it, and starts slurmdbd
again afterwards; the users are the cluster's ordinary test users, under ``PrivateData=jobs``.
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
    return slurmtools.run_as(user, [str(gpueff), "--config", cfg, "--no-color", *args], check=False)


def _dbd_pid() -> int | None:
    try:
        pid = int((slurmtools.tc_root() / "run" / "slurmdbd.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _sacct_answers() -> bool:
    res = slurmtools.run_as(None, ["sacct", "--noheader", "-X", "-j", "1"], check=False)
    return res.returncode == 0


@pytest.fixture(scope="module")
def job_without_dbd() -> Iterator[str]:
    pid = _dbd_pid()
    assert pid is not None, "slurmdbd is not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _dbd_pid() is not None:
        assert time.monotonic() < deadline, "slurmdbd did not stop"
        time.sleep(0.2)
    job = None
    try:
        out = f"--chdir={slurmtools.user_dir('sgtest1')}"
        job = slurmtools.submit(
            "#!/bin/sh\nsleep 120\n", "sgtest1", (out, "--gres=gpu:1", "--mem=100M", "--time=3")
        )
        deadline = time.monotonic() + 120
        while slurmtools.squeue_state(job) != "RUNNING":
            assert time.monotonic() < deadline, f"job {job} did not start"
            time.sleep(0.5)
        assert not _sacct_answers(), "sacct answered with slurmdbd stopped"
        time.sleep(4)  # the sampler's first live summary
        yield job
    finally:
        subprocess.run(["slurmdbd"], check=True)
        deadline = time.monotonic() + 60
        while not _sacct_answers():
            assert time.monotonic() < deadline, "slurmdbd did not come back"
            time.sleep(0.5)
        if job is not None:
            slurmtools.run_as(None, ["scancel", job], check=False)


def test_the_owner_sees_the_running_job_from_the_controller(job_without_dbd: str) -> None:
    res = _gpueff("sgtest1", job_without_dbd)
    assert res.returncode == 0, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith(f"Job {job_without_dbd} ") and first.endswith("RUNNING"), res.stdout
    assert "gpus 1" in res.stdout and "sgtest1" in res.stdout, res.stdout


def test_another_user_learns_nothing_of_it(job_without_dbd: str) -> None:
    res = _gpueff("sgtest2", job_without_dbd)
    assert res.returncode != 0, res.stdout
    assert "sgtest1" not in res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    # The error is accounting's, with its hint: the controller did not answer for this user.
    assert "sacct" in res.stderr or "accounting" in res.stderr, res.stderr


def test_an_ended_job_beside_it_needs_accounting(job_without_dbd: str) -> None:
    # The controller answers the running job alone; job 1 ended long ago: only accounting
    # keeps it, so its error is shown (exit 5, accounting unavailable), not a partial answer.
    res = _gpueff("sgtest1", job_without_dbd, "1")
    assert res.returncode == 5, res.stdout + res.stderr
    assert "slurmdbd" in res.stderr and "Traceback" not in res.stderr
