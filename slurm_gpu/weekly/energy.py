"""The weekly report's energy columns: kWh, idle kWh, cost and CO2 per user, account and
partition, each job's figures computed by ``analysis.energy`` exactly as ``gpueff`` and the
e-mail compute them, then summed.

Kept apart from ``aggregate`` so that its rewrite and this stay independent: one query of its
own (the period's GPU jobs with their GPUs' energy), one pass over the jobs in Python (a job's
cost weighs the time-of-day or monthly rates over its own run, which SQL cannot do portably),
then sums per group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import and_, select
from sqlalchemy.engine import Connection

from slurm_gpu.analysis.energy import GpuEnergy, JobEnergy, job_energy
from slurm_gpu.config import EnergySettings
from slurm_gpu.store.schema import job_gpus, jobs


@dataclass(frozen=True, slots=True)
class EnergyGroup:
    """The energy of one user's, account's or partition's jobs of the period."""

    key: str
    jobs: int
    """Jobs whose GPUs reported energy."""
    kwh: float
    idle_kwh: float | None
    """kWh spent while GPUs idled; ``None`` when no job's idle share was known."""
    cost: float | None
    """In the report's ``currency``; ``None`` without a price."""
    co2_kg: float | None
    """Kilograms; ``None`` without a carbon intensity."""


@dataclass(frozen=True, slots=True)
class EnergySummary:
    """The energy section: every group, largest energy first."""

    currency: str
    kwh: float
    """All jobs of the period with energy, kWh."""
    by_user: tuple[EnergyGroup, ...] = ()
    by_account: tuple[EnergyGroup, ...] = ()
    by_partition: tuple[EnergyGroup, ...] = ()


@dataclass(frozen=True, slots=True)
class _Job:
    user: str
    account: str
    partition: str
    energy: JobEnergy


def period_jobs_energy(
    conn: Connection,
    since_s: float,
    until_s: float,
    settings: EnergySettings,
    unused_max_duty_pct: float,
) -> list[tuple[str, str, str, JobEnergy]]:
    """(user, account, partition, energy) of every GPU job that ended in ``[since_s,
    until_s)`` and whose GPUs reported energy, in job id order."""
    j, g = jobs.c, job_gpus.c
    stmt = (
        select(
            j.job_id,
            j.user,
            j.account,
            j.partition,
            j.start_s,
            j.end_s,
            g.energy_j,
            g.util_mean_pct,
            g.idle_fraction,
        )
        .select_from(job_gpus.join(jobs, j.job_id == g.job_id))
        .where(and_(j.end_s >= since_s, j.end_s < until_s, j.alloc_gpus > 0, j.end_s.is_not(None)))
        .order_by(j.job_id, g.host, g.position)
    )
    out: list[tuple[str, str, str, JobEnergy]] = []
    current: str | None = None
    head: tuple[str, str, str, float | None, float | None] = ("", "", "", None, None)
    gpus: list[GpuEnergy] = []

    def flush() -> None:
        user, account, partition, start_s, end_s = head
        e = job_energy(
            gpus,
            start_s=start_s,
            end_s=end_s,
            settings=settings,
            unused_max_duty_pct=unused_max_duty_pct,
        )
        if e is not None:
            out.append((user, account, partition, e))

    for row in conn.execute(stmt):
        if row.job_id != current:
            if current is not None:
                flush()
            current, gpus = row.job_id, []
            head = (row.user, row.account or "", row.partition or "", row.start_s, row.end_s)
        gpus.append(GpuEnergy(row.energy_j, row.util_mean_pct, row.idle_fraction))
    if current is not None:
        flush()
    return out


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def group(rows: Sequence[_Job], attr: str) -> tuple[EnergyGroup, ...]:
    """Rows summed per value of ``attr`` (``user``, ``account``, ``partition``), largest
    energy first (ties: by name)."""
    parts: dict[str, list[JobEnergy]] = defaultdict(list)
    for r in rows:
        parts[getattr(r, attr)].append(r.energy)
    groups = [
        EnergyGroup(
            key=key,
            jobs=len(es),
            kwh=sum(e.kwh for e in es),
            idle_kwh=_sum(e.idle_kwh for e in es),
            cost=_sum(e.cost for e in es),
            co2_kg=_sum(e.co2_kg for e in es),
        )
        for key, es in parts.items()
    ]
    return tuple(sorted(groups, key=lambda x: (-x.kwh, x.key)))


def energy_summary(
    conn: Connection,
    since_s: float,
    until_s: float,
    settings: EnergySettings,
    unused_max_duty_pct: float,
) -> EnergySummary:
    """The energy section of the period ``[since_s, until_s)``."""
    rows = [
        _Job(user, account, partition, e)
        for user, account, partition, e in period_jobs_energy(
            conn, since_s, until_s, settings, unused_max_duty_pct
        )
    ]
    return EnergySummary(
        currency=settings.currency,
        kwh=sum(r.energy.kwh for r in rows),
        by_user=group(rows, "user"),
        by_account=group(rows, "account"),
        by_partition=group(rows, "partition"),
    )
