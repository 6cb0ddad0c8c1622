"""What a job's owner can do to root's node side, tried on the real test cluster
(docs/security.md, classes "the /proc method counts processes by ancestry" and "one sampler
per job and node").

- A busy loop the owner starts OUTSIDE the job with ``SLURM_JOB_ID=<job>`` in its environment
  is not the job's: the sealed record's CPU time stays that of the job (it once read the loop's
  CPU as the job's, hiding waste and feeding the history that sizes later requests).
- A second prolog for the same job and node keeps the running sampler instead of starting a
  second root process that no epilog stops; after the job, no sampler of it is left.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.capture.spool import JobSpool, read_pidfile, read_record
from slurm_gpu.config import load_settings
from slurm_gpu.hooks.epilog import find_job_samplers
from slurm_gpu.records import NodeRecord

pytestmark = pytest.mark.cluster

SLEEPER = "#!/bin/sh\nsleep {sleep}\n"


def _paths(job_id: str) -> JobSpool:
    settings = load_settings(str(slurmtools.slurm_gpu_config_path()))
    return JobSpool(settings.paths.spool_dir, job_id, slurmtools.node_name())


def _running_sampler(job_id: str, timeout_s: float = 60.0) -> int:
    """The pid of the job's sampler once the prolog has written its pid file."""
    paths = _paths(job_id)
    deadline = time.monotonic() + timeout_s
    while True:
        found = read_pidfile(paths.pid)
        if found is not None:
            return found[0]
        assert time.monotonic() < deadline, f"no sampler pid file for job {job_id}"
        time.sleep(0.2)


def _sealed(job_id: str, timeout_s: float = 90.0) -> NodeRecord:
    paths = _paths(job_id)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(paths.record) or os.path.exists(paths.pid):
        assert time.monotonic() < deadline, f"job {job_id} not sealed"
        time.sleep(0.2)
    return read_record(paths.record)


def _submit(job_dir: Path, sleep: float) -> str:
    return slurmtools.submit(
        SLEEPER.format(sleep=sleep),
        args=["--gres=gpu:1", f"--chdir={job_dir}", f"--output={job_dir}/%j.out"],
    )


def test_owners_busy_loop_outside_the_job_is_not_the_jobs_cpu(job_dir: Path) -> None:
    job_id = _submit(job_dir, sleep=12)
    _running_sampler(job_id)
    # The owner, outside the job (a login shell, not under the job's slurmstepd), claims the
    # job's id in the environment and burns about 4 s of CPU.
    burn = (
        "import time\nend = time.process_time() + 4\nwhile time.process_time() < end:\n    pass\n"
    )
    outside = slurmtools.run_as(
        "sgtest1",
        ["env", f"SLURM_JOB_ID={job_id}", f"SLURM_JOBID={job_id}", "python3", "-c", burn],
        timeout_s=60,
    )
    assert outside.returncode == 0
    assert slurmtools.wait_done(job_id, timeout_s=120) == "COMPLETED"
    host = _sealed(job_id).host
    assert host is not None and host.cpu_time_s is not None
    # The job itself only sleeps: well under a second of CPU, never the loop's ~4 s.
    assert host.cpu_time_s < 1.5, host.cpu_time_s


def test_a_second_prolog_keeps_the_running_sampler_and_none_outlives_the_job(
    job_dir: Path,
) -> None:
    job_id = _submit(job_dir, sleep=15)
    first = _running_sampler(job_id)
    # The prolog again, as slurmd runs it (root, the wrapper, Slurm's own variables: those the
    # first prolog handed its sampler).
    env = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{first}/environ").read_bytes().decode().split("\0")
        if item.startswith(("SLURM", "CUDA_VISIBLE_DEVICES")) and "=" in item
    )
    prolog = slurmtools.tc_root() / "hooks" / "slurm-gpu-prolog"
    again = slurmtools.run_as(
        None, ["env", "-i", *(f"{k}={v}" for k, v in env.items()), str(prolog)]
    )
    assert again.returncode == 0
    samplers = [pid for pid, _ in find_job_samplers(job_id)]
    assert samplers == [first], samplers
    assert read_pidfile(_paths(job_id).pid) is not None
    assert read_pidfile(_paths(job_id).pid)[0] == first  # type: ignore[index]

    assert slurmtools.wait_done(job_id, timeout_s=120) == "COMPLETED"
    record = _sealed(job_id)
    assert record.complete, record.notes
    deadline = time.monotonic() + 30
    while find_job_samplers(job_id):
        assert time.monotonic() < deadline, f"a sampler of job {job_id} outlived it"
        time.sleep(0.5)
