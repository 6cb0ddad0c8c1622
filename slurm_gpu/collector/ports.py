"""What the collector's pass talks to, as protocols: accounting, the AdminComment and report
publishers, the spool's records and the PostgreSQL inbox. The real ones live in their
adapters; tests hand in their own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.store import (
    FindingLike,
    JobBundle,
)

Analyse = Callable[[JobRecord, Sequence[NodeRecord]], Sequence[FindingLike]]


class Accounting(Protocol):
    """What the collector needs of ``slurm_gpu.accounting.AccountingSource``."""

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]: ...

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]: ...


class CommentPublisher(Protocol):
    """Writes stored jobs' summaries into AdminComment (``collector.admincomment``); never
    raises, returns (job ids written, job ids not written)."""

    def publish(self, bundles: Sequence[JobBundle]) -> tuple[list[str], list[str]]: ...


class ReportPublisher(Protocol):
    """Renders stored jobs' ``gpueff`` reports into the store
    (``slurm_gpu.jobreport.prerender``); never raises, returns how many were written or
    handed to its report worker. Work it leaves running (the worker's reports, the owners'
    report files) is done when ``flush`` returns."""

    def publish(self, jobs: Sequence[JobRecord]) -> int: ...

    def flush(self) -> None: ...


class SealedLike(Protocol):
    """A sealed record's location (``slurm_gpu.capture.spool.SealedRecord``)."""

    @property
    def job_id(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def path(self) -> str: ...


class InboxRowLike(Protocol):
    """A record pushed into the PostgreSQL inbox (``slurm_gpu.store.inbox.InboxRow``)."""

    @property
    def job_id(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def digest(self) -> str: ...
    @property
    def data(self) -> bytes | None: ...
    @property
    def key(self) -> tuple[str, str, str]: ...


class Inbox(Protocol):
    """The collector's side of the PostgreSQL inbox (``slurm_gpu.store.inbox.PgInbox``)."""

    def pending(self, only: Collection[str] | None = None) -> Sequence[InboxRowLike]: ...

    def take(self, conn: Any, keys: Sequence[tuple[str, str, str]]) -> None: ...

    def quarantine(self, row: Any, reason: str) -> None: ...


class RecordReader(Protocol):
    """The spool's read side (``slurm_gpu.capture.spool``)."""

    def list_sealed(self, spool_dir: str) -> Sequence[SealedLike]: ...

    def read_record(self, path: str) -> NodeRecord: ...
