"""A demo job on the test cluster leaves a sealed record about exactly its own GPUs, and the
readings show the pattern the workload drove."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.capture.spool import list_sealed, read_record
from slurm_gpu.config import load_settings
from slurm_gpu.records import NodeRecord

pytestmark = pytest.mark.cluster

DEMO_SCRIPT = """#!/bin/sh
exec {python} -m slurm_gpu.demo idle-gpu --duration 8 --tick 0.1
"""


def _sealed(job_id: str, timeout_s: float = 30.0) -> NodeRecord:
    spool = load_settings(str(slurmtools.slurm_gpu_config_path())).paths.spool_dir
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in list_sealed(spool):
            if entry.job_id == job_id:
                return read_record(entry.path)
        time.sleep(0.5)
    raise AssertionError(f"no sealed record for job {job_id} in {spool}")


def test_idle_gpu_demo_is_captured_with_the_jobs_gpus(job_dir: Path) -> None:
    script = DEMO_SCRIPT.format(python=slurmtools.venv_python())
    job_id = slurmtools.submit(
        script,
        args=(
            "--gres=gpu:2",
            f"--chdir={job_dir}",
            f"--output={job_dir}/%j.out",
            f"--export=ALL,SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}",
        ),
    )
    assert slurmtools.wait_done(job_id, timeout_s=180) == "COMPLETED"
    # The workload prints the GPUs it drove: "demo idle-gpu ... on GPUs 1 (GPU-…), 2 (GPU-…)".
    output = (job_dir / f"{job_id}.out").read_text()
    driven = re.findall(r"(\d+) \((GPU-[0-9a-f-]+)\)", output)
    assert len(driven) == 2, output

    record = _sealed(job_id)
    by_uuid = {g.info.uuid: g for g in record.gpus}
    assert sorted(by_uuid) == sorted(u for _, u in driven)
    used, unused = by_uuid[driven[0][1]], by_uuid[driven[1][1]]
    assert used.info.minor_number == int(driven[0][0])
    assert used.samples_available >= 3
    assert used.process_seen and unused.samples_available >= 3
    assert used.utilization.mean is not None and used.utilization.mean > 60
    assert not unused.process_seen
    assert unused.utilization.mean == 0.0
