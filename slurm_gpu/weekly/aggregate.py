"""The weekly report's numbers, computed over the store.

The database does the joins and every ``GROUP BY``: one statement per period returns one row
per job (and GPU model and node it ran on) with its sums over its GPUs and findings, streamed
in chunks and folded into running totals (``slurm_gpu.weekly.jobscan``); a few more grouped
statements give the never-used GPUs' list, the XID codes, the live policy's actions and the
older weeks of the trend. Memory does not grow with the number of jobs (except 8 bytes per
measured job for the exact median), and no statement is run twice over the same jobs: the
report's week and the previous one are also the trend's last two weeks.

Definitions (``docs/report.md`` explains them for readers of the report):

- A job belongs to the period in which it **ended** (``since <= end_s < until``); only GPU jobs
  (``alloc_gpus > 0``) count.
- Allocated GPU-hours: ``jobs.gpu_hours`` (allocated GPUs × elapsed hours).
- A job's duty cycle: the mean over its GPUs (every node) of each GPU's mean NVML utilization.
  A job is *measured* when at least one of its GPUs reported a utilization.
- Active and wasted GPU-hours follow the analysis (``slurm_gpu.analysis.metrics``), so the
  report agrees with ``gpueff`` and the mail users get: per observed GPU, active = mean duty
  cycle × elapsed hours; wasted = elapsed hours for an unused GPU (mean duty cycle at or below
  ``unused_max_duty_pct``), else the share of idle readings × elapsed hours. What is neither
  active nor wasted is time when kernels ran only part of the time. Jobs without telemetry
  count in allocated (and in ``gpu_hours_unmeasured``), never in active or wasted.
- The weighted duty cycle is active over observed GPU-hours (the GPU-hours of GPUs with a
  utilization reading).
- Cause attribution: a job's wasted GPU-hours go, whole, to the cause of its most important
  finding that names a cause (the analysis returns findings most important first, ``seq``
  ascending); waste of a job without such a finding is "no finding".
- A never-used GPU is an unused GPU in the analysis's sense (above), or one never read on
  which no compute process was seen. Its GPU-hours are the job's elapsed hours.
- Idle head/tail: per GPU that was ever active, the idle span before its first active reading
  and after its last one. A job is listed when, on every active GPU, the head (or the tail)
  lasted at least ``idle_edge_min_s``; its idle GPU-hours are the sum of heads and tails.
- The live policy's actions count with their job, in the period the job ended in; GPU-hours
  stopped from being wasted are ``actionrows.stopped_per_action`` (a job's first cancellation:
  idle GPUs × the time left until its time limit, an upper bound), as ``gpueff`` shows them.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, case, func, literal, select
from sqlalchemy.exc import SQLAlchemyError

from slurm_gpu.errors import StoreError
from slurm_gpu.gcpace import fewer_collections
from slurm_gpu.store.actionrows import stopped_per_action
from slurm_gpu.store.schema import job_gpus, jobs, live_actions
from slurm_gpu.weekly import prefetch
from slurm_gpu.weekly.gpuflags import FlagScan, scan_flags
from slurm_gpu.weekly.jobscan import (
    PeriodScan,
    WeekTotals,
    alloc_gh,
    gpu_active,
    gpu_hours,
    gpu_observed,
    gpu_wasted,
    in_period,
    scan,
)
from slurm_gpu.weekly.model import (
    LivePolicyRule,
    LivePolicySummary,
    Period,
    TrendWeek,
    WeeklyReport,
)

WEEK_S = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """Knobs of the aggregation (from the ``[report]`` settings)."""

    site_name: str = "slurm-gpu"
    top_n: int = 10
    """Rows in the top users / top accounts tables."""
    worst_jobs_per_user: int = 5
    table_rows: int = 25
    """Most rows in the never-used and idle head/tail tables."""
    trend_weeks: int = 8
    idle_edge_min_s: float = 600.0
    unused_max_duty_pct: float = 1.0
    """The analysis's threshold: a GPU whose mean duty cycle is at or below it was unused."""


def last_full_week(now_s: float) -> Period:
    """The last full ISO week (Monday 00:00 to Monday 00:00, UTC) before ``now_s``."""
    day = int(now_s // 86400)
    # 1970-01-01 was a Thursday: day 0 has weekday 3 (Monday = 0).
    monday = (day - (day + 3) % 7) * 86400.0
    return Period(since_s=monday - WEEK_S, until_s=monday)


# --------------------------------------------------------------------------- SQL-only parts


def trend_weeks(
    conn: Connection, span: Period, starts: list[float], unused_max_duty_pct: float
) -> dict[int, WeekTotals]:
    """Totals of the weeks starting at ``starts`` (indexes into them) for the jobs that ended
    in ``span``, from two GROUP BYs (jobs, GPUs)."""
    if not starts:
        return {}
    # A CASE ladder, not FLOOR(): SQLite has no floor() unless built with math functions.
    week = case(
        *((jobs.c.end_s < start + WEEK_S, literal(i)) for i, start in enumerate(starts)),
        else_=literal(len(starts) - 1),
    ).label("week")
    per_job = conn.execute(
        select(week, func.count().label("jobs"), func.sum(alloc_gh()).label("alloc"))
        .where(in_period(span))
        .group_by(week)
    ).all()
    hours = gpu_hours()
    per_gpu = conn.execute(
        select(
            week,
            func.coalesce(func.sum(gpu_observed(hours)), 0.0).label("observed"),
            func.coalesce(func.sum(gpu_active(hours)), 0.0).label("active"),
            func.coalesce(func.sum(gpu_wasted(hours, unused_max_duty_pct)), 0.0).label("wasted"),
        )
        .select_from(job_gpus.join(jobs, jobs.c.job_id == job_gpus.c.job_id))
        .where(in_period(span))
        .group_by(week)
    ).all()
    jobs_of = {int(r.week): (int(r.jobs), float(r.alloc or 0.0)) for r in per_job}
    gpu_of = {int(r.week): (float(r.observed), float(r.active), float(r.wasted)) for r in per_gpu}
    out = {}
    for i in range(len(starts)):
        n, alloc = jobs_of.get(i, (0, 0.0))
        observed, active, wasted = gpu_of.get(i, (0.0, 0.0, 0.0))
        out[i] = WeekTotals(n, alloc, observed, active, wasted)
    return out


def trend(
    conn: Connection,
    until_s: float,
    weeks: int,
    unused_max_duty_pct: float,
    newest: tuple[WeekTotals, ...] = (),
) -> tuple[TrendWeek, ...]:
    """Weekly totals for the ``weeks`` weeks ending at ``until_s``. ``newest`` holds totals
    already computed for the last weeks, oldest first (the previous week and the report's
    week, when the report is of one week): only the other weeks are asked of the store."""
    starts = [until_s - (weeks - i) * WEEK_S for i in range(weeks)]
    known = list(newest[len(newest) - weeks :]) if weeks < len(newest) else list(newest)
    ask = starts[: weeks - len(known)]
    asked = (
        trend_weeks(conn, Period(ask[0], ask[-1] + WEEK_S), ask, unused_max_duty_pct) if ask else {}
    )
    totals = [asked[i] for i in range(len(ask))] + known
    return tuple(
        TrendWeek(
            since_s=start,
            until_s=start + WEEK_S,
            jobs=t.jobs,
            gpu_hours_allocated=t.gpu_hours_allocated,
            gpu_hours_active=t.gpu_hours_active,
            gpu_hours_wasted=t.gpu_hours_wasted,
            duty_cycle_weighted_pct=100.0 * t.gpu_hours_active / t.gpu_hours_observed
            if t.gpu_hours_observed > 0
            else None,
        )
        for start, t in zip(starts, totals, strict=True)
    )


def live_policy(conn: Connection, period: Period) -> LivePolicySummary:
    """The live policy's actions on the GPU jobs that ended in ``period``, per rule. One query;
    the loop is over actions (a few per warned job), not over the period's jobs."""
    la = live_actions
    rows = conn.execute(
        select(la.c.job_id, la.c.rule, la.c.action, la.c.gpus, la.c.at_s)
        .add_columns(jobs.c.start_s, jobs.c.time_limit_s)
        .select_from(la.join(jobs, jobs.c.job_id == la.c.job_id))
        .where(in_period(period))
    ).all()
    jobs_by: dict[tuple[str, str], set[str]] = {}
    per_job: dict[str, list[Any]] = {}
    for r in sorted(rows, key=lambda r: (r.job_id, r.at_s)):
        jobs_by.setdefault((r.rule, r.action), set()).add(r.job_id)
        jobs_by.setdefault(("", r.action), set()).add(r.job_id)
        per_job.setdefault(r.job_id, []).append(r)
    stopped: dict[str, float] = {}
    unlimited: set[str] = set()
    for job_id, acts in per_job.items():
        # The function gpueff's report uses, on the same actions: the same numbers.
        for r, gh in zip(
            acts, stopped_per_action(acts, acts[0].start_s, acts[0].time_limit_s), strict=True
        ):
            if gh is None:
                unlimited.add(job_id)
            stopped[r.rule] = stopped.get(r.rule, 0.0) + (gh or 0.0)

    def n(rule: str, action: str) -> int:
        return len(jobs_by.get((rule, action), ()))

    rules = tuple(
        LivePolicyRule(
            rule=rule,
            jobs_warned=n(rule, "warned"),
            jobs_cancelled=n(rule, "cancelled"),
            jobs_would_warn=n(rule, "would_warn"),
            jobs_would_cancel=n(rule, "would_cancel"),
            gpu_hours_stopped=stopped.get(rule, 0.0),
        )
        for rule in sorted({r.rule for r in rows})
    )
    return LivePolicySummary(
        jobs_warned=n("", "warned"),
        jobs_cancelled=n("", "cancelled"),
        gpu_hours_stopped=sum(stopped.values()),
        cancelled_without_limit=len(unlimited),
        rules=rules,
    )


# --------------------------------------------------------------------------- the report


def build_report(
    engine: Engine,
    period: Period,
    options: ReportOptions | None = None,
    *,
    now_s: float | None = None,
) -> WeeklyReport:
    """Compute every aggregate of the weekly report for ``period``.

    Raises ``StoreError`` when the store cannot be read.
    """
    opts = options or ReportOptions()
    length = period.until_s - period.since_s
    if length <= 0:
        from slurm_gpu.errors import UsageError

        raise UsageError("the report period is empty", hint="--since must come before --until")
    previous = Period(since_s=period.since_s - length, until_s=period.since_s)
    thr = opts.unused_max_duty_pct

    def new_scan(headline_only: bool) -> PeriodScan:
        return PeriodScan(
            idle_edge_min_s=opts.idle_edge_min_s,
            table_rows=opts.table_rows,
            worst_per_user=opts.worst_jobs_per_user,
            headline_only=headline_only,
        )

    def side_scans(conn: Connection | None) -> tuple[PeriodScan, FlagScan]:
        """The previous week and the week's flagged GPUs (on a new connection if not given)."""
        prev = new_scan(True)
        flags = FlagScan(opts.table_rows)
        with contextlib.ExitStack() as stack:
            side = conn or stack.enter_context(engine.connect())
            scan(side, previous, thr, prev)
            scan_flags(side, period, thr, flags)
        return prev, flags

    try:
        # Three readers at once, each on its own connection: the week's rows are read ahead
        # (slurm_gpu.weekly.prefetch) while this thread folds them, and the previous week and
        # the flagged GPUs are read and folded on a second thread. The databases execute
        # statements without holding the GIL, so a second core is put to work: mostly by the
        # second thread's statements, as SQLite steps a grouped statement's rows one by one
        # under the GIL once it has joined and sorted them (docs/report.md). A store in
        # memory has no second connection to it: read in turn. The rows of a chunk and the
        # running totals hold no reference cycles: fewer collections (``gcpace``), which at
        # the default thresholds took 0.52 s of a 100,000-job week (docs/performance.md).
        alone = prefetch.in_memory(engine)
        with (
            fewer_collections(),
            ThreadPoolExecutor(max_workers=1) as pool,
            engine.connect() as conn,
        ):
            side = None if alone else pool.submit(side_scans, None)
            now = new_scan(False)
            scan(conn if alone else engine, period, thr, now)
            prev, flags = side_scans(conn) if side is None else side.result()
            # A report of one week is the trend's last week, and the previous one its
            # second to last: their totals are not asked of the store again.
            is_week = period.until_s - WEEK_S == period.since_s
            newest = (prev.week(), now.week()) if is_week else ()
            users = now.group_usage("user", opts.top_n, "wasted")
            report = WeeklyReport(
                site_name=opts.site_name,
                generated_s=time.time() if now_s is None else now_s,
                period=period,
                previous_period=previous,
                headline=now.headline(),
                previous_headline=prev.headline(),
                histogram=now.histogram(),
                by_gpu_model=now.by_gpu_model(),
                by_partition=now.group_usage("partition", None, "alloc"),
                top_users=users,
                top_accounts=now.group_usage("account", opts.top_n, "wasted"),
                worst_jobs=now.worst_jobs([u.key for u in users]),
                causes=now.causes(),
                never_used=flags.never_used(),
                idle_edges=now.idle_edges(),
                hardware=flags.hardware(),
                trend=trend(conn, period.until_s, opts.trend_weeks, thr, newest),
                idle_edge_min_s=opts.idle_edge_min_s,
                live_policy=live_policy(conn, period),
            )
    except SQLAlchemyError as exc:
        raise StoreError(
            f"cannot read the store: {type(exc).__name__}: {exc.args[0] if exc.args else ''}",
            hint="check [store] url and run `slurm-gpu store migrate`",
        ) from exc
    return report
