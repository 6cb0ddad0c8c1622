"""A pass's options, what it counts while it runs (``PassTally``) and its report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CollectorOptions:
    """Timing and batching of the collector (``[collector]`` and ``[accounting]`` settings)."""

    batch_size: int = 500
    """Jobs per accounting query and per store transaction (with the report step, a batch is
    committed in parts of at most ``REPORT_PART_JOBS``)."""
    node_wait_s: float = 600.0
    """How long after a job's end to wait for every node's record before ingesting what
    exists (the others are listed in ``missing_hosts``)."""
    settle_timeout_s: float = 3600.0
    """How long after the newest record to wait for accounting to settle before storing the
    job as accounting has it (or quarantining the records when accounting never knew it)."""
    missing_lookback_s: float = 86400.0
    """How far back the missing-telemetry pass looks for ended GPU jobs."""
    missing_grace_s: float = 600.0
    """A GPU job is declared ``missing`` only this long after it ended (its record may still
    be on its way)."""
    done_retention_s: float = 3 * 86400.0
    """How long ingested files stay in ``<state_dir>/done/`` for debugging."""
    analysis_version: str | None = None
    """Stored with the findings of the ``analyse`` hook."""


@dataclass(frozen=True, slots=True)
class CollectReport:
    """What one pass did; every tuple holds job ids unless named otherwise."""

    ingested: tuple[str, ...] = ()
    missing_telemetry: tuple[str, ...] = ()
    """GPU jobs stored without any record."""
    partial: tuple[str, ...] = ()
    """Ingested with some nodes' records missing."""
    waiting_nodes: tuple[str, ...] = ()
    """Left in the spool: not every node has sealed yet."""
    unsettled: tuple[str, ...] = ()
    """Left in the spool: accounting not settled yet."""
    no_accounting: tuple[str, ...] = ()
    """Left in the spool: accounting does not know the job (yet)."""
    quarantined: tuple[str, ...] = ()
    """Paths of the files moved to quarantine (``postgresql inbox: <job>/<host>`` for rows
    moved to the inbox's quarantine table)."""
    analysis_failed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    """One line per accounting failure (the affected jobs stay in the spool)."""
    admin_comment_written: tuple[str, ...] = ()
    """Stored jobs whose JS1 summary was written into AdminComment."""
    admin_comment_failed: tuple[str, ...] = ()
    """Stored GPU jobs whose summary was not written (failed, or writing had stopped)."""
    accounting_mismatch: tuple[str, ...] = ()
    """Jobs not stored because accounting disagrees with their sealed records (owner uid or
    node list, ``collector.crosscheck``); their records are in quarantine."""
    source_errors: tuple[str, ...] = ()
    """One line per job a pulled source could not be read for (``collector.pull``; the job
    is retried at the next pass)."""


@dataclass
class PassTally:
    ingested: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)
    no_accounting: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    analysis_failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    admin_comment_written: list[str] = field(default_factory=list)
    admin_comment_failed: list[str] = field(default_factory=list)
    accounting_mismatch: list[str] = field(default_factory=list)
    source_errors: list[str] = field(default_factory=list)

    def report(self) -> CollectReport:
        return CollectReport(
            ingested=tuple(self.ingested),
            missing_telemetry=tuple(self.missing),
            partial=tuple(self.partial),
            waiting_nodes=tuple(self.waiting),
            unsettled=tuple(self.unsettled),
            no_accounting=tuple(self.no_accounting),
            quarantined=tuple(self.quarantined),
            analysis_failed=tuple(self.analysis_failed),
            errors=tuple(self.errors),
            admin_comment_written=tuple(self.admin_comment_written),
            admin_comment_failed=tuple(self.admin_comment_failed),
            accounting_mismatch=tuple(self.accounting_mismatch),
            source_errors=tuple(self.source_errors),
        )
