"""Assemble the reports ``gpueff`` shows: accounting first (visibility), then telemetry.

The seams are small protocols so the CLI can plug in the real store and spool and the tests
plug in fakes:

- ``AccountingSource`` (``slurm_gpu.accounting.base``) answers as the *calling* user, so Slurm's
  ``PrivateData`` decides what that user may see. A job accounting does not return is "not
  found", and nothing about it is read from the store or the spool.
- ``TelemetryReader`` returns what is known about a job's GPUs: the final, stored part for an
  ended job, or the live spool summary for a running one.

Overlap. Accounting (one ``sacct`` process, 0.1-0.3 s) and the store read are independent, so
``start_lookup``/``start_recent`` ask accounting in a background thread and, meanwhile, let a
reader that can (``prefetch``) read the store and word the findings. Nothing read that way
reaches a report until ``finish`` has accounting's answer: only jobs accounting returned to
the calling user are reported. A thread rather than a ``Popen`` inside ``SacctSource``: it
works for every ``AccountingSource`` (pyslurm, the fakes of the tests) without changing the
seam, and ``sacct``'s batching, timeout and error mapping stay on their one code path; the
thread waits on the child's pipes with the GIL released, and ``sacct`` itself is another
process, so both really run at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

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


class Prefetching(Protocol):
    """What a reader may add to ``TelemetryReader`` to read ahead while accounting answers.

    Both are best effort and show nothing: they only warm what ``final`` returns later.
    """

    def prefetch(self, ids: Sequence[str]) -> None:
        """Read the stored jobs these accounting queries (``1234``, ``1234_7``) may name."""
        ...

    def prefetch_user(self, user: str, since_s: float, until_s: float, limit: int) -> None:
        """Read ``user``'s newest ``limit`` stored jobs of ``[since_s, until_s]``."""
        ...


T = TypeVar("T")


class _InBackground(Generic[T]):
    """One call run in a daemon thread; ``result`` joins it and re-raises its error."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpueff-accounting", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


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


class PendingLookup:
    """A lookup whose accounting query runs while the caller does other work."""

    def __init__(
        self,
        ids: Sequence[str],
        asked: _InBackground[dict[str, JobRecord]],
        reader: TelemetryReader,
    ) -> None:
        self._ids = list(ids)
        self._asked = asked
        self._reader = reader

    def finish(self, *, min_elapsed_s: float) -> Lookup:
        """Wait for accounting, then build reports for what it returned. Raises
        ``AccountingError`` when accounting cannot be asked."""
        found = self._asked.result()
        groups: list[tuple[str, tuple[JobReport, ...]]] = []
        missing: list[str] = []
        for typed in self._ids:
            jobs = sorted((j for j in found.values() if _matches(typed, j)), key=_task_order)
            if not jobs:
                missing.append(typed)
                continue
            reports = tuple(report_for(j, self._reader, min_elapsed_s=min_elapsed_s) for j in jobs)
            groups.append((typed, reports))
        return Lookup(groups=tuple(groups), missing=tuple(missing))


def start_lookup(
    ids: Sequence[str], accounting: AccountingSource, reader: TelemetryReader
) -> PendingLookup:
    """Ask accounting about the ids as typed (in the background) and, meanwhile, let the
    reader read ahead. Raises ``UsageError`` for a malformed id, before anything starts."""
    queries = [parse_job_id(i).query for i in ids]
    asked = _InBackground(lambda: accounting.get_jobs(queries))
    prefetch = getattr(reader, "prefetch", None)
    if prefetch is not None:
        prefetch(queries)
    return PendingLookup(ids, asked, reader)


def lookup(
    ids: Sequence[str],
    accounting: AccountingSource,
    reader: TelemetryReader,
    *,
    min_elapsed_s: float,
) -> Lookup:
    """Reports for the ids as typed. Raises ``UsageError`` for a malformed id,
    ``AccountingError`` when accounting cannot be asked."""
    return start_lookup(ids, accounting, reader).finish(min_elapsed_s=min_elapsed_s)


def not_found_error(missing: Sequence[str]) -> JobNotFoundError:
    """The error for ids accounting did not return (unknown, or hidden from this user)."""
    return JobNotFoundError(
        f"job {', '.join(missing)} not found",
        hint="check the id; accounting shows you only your own jobs (and those of accounts "
        "you coordinate), and forgets jobs after the site's retention period",
    )


class PendingRecent:
    """A listing whose accounting query runs while the caller does other work."""

    def __init__(
        self, asked: _InBackground[list[JobRecord]], reader: TelemetryReader, limit: int
    ) -> None:
        self._asked = asked
        self._reader = reader
        self._limit = limit

    def finish(self, *, min_elapsed_s: float) -> tuple[JobReport, ...]:
        """Wait for accounting; reports of the jobs it returned, newest first."""
        jobs = self._asked.result()
        jobs = sorted(jobs, key=lambda j: (j.submit_s or 0.0, j.job_id), reverse=True)
        return tuple(
            report_for(j, self._reader, min_elapsed_s=min_elapsed_s) for j in jobs[: self._limit]
        )


def start_recent(
    accounting: AccountingSource,
    reader: TelemetryReader,
    *,
    user: str,
    since_s: float,
    until_s: float,
    limit: int,
) -> PendingRecent:
    """Ask accounting for ``user``'s jobs in ``[since_s, until_s]`` (in the background) and,
    meanwhile, let the reader read ahead."""
    asked = _InBackground(lambda: accounting.jobs_between(since_s, until_s, [user]))
    prefetch = getattr(reader, "prefetch_user", None)
    if prefetch is not None:
        prefetch(user, since_s, until_s, limit)
    return PendingRecent(asked, reader, limit)


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
    pending = start_recent(
        accounting, reader, user=user, since_s=since_s, until_s=until_s, limit=limit
    )
    return pending.finish(min_elapsed_s=min_elapsed_s)
