"""How each ``srun`` step of a job ended, read with Slurm's semantics.

A step's state alone does not say whose the failure was. When a job reaches its time limit,
or a node fails under it, or its batch script returns while steps still run, Slurm ends the
steps itself: they show CANCELLED or FAILED with a signal (9, 15) or with exit code 0 or 127
(the shell's code for a process that did not finish), at the job's end. Those are not the
user's failures: a time-out is the time limit's, a node failure the site's. Only a step that
failed on its own (an exit code of its program, OUT_OF_MEMORY) is the user's failure.
"""

from __future__ import annotations

from enum import StrEnum

from slurm_gpu.records import JobRecord, JobStep

#: Signals Slurm sends to end a step (SIGKILL after KillWait, SIGTERM first).
KILL_SIGNALS = frozenset({9, 15})
#: Exit codes of a step Slurm ended rather than one that failed: 0 (ended by a signal that
#: its shell reported as 0) and 127 (the launcher's code for a task that did not complete).
KILLED_EXIT_CODES = frozenset({0, 127})
#: Job reasons that name a failed node (Slurm's ``FAIL_DOWN_NODE`` is printed ``NodeDown``).
NODE_DOWN_REASONS = frozenset({"NodeDown", "NodeFail", "NODE_FAIL"})
#: A step that ended this close to its job's end (seconds) ended with the job: Slurm's
#: KillWait (30 s by default) and the epilog lie between the two end times.
AT_JOB_END_S = 120.0


class StepEnd(StrEnum):
    """Why a task step ended, and so whose it is."""

    COMPLETED = "completed"
    OWN_FAILURE = "own_failure"
    """It failed on its own (its program's exit code, OUT_OF_MEMORY): the user's."""
    TIME_LIMIT = "time_limit"
    """Ended by the time limit (its own TIMEOUT, or killed when the job timed out)."""
    NODE_FAILURE = "node_failure"
    """Ended because a node failed (NODE_FAIL, or killed when the job's node failed): the
    site's."""
    USER_CANCEL = "user_cancel"
    """Ended by a ``scancel`` (CANCELLED by a uid, or killed when the job was cancelled)."""
    JOB_END = "job_end"
    """Still running when the job itself ended (its batch script returned): Slurm ended it."""


def node_failure(job: JobRecord) -> bool:
    """Whether a node under the job failed: the job ended NODE_FAIL, or any of its steps did
    (a job that says FAILED after a node failure keeps a NODE_FAIL step), or its last reason
    names a node that went down."""
    if job.state == "NODE_FAIL" or any(st.state == "NODE_FAIL" for st in job.steps):
        return True
    return job.reason in NODE_DOWN_REASONS


def _killed(st: JobStep) -> bool:
    """Ended the way Slurm ends a step: CANCELLED or FAILED with a kill signal or exit code
    0/127 (not a program's own non-zero exit code)."""
    if st.state not in ("CANCELLED", "FAILED"):
        return False
    if st.exit_signal in KILL_SIGNALS:
        return True
    if st.exit_signal:
        return False  # another signal (a segmentation fault): the program's own end
    return st.exit_code in KILLED_EXIT_CODES


def _at_job_end(st: JobStep, job: JobRecord) -> bool:
    """The step ended with its job (or when either end is unknown, which Slurm leaves only
    for steps it ended itself)."""
    if st.end_s is None or job.end_s is None:
        return True
    return job.end_s - st.end_s <= AT_JOB_END_S


def step_end(st: JobStep, job: JobRecord, node_failed: bool) -> StepEnd:
    """Why task step ``st`` of ``job`` ended; ``node_failed``: ``node_failure(job)``."""
    if st.state == "NODE_FAIL":
        return StepEnd.NODE_FAILURE
    if st.state == "TIMEOUT":
        return StepEnd.TIME_LIMIT
    if _killed(st) and _at_job_end(st, job):
        if job.state == "TIMEOUT":
            return StepEnd.TIME_LIMIT
        if node_failed:
            return StepEnd.NODE_FAILURE
        if job.state == "CANCELLED" or st.cancelled_by_uid is not None:
            return StepEnd.USER_CANCEL
        return StepEnd.JOB_END
    if st.state == "CANCELLED":
        return StepEnd.USER_CANCEL
    if st.failed:
        return StepEnd.OWN_FAILURE
    return StepEnd.COMPLETED
