"""Jobs on the real test cluster leave one sealed record per node, about exactly their GPUs,
with the job's own CPU time in the host summary."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.capture.spool import JobSpool, read_record
from slurm_gpu.config import load_settings
from slurm_gpu.records import NodeRecord

pytestmark = pytest.mark.cluster

BURN_SCRIPT = """#!/bin/sh
echo "GPUS=$SLURM_JOB_GPUS"
{python} -c '
import time
end = time.process_time() + {burn}
while time.process_time() < end:
    pass
'
sleep {sleep}
"""


def settings():  # type: ignore[no-untyped-def]
    return load_settings(str(slurmtools.slurm_gpu_config_path()))


def sealed(job_id: str, timeout_s: float = 60.0) -> tuple[NodeRecord, JobSpool]:
    """The job's sealed record on the cluster's node (the epilog may finish after sacct says
    COMPLETED)."""
    paths = JobSpool(settings().paths.spool_dir, job_id, slurmtools.node_name())
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(paths.record):
        assert time.monotonic() < deadline, f"no sealed record {paths.record}"
        time.sleep(0.3)
    while os.path.exists(paths.pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # the epilog removes the pid file last
    return read_record(paths.record), paths


def virtual_uuid(minor: int) -> str:
    identity = Path(settings().telemetry.virtual_dir) / str(minor) / "identity.json"
    return str(json.loads(identity.read_text())["uuid"])


def submit(job_dir: Path, gres: str | None, burn: float = 3.0, sleep: float = 3.0) -> str:
    script = BURN_SCRIPT.format(python=slurmtools.venv_python(), burn=burn, sleep=sleep)
    args = [f"--chdir={job_dir}", f"--output={job_dir}/%j.out", "--cpus-per-task=1"]
    if gres:
        args.append(f"--gres={gres}")
    return slurmtools.submit(script, args=args)


def test_gpu_job_is_sealed_with_its_gpus_and_cpu_time(job_dir: Path) -> None:
    job_id = submit(job_dir, "gpu:2", burn=3.0, sleep=3.0)
    assert slurmtools.wait_done(job_id, timeout_s=240) == "COMPLETED"
    output = (job_dir / f"{job_id}.out").read_text()
    m = re.search(r"GPUS=([0-9,]+)", output)
    assert m, output
    minors = [int(i) for i in m.group(1).split(",")]
    assert len(minors) == 2

    record, paths = sealed(job_id)
    assert record.complete, record.notes
    assert record.job_id == job_id
    assert record.hostname == slurmtools.node_name()
    assert record.source == "virtual"
    assert [g.info.uuid for g in record.gpus] == [virtual_uuid(n) for n in minors]
    assert [g.info.minor_number for g in record.gpus] == minors
    assert record.uid == int(slurmtools.run_as(None, ["id", "-u", "sgtest1"]).stdout)
    for g in record.gpus:
        # At 1 s readings over a job of about 6 s plus the hooks around it.
        assert g.samples >= 4 and g.samples_available == g.samples
    assert record.ended_s - record.started_s >= 5
    host = record.host
    assert host is not None
    assert host.method == "proc"
    assert host.cpu_time_s is not None and 2.7 <= host.cpu_time_s <= 6.0
    assert host.rss_max_bytes is not None and host.rss_max_bytes > 1_000_000
    assert host.cpu_cores_busy.n > 0
    # Who may read what: the spool and its files are root's alone; the live summary (checked
    # while a job runs, in test_gpueff_cluster) is removed by the epilog.
    assert stat.S_IMODE(os.stat(paths.spool_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(paths.job_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(paths.record).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(paths.jsonl).st_mode) == 0o600
    assert not os.path.exists(paths.live)
    assert slurmtools.node_state() not in ("drained", "draining", "drain")


def test_cpu_only_job_gets_no_sampler(job_dir: Path) -> None:
    job_id = submit(job_dir, None, burn=0.1, sleep=0.5)
    assert slurmtools.wait_done(job_id, timeout_s=240) == "COMPLETED"
    time.sleep(2)
    assert not os.path.exists(os.path.join(settings().paths.spool_dir, job_id))
    log = Path(settings().paths.log_file).read_text()
    assert f"job={job_id} prolog: no GPU allocated on this node; no sampler" in log
