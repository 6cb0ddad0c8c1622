"""Assemble the reports ``gpueff`` shows: accounting first (visibility), then telemetry.

The seams are small protocols so the CLI can plug in the real store and spool and the tests
plug in fakes:

- ``AccountingSource`` (``slurm_gpu.accounting.base``) answers as the *calling* user, so Slurm's
  ``PrivateData`` decides what that user may see. A job accounting does not return is "not
  found", and nothing about it is read from the store or the spool.
- ``TelemetryReader`` returns what is known about a job's GPUs: the final, stored part for an
  ended job, or the live spool summary for a running one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_gpu.accounting.base import AccountingSource
from slurm_gpu.accounting.jobids import parse_job_id
from slurm_gpu.errors import JobNotFoundError
from slurm_gpu.records import JobRecord
from slurm_gpu.userreport.adapter import RUNNING_STATES, accounting_report, with_telemetry
from slurm_gpu.userreport.model import JobReport, Telemetry, TelemetryStatus

#: Statuses that no telemetry can change: say so instead of showing numbers.
_NOTHING_TO_READ = frozenset(
    {TelemetryStatus.NOT_STARTED, TelemetryStatus.NO_GPU, TelemetryStatus.TOO_SHORT}
)


class TelemetryReader(Protocol):
    """Where the GPU part of a report comes from."""

    def final(self, job: JobRecord) -> Telemetry | None:
        """The stored telemetry of an ended job; ``None`` when not (yet) stored."""
        ...

    def live(self, job: JobRecord) -> Telemetry | None:
        """The live summary of a running job; ``None`` when not readable."""
        ...


@dataclass(frozen=True, slots=True)
class Lookup:
    """The reports found for the ids asked, and the ids not found (in the order asked)."""

    groups: tuple[tuple[str, tuple[JobReport, ...]], ...]
    """(id as typed, its reports): one report for a job or task, every task for an array."""
    missing: tuple[str, ...]


def report_for(job: JobRecord, reader: TelemetryReader, *, min_elapsed_s: float) -> JobReport:
    """One job's report: accounting part, then live or final telemetry where there is some."""
    base = accounting_report(job, min_elapsed_s=min_elapsed_s)
    if base.telemetry in _NOTHING_TO_READ:
        return base
    tel = reader.live(job) if job.state in RUNNING_STATES else reader.final(job)
    if tel is None:
        return base
    return with_telemetry(
        base,
        tel.gpus,
        live=tel.live,
        live_updated_s=tel.updated_s,
        findings=tel.findings,
        recommendations=tel.recommendations,
        notes=tel.notes,
    )


def _matches(typed: str, job: JobRecord) -> bool:
    """Whether accounting's ``job`` answers the id the user typed."""
    parsed = parse_job_id(typed)
    if parsed.array_task is not None:
        return job.array_job_id == parsed.job and job.array_task_id == parsed.array_task
    if parsed.het_offset is not None:
        return job.het_job_id == parsed.job and job.het_job_offset == parsed.het_offset
    return parsed.job in (job.job_id, job.array_job_id, job.het_job_id)


def _task_order(job: JobRecord) -> tuple[int, str]:
    task = job.array_task_id or ""
    return (int(task) if task.isdigit() else -1, job.job_id)


def lookup(
    ids: Sequence[str],
    accounting: AccountingSource,
    reader: TelemetryReader,
    *,
    min_elapsed_s: float,
) -> Lookup:
    """Reports for the ids as typed. Raises ``UsageError`` for a malformed id,
    ``AccountingError`` when accounting cannot be asked."""
    queries = [parse_job_id(i).query for i in ids]
    found = accounting.get_jobs(queries)
    groups: list[tuple[str, tuple[JobReport, ...]]] = []
    missing: list[str] = []
    for typed in ids:
        jobs = sorted((j for j in found.values() if _matches(typed, j)), key=_task_order)
        if not jobs:
            missing.append(typed)
            continue
        reports = tuple(report_for(j, reader, min_elapsed_s=min_elapsed_s) for j in jobs)
        groups.append((typed, reports))
    return Lookup(groups=tuple(groups), missing=tuple(missing))


def not_found_error(missing: Sequence[str]) -> JobNotFoundError:
    """The error for ids accounting did not return (unknown, or hidden from this user)."""
    return JobNotFoundError(
        f"job {', '.join(missing)} not found",
        hint="check the id; accounting shows you only your own jobs (and those of accounts "
        "you coordinate), and forgets jobs after the site's retention period",
    )


def recent(
    accounting: AccountingSource,
    reader: TelemetryReader,
    *,
    user: str,
    since_s: float,
    until_s: float,
    min_elapsed_s: float,
    limit: int,
) -> tuple[JobReport, ...]:
    """Reports of ``user``'s jobs in ``[since_s, until_s]``, newest first, at most ``limit``."""
    jobs = accounting.jobs_between(since_s, until_s, [user])
    jobs = sorted(jobs, key=lambda j: (j.submit_s or 0.0, j.job_id), reverse=True)[:limit]
    return tuple(report_for(j, reader, min_elapsed_s=min_elapsed_s) for j in jobs)
