"""The view model of one job's report: what ``gpueff`` prints and the e-mail shows.

Renderers (terminal, JSON, e-mail) read only these frozen records, never the store, the
accounting source or the spool; ``slurm_gpu.jobreport.adapter`` builds them. ``None`` means
"not known", never zero, so a renderer can say "n/a" instead of a misleading 0 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from slurm_gpu.analysis.energy import JobEnergy
from slurm_gpu.analysis.metrics import wasted_gpu_hours_of
from slurm_gpu.config import AnalysisSettings, EnergySettings
from slurm_gpu.jobreport.fmt import energy_unit

#: The analysis's default threshold of an unused GPU, percent (``[analysis]``).
UNUSED_MAX_DUTY_PCT: float = AnalysisSettings().unused_max_duty_pct


class TelemetryStatus(StrEnum):
    """Where the GPU part of a report comes from, or why there is none."""

    FINAL = "final"
    """The job ended and its sealed record is in the store."""
    LIVE = "live"
    """The job runs; numbers are the sampler's live summary so far."""
    PENDING = "pending"
    """The job ended but the collector has not stored its record yet."""
    NOT_STARTED = "not_started"
    """The job has not started (pending in the queue), or ended without starting."""
    NO_GPU = "no_gpu"
    """The job was allocated no GPU."""
    NO_TELEMETRY = "no_telemetry"
    """The job had GPUs but no telemetry was recorded for it."""
    TOO_SHORT = "too_short"
    """The job ran too briefly for a meaningful reading."""


@dataclass(frozen=True, slots=True)
class GpuLine:
    """One GPU of the job."""

    node: str
    uuid: str
    name: str | None
    """Product name, or ``None`` when unknown."""
    slot: int | None
    """Minor number (``/dev/nvidiaN``) or index, for display only."""
    duty_mean_pct: float | None
    """Mean NVML utilization (duty cycle), percent."""
    duty_p50_pct: float | None
    idle_fraction: float | None
    """Share of readings at or below the idle threshold, 0–1."""
    sm_active_mean_pct: float | None
    memory_peak_bytes: int | None
    memory_total_bytes: int | None
    power_mean_w: float | None
    power_limit_w: float | None
    energy_j: float | None
    process_seen: bool | None
    """Whether any compute process ever ran on it; ``None`` when unknown."""
    throttled_pct: float | None = None
    """Share of the time its clocks were known to be or not to be held down during which
    its power cap or heat held them down (the larger of the two), percent; ``None`` when
    not known."""
    throttle_unknown: bool = False
    """The driver never said whether the clocks were held down: throttling is unknown,
    which the report says instead of 0 %."""
    spark_pct: tuple[float | None, ...] = ()
    """Utilization over time, oldest first, for a sparkline; ``None`` gaps where not read."""


@dataclass(frozen=True, slots=True)
class FindingView:
    """A finding with its wording already rendered from the site's templates."""

    code: str
    severity: str
    """``info``, ``warning`` or ``critical``."""
    cause: int | None
    """The cause number 1–7 of low GPU utilization, ``None`` if it names none."""
    title: str
    text: str
    evidence: tuple[tuple[str, str], ...] = ()
    """(label, formatted value) pairs, every item of the analysis's evidence."""
    evidence_keys: tuple[str, ...] = ()
    """The analysis's key of each ``evidence`` pair, in the same order (``--json``,
    ``--debug``); empty for a report rendered before keys were kept."""
    people_evidence: tuple[tuple[str, str], ...] | None = None
    """The pairs people are shown: named quantities with units and counts, without the
    internal 0/1 flags and identifiers (``adapter.for_people``); ``None``: all of them."""

    @property
    def shown_evidence(self) -> tuple[tuple[str, str], ...]:
        """The evidence a report shows people."""
        return self.evidence if self.people_evidence is None else self.people_evidence

    @property
    def keyed_evidence(self) -> tuple[tuple[str, str], ...]:
        """(key, formatted value) of every item, for ``--json`` and ``--debug``."""
        if len(self.evidence_keys) != len(self.evidence):
            return self.evidence
        return tuple((k, v) for k, (_, v) in zip(self.evidence_keys, self.evidence, strict=True))


@dataclass(frozen=True, slots=True)
class RecommendationView:
    """A better resource request."""

    text: str
    sbatch_lines: tuple[str, ...] = ()
    gpu_hours_saved: float | None = None
    """GPU-hours a job like this would free, ``None`` when not estimated."""


@dataclass(frozen=True, slots=True)
class LiveActionView:
    """One action the live policy (``slurm-gpu police``) took on the job while it ran."""

    at_s: float
    """When, seconds since the epoch."""
    after_start_s: float | None
    """When, seconds after the job started; ``None`` when its start is not known."""
    rule: str
    """``never_used`` (a GPU never used) or ``idle`` (GPUs idle too long)."""
    action: str
    """``warned`` or ``cancelled`` (dry-run actions are not shown to the job's owner)."""
    gpus: int
    """GPUs the rule found idle."""
    idle_gpu_hours: float
    """Their idle GPU-hours at the time of the action."""
    stopped_gpu_hours: float | None
    """GPU-hours the action stopped from being wasted (``actionrows.stopped_gpu_hours``):
    for a cancellation, the idle GPUs times the time left until the time limit; 0 for a
    warning; ``None`` when not known (no time limit)."""


@dataclass(frozen=True, slots=True)
class Telemetry:
    """The GPU part of one job's report, already in view-model terms."""

    gpus: tuple[GpuLine, ...]
    live: bool
    updated_s: float | None = None
    findings: tuple[FindingView, ...] = ()
    recommendations: tuple[RecommendationView, ...] = ()
    notes: tuple[str, ...] = ()
    timeline_note: str = ""
    """Why the GPUs have no sparkline although the job was sampled (retention removed the
    timeline); empty otherwise."""
    live_actions: tuple[LiveActionView, ...] = ()
    """The live policy's actions on the job, oldest first."""
    source: str = ""
    """Where live numbers came from: ``LIVE_SOURCE_SPOOL`` or ``LIVE_SOURCE_PROMETHEUS``;
    empty for a final record."""
    energy_settings: EnergySettings | None = None
    """The site's ``[energy]`` rates, which the reader that knows the settings adds; ``None``:
    the defaults (kWh and the idle share, no cost, no CO2)."""
    page_base_url: str = ""
    """``[web] base_url``, added by the reader that knows the settings: the report links to
    the job's web page under it; empty: no link."""
    uncollected: bool = False
    """The job ended but its record is not in the store (yet): ``gpus`` are the node's last
    live summary, if it still has one, and ``notes`` say why nothing more is known."""


#: A running job's numbers read from its node's live summary on this host.
LIVE_SOURCE_SPOOL = "spool"
#: A running job's numbers read from Prometheus (``[live] prometheus_url``).
LIVE_SOURCE_PROMETHEUS = "prometheus"


#: Statuses whose report may hold GPU lines: the sealed record, the live summary of a running
#: job, or the last live summary of an ended job not collected yet.
_WITH_NUMBERS = frozenset({TelemetryStatus.FINAL, TelemetryStatus.LIVE, TelemetryStatus.PENDING})


@dataclass(frozen=True, slots=True)
class JobReport:
    """Everything one job's report shows."""

    job_id: str
    """``JobIDRaw``."""
    job_id_display: str
    """``JobID`` as users type it (``1234_7``)."""
    job_name: str
    user: str
    account: str | None
    partition: str | None
    state: str
    exit_code: int | None
    elapsed_s: int
    time_limit_s: int | None
    start_s: float | None
    end_s: float | None
    nodes: tuple[str, ...]
    cpus: int | None
    gpus_allocated: int
    gpu_model: str | None
    req_mem_bytes: int | None
    max_rss_bytes: int | None
    total_cpu_s: float | None
    telemetry: TelemetryStatus
    telemetry_note: str = ""
    """One sentence when the status needs explaining (live since, no samples, …)."""
    live_updated_s: float | None = None
    """Time of the live summary, for ``LIVE``."""
    live_source: str | None = None
    """Where the live numbers came from (``spool``, ``prometheus``), for ``LIVE``."""
    gpus: tuple[GpuLine, ...] = ()
    findings: tuple[FindingView, ...] = ()
    recommendations: tuple[RecommendationView, ...] = ()
    array_job_id: str | None = None
    mail_user: str | None = None
    notes: tuple[str, ...] = field(default=())
    unused_max_duty_pct: float = UNUSED_MAX_DUTY_PCT
    """``[analysis] unused_max_duty_pct``: a GPU at or below this mean duty cycle was unused."""
    timeline_note: str = ""
    """One sentence when the store's retention removed the job's timeline; else empty."""
    live_actions: tuple[LiveActionView, ...] = ()
    """The live policy's warnings and cancellations while the job ran, oldest first."""
    energy: JobEnergy | None = None
    """GPU energy, its idle part, cost and CO2 (``analysis.energy``); ``None`` when no GPU
    reported energy."""
    page_url: str = ""
    """The job's web page (``[web] base_url``/job/<id>); empty when no page is configured."""
    exit_signal: int | None = None
    """The signal that ended the batch script (``ExitCode``'s number after the colon), for an
    ended job; ``None`` while it runs or when accounting gave none, 0 for no signal."""

    # ------------------------------------------------------------------ derived numbers

    @property
    def exit_label(self) -> str | None:
        """How the job ended, as shown: ``exit 3``; ``signal 9, SIGKILL`` for a script a
        signal ended (sacct's ``0:9``: "exit 0" alone would read as a clean exit); ``exit 2,
        signal 15, SIGTERM`` when both are set; ``None`` before the job ended."""
        if self.exit_code is None:
            return None
        sig = self.exit_signal
        if not sig:
            return f"exit {self.exit_code}"
        import signal  # only here: the report's import path does without it

        try:
            signal_text = f"signal {sig}, {signal.Signals(sig).name}"
        except ValueError:  # a real-time signal (Slurm's 53 for an I/O set-up failure)
            signal_text = f"signal {sig}"
        return signal_text if self.exit_code == 0 else f"exit {self.exit_code}, {signal_text}"

    @property
    def cpu_efficiency_pct(self) -> float | None:
        """CPU time used over cores × elapsed, percent, as seff computes it (the CPU time
        rounded half up to whole seconds first); ``None`` when unknown."""
        if self.total_cpu_s is None or not self.cpus or self.elapsed_s <= 0:
            return None
        # seff's $cput is whole seconds; unrounded, a 20 s two-core job could differ by up to
        # 1.25 points from what seff prints for it.
        cput = math.floor(self.total_cpu_s + 0.5)
        return 100.0 * cput / (self.cpus * self.elapsed_s)

    @property
    def mem_efficiency_pct(self) -> float | None:
        """Peak resident memory over requested memory, percent; ``None`` when unknown."""
        if self.max_rss_bytes is None or not self.req_mem_bytes:
            return None
        return 100.0 * self.max_rss_bytes / self.req_mem_bytes

    @property
    def time_used_pct(self) -> float | None:
        """Elapsed over time limit, percent."""
        if not self.time_limit_s:
            return None
        return 100.0 * self.elapsed_s / self.time_limit_s

    @property
    def has_gpu_numbers(self) -> bool:
        """Whether the report holds per-GPU telemetry to show."""
        return self.telemetry in _WITH_NUMBERS and bool(self.gpus)

    @property
    def gpu_hours_allocated(self) -> float:
        """GPUs × elapsed, hours."""
        return self.gpus_allocated * self.elapsed_s / 3600.0

    @property
    def duty_mean_pct(self) -> float | None:
        """Mean duty cycle over the job's GPUs (an allocated GPU never read counts as unknown)."""
        values = [g.duty_mean_pct for g in self.gpus if g.duty_mean_pct is not None]
        if not values:
            return None
        return sum(values) / len(values)

    @property
    def gpu_hours_wasted(self) -> float | None:
        """Idle GPU-hours, the engine's one definition (``metrics.wasted_gpu_hours``): per GPU
        with readings, the whole elapsed time when it was unused (mean duty cycle at or below
        ``unused_max_duty_pct``), else its share of idle readings × elapsed; hours, ``None``
        without data. Under-use (a GPU busy 40 % of the time) is not counted here."""
        if not self.has_gpu_numbers:
            return None
        observed = [
            (
                g.duty_mean_pct > self.unused_max_duty_pct,
                None if g.idle_fraction is None else 100.0 * g.idle_fraction,
            )
            for g in self.gpus
            if g.duty_mean_pct is not None
        ]
        return wasted_gpu_hours_of(observed, self.elapsed_s)

    @property
    def energy_unit(self) -> str:
        """The one unit of the per-GPU energy column (``fmt.energy_unit``): Wh, or kWh from 1
        kWh; never J, as the job's total and the web page never are (a one-GPU job's line and
        total then say the same number)."""
        return energy_unit((g.energy_j for g in self.gpus), total=True)

    @property
    def energy_j(self) -> float | None:
        """Energy of all GPUs, joules; ``None`` when no GPU reported any."""
        values = [g.energy_j for g in self.gpus if g.energy_j is not None]
        return sum(values) if values else None
