"""The period's flagged GPUs: never used, or with hardware trouble (throttling, ECC, XID).

Few GPUs carry a flag (a few in a hundred), so one statement streams exactly those GPU rows,
in job order, and ``FlagScan`` folds them: the never-used totals and their largest GPUs, and
per node the trouble sums and distinct XID codes. What it keeps grows with the number of
nodes, not with the number of jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, case, literal, or_, select

from slurm_gpu.store.schema import job_gpus, jobs
from slurm_gpu.weekly.jobscan import (
    CHUNK_ROWS,
    TopN,
    gpu_hours,
    in_period,
    never_used_cond,
    trouble_cond,
)
from slurm_gpu.weekly.model import NeverUsedGpu, NeverUsedSummary, NodeHardware, Period


def flags_statement(period: Period, unused_max_duty_pct: float) -> Any:
    """The period's GPU rows that are never used or in trouble, in job order."""
    g = job_gpus.c
    never = never_used_cond(unused_max_duty_pct)
    trouble = trouble_cond()
    return (
        select(
            g.job_id,
            jobs.c.job_id_display,
            jobs.c.user,
            g.host,
            g.uuid,
            g.model,
            g.process_seen,
            g.util_mean_pct,
            gpu_hours().label("hours"),
            case((never, literal(1)), else_=literal(0)).label("never"),
            case((trouble, literal(1)), else_=literal(0)).label("trouble"),
            g.throttle_power_s,
            g.throttle_thermal_s,
            g.ecc_corrected,
            g.ecc_uncorrected,
            g.xid_events,
        )
        .select_from(job_gpus.join(jobs, jobs.c.job_id == g.job_id))
        .where(in_period(period), or_(never, trouble))
        .order_by(g.job_id)
    )


@dataclass(slots=True)
class _Node:
    """Hardware trouble of one node: seconds of throttling, ECC error counts, XID codes."""

    jobs: int = 0
    power_s: float = 0.0
    thermal_s: float = 0.0
    ecc_c: int = 0
    ecc_u: int = 0
    xid: set[int] = field(default_factory=set)


def _xid_codes(events: Any) -> list[int]:
    """The numeric codes of a comma-separated XID list ("79", "48,63"); others are skipped."""
    out = []
    for code in str(events or "").split(","):
        try:
            number = float(code.strip())
        except ValueError:
            continue
        if number == number and abs(number) != float("inf"):
            out.append(int(number))
    return out


class FlagScan:
    """Running totals of the period's flagged GPUs; feed it with ``scan_flags``."""

    def __init__(self, table_rows: int) -> None:
        self.never_gpus = 0
        self.never_jobs = 0
        self.never_hours = 0.0
        self.never_top = TopN(table_rows)
        self.nodes: dict[str, _Node] = {}
        self._job: Any = None
        self._job_never = False
        self._job_nodes: set[str] = set()

    def add(self, r: Any) -> None:
        """Fold one flagged GPU row (rows of one job come together)."""
        if r.job_id != self._job:
            self._job, self._job_never = r.job_id, False
            self._job_nodes.clear()
        if r.never:
            self.never_gpus += 1
            hours = float(r.hours) if r.hours is not None else 0.0
            self.never_hours += hours
            if not self._job_never:
                self._job_never = True
                self.never_jobs += 1
            self.never_top.offer(
                (-hours, str(r.job_id), str(r.host), str(r.uuid)),
                lambda: NeverUsedGpu(
                    job_id=str(r.job_id),
                    job_id_display=str(r.job_id_display),
                    user=str(r.user),
                    hostname=str(r.host),
                    gpu_uuid=str(r.uuid),
                    gpu_model=r.model,
                    process_seen=bool(r.process_seen),
                    duty_cycle_pct=None if r.util_mean_pct is None else float(r.util_mean_pct),
                    gpu_hours=hours,
                ),
            )
        if r.trouble:
            host = str(r.host)
            n = self.nodes.get(host)
            if n is None:
                n = self.nodes[host] = _Node()
            if host not in self._job_nodes:
                self._job_nodes.add(host)
                n.jobs += 1
            n.power_s += float(r.throttle_power_s or 0.0)
            n.thermal_s += float(r.throttle_thermal_s or 0.0)
            n.ecc_c += int(r.ecc_corrected or 0)
            n.ecc_u += int(r.ecc_uncorrected or 0)
            n.xid.update(_xid_codes(r.xid_events))

    def never_used(self) -> NeverUsedSummary:
        """Never-used GPUs: how many, in how many jobs, their GPU-hours, the largest."""
        return NeverUsedSummary(
            gpus=self.never_gpus,
            jobs=self.never_jobs,
            gpu_hours=self.never_hours,
            worst=tuple(self.never_top.items),
        )

    def hardware(self) -> tuple[NodeHardware, ...]:
        """Nodes with GPU trouble, worst first."""
        out = [
            NodeHardware(
                hostname=host,
                jobs=n.jobs,
                throttle_power_h=n.power_s / 3600.0,
                throttle_thermal_h=n.thermal_s / 3600.0,
                ecc_corrected=n.ecc_c,
                ecc_uncorrected=n.ecc_u,
                xid_codes=tuple(sorted(n.xid)),
            )
            for host, n in self.nodes.items()
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


def scan_flags(
    conn: Connection, period: Period, unused_max_duty_pct: float, into: FlagScan
) -> None:
    """Stream ``period``'s flagged GPUs from the store into ``into``."""
    result = conn.execution_options(stream_results=True).execute(
        flags_statement(period, unused_max_duty_pct)
    )
    for chunk in result.partitions(CHUNK_ROWS):
        for row in chunk:
            into.add(row)
