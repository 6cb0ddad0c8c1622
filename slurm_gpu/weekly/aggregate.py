"""The weekly report's numbers, computed over the store.

Work is split where each tool is strong: the database does the joins and every ``GROUP BY``
(per job over its GPUs and findings, per GPU model, per node, per week of the trend), with the
same SQLAlchemy Core expressions on SQLite and PostgreSQL; pandas then works column-wise on one
row per job of the period (medians, the weighted histogram, top users and their worst jobs).
Nothing loops in Python per job.

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

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Select,
    and_,
    case,
    cast,
    func,
    literal,
    not_,
    or_,
    select,
)
from sqlalchemy.exc import SQLAlchemyError

from slurm_gpu.errors import StoreError
from slurm_gpu.store.actionrows import stopped_per_action
from slurm_gpu.store.schema import findings, job_gpus, jobs, live_actions
from slurm_gpu.weekly.model import (
    CAUSES,
    CauseShare,
    GroupUsage,
    Headline,
    HistogramBin,
    IdleEdgeJob,
    IdleEdgeSummary,
    LivePolicyRule,
    LivePolicySummary,
    NeverUsedGpu,
    NeverUsedSummary,
    NodeHardware,
    Period,
    TrendWeek,
    UserWorstJobs,
    WeeklyReport,
    WorstJob,
)

WEEK_S = 7 * 86400.0
HISTOGRAM_BIN_PCT = 10.0
NO_FINDING_LABEL = "No finding (unexplained)"


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


# --------------------------------------------------------------------------- SQL pieces


def _gpu_job() -> Any:
    return and_(jobs.c.alloc_gpus > 0, jobs.c.end_s.is_not(None))


def _in(period: Period) -> Any:
    return and_(jobs.c.end_s >= period.since_s, jobs.c.end_s < period.until_s, _gpu_job())


def _alloc_gh() -> Any:
    return func.coalesce(
        jobs.c.gpu_hours, jobs.c.alloc_gpus * cast(jobs.c.elapsed_s, Float) / 3600.0
    )


def _gpu_hours() -> Any:
    """One GPU's hours in its job: the job's elapsed time."""
    return cast(jobs.c.elapsed_s, Float) / 3600.0


def _gpu_active(hours: Any) -> Any:
    """Busy GPU-hours of one GPU: mean duty cycle × hours (NULL when not observed)."""
    return hours * job_gpus.c.util_mean_pct / 100.0


def _gpu_wasted(hours: Any, unused_max_duty_pct: float) -> Any:
    """Wasted GPU-hours of one GPU, as the analysis counts them: the whole span of an unused
    GPU, else the share of readings that were idle (NULL when not observed)."""
    g = job_gpus.c
    return case(
        (g.util_mean_pct.is_(None), None),
        (g.util_mean_pct <= unused_max_duty_pct, hours),
        else_=hours * func.coalesce(g.idle_fraction, 0.0),
    )


def _gpu_observed(hours: Any) -> Any:
    return case((job_gpus.c.util_mean_pct.is_not(None), hours), else_=0.0)


def _gpu_rollup(period: Period, unused_max_duty_pct: float) -> Any:
    """Per job of the period: duty cycle, busy/wasted GPU-hours, energy, idle head/tail."""
    g = job_gpus.c
    hours = _gpu_hours()
    ever_active = g.active_first_time_s.is_not(None)
    head = case((ever_active, func.coalesce(g.idle_head_s, 0.0)), else_=None)
    tail = case((ever_active, func.coalesce(g.idle_tail_s, 0.0)), else_=None)
    return (
        select(
            g.job_id.label("job_id"),
            func.avg(g.util_mean_pct).label("duty_pct"),
            func.sum(_gpu_active(hours)).label("gpu_hours_active"),
            func.sum(_gpu_wasted(hours, unused_max_duty_pct)).label("gpu_hours_wasted"),
            func.sum(_gpu_observed(hours)).label("gpu_hours_observed"),
            func.sum(g.energy_j).label("energy_j"),
            func.min(head).label("idle_head_s"),
            func.min(tail).label("idle_tail_s"),
            func.sum(head + tail).label("edge_s"),
        )
        .select_from(job_gpus.join(jobs, jobs.c.job_id == g.job_id))
        .where(_in(period))
        .group_by(g.job_id)
        .subquery("g")
    )


def _top_finding(period: Period) -> Any:
    """Per job of the period: the cause and code of its most important finding with a cause."""
    f = findings.c
    first = (
        select(f.job_id.label("job_id"), func.min(f.seq).label("seq"))
        .select_from(findings.join(jobs, jobs.c.job_id == f.job_id))
        .where(_in(period), f.cause.is_not(None))
        .group_by(f.job_id)
        .subquery("ff")
    )
    return (
        select(f.job_id.label("job_id"), f.cause.label("cause"), f.code.label("code"))
        .select_from(findings.join(first, and_(f.job_id == first.c.job_id, f.seq == first.c.seq)))
        .subquery("f")
    )


def _frame(conn: Connection, stmt: Select[Any], chunk_rows: int = 100_000) -> pd.DataFrame:
    """The result of ``stmt`` as a DataFrame, built in chunks: a million result rows held as
    Python row objects at once would cost more memory than the frame itself."""
    result = conn.execution_options(stream_results=True).execute(stmt)
    columns = list(result.keys())
    parts = [
        pd.DataFrame.from_records(rows, columns=columns) for rows in result.partitions(chunk_rows)
    ]
    if not parts:
        return pd.DataFrame(columns=columns)
    return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def job_frame(conn: Connection, period: Period, unused_max_duty_pct: float) -> pd.DataFrame:
    """One row per GPU job of the period with its allocation, duty cycle and main cause.

    Columns: ``job_id, job_id_display, user, account, partition, gpus, elapsed_s,
    gpu_hours_allocated, duty_pct, energy_j, idle_head_s, idle_tail_s, edge_s, cause, code,
    gpu_hours_active, gpu_hours_wasted, gpu_hours_observed`` (NaN for unmeasured jobs).
    """
    g = _gpu_rollup(period, unused_max_duty_pct)
    f = _top_finding(period)
    stmt = (
        select(
            jobs.c.job_id,
            jobs.c.job_id_display,
            jobs.c.user,
            jobs.c.account,
            jobs.c.partition,
            jobs.c.alloc_gpus.label("gpus"),
            jobs.c.elapsed_s,
            _alloc_gh().label("gpu_hours_allocated"),
            g.c.duty_pct,
            g.c.gpu_hours_active,
            g.c.gpu_hours_wasted,
            g.c.gpu_hours_observed,
            g.c.energy_j,
            g.c.idle_head_s,
            g.c.idle_tail_s,
            g.c.edge_s,
            f.c.cause,
            f.c.code,
        )
        .select_from(
            jobs.outerjoin(g, g.c.job_id == jobs.c.job_id).outerjoin(f, f.c.job_id == jobs.c.job_id)
        )
        .where(_in(period))
    )
    df = _frame(conn, stmt)
    for col in (
        "elapsed_s",
        "gpu_hours_allocated",
        "duty_pct",
        "gpu_hours_active",
        "gpu_hours_wasted",
        "gpu_hours_observed",
        "energy_j",
        "idle_head_s",
        "idle_tail_s",
        "edge_s",
    ):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["gpus"] = pd.to_numeric(df["gpus"]).astype("int64")
    df["cause"] = pd.to_numeric(df["cause"], errors="coerce").astype("Int64")
    unmeasured = df["duty_pct"].isna()
    for col in ("gpu_hours_active", "gpu_hours_wasted", "gpu_hours_observed"):
        df.loc[unmeasured, col] = np.nan
    return df


# --------------------------------------------------------------------------- pandas parts


def _opt_float(value: Any) -> float | None:
    if value is None or pd.isna(value):
        return None
    return float(value)


def headline(df: pd.DataFrame) -> Headline:
    """Totals of a job frame."""
    measured = df["duty_pct"].notna()
    m = df[measured]
    observed = float(m["gpu_hours_observed"].sum())
    active = float(m["gpu_hours_active"].sum())
    energy = m["energy_j"]
    return Headline(
        jobs=len(df),
        jobs_measured=int(measured.sum()),
        jobs_with_findings=int(df["cause"].notna().sum()),
        gpu_hours_allocated=float(df["gpu_hours_allocated"].sum()),
        gpu_hours_unmeasured=float(df.loc[~measured, "gpu_hours_allocated"].sum()),
        gpu_hours_active=active,
        gpu_hours_wasted=float(m["gpu_hours_wasted"].sum()),
        duty_cycle_median_pct=_opt_float(m["duty_pct"].median()) if len(m) else None,
        duty_cycle_weighted_pct=100.0 * active / observed if observed > 0 else None,
        energy_kwh=float(energy.sum()) / 3.6e6 if energy.notna().any() else None,
    )


def histogram(df: pd.DataFrame) -> tuple[HistogramBin, ...]:
    """Measured jobs in 10 %-wide duty-cycle bins, with their allocated GPU-hours."""
    m = df[df["duty_pct"].notna()]
    n_bins = int(100 / HISTOGRAM_BIN_PCT)
    idx = np.clip((m["duty_pct"].to_numpy() // HISTOGRAM_BIN_PCT).astype(int), 0, n_bins - 1)
    jobs_per = np.bincount(idx, minlength=n_bins)
    hours_per = np.bincount(idx, weights=m["gpu_hours_allocated"].to_numpy(), minlength=n_bins)
    return tuple(
        HistogramBin(
            lo_pct=i * HISTOGRAM_BIN_PCT,
            hi_pct=(i + 1) * HISTOGRAM_BIN_PCT,
            jobs=int(jobs_per[i]),
            gpu_hours_allocated=float(hours_per[i]),
        )
        for i in range(n_bins)
    )


def _group_usage(
    df: pd.DataFrame, key: str, limit: int | None, order: str
) -> tuple[GroupUsage, ...]:
    """Per-group totals over measured jobs, with each group's main cause."""
    if df.empty:
        return ()
    d = df.assign(_key=df[key].fillna("(none)").astype(str))
    sums = d.groupby("_key", sort=False).agg(
        jobs=("job_id", "size"),
        alloc=("gpu_hours_allocated", "sum"),
        alloc_m=("gpu_hours_observed", "sum"),
        active=("gpu_hours_active", "sum"),
        wasted=("gpu_hours_wasted", "sum"),
    )
    with_cause = d[d["cause"].notna() & d["gpu_hours_wasted"].notna()]
    by_cause = (
        with_cause.groupby(["_key", "cause"], sort=True)["gpu_hours_wasted"].sum().reset_index()
    )
    # Largest waste first; among equals the lowest cause number, for a stable answer.
    by_cause = by_cause.sort_values(
        ["_key", "gpu_hours_wasted", "cause"], ascending=[True, False, True]
    ).drop_duplicates("_key")
    sums = sums.join(by_cause.set_index("_key")[["cause", "gpu_hours_wasted"]], how="left")
    sums = sums.reset_index().sort_values([order, "_key"], ascending=[False, True])
    if limit is not None:
        sums = sums.head(limit)
    return tuple(
        GroupUsage(
            key=str(r["_key"]),
            jobs=int(r["jobs"]),
            gpu_hours_allocated=float(r["alloc"]),
            gpu_hours_active=float(r["active"]),
            gpu_hours_wasted=float(r["wasted"]),
            duty_cycle_weighted_pct=100.0 * r["active"] / r["alloc_m"]
            if r["alloc_m"] > 0
            else None,
            main_cause=None if pd.isna(r["cause"]) else int(r["cause"]),
            main_cause_gpu_hours=0.0
            if pd.isna(r["gpu_hours_wasted"])
            else float(r["gpu_hours_wasted"]),
        )
        for r in sums.to_dict("records")
    )


def worst_jobs(df: pd.DataFrame, users: Sequence[str], per_user: int) -> tuple[UserWorstJobs, ...]:
    """The ``per_user`` most wasteful measured jobs of each of ``users``, in that order."""
    m = df[df["user"].isin(list(users)) & df["gpu_hours_wasted"].notna()]
    m = m.sort_values(["gpu_hours_wasted", "job_id"], ascending=[False, True])
    top = m.groupby("user", sort=False).head(per_user)
    by_user = {u: grp for u, grp in top.groupby("user", sort=False)}
    out = []
    for n, user in enumerate(users):
        grp = by_user.get(user)
        rows = [] if grp is None else grp.to_dict("records")
        out.append(
            UserWorstJobs(
                user=user,
                anchor=f"user-{n + 1}",
                jobs=tuple(_worst_job(r) for r in rows),
            )
        )
    return tuple(out)


def _worst_job(r: Any) -> WorstJob:
    return WorstJob(
        job_id=str(r["job_id"]),
        job_id_display=str(r["job_id_display"]),
        user=str(r["user"]),
        account=None if pd.isna(r["account"]) else str(r["account"]),
        partition=None if pd.isna(r["partition"]) else str(r["partition"]),
        gpus=int(r["gpus"]),
        elapsed_s=float(r["elapsed_s"]),
        duty_cycle_pct=_opt_float(r["duty_pct"]),
        gpu_hours_allocated=float(r["gpu_hours_allocated"]),
        gpu_hours_wasted=float(r["gpu_hours_wasted"]),
        cause=None if pd.isna(r["cause"]) else int(r["cause"]),
        finding_code=None if pd.isna(r["code"]) else str(r["code"]),
    )


def causes(df: pd.DataFrame) -> tuple[CauseShare, ...]:
    """Wasted GPU-hours per cause 1–7, then the waste with no finding."""
    m = df[df["gpu_hours_wasted"].notna()]
    key = m["cause"].fillna(0).astype("int64")
    grouped = m.groupby(key)["gpu_hours_wasted"]
    totals: dict[Any, float] = {k: float(v) for k, v in grouped.sum().items()}
    counts: dict[Any, int] = {k: int(v) for k, v in grouped.size().items()}
    rows = []
    for cause in [*CAUSES, 0]:
        total = totals.get(cause, 0.0)
        count = counts.get(cause, 0)
        rows.append(
            CauseShare(
                cause=cause or None,
                label=CAUSES.get(cause, NO_FINDING_LABEL),
                jobs=count,
                gpu_hours_wasted=total,
            )
        )
    return tuple(rows)


def idle_edges(df: pd.DataFrame, min_s: float, limit: int) -> IdleEdgeSummary:
    """Jobs whose GPUs all idled at least ``min_s`` at the start or at the end."""
    hit = df[(df["idle_head_s"] >= min_s) | (df["idle_tail_s"] >= min_s)]
    hit = hit.assign(gpu_hours_idle=hit["edge_s"] / 3600.0)
    hit = hit.sort_values(["gpu_hours_idle", "job_id"], ascending=[False, True])
    worst = tuple(
        IdleEdgeJob(
            job_id=str(r["job_id"]),
            job_id_display=str(r["job_id_display"]),
            user=str(r["user"]),
            gpus=int(r["gpus"]),
            elapsed_s=float(r["elapsed_s"]),
            idle_head_s=float(r["idle_head_s"]),
            idle_tail_s=float(r["idle_tail_s"]),
            gpu_hours_idle=float(r["gpu_hours_idle"]),
        )
        for r in hit.head(limit).to_dict("records")
    )
    return IdleEdgeSummary(
        jobs=len(hit), gpu_hours_idle=float(hit["gpu_hours_idle"].sum()), worst=worst
    )


# --------------------------------------------------------------------------- SQL-only parts


def by_gpu_model(
    conn: Connection, period: Period, unused_max_duty_pct: float
) -> tuple[GroupUsage, ...]:
    """Per GPU model, over the GPUs that reported telemetry (one GROUP BY)."""
    g = job_gpus.c
    hours = _gpu_hours()
    model = func.coalesce(g.model, "(unknown)")
    stmt = (
        select(
            model.label("key"),
            func.count(func.distinct(g.job_id)).label("jobs"),
            func.sum(hours).label("alloc"),
            func.sum(_gpu_observed(hours)).label("alloc_m"),
            func.coalesce(func.sum(_gpu_active(hours)), 0.0).label("active"),
            func.coalesce(func.sum(_gpu_wasted(hours, unused_max_duty_pct)), 0.0).label("wasted"),
        )
        .select_from(job_gpus.join(jobs, jobs.c.job_id == g.job_id))
        .where(_in(period))
        .group_by(model)
    )
    out = [
        GroupUsage(
            key=str(r.key),
            jobs=int(r.jobs),
            gpu_hours_allocated=float(r.alloc),
            gpu_hours_active=float(r.active),
            gpu_hours_wasted=float(r.wasted),
            duty_cycle_weighted_pct=100.0 * float(r.active) / float(r.alloc_m)
            if float(r.alloc_m) > 0
            else None,
        )
        for r in conn.execute(stmt).all()
    ]
    out.sort(key=lambda u: (-u.gpu_hours_allocated, u.key))
    return tuple(out)


def _never_used_cond(unused_max_duty_pct: float) -> Any:
    g = job_gpus.c
    return or_(
        g.util_mean_pct <= unused_max_duty_pct,
        and_(g.util_mean_pct.is_(None), not_(g.process_seen)),
    )


def never_used(
    conn: Connection, period: Period, limit: int, unused_max_duty_pct: float
) -> NeverUsedSummary:
    """Allocated GPUs the job did not use: mean duty cycle at or below the analysis's
    ``unused_max_duty_pct`` (or, unread, no process ever seen)."""
    g = job_gpus.c
    cond = and_(_in(period), _never_used_cond(unused_max_duty_pct))
    hours = _gpu_hours()
    base = job_gpus.join(jobs, jobs.c.job_id == g.job_id)
    totals = conn.execute(
        select(
            func.count(),
            func.count(func.distinct(g.job_id)),
            func.coalesce(func.sum(hours), 0.0),
        )
        .select_from(base)
        .where(cond)
    ).one()
    rows = conn.execute(
        select(
            g.job_id,
            jobs.c.job_id_display,
            jobs.c.user,
            g.host,
            g.uuid,
            g.model,
            g.process_seen,
            g.util_mean_pct,
            hours.label("hours"),
        )
        .select_from(base)
        .where(cond)
        .order_by(hours.desc(), g.job_id, g.host, g.uuid)
        .limit(limit)
    ).all()
    return NeverUsedSummary(
        gpus=int(totals[0]),
        jobs=int(totals[1]),
        gpu_hours=float(totals[2]),
        worst=tuple(
            NeverUsedGpu(
                job_id=str(r.job_id),
                job_id_display=str(r.job_id_display),
                user=str(r.user),
                hostname=str(r.host),
                gpu_uuid=str(r.uuid),
                gpu_model=r.model,
                process_seen=bool(r.process_seen),
                duty_cycle_pct=None if r.util_mean_pct is None else float(r.util_mean_pct),
                gpu_hours=float(r.hours),
            )
            for r in rows
        ),
    )


def hardware(conn: Connection, period: Period) -> tuple[NodeHardware, ...]:
    """Per node: throttling time, ECC errors and XID codes of the period's jobs."""
    g = job_gpus.c
    trouble = or_(
        g.throttle_power_s > 0,
        g.throttle_thermal_s > 0,
        func.coalesce(g.ecc_corrected, 0) > 0,
        func.coalesce(g.ecc_uncorrected, 0) > 0,
        g.xid_events != "",
    )
    base = job_gpus.join(jobs, jobs.c.job_id == g.job_id)
    rows = conn.execute(
        select(
            g.host,
            func.count(func.distinct(g.job_id)).label("jobs"),
            func.sum(g.throttle_power_s).label("power_s"),
            func.sum(g.throttle_thermal_s).label("thermal_s"),
            func.coalesce(func.sum(g.ecc_corrected), 0).label("ecc_c"),
            func.coalesce(func.sum(g.ecc_uncorrected), 0).label("ecc_u"),
        )
        .select_from(base)
        .where(_in(period), trouble)
        .group_by(g.host)
    ).all()
    # Distinct XID codes: few rows carry any, so split them here.
    xid_rows = _frame(
        conn,
        select(g.host, g.xid_events).select_from(base).where(_in(period), g.xid_events != ""),
    )
    codes: dict[str, tuple[int, ...]] = {}
    if not xid_rows.empty:
        exploded = xid_rows.assign(code=xid_rows["xid_events"].str.split(",")).explode("code")
        exploded["code"] = pd.to_numeric(exploded["code"].str.strip(), errors="coerce")
        exploded = exploded.dropna(subset=["code"])
        for host, grp in exploded.groupby("host"):
            codes[str(host)] = tuple(sorted({int(c) for c in grp["code"]}))
    out = [
        NodeHardware(
            hostname=str(r.host),
            jobs=int(r.jobs),
            throttle_power_h=float(r.power_s or 0) / 3600.0,
            throttle_thermal_h=float(r.thermal_s or 0) / 3600.0,
            ecc_corrected=int(r.ecc_c),
            ecc_uncorrected=int(r.ecc_u),
            xid_codes=codes.get(str(r.host), ()),
        )
        for r in rows
    ]
    out.sort(
        key=lambda n: (
            -n.ecc_uncorrected,
            -len(n.xid_codes),
            -(n.throttle_power_h + n.throttle_thermal_h),
            n.hostname,
        )
    )
    return tuple(out)


def trend(
    conn: Connection, until_s: float, weeks: int, unused_max_duty_pct: float
) -> tuple[TrendWeek, ...]:
    """Weekly totals for the ``weeks`` weeks ending at ``until_s`` (two GROUP BYs)."""
    span = Period(since_s=until_s - weeks * WEEK_S, until_s=until_s)
    starts = [span.since_s + i * WEEK_S for i in range(weeks)]
    # A CASE ladder, not FLOOR(): SQLite has no floor() unless built with math functions.
    week = case(
        *((jobs.c.end_s < start + WEEK_S, literal(i)) for i, start in enumerate(starts)),
        else_=literal(weeks - 1),
    ).label("week")
    per_job = conn.execute(
        select(week, func.count().label("jobs"), func.sum(_alloc_gh()).label("alloc"))
        .where(_in(span))
        .group_by(week)
    ).all()
    hours = _gpu_hours()
    per_gpu = conn.execute(
        select(
            week,
            func.coalesce(func.sum(_gpu_observed(hours)), 0.0).label("observed"),
            func.coalesce(func.sum(_gpu_active(hours)), 0.0).label("active"),
            func.coalesce(func.sum(_gpu_wasted(hours, unused_max_duty_pct)), 0.0).label("wasted"),
        )
        .select_from(job_gpus.join(jobs, jobs.c.job_id == job_gpus.c.job_id))
        .where(_in(span))
        .group_by(week)
    ).all()
    jobs_of = {int(r.week): (int(r.jobs), float(r.alloc or 0.0)) for r in per_job}
    gpu_of = {int(r.week): (float(r.observed), float(r.active), float(r.wasted)) for r in per_gpu}
    out = []
    for i, start in enumerate(starts):
        n, alloc = jobs_of.get(i, (0, 0.0))
        observed, active, wasted = gpu_of.get(i, (0.0, 0.0, 0.0))
        out.append(
            TrendWeek(
                since_s=start,
                until_s=start + WEEK_S,
                jobs=n,
                gpu_hours_allocated=alloc,
                gpu_hours_active=active,
                gpu_hours_wasted=wasted,
                duty_cycle_weighted_pct=100.0 * active / observed if observed > 0 else None,
            )
        )
    return tuple(out)


def live_policy(conn: Connection, period: Period) -> LivePolicySummary:
    """The live policy's actions on the GPU jobs that ended in ``period``, per rule. One query;
    the loop is over actions (a few per warned job), not over the period's jobs."""
    la = live_actions
    rows = conn.execute(
        select(la.c.job_id, la.c.rule, la.c.action, la.c.gpus, la.c.at_s)
        .add_columns(jobs.c.start_s, jobs.c.time_limit_s)
        .select_from(la.join(jobs, jobs.c.job_id == la.c.job_id))
        .where(_in(period))
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
    try:
        with engine.connect() as conn:
            df = job_frame(conn, period, opts.unused_max_duty_pct)
            prev = job_frame(conn, previous, opts.unused_max_duty_pct)
            users = _group_usage(df, "user", opts.top_n, "wasted")
            report = WeeklyReport(
                site_name=opts.site_name,
                generated_s=time.time() if now_s is None else now_s,
                period=period,
                previous_period=previous,
                headline=headline(df),
                previous_headline=headline(prev),
                histogram=histogram(df),
                by_gpu_model=by_gpu_model(conn, period, opts.unused_max_duty_pct),
                by_partition=_group_usage(df, "partition", None, "alloc"),
                top_users=users,
                top_accounts=_group_usage(df, "account", opts.top_n, "wasted"),
                worst_jobs=worst_jobs(df, [u.key for u in users], opts.worst_jobs_per_user),
                causes=causes(df),
                never_used=never_used(conn, period, opts.table_rows, opts.unused_max_duty_pct),
                idle_edges=idle_edges(df, opts.idle_edge_min_s, opts.table_rows),
                hardware=hardware(conn, period),
                trend=trend(conn, period.until_s, opts.trend_weeks, opts.unused_max_duty_pct),
                idle_edge_min_s=opts.idle_edge_min_s,
                live_policy=live_policy(conn, period),
            )
    except SQLAlchemyError as exc:
        raise StoreError(
            f"cannot read the store: {type(exc).__name__}: {exc.args[0] if exc.args else ''}",
            hint="check [store] url and run `slurm-gpu store migrate`",
        ) from exc
    return report
