"""The steps of ``slurm-gpu demo run`` after the jobs ended, each through the same command a
site or a user would run: ``slurm-gpu collect``, ``gpueff JOBID`` as the job's owner,
``slurm-gpu mail`` as Slurm's MailProg runs it, ``slurm-gpu report weekly``.

The command runner is injected (``Runner``) so that tests can fake the commands.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from slurm_gpu.demo.submit import Runner, run_command
from slurm_gpu.errors import UsageError


def tool(name: str) -> str:
    """The console script ``name`` installed beside this interpreter (``slurm-gpu``, ``gpueff``).

    Raises ``UsageError`` when it is not there (slurm-gpu not installed in this environment).
    """
    path = Path(sys.executable).with_name(name)
    if not path.is_file():
        raise UsageError(
            f"{path} does not exist", hint="install slurm-gpu into this environment (make venv)"
        )
    return str(path)


def as_user(argv: Sequence[str], user: str | None, env: Mapping[str, str]) -> list[str]:
    """``argv`` with ``env`` set, run as ``user`` through runuser when given."""
    cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


def collect_until_stored(
    collect_argv: Sequence[str],
    job_ids: Sequence[str],
    stored: Callable[[Sequence[str]], set[str]],
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    runner: Runner = run_command,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> set[str]:
    """Run the collector until every job of ``job_ids`` is in the store (accounting settles a
    few seconds after a job ends, so one pass may not be enough). Returns the jobs still
    missing at the timeout (empty when all are stored)."""
    deadline = clock() + timeout_s
    while True:
        runner(list(collect_argv))
        missing = set(job_ids) - stored(job_ids)
        if not missing or clock() >= deadline:
            return missing
        sleep(poll_s)


@dataclass(frozen=True, slots=True)
class EndedJob:
    """What Slurm tells its MailProg about a job that ended."""

    job_id: str
    name: str
    state: str
    elapsed_s: int
    exit_code: int


def mail_subject(job: EndedJob) -> str:
    """The subject slurmctld gives an END mail, e.g. ``Slurm Job_id=12 Name=train Ended, Run
    time 00:00:41, COMPLETED, ExitCode 0``."""
    h, rest = divmod(max(job.elapsed_s, 0), 3600)
    m, s = divmod(rest, 60)
    verb = "Ended" if job.state == "COMPLETED" else "Failed"
    return (
        f"Slurm Job_id={job.job_id} Name={job.name} {verb}, Run time {h:02d}:{m:02d}:{s:02d}, "
        f"{job.state}, ExitCode {job.exit_code}"
    )


def mail_command(
    mail_argv: Sequence[str], job: EndedJob, recipient: str
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment with which slurmctld runs MailProg for ``job``'s END mail
    (``--foreground``: the demo waits for the message instead of detaching)."""
    env = dict(os.environ)
    env.update(
        SLURM_JOB_ID=job.job_id,
        SLURM_JOB_MAIL_TYPE="Ended" if job.state == "COMPLETED" else "Failed",
        SLURM_JOB_STATE=job.state,
    )
    return [*mail_argv, "--foreground", "-s", mail_subject(job), recipient], env


def iso_utc(epoch_s: float) -> str:
    """``2026-11-21T10:12:03`` in UTC, as ``report weekly --since`` takes it."""
    return datetime.fromtimestamp(int(epoch_s), UTC).strftime("%Y-%m-%dT%H:%M:%S")
