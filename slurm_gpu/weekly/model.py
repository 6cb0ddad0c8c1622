"""Frozen records of the weekly report's aggregates.

Every number the HTML page and the JSON output show lives here, computed once by
``slurm_gpu.weekly.aggregate``; rendering only formats. GPU-hours are GPU × hours of
allocation; duty cycles are NVML utilization (share of time any kernel ran), in percent.
``None`` means "not measured" (no telemetry for any job in the group), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurm_gpu.weekly.energy import EnergySummary

#: Version of the JSON document (``slurm-gpu report weekly --format json``). Bump it when a
#: field changes meaning or disappears; adding a field keeps the version.
REPORT_SCHEMA_VERSION = 1

#: The seven causes of low GPU utilization, numbered as in the analysis findings.
CAUSES: dict[int, str] = {
    1: "Too little parallel work",
    2: "Data loading and preprocessing",
    3: "Model architecture / hyper-parameters",
    4: "Memory management",
    5: "Communication overhead",
    6: "Allocation and scheduling",
    7: "Lack of monitoring",
}


@dataclass(frozen=True, slots=True)
class Period:
    """A half-open time span ``[since_s, until_s)`` in Unix epoch seconds (UTC)."""

    since_s: float
    until_s: float


@dataclass(frozen=True, slots=True)
class Headline:
    """The period's totals over the GPU jobs that ended in it."""

    jobs: int
    """GPU jobs that ended in the period."""
    jobs_measured: int
    """Of those, jobs with GPU telemetry."""
    jobs_with_findings: int
    gpu_hours_allocated: float
    """All GPU jobs, measured or not."""
    gpu_hours_unmeasured: float
    """Allocated GPU-hours of jobs without telemetry (not in active or wasted)."""
    gpu_hours_active: float
    gpu_hours_wasted: float
    duty_cycle_median_pct: float | None
    """Median over measured jobs of the job's duty cycle."""
    duty_cycle_weighted_pct: float | None
    """Active over allocated GPU-hours of measured jobs: the duty cycle of the average
    GPU-hour."""
    energy_kwh: float | None
    """GPU energy of measured jobs; ``None`` when no GPU reported energy."""


@dataclass(frozen=True, slots=True)
class HistogramBin:
    """Measured jobs whose duty cycle falls in ``[lo_pct, hi_pct)`` (the last bin holds 100)."""

    lo_pct: float
    hi_pct: float
    jobs: int
    gpu_hours_allocated: float


@dataclass(frozen=True, slots=True)
class GroupUsage:
    """Usage of one GPU model, partition, user or account."""

    key: str
    jobs: int
    gpu_hours_allocated: float
    gpu_hours_active: float
    gpu_hours_wasted: float
    duty_cycle_weighted_pct: float | None
    main_cause: int | None = None
    """Cause (1–7) carrying most of this group's wasted GPU-hours; ``None`` if no finding."""
    main_cause_gpu_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class WorstJob:
    """One job with much waste, for the per-user tables."""

    job_id: str
    job_id_display: str
    user: str
    account: str | None
    partition: str | None
    gpus: int
    elapsed_s: float
    duty_cycle_pct: float | None
    gpu_hours_allocated: float
    gpu_hours_wasted: float
    cause: int | None
    finding_code: str | None


@dataclass(frozen=True, slots=True)
class UserWorstJobs:
    """The worst jobs of one top user (the target of the user table's anchor link)."""

    user: str
    anchor: str
    """HTML id of the user's table: ``user-<n>``, safe whatever the user name holds."""
    jobs: tuple[WorstJob, ...]


@dataclass(frozen=True, slots=True)
class CauseShare:
    """Wasted GPU-hours attributed to one cause; ``cause=None`` is waste with no finding."""

    cause: int | None
    label: str
    jobs: int
    gpu_hours_wasted: float


@dataclass(frozen=True, slots=True)
class NeverUsedGpu:
    """An allocated GPU the job did not use (mean duty cycle at or below the analysis's
    ``unused_max_duty_pct``, or never read and no compute process seen)."""

    job_id: str
    job_id_display: str
    user: str
    hostname: str
    gpu_uuid: str
    gpu_model: str | None
    process_seen: bool
    duty_cycle_pct: float | None
    """Mean duty cycle of the GPU; ``None`` when it could not be read."""
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class NeverUsedSummary:
    gpus: int
    jobs: int
    gpu_hours: float
    worst: tuple[NeverUsedGpu, ...]
    """The largest, by GPU-hours, at most ``report.table_rows``."""


@dataclass(frozen=True, slots=True)
class IdleEdgeJob:
    """A job whose GPUs sat idle at its start (head) or its end (tail)."""

    job_id: str
    job_id_display: str
    user: str
    gpus: int
    elapsed_s: float
    idle_head_s: float
    idle_tail_s: float
    gpu_hours_idle: float
    """GPUs × (head + tail) hours."""


@dataclass(frozen=True, slots=True)
class IdleEdgeSummary:
    jobs: int
    gpu_hours_idle: float
    worst: tuple[IdleEdgeJob, ...]


@dataclass(frozen=True, slots=True)
class NodeHardware:
    """GPU hardware trouble seen on one node during the period."""

    hostname: str
    jobs: int
    """Jobs that saw any trouble on this node."""
    throttle_power_h: float
    throttle_thermal_h: float
    ecc_corrected: int
    ecc_uncorrected: int
    xid_codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TrendWeek:
    """One week of the trend (weeks end at the report's ``until``)."""

    since_s: float
    until_s: float
    jobs: int
    gpu_hours_allocated: float
    gpu_hours_active: float
    gpu_hours_wasted: float
    duty_cycle_weighted_pct: float | None


@dataclass(frozen=True, slots=True)
class LivePolicyRule:
    """The live policy's actions of one rule on the jobs that ended in the period."""

    rule: str
    """``never_used`` or ``idle``."""
    jobs_warned: int
    jobs_cancelled: int
    jobs_would_warn: int
    """Dry run: jobs it would have warned (nothing happened to them)."""
    jobs_would_cancel: int
    gpu_hours_stopped: float
    """GPU-hours its cancellations stopped from being wasted (``actionrows.stopped_gpu_hours``:
    idle GPUs × the time left until the time limit, an upper bound); warnings credit none."""


@dataclass(frozen=True, slots=True)
class LivePolicySummary:
    """What the live policy (``slurm-gpu police``) did to the jobs that ended in the period."""

    jobs_warned: int = 0
    """Jobs warned at least once (any rule)."""
    jobs_cancelled: int = 0
    gpu_hours_stopped: float = 0.0
    """GPU-hours stopped from being wasted, the sum over the cancellations (as ``gpueff``)."""
    cancelled_without_limit: int = 0
    """Cancelled jobs without a time limit: counted, not credited."""
    rules: tuple[LivePolicyRule, ...] = ()


@dataclass(frozen=True, slots=True)
class WeeklyReport:
    """Everything the weekly report shows."""

    site_name: str
    generated_s: float
    period: Period
    previous_period: Period
    headline: Headline
    previous_headline: Headline
    histogram: tuple[HistogramBin, ...]
    by_gpu_model: tuple[GroupUsage, ...]
    by_partition: tuple[GroupUsage, ...]
    top_users: tuple[GroupUsage, ...]
    top_accounts: tuple[GroupUsage, ...]
    worst_jobs: tuple[UserWorstJobs, ...]
    causes: tuple[CauseShare, ...]
    never_used: NeverUsedSummary
    idle_edges: IdleEdgeSummary
    hardware: tuple[NodeHardware, ...]
    trend: tuple[TrendWeek, ...]
    idle_edge_min_s: float
    """Threshold used for the idle head/tail section."""
    live_policy: LivePolicySummary = field(default_factory=LivePolicySummary)
    """The live policy's warnings and cancellations of the period's jobs."""
    energy: EnergySummary | None = None
    """kWh, idle kWh, cost and CO2 per user, account and partition (``weekly.energy``);
    ``None`` when not computed."""
