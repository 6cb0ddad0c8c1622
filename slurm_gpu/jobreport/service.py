"""Assemble the reports ``gpueff`` shows: accounting first (visibility), then telemetry.

The seams are small protocols so the CLI can plug in the real store and spool and the tests
plug in fakes:

- ``AccountingSource`` (``slurm_gpu.accounting.base``) answers as the *calling* user, so Slurm's
  ``PrivateData`` decides what that user may see. A job accounting does not return is "not
  found", and nothing about it is shown.
- ``TelemetryReader`` returns what is known about a job's GPUs: the final, stored part for an
  ended job, or the live spool summary for a running one.

Owner fast path. Slurm always shows users their own jobs (``PrivateData`` hides only other
users' jobs) and shows root every job, and a settled job's accounting no longer changes. So
when the store holds the very job an id names, settled and owned by the calling uid (or the
caller is root), accounting would add nothing: ``start_lookup`` reads the store first (a few
milliseconds) and asks accounting only for the ids the store cannot answer that way
(``answer_from_store``; ``docs/gpueff.md``, "Who can see what").

Overlap. Accounting (one ``sacct`` process, 0.1-0.3 s) and the rest of the work are
independent, so ``start_lookup``/``start_recent`` ask accounting in a background thread and,
meanwhile, let a reader that can (``prefetch``) read the store and word the findings. Nothing
read that way reaches a report until ``finish`` has accounting's answer: only jobs accounting
returned to the calling user (or the owner path answered) are reported.

A thread rather than a ``Popen`` inside ``SacctSource``: it works for every
``AccountingSource`` (pyslurm, the fakes of the tests) without changing the seam, and
``sacct``'s batching, timeout and error mapping stay on their one code path; the thread waits
on the child's pipes with the GIL released, and ``sacct`` itself is another
process, so both really run at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from slurm_gpu.accounting.base import AccountingSource, is_settled
from slurm_gpu.accounting.jobids import answers, parse_job_id
from slurm_gpu.background import InBackground
from slurm_gpu.errors import JobNotFoundError
from slurm_gpu.jobreport.adapter import RUNNING_STATES, accounting_report, with_telemetry
from slurm_gpu.jobreport.model import JobReport, Telemetry, TelemetryStatus
from slurm_gpu.records import JobRecord

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


class StoreFirst(Protocol):
    """What a reader may add to ``TelemetryReader`` so the store can answer before accounting."""

    def read_stored(self, queries: Sequence[str]) -> Sequence[JobRecord]:
        """The stored (ended, collected) jobs these accounting queries (``1234``, ``1234_7``)
        may name, with their accounting as stored. Best effort: ``()`` when the store cannot
        be read (``final`` raises the error if a job accounting returns needs the store)."""
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
    if tel.page_base_url:
        base = replace(base, page_url=page_url(tel.page_base_url, job.job_id_display))
    if tel.uncollected:
        # Ended, not in the store yet: still "not collected yet", with the node's last live
        # numbers where it still has them.
        models = sorted({g.name for g in tel.gpus if g.name})
        return replace(
            base,
            gpus=tel.gpus,
            gpu_model=", ".join(models) if models else base.gpu_model,
            notes=tuple(tel.notes),
            live_updated_s=tel.updated_s,
            live_source=tel.source or None,
        )
    if tel.live and not tel.gpus:
        # No live number here (no Prometheus, or it did not answer): the accounting part
        # as before, and the reason, never an empty GPU part that would read as idle.
        return replace(base, notes=tuple(tel.notes))
    return with_telemetry(
        base,
        tel.gpus,
        live=tel.live,
        live_updated_s=tel.updated_s,
        findings=tel.findings,
        recommendations=tel.recommendations,
        notes=tel.notes,
        timeline_note=tel.timeline_note,
        live_actions=tel.live_actions,
        live_source=tel.source,
        energy_settings=tel.energy_settings,
    )


def page_url(base_url: str, job_id_display: str) -> str:
    """The job's web page under ``[web] base_url``: ``<base>/job/<id>`` (``1234_7`` as is)."""
    from urllib.parse import quote

    return f"{base_url.rstrip('/')}/job/{quote(job_id_display, safe='_+')}"


class AccountingNeeded(Exception):
    """Raised by ``NoAccounting``: the answer needs accounting, which is not to be asked."""


class NoAccounting:
    """Accounting for a lookup that must be answered from the store alone (``gpueff``'s fast
    entry, the collector's rendering of reports): being asked at all means it cannot be."""

    name = "none"

    def get_jobs(self, job_ids: object) -> dict[str, JobRecord]:
        raise AccountingNeeded

    def jobs_between(self, *args: object, **kwargs: object) -> list[JobRecord]:
        raise AccountingNeeded


def _matches(typed: str, job: JobRecord) -> bool:
    """Whether accounting's ``job`` answers the id the user typed."""
    return answers(
        typed, job.job_id, job.array_job_id, job.array_task_id, job.het_job_id, job.het_job_offset
    )


def _task_order(job: JobRecord) -> tuple[int, str]:
    task = job.array_task_id or ""
    return (int(task) if task.isdigit() else -1, job.job_id)


def answer_from_store(
    typed: str, stored: Sequence[JobRecord], caller_uid: int | None
) -> JobRecord | None:
    """The stored job that answers the id ``typed`` exactly as accounting would, or ``None``
    when accounting must be asked.

    Accounting adds nothing, and may be skipped, only when all of these hold:

    - the caller's uid is known;
    - the id names one job or one array task or het component, and the store holds exactly
      that one job for it. A plain id that is an array or a het job is not answered: the
      store holds only the collected GPU tasks, accounting knows all of them;
    - the stored job belongs to the caller (its ``uid``), or the caller is root: Slurm shows
      every user their own jobs whatever ``PrivateData`` says, and root every job;
    - its stored accounting is settled (``is_settled``: a final state, end time and TRES
      known), so asking again could not give a newer answer.
    """
    if caller_uid is None:
        return None
    parsed = parse_job_id(typed)
    if parsed.array_task is not None and not parsed.array_task.isdigit():
        return None  # a range of tasks: only accounting knows which exist
    matches = [j for j in stored if _matches(typed, j)]
    if len(matches) != 1:
        return None
    (job,) = matches
    if (
        parsed.array_task is None
        and parsed.het_offset is None
        and (job.job_id != parsed.job or job.array_job_id is not None or job.het_job_id is not None)
    ):
        return None
    if job.uid is None or not is_settled(job):
        return None
    if caller_uid != 0 and job.uid != caller_uid:
        return None
    return job


class PendingLookup:
    """A lookup whose accounting query (if one was needed) runs while the caller does other
    work."""

    def __init__(
        self,
        ids: Sequence[str],
        answered: dict[str, JobRecord],
        asked: InBackground[dict[str, JobRecord]] | None,
        reader: TelemetryReader,
    ) -> None:
        self._ids = list(ids)
        self._answered = answered
        self._asked = asked
        self._reader = reader

    @property
    def asked_accounting(self) -> bool:
        """Whether accounting was asked (``False``: the store answered every id)."""
        return self._asked is not None

    def finish(self, *, min_elapsed_s: float) -> Lookup:
        """Wait for accounting, then build reports for what it (or, for the caller's own
        settled jobs, the store) returned. Raises ``AccountingError`` when accounting cannot
        be asked."""
        found = self._asked.result() if self._asked is not None else {}
        groups: list[tuple[str, tuple[JobReport, ...]]] = []
        missing: list[str] = []
        for typed in self._ids:
            own = self._answered.get(typed)
            if own is not None:
                jobs = [own]
            else:
                jobs = sorted((j for j in found.values() if _matches(typed, j)), key=_task_order)
            if not jobs:
                missing.append(typed)
                continue
            reports = tuple(report_for(j, self._reader, min_elapsed_s=min_elapsed_s) for j in jobs)
            groups.append((typed, reports))
        return Lookup(groups=tuple(groups), missing=tuple(missing))


def start_lookup(
    ids: Sequence[str],
    accounting: AccountingSource,
    reader: TelemetryReader,
    *,
    caller_uid: int | None = None,
) -> PendingLookup:
    """Answer the ids as typed: from the store where ``answer_from_store`` allows it (a reader
    with ``read_stored`` and the caller's real ``caller_uid``), else by asking accounting in
    the background while the reader reads ahead. Raises ``UsageError`` for a malformed id,
    before anything starts."""
    queries = [parse_job_id(i).query for i in ids]
    answered: dict[str, JobRecord] = {}
    read_stored = getattr(reader, "read_stored", None)
    if caller_uid is not None and read_stored is not None:
        stored = read_stored(queries)
        for typed in ids:
            job = answer_from_store(typed, stored, caller_uid)
            if job is not None:
                answered[typed] = job
    rest = list(dict.fromkeys(q for t, q in zip(ids, queries, strict=True) if t not in answered))
    if not rest:
        return PendingLookup(ids, answered, None, reader)
    asked = InBackground(lambda: accounting.get_jobs(rest))
    prefetch = getattr(reader, "prefetch", None)
    if prefetch is not None:
        prefetch(rest)
    return PendingLookup(ids, answered, asked, reader)


def lookup(
    ids: Sequence[str],
    accounting: AccountingSource,
    reader: TelemetryReader,
    *,
    min_elapsed_s: float,
    caller_uid: int | None = None,
) -> Lookup:
    """Reports for the ids as typed. Raises ``UsageError`` for a malformed id,
    ``AccountingError`` when accounting cannot be asked."""
    pending = start_lookup(ids, accounting, reader, caller_uid=caller_uid)
    return pending.finish(min_elapsed_s=min_elapsed_s)


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
        self, asked: InBackground[list[JobRecord]], reader: TelemetryReader, limit: int
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
    asked = InBackground(lambda: accounting.jobs_between(since_s, until_s, [user]))
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
