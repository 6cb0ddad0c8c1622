"""Accounting against the real test cluster: SacctSource on real jobs, and a JS1 summary that
the real reportseff shows."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.accounting import is_settled
from slurm_gpu.accounting.admincomment import AdminCommentWriter, encode
from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.errors import AccountingError

NAME = "a|b\nc é"


def _settled(source: SacctSource, job_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rec = source.get_jobs([job_id]).get(job_id)
        if rec is not None and is_settled(rec):
            return
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} not settled in accounting after {timeout_s} s")


def test_real_jobs_parse(job_dir: Path) -> None:
    ok = slurmtools.submit(
        "#!/bin/sh\nsleep 1\n",
        args=(f"--job-name={NAME}", "--gres=gpu:2", f"--chdir={job_dir}", "--output=/dev/null"),
    )
    bad = slurmtools.submit(
        "#!/bin/sh\nexit 3\n", args=(f"--chdir={job_dir}", "--output=/dev/null")
    )
    assert slurmtools.wait_done(ok) == "COMPLETED"
    assert slurmtools.wait_done(bad) == "FAILED"
    source = SacctSource()
    _settled(source, ok)
    _settled(source, bad)
    jobs = source.get_jobs([ok, bad])
    assert jobs[ok].job_name == NAME and jobs[ok].alloc_tres.gpus == 2
    assert jobs[ok].user == "sgtest1" and jobs[ok].nodelist == (slurmtools.node_name(),)
    assert (jobs[bad].state, jobs[bad].exit_code) == ("FAILED", 3)


def test_unknown_job_is_absent() -> None:
    assert SacctSource().get_jobs(["99999999"]) == {}


def test_missing_sacct_is_typed() -> None:
    with pytest.raises(AccountingError):
        SacctSource(sacct_path="/nonexistent/sacct").get_jobs(["1"])


def test_reportseff_shows_our_js1_summary(job_dir: Path) -> None:
    reportseff = shutil.which("reportseff") or str(
        Path(slurmtools.venv_python()).parent / "reportseff"
    )
    job_id = slurmtools.submit(
        "#!/bin/sh\nsleep 6\n", args=("--gres=gpu:1", f"--chdir={job_dir}", "--output=/dev/null")
    )
    deadline = time.monotonic() + 60
    while slurmtools.squeue_state(job_id) != "RUNNING":
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.3)
    source = SacctSource()
    running = source.get_jobs([job_id])[job_id]
    summary = {
        "gpus": 1,
        "total_time": 6,
        "nodes": {
            slurmtools.node_name(): {
                "cpus": 1,
                "total_time": 3.0,
                "gpu_utilization": {"0": 73.4},
                "gpu_used_memory": {"0": 3 * 1024**3},
                "gpu_total_memory": {"0": 12 * 1024**3},
            }
        },
    }
    writer = AdminCommentWriter()
    writer.write_running(running, encode(summary))
    assert slurmtools.wait_done(job_id) == "COMPLETED"
    out = slurmtools.run_as(
        None, [reportseff, "--no-color", "--format", "JobID,GPUEff,GPUMem", job_id]
    ).stdout
    line = next(line for line in out.splitlines() if line.split() and line.split()[0] == job_id)
    assert line.split()[1:] == ["73.4%", "25.0%"]


def test_sacctmgr_write_after_the_end_is_verified(job_dir: Path) -> None:
    """After the end only sacctmgr can write; Slurm 22.05's lower-cases the value, and the
    writer must say so instead of leaving a broken summary silently."""
    job_id = slurmtools.submit(
        "#!/bin/sh\ntrue\n", args=(f"--chdir={job_dir}", "--output=/dev/null")
    )
    assert slurmtools.wait_done(job_id) == "COMPLETED"
    source = SacctSource()
    _settled(source, job_id)
    finished = source.get_jobs([job_id])[job_id]
    comment = encode({"gpus": 0, "total_time": 0, "nodes": {}})
    try:
        AdminCommentWriter().write(finished, comment)
    except AccountingError as err:
        assert "lower-cased" in err.message
    else:
        assert source.get_jobs([job_id])[job_id].admin_comment == comment
