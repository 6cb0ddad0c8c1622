"""``gpueff`` as a new user meets it on the real test cluster: the job that just ended (not
collected yet) as its owner, a range of array tasks, a running and a pending job.

Run with the command under test from this checkout: ``VENV`` names the virtualenv whose
``gpueff`` script runs, ``PYTHONPATH`` the checkout (the test users inherit both through
``runuser``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import slurmtools


def _gpueff(*args: str) -> tuple[int, str, str]:
    gpueff = slurmtools.venv_python().parent / "gpueff"
    cfg = str(slurmtools.slurm_gpu_config_path())
    res = slurmtools.run_as("sgtest1", [str(gpueff), "--config", cfg, *args], check=False)
    return res.returncode, res.stdout, res.stderr


def _script(body: str, *sbatch: str) -> str:
    lines = ["#!/bin/sh", "#SBATCH --gres=gpu:1", "#SBATCH --mem=100M", "#SBATCH --time=00:02:00"]
    return "\n".join([*lines, *(f"#SBATCH {o}" for o in sbatch), body, ""])


@pytest.fixture(scope="module")
def out_dir() -> str:
    return f"--chdir={slurmtools.user_dir('sgtest1')}"


@pytest.fixture(scope="module")
def ended_jobs(out_dir: str) -> tuple[str, str]:
    """(a GPU job, a 3-task GPU array) that ended and were not collected."""
    single = slurmtools.submit(_script("sleep 15"), "sgtest1", (out_dir,))
    array = slurmtools.submit(_script("sleep 12"), "sgtest1", (out_dir, "--array=1-3"))
    slurmtools.wait_done(single, timeout_s=240)
    for task in (1, 2, 3):
        slurmtools.wait_done(f"{array}_{task}", timeout_s=240)
    return single, array


def test_the_owner_of_a_job_not_collected_yet_reads_not_collected_yet(
    ended_jobs: tuple[str, str],
) -> None:
    single, _ = ended_jobs
    rc, out, err = _gpueff(single)
    assert rc == 0, err
    assert "not been collected yet" in out, out
    assert "Permission denied" not in out + err


@pytest.mark.parametrize("args", [(), ("--since", "1h")])
def test_a_listing_goes_on_past_jobs_not_collected_yet(
    ended_jobs: tuple[str, str], args: tuple[str, ...]
) -> None:
    single, array = ended_jobs
    rc, out, err = _gpueff(*args)
    assert rc == 0, err
    mine = [ln for ln in out.splitlines() if ln.split()[:1] == [single]]
    assert mine and "not collected yet" in mine[0], out
    assert any(ln.startswith(f"{array}_2 ") for ln in out.splitlines()), out


def test_a_range_of_array_tasks(ended_jobs: tuple[str, str]) -> None:
    _, array = ended_jobs
    rc, out, err = _gpueff(f"{array}_[1-2]")
    assert rc == 0, err
    tasks = [ln.split()[0] for ln in out.splitlines() if ln.startswith(f"{array}_")]
    assert tasks == [f"{array}_1", f"{array}_2"], out
    assert "All 2 tasks:" in out and "GPU-hours" in out


def test_a_whole_array_has_a_summary(ended_jobs: tuple[str, str]) -> None:
    _, array = ended_jobs
    rc, out, err = _gpueff(array)
    assert rc == 0, err
    assert f"Array {array}: 3 tasks" in out and "All 3 tasks:" in out
    assert "elapsed  min" in out


@pytest.fixture(scope="module")
def running_job(out_dir: str) -> Iterator[str]:
    job = slurmtools.submit(_script("sleep 60"), "sgtest1", (out_dir,))
    deadline = time.monotonic() + 120
    while slurmtools.squeue_state(job) != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} did not start"
        time.sleep(0.5)
    time.sleep(4)  # the sampler's first live summary
    yield job
    slurmtools.run_as(None, ["scancel", job], check=False)


def test_a_running_job_has_no_exit_code(running_job: str) -> None:
    rc, out, err = _gpueff(running_job)
    assert rc == 0, err
    first = out.splitlines()[0]
    assert first.endswith("RUNNING"), out
    assert "(exit" not in first


def test_a_running_job_names_its_gpu_by_model(running_job: str) -> None:
    """Needs the node's sampler to run this checkout's code (the live summary's GPU names)."""
    rc, out, err = _gpueff(running_job)
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if "gpus 1" in ln)
    assert "gpus 1 x " in line and not line.rstrip().endswith("x a100"), out


def test_a_pending_job_shows_the_gpus_it_asked_for(out_dir: str) -> None:
    job = slurmtools.submit(_script("sleep 1", "--hold"), "sgtest1", (out_dir,))
    try:
        # slurmdbd learns of a submitted job a moment later; gpueff asks sacct.
        deadline = time.monotonic() + 60
        while slurmtools.sacct_state(job) is None:
            assert time.monotonic() < deadline, f"sacct does not know job {job}"
            time.sleep(0.5)
        rc, out, err = _gpueff(job)
        assert rc == 0, err
        first = out.splitlines()[0]
        assert first.endswith("PENDING") and "(exit" not in first, out
        assert "gpus 1" in out and "gpus 0" not in out, out
    finally:
        slurmtools.run_as(None, ["scancel", job], check=False)
