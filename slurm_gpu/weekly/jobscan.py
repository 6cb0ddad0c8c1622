"""One streamed pass over a period's GPU jobs: every per-job figure of the weekly report.

The database does the joins and the grouping: one statement returns, per job of the period and
per GPU model it ran on, its allocation, the sums over those GPUs (duty cycle, busy, wasted and
observed GPU-hours, energy, idle head and tail) and the cause of its most important finding.
The rows come in job order and are read in chunks; ``PeriodScan`` folds them into running
totals, each row once. What it keeps grows with the number of users, accounts, partitions
and models (a few thousand at most), not with the number of jobs, except the measured jobs'
duty cycles (8 bytes each, ``array('d')``) for the exact median.

Float sums are added one job at a time in job-id order, so figures can differ from a sum in
another order in the last bits (about 1e-15 relative).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import (
    Connection,
    Engine,
    Float,
    String,
    and_,
    case,
    cast,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
)

from slurm_gpu.store.schema import findings, job_gpus, jobs
from slurm_gpu.weekly import prefetch
from slurm_gpu.weekly.model import (
    CAUSES,
    CauseShare,
    GroupUsage,
    Headline,
    HistogramBin,
    IdleEdgeJob,
    IdleEdgeSummary,
    Period,
    UserWorstJobs,
    WorstJob,
)

HISTOGRAM_BIN_PCT = 10.0
NO_FINDING_LABEL = "No finding (unexplained)"
#: Result rows fetched from the database at a time (memory per chunk, not per period).
CHUNK_ROWS = 10_000


# --------------------------------------------------------------------------- SQL pieces


def gpu_job() -> Any:
    """A GPU job that has ended."""
    return and_(jobs.c.alloc_gpus > 0, jobs.c.end_s.is_not(None))


def in_period(period: Period) -> Any:
    """A GPU job that ended in ``period`` (``since <= end_s < until``)."""
    return and_(jobs.c.end_s >= period.since_s, jobs.c.end_s < period.until_s, gpu_job())


def alloc_gh() -> Any:
    """A job's allocated GPU-hours."""
    return func.coalesce(
        jobs.c.gpu_hours, jobs.c.alloc_gpus * cast(jobs.c.elapsed_s, Float) / 3600.0
    )


def gpu_hours() -> Any:
    """One GPU's hours in its job: the job's elapsed time."""
    return cast(jobs.c.elapsed_s, Float) / 3600.0


def gpu_active(hours: Any) -> Any:
    """Busy GPU-hours of one GPU: mean duty cycle × hours (NULL when not observed)."""
    return hours * job_gpus.c.util_mean_pct / 100.0


def gpu_wasted(hours: Any, unused_max_duty_pct: float) -> Any:
    """Wasted GPU-hours of one GPU, as the analysis counts them: the whole span of an unused
    GPU, else the share of readings that were idle (NULL when not observed)."""
    g = job_gpus.c
    return case(
        (g.util_mean_pct.is_(None), None),
        (g.util_mean_pct <= unused_max_duty_pct, hours),
        else_=hours * func.coalesce(g.idle_fraction, 0.0),
    )


def gpu_observed(hours: Any) -> Any:
    """Hours of a GPU that reported a utilization (0 otherwise)."""
    return case((job_gpus.c.util_mean_pct.is_not(None), hours), else_=0.0)


def never_used_cond(unused_max_duty_pct: float) -> Any:
    """An allocated GPU the job did not use (or, unread, on which no process was seen)."""
    g = job_gpus.c
    return or_(
        g.util_mean_pct <= unused_max_duty_pct,
        and_(g.util_mean_pct.is_(None), not_(g.process_seen)),
    )


def trouble_cond() -> Any:
    """A GPU with throttling, ECC errors or XID events."""
    g = job_gpus.c
    return or_(
        g.throttle_power_s > 0,
        g.throttle_thermal_s > 0,
        func.coalesce(g.ecc_corrected, 0) > 0,
        func.coalesce(g.ecc_uncorrected, 0) > 0,
        g.xid_events != "",
    )


def _top_finding(column: Any) -> Any:
    """``column`` of the job's most important finding that names a cause (lowest ``seq``)."""
    f = findings.c
    return (
        select(column)
        .where(f.job_id == jobs.c.job_id, f.cause.is_not(None))
        .order_by(f.seq)
        .limit(1)
        .scalar_subquery()
    )


def scan_statement(period: Period, unused_max_duty_pct: float, *, full: bool = True) -> Any:
    """One row per (job of ``period``, GPU model); a job without GPU rows has one row with
    ``n_gpus = 0``. Ordered by end time and job id, so that a job's rows are adjacent.
    (Never-used GPUs and hardware trouble, a few GPUs in a hundred, come from
    ``gpuflags.flags_statement``.)

    ``full=False``: what the headline needs only, one row per job (names, finding code, model
    and idle head and tail are NULL), for the previous period."""
    g = job_gpus.c
    hours = gpu_hours()
    # An inline constant, not a bound parameter: PostgreSQL must see the GROUP BY expression
    # and the selected one as the same.
    model = func.coalesce(g.model, literal_column("'(unknown)'"))
    ever_active = g.active_first_time_s.is_not(None)
    head = case((ever_active, func.coalesce(g.idle_head_s, 0.0)), else_=None)
    tail = case((ever_active, func.coalesce(g.idle_tail_s, 0.0)), else_=None)

    key = (jobs.c.end_s, jobs.c.job_id, *((model,) if full else ()))

    def only_full(expr: Any, label: str) -> Any:
        return (expr if full else null()).label(label)

    return (
        select(
            jobs.c.job_id,
            only_full(jobs.c.job_id_display, "job_id_display"),
            only_full(jobs.c.user, "user"),
            only_full(jobs.c.account, "account"),
            only_full(jobs.c.partition, "partition"),
            jobs.c.alloc_gpus,
            jobs.c.elapsed_s,
            jobs.c.gpu_hours,
            # The finding's cause and code in one subquery: "<cause> <code>".
            _top_finding(
                cast(findings.c.cause, String) + literal_column("' '") + findings.c.code
            ).label("finding"),
            only_full(model, "model"),
            func.count(g.uuid).label("n_gpus"),
            func.sum(g.util_mean_pct).label("util_sum"),
            func.count(g.util_mean_pct).label("util_n"),
            func.sum(gpu_wasted(hours, unused_max_duty_pct)).label("wasted"),
            func.sum(g.energy_j).label("energy_j"),
            only_full(func.min(head), "head_s"),
            only_full(func.min(tail), "tail_s"),
            only_full(func.sum(head + tail), "edge_s"),
        )
        .select_from(jobs.outerjoin(job_gpus, g.job_id == jobs.c.job_id))
        .where(in_period(period))
        # The job's other columns depend on its primary key (SQL:2003 functional dependency,
        # which PostgreSQL and SQLite both accept): a short sort key. The end time leads so
        # that SQLite reads the period through its end-time index: grouped by the job id alone,
        # it would rather walk every job of the store in primary-key order.
        .group_by(*key)
        .order_by(*key)
    )


# Positions in a row of ``scan_statement`` (rows are read as tuples: no per-row lookups).
(
    _ID,
    _DISPLAY,
    _USER,
    _ACCOUNT,
    _PARTITION,
    _GPUS,
    _ELAPSED,
    _GH,
    _FINDING,
    _MODEL,
    _N_GPUS,
    _UTIL_SUM,
    _UTIL_N,
    _WASTED,
    _ENERGY,
    _HEAD,
    _TAIL,
    _EDGE,
) = range(18)


# --------------------------------------------------------------------------- running totals


def _add(a: float | None, b: Any) -> float | None:
    """SQL's SUM of two partial sums: NULL only when both are."""
    if b is None:
        return a
    return float(b) if a is None else a + float(b)


def _lo(a: float | None, b: Any) -> float | None:
    """SQL's MIN of two partial minima (NULLs ignored)."""
    if b is None:
        return a
    return float(b) if a is None else min(a, float(b))


def _f(value: Any) -> float:
    """A value that may be NULL as a float (NaN for NULL, as a DataFrame held it)."""
    return math.nan if value is None else float(value)


@dataclass(slots=True)
class _Group:
    """Running totals of one user, account, partition or GPU model (GPU-hours; a model's over
    its GPUs, its waste by the cause of each GPU's job)."""

    jobs: int = 0
    alloc: float = 0.0
    observed: float = 0.0
    active: float = 0.0
    wasted: float = 0.0
    wasted_by_cause: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WeekTotals:
    """A period's totals as one week of the trend (GPU-hours)."""

    jobs: int
    gpu_hours_allocated: float
    gpu_hours_observed: float
    gpu_hours_active: float
    gpu_hours_wasted: float


class TopN:
    """The ``n`` smallest items by ``key`` seen so far (a sorted list of at most ``n``)."""

    __slots__ = ("items", "keys", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.keys: list[tuple[Any, ...]] = []
        self.items: list[Any] = []

    def offer(self, key: tuple[Any, ...], make: Callable[[], Any]) -> None:
        if self.n <= 0 or (len(self.keys) >= self.n and key >= self.keys[-1]):
            return
        at = bisect.bisect_right(self.keys, key)
        self.keys.insert(at, key)
        self.items.insert(at, make())
        if len(self.keys) > self.n:
            del self.keys[-1], self.items[-1]


class PeriodScan:
    """The running totals of one period's jobs; feed it with ``scan``."""

    def __init__(
        self,
        *,
        idle_edge_min_s: float,
        table_rows: int,
        worst_per_user: int,
        headline_only: bool = False,
    ) -> None:
        self.headline_only = headline_only
        """Only the headline and the week's totals (rows of ``scan_statement(full=False)``)."""
        self.edge_min_s = idle_edge_min_s
        self.worst_per_user = worst_per_user
        self.jobs = 0
        self.jobs_measured = 0
        self.jobs_with_findings = 0
        self.alloc = 0.0
        self.unmeasured_alloc = 0.0
        self.observed = 0.0
        self.active = 0.0
        self.wasted = 0.0
        self.energy_j = 0.0
        self.energy_seen = False
        self.duty = array("d")
        n_bins = int(100 / HISTOGRAM_BIN_PCT)
        self.bin_jobs = [0] * n_bins
        self.bin_hours = [0.0] * n_bins
        self.groups: dict[str, dict[str, _Group]] = {"user": {}, "account": {}, "partition": {}}
        self.worst: dict[str, TopN] = {}
        self.cause_jobs: dict[int, int] = {}
        self.cause_wasted: dict[int, float] = {}
        self.edge_jobs = 0
        self.edge_gh = 0.0
        self.edge_top = TopN(table_rows)
        self.models: dict[str, _Group] = {}

    # ----------------------------------------------------------------- feeding

    def add_job(self, parts: list[Any]) -> None:
        """Fold one job (its rows of ``scan_statement``) into the totals."""
        j = parts[0]
        hours = _hours(j)
        util_sum, util_n = j[_UTIL_SUM], j[_UTIL_N]
        wasted, energy = j[_WASTED], j[_ENERGY]
        head, tail, edge = j[_HEAD], j[_TAIL], j[_EDGE]
        if len(parts) > 1:
            for p in parts[1:]:
                util_sum = _add(util_sum, p[_UTIL_SUM])
                util_n += p[_UTIL_N]
                wasted = _add(wasted, p[_WASTED])
                energy = _add(energy, p[_ENERGY])
                head = _lo(head, p[_HEAD])
                tail = _lo(tail, p[_TAIL])
                edge = _add(edge, p[_EDGE])
        cause: int | None = None
        code: str | None = None
        if j[_FINDING] is not None:
            number, _, code = str(j[_FINDING]).partition(" ")
            cause = int(number)
        if not self.headline_only:
            self._per_model(parts, hours, cause)
        # Every GPU of a job lasts its elapsed time: busy GPU-hours are the hours times the
        # sum of the GPUs' duty cycles, observed ones the hours times the GPUs read.
        active = _active(hours, util_sum)
        observed = None if hours is None else util_n * hours
        duty = float(util_sum) / util_n if util_n else None
        alloc = _alloc(j)
        self.jobs += 1
        if alloc is not None:
            self.alloc += alloc
        if cause is not None:
            self.jobs_with_findings += 1
        if duty is None:
            # Not measured: allocated only, never active or wasted.
            if alloc is not None:
                self.unmeasured_alloc += alloc
            active = wasted = observed = None
        else:
            self.jobs_measured += 1
            if observed is not None:
                self.observed += observed
            if active is not None:
                self.active += active
            if wasted is not None:
                self.wasted += wasted
            if energy is not None:
                self.energy_j += energy
                self.energy_seen = True
            self.duty.append(duty)
            b = min(max(int(duty // HISTOGRAM_BIN_PCT), 0), len(self.bin_jobs) - 1)
            self.bin_jobs[b] += 1
            self.bin_hours[b] += 0.0 if alloc is None else alloc
        if not self.headline_only:
            self._groups_worst_edges(
                j, duty, (cause, code), alloc, observed, active, wasted, head, tail, edge
            )

    def _groups_worst_edges(
        self,
        j: Any,
        duty: float | None,
        finding: tuple[int | None, str | None],
        alloc: float | None,
        observed: float | None,
        active: float | None,
        wasted: float | None,
        head: float | None,
        tail: float | None,
        edge: float | None,
    ) -> None:
        """Users, accounts, partitions, causes, worst jobs and idle edges: one job's share."""
        cause = finding[0]
        for name, pos in (("user", _USER), ("account", _ACCOUNT), ("partition", _PARTITION)):
            key = "(none)" if j[pos] is None else str(j[pos])
            grp = self.groups[name].get(key)
            if grp is None:
                grp = self.groups[name][key] = _Group()
            grp.jobs += 1
            if alloc is not None:
                grp.alloc += alloc
            if observed is not None:
                grp.observed += observed
            if active is not None:
                grp.active += active
            if wasted is not None:
                grp.wasted += wasted
                if cause is not None:
                    grp.wasted_by_cause[cause] = grp.wasted_by_cause.get(cause, 0.0) + wasted
        if wasted is not None:
            key_c = cause or 0
            self.cause_jobs[key_c] = self.cause_jobs.get(key_c, 0) + 1
            self.cause_wasted[key_c] = self.cause_wasted.get(key_c, 0.0) + wasted
            if j[_USER] is not None:
                self._offer_worst(j, duty, wasted, alloc, finding)
        if (head is not None and head >= self.edge_min_s) or (
            tail is not None and tail >= self.edge_min_s
        ):
            idle_gh = _f(edge) / 3600.0
            self.edge_jobs += 1
            if not math.isnan(idle_gh):
                self.edge_gh += idle_gh
            self.edge_top.offer(
                (-idle_gh, str(j[_ID])),
                lambda: IdleEdgeJob(
                    job_id=str(j[_ID]),
                    job_id_display=str(j[_DISPLAY]),
                    user=str(j[_USER]),
                    gpus=int(j[_GPUS]),
                    elapsed_s=_f(j[_ELAPSED]),
                    idle_head_s=_f(head),
                    idle_tail_s=_f(tail),
                    gpu_hours_idle=idle_gh,
                ),
            )

    def _offer_worst(
        self,
        j: Any,
        duty: float | None,
        wasted: float,
        alloc: float | None,
        finding: tuple[int | None, str | None],
    ) -> None:
        user = str(j[_USER])
        top = self.worst.get(user)
        if top is None:
            top = self.worst[user] = TopN(self.worst_per_user)
        top.offer(
            (-wasted, str(j[_ID])),
            lambda: WorstJob(
                job_id=str(j[_ID]),
                job_id_display=str(j[_DISPLAY]),
                user=user,
                account=None if j[_ACCOUNT] is None else str(j[_ACCOUNT]),
                partition=None if j[_PARTITION] is None else str(j[_PARTITION]),
                gpus=int(j[_GPUS]),
                elapsed_s=_f(j[_ELAPSED]),
                duty_cycle_pct=duty,
                gpu_hours_allocated=_f(alloc),
                gpu_hours_wasted=wasted,
                cause=finding[0],
                finding_code=finding[1],
            ),
        )

    def _per_model(self, parts: list[Any], hours: float | None, cause: int | None) -> None:
        """GPU models: sums over the job's GPUs of each model (``hours``: one GPU's), their
        waste also under the job's ``cause``."""
        for p in parts:
            if not p[_N_GPUS]:
                continue
            key = str(p[_MODEL])
            m = self.models.get(key)
            if m is None:
                m = self.models[key] = _Group()
            m.jobs += 1  # rows are per (job, model): one per model of the job
            if hours is not None:
                m.alloc += p[_N_GPUS] * hours
                m.observed += p[_UTIL_N] * hours
            m.active += _active(hours, p[_UTIL_SUM]) or 0.0
            m.wasted += _nz(p[_WASTED])
            if cause is not None and p[_WASTED] is not None:
                by_cause = m.wasted_by_cause
                by_cause[cause] = by_cause.get(cause, 0.0) + float(p[_WASTED])

    # ----------------------------------------------------------------- results

    def headline(self) -> Headline:
        """The period's totals."""
        # The exact median (the mean of the two middle values for an even count), taken by
        # numpy on the 8-byte values in place: no Python float object per job.
        median = float(np.median(np.frombuffer(self.duty))) if self.duty else None
        return Headline(
            jobs=self.jobs,
            jobs_measured=self.jobs_measured,
            jobs_with_findings=self.jobs_with_findings,
            gpu_hours_allocated=self.alloc,
            gpu_hours_unmeasured=self.unmeasured_alloc,
            gpu_hours_active=self.active,
            gpu_hours_wasted=self.wasted,
            duty_cycle_median_pct=median,
            duty_cycle_weighted_pct=100.0 * self.active / self.observed
            if self.observed > 0
            else None,
            energy_kwh=self.energy_j / 3.6e6 if self.energy_seen else None,
        )

    def week(self) -> WeekTotals:
        """The period as a week of the trend."""
        return WeekTotals(self.jobs, self.alloc, self.observed, self.active, self.wasted)

    def histogram(self) -> tuple[HistogramBin, ...]:
        """Measured jobs in 10 %-wide duty-cycle bins, with their allocated GPU-hours."""
        return tuple(
            HistogramBin(
                lo_pct=i * HISTOGRAM_BIN_PCT,
                hi_pct=(i + 1) * HISTOGRAM_BIN_PCT,
                jobs=self.bin_jobs[i],
                gpu_hours_allocated=self.bin_hours[i],
            )
            for i in range(len(self.bin_jobs))
        )

    def group_usage(self, name: str, limit: int | None, order: str) -> tuple[GroupUsage, ...]:
        """Per user, account or partition (``name``), ordered by ``order`` (``wasted`` or
        ``alloc``) then key, at most ``limit``; each with its main cause (largest waste; among
        equals the lowest cause number)."""
        groups = self.groups[name]

        def rank(key: str) -> tuple[float, str]:
            g = groups[key]
            return (-(g.wasted if order == "wasted" else g.alloc), key)

        keys = sorted(groups, key=rank)
        if limit is not None:
            keys = keys[:limit]
        return tuple(_usage(key, groups[key]) for key in keys)

    def worst_jobs(self, users: list[str]) -> tuple[UserWorstJobs, ...]:
        """The most wasteful measured jobs of each of ``users``, in that order."""
        return tuple(
            UserWorstJobs(
                user=user,
                anchor=f"user-{n + 1}",
                jobs=tuple(self.worst[user].items) if user in self.worst else (),
            )
            for n, user in enumerate(users)
        )

    def causes(self) -> tuple[CauseShare, ...]:
        """Wasted GPU-hours per cause 1–7, then the waste with no finding."""
        return tuple(
            CauseShare(
                cause=cause or None,
                label=CAUSES.get(cause, NO_FINDING_LABEL),
                jobs=self.cause_jobs.get(cause, 0),
                gpu_hours_wasted=self.cause_wasted.get(cause, 0.0),
            )
            for cause in [*CAUSES, 0]
        )

    def idle_edges(self) -> IdleEdgeSummary:
        """Jobs whose GPUs all idled at least ``idle_edge_min_s`` at the start or the end."""
        return IdleEdgeSummary(
            jobs=self.edge_jobs, gpu_hours_idle=self.edge_gh, worst=tuple(self.edge_top.items)
        )

    def by_gpu_model(self) -> tuple[GroupUsage, ...]:
        """Per GPU model, over the GPUs in the store (largest allocation first), each with its
        main cause as ``group_usage``'s."""
        out = [_usage(key, m) for key, m in self.models.items()]
        out.sort(key=lambda u: (-u.gpu_hours_allocated, u.key))
        return tuple(out)


def _usage(key: str, g: _Group) -> GroupUsage:
    """One group's row, with its main cause: the cause with the most wasted GPU-hours (among
    equals the lowest number) and those hours."""
    main = min(g.wasted_by_cause.items(), key=lambda kv: (-kv[1], kv[0]), default=None)
    return GroupUsage(
        key=key,
        jobs=g.jobs,
        gpu_hours_allocated=g.alloc,
        gpu_hours_active=g.active,
        gpu_hours_wasted=g.wasted,
        duty_cycle_weighted_pct=100.0 * g.active / g.observed if g.observed > 0 else None,
        main_cause=None if main is None else main[0],
        main_cause_gpu_hours=0.0 if main is None else main[1],
    )


def _hours(j: Any) -> float | None:
    """One GPU's hours in job row ``j``: the job's elapsed time (None when unknown)."""
    return None if j[_ELAPSED] is None else float(j[_ELAPSED]) / 3600.0


def _active(hours: float | None, util_sum: Any) -> float | None:
    """Busy GPU-hours of GPUs of ``hours`` each whose duty cycles (%) sum to ``util_sum``."""
    if hours is None or util_sum is None:
        return None
    return hours * float(util_sum) / 100.0


def _alloc(j: Any) -> float | None:
    """Allocated GPU-hours of job row ``j`` (``alloc_gh`` in Python: stored, or GPUs × hours)."""
    if j[_GH] is not None:
        return float(j[_GH])
    if j[_GPUS] is None or j[_ELAPSED] is None:
        return None
    return int(j[_GPUS]) * float(j[_ELAPSED]) / 3600.0


def _nz(value: Any) -> float:
    """A partial sum that may be NULL, as a float (0 for NULL)."""
    return 0.0 if value is None else float(value)


def scan(
    source: Connection | Engine, period: Period, unused_max_duty_pct: float, into: PeriodScan
) -> None:
    """Stream ``period``'s jobs from the store into ``into``, ``CHUNK_ROWS`` rows at a time.

    Given an engine (not a store in memory), the rows are read ahead on a connection of their
    own while this thread folds them (``slurm_gpu.weekly.prefetch``)."""
    stmt = scan_statement(period, unused_max_duty_pct, full=not into.headline_only)
    parts_of: Iterable[Sequence[Any]]
    if isinstance(source, Engine) and not prefetch.in_memory(source):
        parts_of = prefetch.chunks(source, stmt, CHUNK_ROWS)
    elif isinstance(source, Engine):
        with source.connect() as conn:
            scan(conn, period, unused_max_duty_pct, into)
        return
    else:
        parts_of = (
            source.execution_options(stream_results=True).execute(stmt).partitions(CHUNK_ROWS)
        )
    parts: list[Any] = []
    current: Any = None
    add = into.add_job
    for chunk in parts_of:
        for row in chunk:
            if row[_ID] != current:
                if parts:
                    add(parts)
                parts = [row]
                current = row[_ID]
            else:
                parts.append(row)
    if parts:
        add(parts)
