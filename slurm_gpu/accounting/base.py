"""The accounting seam: where job metadata (who, what was asked, what was used) comes from.

Two implementations: ``SacctSource`` (runs ``sacct``, every Slurm version, the default) and
``PyslurmSource`` (the optional ``pyslurm`` extra, tied to one Slurm release). Both return
``JobRecord``s with step data already folded into the job.

Visibility: both ask as the calling user, and Slurm applies ``PrivateData`` itself; a job that
accounting does not return is "not found" for that user, whether it does not exist or is
hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from slurm_gpu.records import JobRecord

#: States in which a job will not change any more (``RUNNING``, ``PENDING``, ``REQUEUED``,
#: ``SUSPENDED``, ``RESIZING`` are not final).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REVOKED",
    }
)


@runtime_checkable
class AccountingSource(Protocol):
    """Job metadata from Slurm accounting."""

    name: str
    """``sacct`` or ``pyslurm``."""

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """Look up many jobs in as few queries as possible.

        ``job_ids`` may be raw ids (``1241``), array tasks (``1234_7``), whole arrays
        (``1234``, which expands to every task), or het components (``1234+0``). The result
        maps each returned job's raw id (``JobRecord.job_id``) to its record; ids accounting
        does not return (unknown, or hidden from the calling user) are simply absent.
        Raises ``AccountingError`` when accounting cannot be asked.
        """
        ...

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        """Jobs that were eligible or running at some time in ``[start_s, end_s]`` (epoch s),
        optionally only those of ``users``. Raises ``AccountingError``."""
        ...


def is_settled(job: JobRecord) -> bool:
    """Whether accounting has everything it will ever have for this job.

    slurmdbd receives some fields a few seconds after the job ends (the end time, ReqTRES,
    the final step statistics), so a collector that runs from EpilogSlurmctld can see a record
    that is still being filled. A job is settled when its state is final, its end time is
    known and its allocated TRES are recorded (jobs that never started have none).
    """
    if job.state not in FINAL_STATES or job.end_s is None:
        return False
    if job.start_s is None or job.start_s <= 0:
        # Cancelled before it started: nothing more will arrive.
        return True
    return job.alloc_tres.raw != "" and job.req_tres.raw != ""
