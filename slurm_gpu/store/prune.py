"""Retention: remove what the store keeps only for a while, in short transactions.

Two horizons (``[store]`` settings, days; 0 keeps for ever):

* ``timeline_retention_days``: a job's per-GPU timelines and its rendered ``gpueff`` report
  (the bulk of the store) are deleted, and ``jobs.timeline_pruned_s`` says when. The job's
  summary, per-GPU and per-host numbers and findings stay, so ``gpueff`` still answers and says
  that the timeline is gone.
* ``summary_retention_days``: the whole job (every row of it) is deleted.

A job's age is its end time (``jobs.end_s``); a job stored without one is never pruned.

Each batch of at most ``batch_jobs`` jobs is one transaction (SQLite: ``BEGIN IMMEDIATE``,
committed before the next batch), so the collector and readers wait at most one batch's
deletes, never the whole pass. Running it again prunes only what is still due: a pruned job
leaves the ``(timeline_pruned_s, end_s)`` index range that the next batch is read from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Select, and_, delete, func, select, update
from sqlalchemy.exc import SQLAlchemyError

from slurm_gpu.errors import StoreError
from slurm_gpu.store import migrations, schema

DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long the store keeps things, in days; 0 keeps them for ever."""

    timeline_days: float
    """Per-GPU timelines and rendered reports."""
    summary_days: float
    """Whole jobs: summaries, per-GPU and per-host rows, findings."""
    batch_jobs: int = 500
    """Jobs per transaction."""

    def cutoffs(self, now_s: float) -> tuple[float | None, float | None]:
        """(timeline cutoff, summary cutoff) in seconds since the epoch; ``None``: keep all."""
        return (
            now_s - self.timeline_days * DAY_S if self.timeline_days > 0 else None,
            now_s - self.summary_days * DAY_S if self.summary_days > 0 else None,
        )


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune did (or, with ``dry_run``, would do)."""

    dry_run: bool
    timeline_cutoff_s: float | None
    """Jobs that ended before this lose their timelines; ``None``: timelines kept for ever."""
    summary_cutoff_s: float | None
    """Jobs that ended before this are deleted; ``None``: jobs kept for ever."""
    jobs_deleted: int
    timelines_pruned: int
    """Jobs whose timelines and report were deleted (not counting deleted jobs)."""
    timeline_rows: int
    """``timelines`` rows deleted (one per node of a job); 0 in a dry run."""
    report_rows: int
    """``job_reports`` rows deleted; 0 in a dry run."""
    batches: int
    """Transactions committed."""
    seconds: float
    """Wall-clock time of the whole prune."""
    longest_batch_s: float
    """The longest single transaction: how long a writer could have waited on it."""


def _batches(
    engine: Engine,
    pick: Callable[[int], Select[Any]],
    act: Callable[[Connection, Sequence[str]], tuple[int, int]],
    batch_jobs: int,
) -> tuple[int, int, int, int, float]:
    """Run ``act`` on batches of ids from ``pick`` until none is left, each batch in its own
    write transaction. Returns (jobs, timeline rows, report rows, batches, longest batch s)."""
    jobs = tl_rows = rep_rows = batches = 0
    longest = 0.0
    while True:
        start = time.perf_counter()
        t = r = 0
        with migrations.write_transaction(engine) as conn:
            ids = list(conn.execute(pick(batch_jobs)).scalars())
            if ids:
                t, r = act(conn, ids)
        longest = max(longest, time.perf_counter() - start)
        if not ids:
            return jobs, tl_rows, rep_rows, batches, longest
        jobs += len(ids)
        tl_rows += t
        rep_rows += r
        batches += 1


def _count(engine: Engine, cond: ColumnElement[bool]) -> int:
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(schema.jobs).where(cond)).scalar()
    return int(n or 0)


def prune(
    engine: Engine,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    clock: Callable[[], float] = time.time,
) -> PruneResult:
    """Apply ``policy`` to the store behind ``engine`` (migrated to the latest schema).

    Raises ``StoreError`` on a database error; the batches committed before it stay pruned.
    """
    j = schema.jobs
    started = time.perf_counter()
    tl_cut, sum_cut = policy.cutoffs(clock())
    size = max(1, policy.batch_jobs)
    # Whole jobs first: their timelines then need no separate pass.
    old_jobs: ColumnElement[bool] | None = j.c.end_s < sum_cut if sum_cut is not None else None
    old_timelines: ColumnElement[bool] | None = (
        and_(j.c.timeline_pruned_s.is_(None), j.c.end_s < tl_cut) if tl_cut is not None else None
    )
    if old_timelines is not None and old_jobs is not None:
        old_timelines = and_(old_timelines, j.c.end_s >= sum_cut)
    try:
        if dry_run:
            return PruneResult(
                dry_run=True,
                timeline_cutoff_s=tl_cut,
                summary_cutoff_s=sum_cut,
                jobs_deleted=_count(engine, old_jobs) if old_jobs is not None else 0,
                timelines_pruned=_count(engine, old_timelines) if old_timelines is not None else 0,
                timeline_rows=0,
                report_rows=0,
                batches=0,
                seconds=time.perf_counter() - started,
                longest_batch_s=0.0,
            )
        deleted = (0, 0, 0, 0, 0.0)
        if old_jobs is not None:
            cond = old_jobs

            def pick_jobs(n: int) -> Select[Any]:
                return select(j.c.job_id).where(cond).order_by(j.c.end_s).limit(n)

            def delete_jobs(conn: Connection, ids: Sequence[str]) -> tuple[int, int]:
                counts: dict[str, int] = {}
                for table in schema.JOB_CHILD_TABLES:
                    res = conn.execute(delete(table).where(table.c.job_id.in_(ids)))
                    counts[table.name] = res.rowcount
                conn.execute(delete(j).where(j.c.job_id.in_(ids)))
                return counts["timelines"], counts["job_reports"]

            deleted = _batches(engine, pick_jobs, delete_jobs, size)
        pruned = (0, 0, 0, 0, 0.0)
        if old_timelines is not None:
            tl_cond = old_timelines

            def pick_timelines(n: int) -> Select[Any]:
                return select(j.c.job_id).where(tl_cond).order_by(j.c.end_s).limit(n)

            def drop_timelines(conn: Connection, ids: Sequence[str]) -> tuple[int, int]:
                tl, rep = schema.timelines, schema.job_reports
                t = conn.execute(delete(tl).where(tl.c.job_id.in_(ids))).rowcount
                r = conn.execute(delete(rep).where(rep.c.job_id.in_(ids))).rowcount
                conn.execute(update(j).where(j.c.job_id.in_(ids)).values(timeline_pruned_s=clock()))
                return t, r

            pruned = _batches(engine, pick_timelines, drop_timelines, size)
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise StoreError(
            f"store prune: {detail}",
            hint="the batches before this one stay pruned; run `slurm-gpu store prune` again",
        ) from None
    return PruneResult(
        dry_run=False,
        timeline_cutoff_s=tl_cut,
        summary_cutoff_s=sum_cut,
        jobs_deleted=deleted[0],
        timelines_pruned=pruned[0],
        timeline_rows=deleted[1] + pruned[1],
        report_rows=deleted[2] + pruned[2],
        batches=deleted[3] + pruned[3],
        seconds=time.perf_counter() - started,
        longest_batch_s=max(deleted[4], pruned[4]),
    )
