"""``slurm-gpu live``'s model: every running GPU job, worst first by GPU-hours wasted now.

A job's rows from every host (``LiveJob``, from Prometheus or this node's live files) are
joined into one ``LiveRow``. The diagnosis so far is a subset of the rules applied after the
job, on the live aggregates: a GPU never used since the job started, and GPUs idle now for at
least ``idle_min_s``. Data older than ``stale_after_s`` are flagged, never judged. Slurm's
running GPU jobs (``live.allocation``) are the list: a job whose node sends no live data is
shown with that finding, not left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from slurm_gpu.live.allocation import SlurmJob
from slurm_gpu.records import LiveJob


@dataclass(frozen=True, slots=True)
class Finding:
    """One live finding: a stable key and its wording."""

    key: str
    text: str


@dataclass(frozen=True, slots=True)
class LiveRow:
    """One running job on all its hosts."""

    job_id: str
    user: str
    account: str
    partition: str
    hosts: tuple[str, ...]
    gpus: int
    gpus_idle: int
    """GPUs below the idle threshold now."""
    gpus_never_used: int
    """GPUs never above the idle threshold since the job started."""
    idle_since_s: float | None
    """Earliest start of a current idle run among the job's GPUs, unix seconds."""
    duty_recent_pct: float | None
    """Mean duty cycle over ``recent_window_s`` across the job's GPUs, percent."""
    recent_window_s: float | None
    duty_since_start_pct: float | None
    """Kernel seconds over sampled seconds across the job's GPUs since it started, percent."""
    gpus_wasted_now: float
    """Idle share of each GPU over the recent window, summed: GPU-hours wasted per hour."""
    gpu_hours_wasted: float
    """Sampled minus kernel GPU-seconds since the start, in hours."""
    started_s: float
    updated_s: float
    """The oldest host's last reading, unix seconds."""
    stale: bool
    """Some host's data are older than ``stale_after_s``."""
    findings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["hosts"] = list(self.hosts)
        d["findings"] = [asdict(f) for f in self.findings]
        return d


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _minutes(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"


def _missing_row(sj: SlurmJob, hosts: Sequence[str]) -> LiveRow:
    return LiveRow(
        job_id=sj.job_id,
        user=sj.user,
        account=sj.account,
        partition=sj.partition,
        hosts=tuple(sorted(sj.gpu_idx)),
        gpus=sum(len(i) for i in sj.gpu_idx.values()),
        gpus_idle=0,
        gpus_never_used=0,
        idle_since_s=None,
        duty_recent_pct=None,
        recent_window_s=None,
        duty_since_start_pct=None,
        gpus_wasted_now=0.0,
        gpu_hours_wasted=0.0,
        started_s=sj.start_s or 0.0,
        updated_s=0.0,
        stale=True,
        findings=(Finding("no_data", f"no live data from {', '.join(hosts)}: not judged"),),
    )


def build_rows(
    jobs: Sequence[LiveJob],
    now_s: float,
    *,
    idle_min_s: float,
    stale_after_s: float,
    slurm_jobs: Mapping[str, SlurmJob] | None = None,
) -> list[LiveRow]:
    """One row per job, worst first: GPUs wasted now, then GPU-hours wasted so far. With
    ``slurm_jobs`` (Slurm's running GPU jobs), every one of them has a row: those with no live
    data from some node carry a ``no_data`` finding and are not judged."""
    by_job: dict[str, list[LiveJob]] = {}
    for job in jobs:
        by_job.setdefault(job.job_id, []).append(job)
    rows = []
    for job_id, parts in by_job.items():
        gpus = [g for p in parts for g in p.gpus]
        if not gpus:
            continue
        first = parts[0]
        updated = min(p.updated_s for p in parts)
        stale = now_s - updated > stale_after_s
        idle_since = [g.idle_since_s for g in gpus if g.idle_since_s is not None]
        busy = sum(g.busy_s or 0.0 for g in gpus)
        sampled = sum(g.sampled_s or 0.0 for g in gpus)
        never = [g for g in gpus if g.active_first_s is None and (g.sampled_s or 0) >= idle_min_s]
        long_idle = [s for s in idle_since if now_s - s >= idle_min_s]
        wasted_now = sum(
            1.0 - min(100.0, max(0.0, g.utilization_recent_pct)) / 100.0
            for g in gpus
            if g.utilization_recent_pct is not None
        )
        findings: list[Finding] = []
        if stale:
            findings.append(Finding("stale", f"data {_minutes(now_s - updated)} old: not judged"))
        else:
            if never:
                findings.append(
                    Finding("never_used", f"{len(never)} of {len(gpus)} GPU(s) never used")
                )
            if long_idle:
                findings.append(
                    Finding(
                        "idle_now",
                        f"{len(long_idle)} GPU(s) idle for {_minutes(now_s - min(long_idle))}",
                    )
                )
        rows.append(
            LiveRow(
                job_id=job_id,
                user=first.user,
                account=first.account,
                partition=first.partition,
                hosts=tuple(sorted({p.host for p in parts})),
                gpus=len(gpus),
                gpus_idle=len(idle_since),
                gpus_never_used=len(never),
                idle_since_s=min(idle_since) if idle_since else None,
                duty_recent_pct=_mean(g.utilization_recent_pct for g in gpus),
                recent_window_s=_mean(g.recent_window_s for g in gpus),
                duty_since_start_pct=100.0 * busy / sampled if sampled else None,
                gpus_wasted_now=wasted_now,
                gpu_hours_wasted=max(0.0, sampled - busy) / 3600.0,
                started_s=min(p.started_s for p in parts),
                updated_s=updated,
                stale=stale,
                findings=tuple(findings),
            )
        )
    if slurm_jobs is not None:
        seen = {r.job_id: r for r in rows}
        for job_id, sj in slurm_jobs.items():
            row = seen.get(job_id)
            missing = sorted(set(sj.gpu_idx) - set(row.hosts if row else ()))
            if row is None:
                rows.append(_missing_row(sj, missing))
            elif missing:
                note = Finding("no_data", f"no live data from {', '.join(missing)}: not judged")
                rows[rows.index(row)] = replace(
                    row,
                    stale=True,
                    findings=(note, *tuple(f for f in row.findings if f.key == "stale")),
                )
    rows.sort(key=lambda r: (-r.gpus_wasted_now, -r.gpu_hours_wasted, int(r.job_id)))
    return rows


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def render_table(rows: Sequence[LiveRow], now_s: float, source: str) -> str:
    """The terminal table: one line per job, then its findings indented."""
    if not rows:
        return f"No running GPU job ({source}).\n"
    window = _mean(r.recent_window_s for r in rows)
    recent = f"duty {_minutes(window)}" if window else "duty recent"
    header = (
        f"{'JOBID':>10} {'USER':<12} {'ACCOUNT':<12} {'GPUS':>4} {'IDLE':>4} "
        f"{recent:>14} {'SINCE START':>11} {'WASTED NOW':>10} {'GPU-H LOST':>10}  NODES"
    )
    lines = [f"Running GPU jobs, worst first ({source})", header]
    for r in rows:
        lines.append(
            f"{r.job_id:>10} {r.user[:12]:<12} {r.account[:12]:<12} {r.gpus:>4} "
            f"{r.gpus_idle:>4} {_pct(r.duty_recent_pct):>14} {_pct(r.duty_since_start_pct):>11} "
            f"{r.gpus_wasted_now:>10.2f} {r.gpu_hours_wasted:>10.2f}  {','.join(r.hosts)}"
        )
        lines.extend(f"{'':>10}   {f.text}" for f in r.findings)
    lines.append("WASTED NOW: GPUs' idle share summed (GPU-hours lost per hour).")
    return "\n".join(lines) + "\n"
