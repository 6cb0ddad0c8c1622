"""Accounting against the real test cluster: SacctSource on real jobs, and a JS1 summary that
the real reportseff shows."""

from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.accounting import is_settled
from slurm_gpu.accounting.admincomment import AdminCommentWriter, encode
from slurm_gpu.accounting.sacct import DELIM, SacctSource
from slurm_gpu.accounting.usertext import WORK_DIR_MAX_LEN
from slurm_gpu.errors import AccountingError
from slurm_gpu.textsafe import clean_user_text

NAME = "a|b\nc é"

#: The single query the accounting adapter used to ask (user strings included): the format
#: the crafted directory below forges a record in.
OLD_FIELDS = [
    "JobIDRaw",
    "JobID",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "User",
    "UID",
    "Account",
    "Partition",
    "QOS",
    "AllocCPUS",
    "NNodes",
    "ReqMem",
    "AllocTRES",
    "ReqTRES",
    "MaxRSS",
    "TotalCPU",
    "ElapsedRaw",
    "Elapsed",
    "TimelimitRaw",
    "Timelimit",
    "Submit",
    "Start",
    "End",
    "NodeList",
    "JobName",
    "Comment",
    "AdminComment",
    "WorkDir",
    "JobIDRaw",
]


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
    assert jobs[ok].job_name == clean_user_text(NAME) and jobs[ok].alloc_tres.gpus == 2
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


def _forged_record(victim: str) -> str:
    """A whole record for ``victim`` in ``OLD_FIELDS``, owned by sgtest1, short enough for one
    file name (no '/')."""
    values = {f: "" for f in OLD_FIELDS}
    values.update(
        JobIDRaw=victim,
        JobID=victim,
        State="COMPLETED",
        ExitCode="0:0",
        DerivedExitCode="0:0",
        User="sgtest1",
        UID=str(pwd.getpwnam("sgtest1").pw_uid),
        Partition="gpu",
        AllocCPUS="1",
        NNodes="1",
        AllocTRES="cpu=1",
        ReqTRES="cpu=1",
        ElapsedRaw="1",
        TimelimitRaw="1",
        Submit="1795000000",
        Start="1795000001",
        End="1795000002",
        NodeList="vm",
        JobName="f",
    )
    return DELIM.join(values[f] for f in OLD_FIELDS)


def test_crafted_workdir_cannot_forge_another_users_job() -> None:
    """The review's attack on the real sacct: sgtest1 submits from a directory whose name
    holds the delimiter, its own job id and a newline, then a forged record of a job that
    sgtest2 submitted just before. sacct prints the directory raw; the victim must keep
    sgtest2 as its owner, and neither job may gain a forged extra run."""
    sgtest2_dir = slurmtools.user_dir("sgtest2")
    attacker_base = slurmtools.user_dir("sgtest1")
    sgtest1 = pwd.getpwnam("sgtest1")
    try:
        victim = slurmtools.submit(
            "#!/bin/sh\nsleep 1\n",
            user="sgtest2",
            args=(f"--chdir={sgtest2_dir}", "--output=/dev/null"),
        )
        # The attacker's record must end at its own id, so the name predicts it: the next id
        # on a quiet cluster. A job that got another id is cancelled and the attempt retried.
        attacker = crafted = None
        predicted = int(victim) + 1
        for _ in range(5):
            crafted = attacker_base / (
                f"x{DELIM}{predicted}\n{_forged_record(victim)}\n{predicted}{DELIM}y"
            )
            crafted.mkdir()
            os.chown(crafted, sgtest1.pw_uid, sgtest1.pw_gid)
            got = slurmtools.submit(
                "#!/bin/sh\ntrue\n",
                args=(f"--chdir={crafted}", "--output=/dev/null"),
            )
            if got == str(predicted):
                attacker = got
                break
            slurmtools.run_as("sgtest1", ["scancel", got], check=False)
            predicted = int(got) + 1
        assert attacker is not None and crafted is not None, "could not predict a job id"
        assert slurmtools.wait_done(victim) == "COMPLETED"
        slurmtools.wait_done(attacker)
        source = SacctSource()
        _settled(source, victim)
        _settled(source, attacker)
        # sacct really prints the directory raw: the forged record is in its output.
        raw = slurmtools.run_as(
            None,
            ["sacct", "-n", "-P", "-X", f"--delimiter={DELIM}", "-o", "WorkDir", "-j", attacker],
        ).stdout
        assert f"{DELIM}{attacker}\n{victim}{DELIM}" in raw
        jobs = source.get_jobs([victim, attacker])
        owner = pwd.getpwnam("sgtest2")
        assert (jobs[victim].user, jobs[victim].uid) == ("sgtest2", owner.pw_uid)
        assert jobs[victim].restarts == 0 and jobs[victim].state == "COMPLETED"
        assert (jobs[attacker].user, jobs[attacker].uid) == ("sgtest1", sgtest1.pw_uid)
        assert jobs[attacker].restarts == 0
        # The text query read the crafted name whole (cleaned), for its own job only.
        assert source.last_text_dropped == 0
        assert jobs[attacker].work_dir == clean_user_text(str(crafted), WORK_DIR_MAX_LEN)
    finally:
        shutil.rmtree(sgtest2_dir, ignore_errors=True)
        shutil.rmtree(attacker_base, ignore_errors=True)
