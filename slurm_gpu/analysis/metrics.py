"""Metrics of one job: pure functions of its accounting record and its sealed node records.

Every value is ``None`` when the data to compute it is missing ("not enough data"), never a
misleading 0. The CPU and memory efficiencies follow Slurm's ``seff`` (``contribs/seff/seff``)
formula for formula, so both tools print the same number for the same job; see
``docs/analysis.md`` for the definitions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from slurm_gpu.analysis.allocation import whole_node_allocation
from slurm_gpu.analysis.outcomes import StepEnd, node_failure, step_end
from slurm_gpu.analysis.stackmetrics import StackMetrics, stack_metrics
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import (
    STALL_CPU_BINS,
    STALL_CPU_STEP_PCT,
    STALL_DUTY_BINS,
    STALL_DUTY_STEP_PCT,
    GpuSummary,
    JobRecord,
    NodeRecord,
    TimelinePoint,
)
from slurm_gpu.sourcecaps import SourceCapabilities, capabilities_of, combined

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6


class DataStatus(StrEnum):
    """Whether the job's GPU telemetry supports a diagnosis."""

    OK = "ok"
    NO_GPU = "no_gpu"
    """No GPU was allocated and none was observed."""
    NO_TELEMETRY = "no_telemetry"
    """GPUs were allocated but no node record (or no GPU reading) exists."""
    TOO_SHORT = "too_short"
    """The job ran for less than ``min_elapsed_s`` (including 0 s)."""


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    """One GPU over one job."""

    uuid: str
    hostname: str
    name: str | None
    compute_capability: tuple[int, int] | None
    samples: int
    samples_available: int
    observed_s: float | None
    """Seconds between the node record's start and end."""
    duty_mean_pct: float | None
    duty_p10_pct: float | None
    duty_p50_pct: float | None
    duty_p90_pct: float | None
    duty_max_pct: float | None
    idle_share_pct: float | None
    """Readings at or below the sampler's idle threshold over readings answered, percent."""
    idle_head_s: float | None
    """From the record's start to the first active reading, less one interval (a reading
    covers the interval before it); the whole span when never active."""
    idle_tail_s: float | None
    """From the last active reading to the record's end, less one interval."""
    memory_peak_bytes: int | None
    memory_capacity_bytes: int | None
    memory_peak_pct: float | None
    power_mean_w: float | None
    power_limit_w: float | None
    power_max_w: float | None
    """The highest power reading, W."""
    power_mean_of_limit_pct: float | None
    energy_kwh: float | None
    sm_active_mean_pct: float | None
    tensor_active_mean_pct: float | None
    memory_util_mean_pct: float | None
    """Mean share of time the memory controller was busy (memory bandwidth), percent;
    ``None`` where the source never reported it."""
    throttle_power_pct: float | None
    """Seconds the power policy held the clocks down over the seconds it was known to or not
    (``GpuSummary.throttle_power_known_s``; the observed span in records sealed before that
    was counted), percent. ``None``: unknown (the driver never gave reasons), not 0 %."""
    throttle_thermal_pct: float | None
    """The same for thermal slowdowns."""
    nvlink_bytes: int | None
    nvlink_idle_share_pct: float | None
    """NVLink bytes moved while the GPU was idle over all NVLink bytes, percent."""
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    xid_events: tuple[int, ...]
    process_seen: bool
    processes_known: bool
    """Whether the process list could be read on this GPU: at every answered reading, where
    the sampler counted unreadable lists (``GpuSummary.process_list_unread``). Records sealed
    before that are judged per node: a GPU that ran kernels with no process seen proves the
    list was unreadable there (a kernel needs a process), so ``process_seen=False`` on any GPU
    of that node means "unknown", not "none"."""
    max_processes: int
    """Most compute processes seen on the GPU at once (0 when none seen or unknown)."""
    is_mig: bool
    """A MIG slice rather than a whole GPU."""
    used: bool
    """Its mean duty cycle exceeded ``unused_max_duty_pct`` (a process that never ran a kernel
    does not make a GPU used); without readings, whether a process appeared on it."""
    starved: bool
    """Not ``used``, yet buckets with kernels (the job's: the GPU is its) spanned at least
    ``starved_min_span_pct`` of the job: a GPU fed so slowly (one batch now and then) that its
    mean duty cycle rounds to nothing. The rules diagnose it with the used GPUs; the idle
    GPU-hours (``wasted_gpu_hours``) count it like an unused one."""
    enough_data: bool
    """At least ``min_samples`` readings were answered."""
    sparse_kernels: bool = False
    """Kernels in fewer than half of the timeline buckets between its first and last one: a
    GPU fed a batch now and then, whose last busy bucket says little of when its work
    ended (no ragged tail, no idle phases judged on it)."""
    active_last_s: float | None = None
    """Epoch seconds of the GPU's last active reading; ``None`` if never active."""
    idle_phases: int = 0
    """Mid-job idle phases: runs of timeline buckets at or below ``idle_pct`` at least
    ``idle_phase_min_s`` long, between the GPU's first and last active bucket."""
    idle_phases_s: float = 0.0
    """Their total length, seconds."""
    idle_phase_cores: float | None = None
    """Mean cores busy on the node during those phases (what the host did meanwhile)."""
    busy_cores: float | None = None
    """Mean cores busy on the node in the GPU's other buckets between its first and last
    active one."""
    power_busy_w: float | None = None
    """Power drawn while kernels ran, estimated, W: the GPU's lowest timeline reading (its
    idle draw, at most) plus the mean's excess over it divided by the duty cycle. The readings
    are 1 s means, so a GPU busy in bursts shorter than that never shows its draw during them
    in one reading (an H200 at 46 % duty, at its 700 W cap in every burst: no reading above
    541 W). An upper bound (between bursts the GPU draws more than at idle); ``None`` below
    ``BUSY_POWER_MIN_DUTY_PCT`` or without a timeline."""
    throttle_known_pct: float | None = None
    """Share of the observed span over which both throttling causes were known, percent
    (at most 100); ``None`` in records sealed before it was counted."""


@dataclass(frozen=True, slots=True)
class JobMetrics:
    """One job: accounting efficiencies (as seff), GPU-hours, balance, and its GPUs."""

    job_id: str
    status: DataStatus
    elapsed_s: int
    time_limit_s: int | None
    time_efficiency_pct: float | None
    """Elapsed over the time limit, percent."""
    ncpus: int
    """seff's core count: AllocCPUS, else the TRES cpu count, and 1 when neither is known."""
    nnodes: int
    cpu_used_s: int | None
    """seff's "CPU Utilized": TotalCPU rounded to whole seconds (half up)."""
    cpu_efficiency_pct: float | None
    """seff's "CPU Efficiency": cpu_used_s / (elapsed_s × ncpus) × 100."""
    cores_busy_mean_per_node: float | None
    """cpu_used_s / elapsed_s / nnodes: mean cores busy on one node, the same scope as
    ``host_cores_peak`` and ``host_cores_allocated_per_node``."""
    mem_used_bytes: int | None
    """seff's "Memory Utilized": the largest MaxRSS over the job's steps."""
    mem_allocated_bytes: int | None
    """The job's allocated memory (AllocTRES mem, else the multiplied-out ReqMem)."""
    mem_efficiency_pct: float | None
    """seff's "Memory Efficiency": mem_used_bytes / mem_allocated_bytes × 100."""
    gpus_allocated: int
    gpus_observed: int
    gpus_used: int
    gpu_hours_allocated: float
    """Allocated GPUs × elapsed, hours."""
    gpu_hours_busy: float | None
    """Σ over observed GPUs of mean duty cycle × elapsed, hours."""
    gpu_hours_wasted: float | None
    """Σ over observed GPUs of idle share × elapsed, where an unused GPU counts whole, hours:
    time an allocated GPU ran no kernel at all. Unobserved GPUs are not counted. The one
    definition (``wasted_gpu_hours``) every channel uses."""
    duty_mean_pct: float | None
    """Mean of the observed GPUs' mean duty cycles."""
    imbalance_spread_pct: float | None
    """Max minus min of the used GPUs' mean duty cycles (two or more used GPUs)."""
    imbalance_cv: float | None
    """Coefficient of variation of the used GPUs' mean duty cycles."""
    node_spread_pct: float | None
    """Max minus min of the per-node mean duty cycles (two or more nodes with used GPUs)."""
    energy_kwh: float | None
    cpus_per_gpu: float | None
    stall_share_pct: float | None
    """Share of time in which the used GPUs' duty cycle was below ``low_duty_pct`` while the
    job's host cores were busy at ``cpu_saturated_pct`` or more of the node's allocation,
    percent (input-bound time). Counted per reading where the sampler kept the (duty, cores
    busy) grid (``stall_from_readings``); else measured on the downsampled timeline, whose
    resolution is the bucket width."""
    stall_share_strict_pct: float | None
    """The same with the GPUs below ``dataloader_max_duty_pct`` and the cores pinned (at
    ``cpu_saturated_strict_pct`` or more), percent: input-bound time of a job at moderate
    duty."""
    host_cores_peak: float | None
    """Most cores busy on one node in one timeline bucket (or reading), cores."""
    host_cores_allocated_per_node: float | None
    host_rss_peak_bytes: int | None
    """Largest resident memory of the job on one node, bytes."""
    whole_node: bool
    """The site allocated whole nodes (exclusive partition, or more CPUs/memory than requested
    by more than ``whole_node_alloc_factor``): a smaller request would change nothing."""
    nodes_expected: int
    nodes_with_record: int
    gpus: tuple[GpuMetrics, ...]
    stall_from_readings: bool = False
    """The stall shares were counted at sampling resolution (every used GPU had a grid)."""
    main_stall_share_pct: float | None = None
    """Share of the timeline, between the first and last bucket with kernels on the used and
    starved GPUs and outside idle phases, in which none of them ran a kernel (duty at or below
    ``unused_max_duty_pct``) while at least ``main_process_min_cores`` cores per such GPU were
    busy on its node, percent: the GPUs waited on one busy process each (a DataLoader with
    ``num_workers=0``), however many cores the job had. ``None`` without a timeline."""
    steps: StepMetrics | None = None
    """The job's ``srun`` steps as accounting knows them; ``None`` without any."""
    source: SourceCapabilities = field(default_factory=lambda: capabilities_of("nvml"))
    """What the job's telemetry source(s) can tell (``sourcecaps.combined`` over its node
    records): the rules that need a signal it lacks say "cannot tell" instead of judging."""
    stacks: StackMetrics | None = None
    """Stack samples of the job's Python processes (``docs/stacks.md``); ``None`` where stack
    sampling was off."""
    interval_s: float | None = None
    """The job's records' own reading interval (the coarsest over its nodes), seconds;
    ``None`` without a record."""
    node_failure: bool = False
    """A node under the job failed (``outcomes.node_failure``: NODE_FAIL of the job or of a
    step, or a node-down reason)."""
    core_efficiency_pct: float | None = None
    """``cpu_efficiency_pct`` over physical cores where ``threads_per_core`` is known (at most
    100), else equal to it, percent: what host-bound judgements compare."""
    physical_cores: bool = False
    """Whether core counts in host-bound judgements are physical cores (the topology is
    known: ``threads_per_core``) rather than Slurm's CPUs."""
    gpu_hours_after_progress: float | None = None
    """Allocated GPUs × the time from the last reading with a kernel on any of the job's GPUs
    to the job's end, hours: what the job held without progress at its end (after a node
    failure, the time lost waiting for Slurm to notice); ``None`` without such a reading."""


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """The job's task steps (``srun``; not ``batch`` or ``extern``) from accounting."""

    total: int
    failed: int
    """Steps that failed on their own (``outcomes.StepEnd.OWN_FAILURE``: their program's exit
    code, OUT_OF_MEMORY); not those Slurm ended at the job's end, by a time limit, a node
    failure or a ``scancel``, counted below."""
    node_failed: int
    """Steps ended by a node failure (NODE_FAIL, or killed when the job's node failed)."""
    first_failed_exit_code: int | None
    gpu_hours_failed: float
    """GPU-hours spent by the failed steps: each step's GPUs (its AllocTRES, else the job's
    GPUs per node times the step's nodes) times its elapsed time, hours; at most the job's."""
    gpu_hours_estimated: bool
    """Some failed step did not report its GPUs: its share was estimated as above."""
    cpus_max: int | None
    """Most CPUs any step was bound to."""
    cpu_efficiency_pct: float | None
    """Σ TotalCPU / Σ (elapsed × CPUs) over the steps with all three known: how busy the
    cores each step was bound to were, percent (``None`` without such a step)."""
    tasks_per_node_max: float | None = None
    """Most tasks (ranks) any step ran per node (``NTasks`` over its nodes); ``None`` where
    accounting gave no task count."""
    time_limit: int = 0
    """Steps ended by the time limit."""
    user_cancelled: int = 0
    """Steps ended by a ``scancel``."""
    job_end: int = 0
    """Steps still running when the job ended, ended by Slurm."""


# --------------------------------------------------------------------------- seff


def seff_ncpus(job: JobRecord) -> int:
    """seff's ``$ncpus``: AllocCPUS, else the TRES cpu count; 0 or unknown becomes 1."""
    ncpus = job.alloc_cpus if job.alloc_cpus is not None else job.alloc_tres.cpus
    return ncpus if ncpus else 1


def seff_nnodes(job: JobRecord) -> int:
    """seff's ``$nnodes``: allocated nodes; 0 or unknown becomes 1."""
    nnodes = job.alloc_tres.nodes or len(job.nodelist)
    return nnodes if nnodes else 1


def seff_cpu_used_s(job: JobRecord) -> int | None:
    """seff's ``$cput``: whole seconds plus the microseconds rounded half up."""
    if job.total_cpu_s is None:
        return None
    whole = math.floor(job.total_cpu_s)
    return whole + math.floor((job.total_cpu_s - whole) + 0.5)


def seff_cpu_efficiency_pct(job: JobRecord) -> float | None:
    """``cput / (elapsed × ncpus) × 100``; ``None`` where seff would print a meaningless 0."""
    cput = seff_cpu_used_s(job)
    core_walltime = job.elapsed_s * seff_ncpus(job)
    if cput is None or core_walltime <= 0:
        return None
    return cput / core_walltime * 100.0


def seff_mem_allocated_bytes(job: JobRecord) -> int | None:
    """The memory seff divides by: AllocTRES ``mem`` (Slurm ≥ 23.02's seff), which equals the
    per-CPU or per-node ReqMem multiplied out by CPUs or nodes (older seff); bytes."""
    alloc = job.alloc_tres.mem_bytes
    return alloc if alloc else job.req_mem_bytes or None


def seff_mem_efficiency_pct(job: JobRecord) -> float | None:
    """``MaxRSS / allocated memory × 100``; ``None`` without either."""
    alloc = seff_mem_allocated_bytes(job)
    if job.max_rss_bytes is None or not alloc:
        return None
    return job.max_rss_bytes / alloc * 100.0


def seff_pct_text(value: float | None) -> str:
    """A percentage as seff prints it (``%.2f%%``), or ``n/a``."""
    return "n/a" if value is None else f"{value:.2f}%"


# --------------------------------------------------------------------------- per GPU


def _ratio_pct(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return 100.0 * part / whole


def processes_readable(node: NodeRecord, settings: AnalysisSettings) -> bool:
    """For records without ``process_list_unread``: whether the node's GPU process lists were
    readable, False when a GPU ran kernels (mean duty above ``unused_max_duty_pct``) and yet
    no process was ever seen on it."""
    for g in node.gpus:
        mean = g.utilization.mean
        if mean is not None and mean > settings.unused_max_duty_pct and not g.process_seen:
            return False
    return True


@dataclass(frozen=True, slots=True)
class IdlePhases:
    """Mid-job idle phases of one GPU (see ``GpuMetrics.idle_phases``)."""

    count: int
    total_s: float
    phase_cores: float | None
    other_cores: float | None


def idle_phases(node: NodeRecord, index: int, settings: AnalysisSettings) -> IdlePhases:
    """The idle phases of GPU ``index`` of ``node`` from its timeline: runs of buckets at or
    below ``idle_pct`` (a bucket without a value ends a run) between the GPU's first and last
    active bucket, counted when at least ``idle_phase_min_s`` long; with the mean cores busy
    during them and during the rest of that span (time-weighted)."""
    points = [p for p in node.timeline if index < len(p.gpu_utilization_pct)]
    values = [p.gpu_utilization_pct[index] for p in points]
    active = [k for k, u in enumerate(values) if u is not None and u > settings.idle_pct]
    if len(active) < 2:
        return IdlePhases(0, 0.0, None, None)
    count = 0
    total = 0.0
    in_phase: set[int] = set()
    run: list[int] = []
    for k in range(active[0], active[-1] + 1):
        u = values[k]
        if u is not None and u <= settings.idle_pct:
            run.append(k)
            continue
        length = sum(points[j].width_s for j in run)
        if run and length >= settings.idle_phase_min_s:
            count += 1
            total += length
            in_phase.update(run)
        run = []

    def mean_cores(keys: list[int]) -> float | None:
        known = [(points[k].width_s, points[k].host_cpu_cores) for k in keys]
        weight = sum(w for w, c in known if c is not None)
        if weight <= 0:
            return None
        return sum(w * c for w, c in known if c is not None) / weight

    span = list(range(active[0], active[-1] + 1))
    return IdlePhases(
        count,
        total,
        mean_cores(sorted(in_phase)),
        mean_cores([k for k in span if k not in in_phase]),
    )


@dataclass(frozen=True, slots=True)
class KernelSpan:
    """Where one GPU's timeline shows kernels (a bucket with a duty cycle above 0)."""

    buckets: int = 0
    """Buckets with a kernel."""
    span_s: float = 0.0
    """From the start of the first such bucket to the end of the last, seconds."""
    share: float = 1.0
    """Buckets with a kernel over the buckets with a value between them (1.0 with none)."""


def kernel_span(node: NodeRecord, index: int) -> KernelSpan:
    """Where GPU ``index`` of ``node`` ran kernels, from its timeline."""
    known = [
        (p, u)
        for p in node.timeline
        if index < len(p.gpu_utilization_pct) and (u := p.gpu_utilization_pct[index]) is not None
    ]
    marks = [k for k, (_p, u) in enumerate(known) if u > 0.0]
    if not marks:
        return KernelSpan()
    first, last = known[marks[0]][0], known[marks[-1]][0]
    return KernelSpan(
        len(marks), last.t_s + last.width_s - first.t_s, len(marks) / (marks[-1] - marks[0] + 1)
    )


#: Below this mean duty cycle, percent, the power while kernels ran is not estimated: dividing
#: by a small duty makes any draw above idle look like a full one.
BUSY_POWER_MIN_DUTY_PCT = 25.0


def power_floor(node: NodeRecord, index: int) -> float | None:
    """The lowest timeline power reading of GPU ``index`` of ``node``, W (``None``: none)."""
    seen = [
        w
        for p in node.timeline
        if index < len(p.gpu_power_w) and (w := p.gpu_power_w[index]) is not None
    ]
    return min(seen) if seen else None


def _power_busy(
    mean_w: float | None, duty_pct: float | None, floor_w: float | None
) -> float | None:
    if mean_w is None or duty_pct is None or floor_w is None or floor_w > mean_w:
        return None
    if duty_pct < BUSY_POWER_MIN_DUTY_PCT:
        return None
    return floor_w + (mean_w - floor_w) / (duty_pct / 100.0)


#: A starved GPU ran kernels in at least this many timeline buckets (one stray kernel at
#: start-up, a CUDA check, does not make a GPU used).
STARVED_MIN_BUCKETS = 2


def gpu_metrics(
    gpu: GpuSummary,
    node: NodeRecord,
    settings: AnalysisSettings,
    processes_known: bool = True,
    phases: IdlePhases | None = None,
    caps: SourceCapabilities | None = None,
    kernels: KernelSpan | None = None,
    power_floor_w: float | None = None,
) -> GpuMetrics:
    """The metrics of one GPU from its summary and its node record. ``processes_known`` is
    ``processes_readable(node)``, computed once per node by the caller; it is used only for
    records sealed before the sampler counted unreadable lists. ``caps``: what the record's
    source can tell (default: its ``NodeRecord.source``); without a timeline (per-step means)
    the idle head, tail and share are unknown and any answered reading is enough data; without
    a process list, whether a process held the GPU is unknown. ``power_floor_w``: the lowest
    timeline power reading (``power_floor``), for ``GpuMetrics.power_busy_w``."""
    if caps is None:
        caps = capabilities_of(node.source)
    dist = gpu.utilization
    n = dist.n
    span = node.ended_s - node.started_s
    observed = span if span > 0 else None
    interval = node.interval_s
    head = tail = None
    if n:
        if gpu.active_first_time_s is None:
            head = tail = observed
        else:
            head = max(0.0, gpu.active_first_time_s - interval - node.started_s)
            last = gpu.active_last_time_s or gpu.active_first_time_s
            tail = max(0.0, node.ended_s - last - interval)
    if not caps.timeline:
        head = tail = None  # per-step means say nothing of when the GPU worked
    capacity = gpu.info.memory_total_bytes
    mean = dist.mean
    used = gpu.process_seen if mean is None else mean > settings.unused_max_duty_pct
    # No process list needed: Slurm gives a GPU to one job, so its kernels are the job's.
    kernels = kernels or KernelSpan()
    starved = (
        not used
        and mean is not None
        and observed is not None
        and kernels.buckets >= STARVED_MIN_BUCKETS
        and 100.0 * kernels.span_s / observed >= settings.starved_min_span_pct
    )
    if starved:
        # Its kernels are too sparse to see where its work began and ended.
        head = tail = None
    throttle_power, throttle_thermal = gpu.throttle_pct(observed)
    nvl_idle = None
    if gpu.nvlink_bytes and gpu.nvlink_bytes_while_idle is not None:
        nvl_idle = 100.0 * gpu.nvlink_bytes_while_idle / gpu.nvlink_bytes
    return GpuMetrics(
        uuid=gpu.info.uuid,
        hostname=node.hostname,
        name=gpu.info.name,
        compute_capability=gpu.info.compute_capability,
        samples=gpu.samples,
        samples_available=gpu.samples_available,
        observed_s=observed,
        duty_mean_pct=mean,
        duty_p10_pct=dist.percentile(10),
        duty_p50_pct=dist.percentile(50),
        duty_p90_pct=dist.percentile(90),
        duty_max_pct=dist.percentile(100),
        idle_share_pct=_ratio_pct(gpu.idle_samples, gpu.samples_available)
        if caps.timeline
        else None,
        idle_head_s=head,
        idle_tail_s=tail,
        memory_peak_bytes=gpu.memory_used_max_bytes,
        memory_capacity_bytes=capacity,
        memory_peak_pct=_ratio_pct(gpu.memory_used_max_bytes, capacity),
        power_mean_w=gpu.power_mean_w,
        power_limit_w=gpu.info.power_limit_w,
        power_max_w=gpu.power_max_w,
        power_mean_of_limit_pct=_ratio_pct(gpu.power_mean_w, gpu.info.power_limit_w),
        energy_kwh=None if gpu.energy_j is None else gpu.energy_j / JOULES_PER_KWH,
        sm_active_mean_pct=gpu.sm_active_mean_pct,
        tensor_active_mean_pct=gpu.tensor_active_mean_pct,
        memory_util_mean_pct=gpu.memory_utilization_mean_pct,
        throttle_power_pct=throttle_power,
        throttle_thermal_pct=throttle_thermal,
        power_busy_w=_power_busy(gpu.power_mean_w, mean, power_floor_w),
        nvlink_bytes=gpu.nvlink_bytes,
        nvlink_idle_share_pct=nvl_idle,
        ecc_corrected=gpu.ecc_corrected,
        ecc_uncorrected=gpu.ecc_uncorrected,
        xid_events=gpu.xid_events,
        process_seen=gpu.process_seen,
        processes_known=caps.process_list
        and (processes_known if gpu.process_list_unread is None else gpu.process_list_unread == 0),
        max_processes=gpu.max_processes,
        is_mig=gpu.info.mig_profile is not None or gpu.info.uuid.startswith("MIG-"),
        used=used,
        starved=starved,
        sparse_kernels=kernels.buckets >= STARVED_MIN_BUCKETS
        and kernels.share < SPARSE_KERNEL_SHARE,
        enough_data=gpu.samples_available >= settings.min_samples
        or (not caps.timeline and gpu.samples_available > 0),
        active_last_s=gpu.active_last_time_s,
        idle_phases=phases.count if phases else 0,
        idle_phases_s=phases.total_s if phases else 0.0,
        idle_phase_cores=phases.phase_cores if phases else None,
        busy_cores=phases.other_cores if phases else None,
        throttle_known_pct=_known_pct(gpu, observed),
    )


def _known_pct(gpu: GpuSummary, observed_s: float | None) -> float | None:
    power, thermal = gpu.throttle_power_known_s, gpu.throttle_thermal_known_s
    if power is None or thermal is None:
        return None
    pct = _ratio_pct(min(power, thermal), observed_s)
    return None if pct is None else min(100.0, pct)


# --------------------------------------------------------------------------- per job


def wasted_gpu_hours(gpus: Sequence[GpuMetrics], elapsed_s: float) -> float | None:
    """Idle ("wasted") GPU-hours: the time an allocated GPU ran no kernel at all.

    Σ over observed GPUs of idle share × elapsed, an unused GPU counting whole; hours.
    Under-use (a GPU busy 40 % of the time) is not waste here: that is allocated − busy.
    GPUs without readings are not counted; ``None`` when no GPU was observed. This is the one
    definition: the engine, ``gpueff``, the e-mail and the weekly report call it (or, in SQL,
    reproduce it from the same stored per-GPU numbers).
    """
    observed = [(g.used, g.idle_share_pct) for g in gpus if g.duty_mean_pct is not None]
    return wasted_gpu_hours_of(observed, elapsed_s)


def wasted_gpu_hours_of(
    observed: Sequence[tuple[bool, float | None]], elapsed_s: float
) -> float | None:
    """``wasted_gpu_hours`` from each observed GPU's (used, idle share in percent), for readers
    that hold only those numbers (the per-job report); hours, ``None`` for no GPU."""
    if not observed:
        return None
    hours = max(elapsed_s, 0.0) / SECONDS_PER_HOUR
    return sum(hours if not used else (idle or 0.0) / 100.0 * hours for used, idle in observed)


def _spread(values: Sequence[float]) -> float | None:
    return max(values) - min(values) if len(values) >= 2 else None


def _fmean(values: Iterable[float]) -> float:
    """``statistics.fmean`` (the same ``fsum`` over the count) without importing
    ``statistics``, which brings ``fractions`` and ``decimal`` into every ``gpueff``'s start.
    ``values`` must not be empty."""
    data = list(values)
    return math.fsum(data) / len(data)


def _cv(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    import statistics  # only here: exact population deviation (see _fmean)

    mean = _fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else None


def _cores_per_node(job: JobRecord, node: NodeRecord, nnodes: int) -> float | None:
    if node.host is not None and node.host.allocated_cores:
        return float(node.host.allocated_cores)
    if job.alloc_cpus:
        return job.alloc_cpus / nnodes
    return None


def _stall_and_peak(
    job: JobRecord,
    nodes: Sequence[NodeRecord],
    used: set[str],
    nnodes: int,
    settings: AnalysisSettings,
) -> tuple[float | None, float | None, float | None]:
    """(input-bound share of time, the same below full duty with pinned cores, both in
    percent; peak cores busy on one node)."""
    stalled_s = strict_s = total_s = 0.0
    peak: float | None = None
    per_core = max(settings.threads_per_core, 1)
    for node in nodes:
        cpus = _cores_per_node(job, node, nnodes)
        # Physical cores where the topology is known: a busy core keeps one thread busy.
        cores = max(cpus / per_core, 1.0) if cpus else cpus
        indices = [i for i, g in enumerate(node.gpus) if g.info.uuid in used]
        for point in node.timeline:
            if point.host_cpu_cores is not None:
                peak = max(peak or 0.0, point.host_cpu_cores)
            utils = [
                u
                for i in indices
                if i < len(point.gpu_utilization_pct)
                and (u := point.gpu_utilization_pct[i]) is not None
            ]
            if not utils or point.host_cpu_cores is None or not cores:
                continue
            total_s += point.width_s
            duty = _fmean(utils)
            busy_pct = min(100.0, 100.0 * point.host_cpu_cores / cores)
            if duty < settings.low_duty_pct and busy_pct >= settings.cpu_saturated_pct:
                stalled_s += point.width_s
            # Below full with the cores pinned (a stricter saturation: healthy jobs at
            # moderate duty use many cores too): an input-bound job at 55-65 % duty.
            if (
                duty < settings.dataloader_max_duty_pct
                and busy_pct >= settings.cpu_saturated_strict_pct
            ):
                strict_s += point.width_s
        if not node.timeline and node.host is not None and node.host.cpu_cores_busy.n:
            # No timeline: fall back to the cores-busy distribution (not time-correlated).
            top = node.host.cpu_cores_busy.percentile(100)
            if top is not None and cpus:
                peak = max(peak or 0.0, top / 100.0 * cpus)
    if total_s <= 0:
        return None, None, peak
    return 100.0 * stalled_s / total_s, 100.0 * strict_s / total_s, peak


#: Below this share of timeline buckets with kernels (between the first and the last), a
#: GPU's idle runs are waits between batches, not idle phases.
SPARSE_KERNEL_SHARE = 0.5

#: Most cores per GPU one process keeps busy (its thread plus helper threads' share).
MAIN_PROCESS_MAX_CORES = 1.5


def main_process_stall_pct(
    nodes: Sequence[NodeRecord], fed: set[str], settings: AnalysisSettings
) -> float | None:
    """``JobMetrics.main_stall_share_pct`` over the GPUs ``fed`` (used or starved), each GPU
    judged on its own timeline (ranks that wait together and independent single-GPU processes
    alike); ``None`` without a timeline or host readings on any of their nodes."""
    stalled_s = total_s = 0.0
    for node in nodes:
        indices = [i for i, g in enumerate(node.gpus) if g.info.uuid in fed]
        # Every rank's process keeps one core busy; many more cores busy is the job-wide
        # saturation that stall_share_pct measures.
        need = settings.main_process_min_cores * len(indices)
        most = MAIN_PROCESS_MAX_CORES * len(indices)
        for index in indices:
            for point, stalled in _gpu_waits(node, index, settings):
                if point.host_cpu_cores is None:
                    continue
                total_s += point.width_s
                if stalled and need <= point.host_cpu_cores <= most:
                    stalled_s += point.width_s
    if total_s <= 0:
        return None
    return 100.0 * stalled_s / total_s


def _gpu_waits(
    node: NodeRecord, index: int, settings: AnalysisSettings
) -> list[tuple[TimelinePoint, bool]]:
    """The timeline buckets of GPU ``index`` between its first and last bucket with a kernel,
    outside idle phases, each with whether it ran no kernel in it."""
    points = [
        (p, p.gpu_utilization_pct[index])
        for p in node.timeline
        if index < len(p.gpu_utilization_pct) and p.gpu_utilization_pct[index] is not None
    ]
    kernel = [k for k, (_p, u) in enumerate(points) if u is not None and u > 0.0]
    if len(kernel) < 2:
        return []
    span = range(kernel[0], kernel[-1] + 1)
    # Long runs without kernels are phases only between long busy stretches (a task farm at
    # 68 % for 28 min, then idle for 12): where kernels show in fewer than half of the buckets,
    # every run is the wait for the next batch, however long it looks.
    phase: set[int] = set()
    if len(kernel) >= SPARSE_KERNEL_SHARE * len(span):
        run: list[int] = []
        for k in span:
            u = points[k][1]
            if u is not None and u <= settings.unused_max_duty_pct:
                run.append(k)
                continue
            if run and sum(points[j][0].width_s for j in run) >= settings.idle_phase_min_s:
                phase.update(run)
            run = []
    return [
        (points[k][0], (points[k][1] or 0.0) <= settings.unused_max_duty_pct)
        for k in span
        if k not in phase
    ]


def step_metrics(job: JobRecord, gpus_allocated: int, nnodes: int) -> StepMetrics | None:
    """The job's task steps summed up; ``None`` when accounting listed none."""
    tasks = [st for st in job.steps if st.is_task]
    if not tasks:
        return None
    down = node_failure(job)
    ends = [step_end(st, job, down) for st in tasks]
    node_failed = [st for st, e in zip(tasks, ends, strict=True) if e is StepEnd.NODE_FAILURE]
    failed = [st for st, e in zip(tasks, ends, strict=True) if e is StepEnd.OWN_FAILURE]
    gpu_hours = 0.0
    estimated = False
    for st in failed:
        gpus: float
        if st.gpus is not None:
            gpus = st.gpus
        else:
            estimated = True
            gpus = gpus_allocated / max(nnodes, 1) * (st.nodes or 1)
        gpu_hours += gpus * max(st.elapsed_s, 0) / SECONDS_PER_HOUR
    gpu_hours = min(gpu_hours, gpus_allocated * max(job.elapsed_s, 0) / SECONDS_PER_HOUR)
    used_s = bound_s = 0.0
    for st in tasks:
        if st.total_cpu_s is not None and st.cpus and st.elapsed_s > 0:
            used_s += st.total_cpu_s
            bound_s += st.elapsed_s * st.cpus
    cpus = [st.cpus for st in tasks if st.cpus]
    per_node = [st.tasks / (st.nodes or 1) for st in tasks if st.tasks]
    return StepMetrics(
        total=len(tasks),
        failed=len(failed),
        node_failed=len(node_failed),
        first_failed_exit_code=failed[0].exit_code if failed else None,
        gpu_hours_failed=gpu_hours,
        gpu_hours_estimated=estimated,
        cpus_max=max(cpus) if cpus else None,
        cpu_efficiency_pct=100.0 * used_s / bound_s if bound_s > 0 else None,
        tasks_per_node_max=max(per_node, default=None),
        time_limit=ends.count(StepEnd.TIME_LIMIT),
        user_cancelled=ends.count(StepEnd.USER_CANCEL),
        job_end=ends.count(StepEnd.JOB_END),
    )


def _grid_share(grid: Sequence[int], below_duty_pct: float, cpu_min_pct: float) -> int:
    """Readings of a stall grid with the duty cycle in a bin wholly below ``below_duty_pct``
    and the cores busy in a bin at or above ``cpu_min_pct`` (thresholds between bin edges
    count only whole bins: the share errs low)."""
    duty_bins = [
        i for i in range(STALL_DUTY_BINS) if (i + 1) * STALL_DUTY_STEP_PCT <= below_duty_pct
    ]
    cpu_bins = [j for j in range(STALL_CPU_BINS) if j * STALL_CPU_STEP_PCT >= cpu_min_pct]
    return sum(grid[i * STALL_CPU_BINS + j] for i in duty_bins for j in cpu_bins)


def stall_shares_from_readings(
    gpus: Sequence[GpuSummary], settings: AnalysisSettings
) -> tuple[float, float] | None:
    """(stall share, strict stall share), percent of readings, from the used GPUs' stall
    grids; ``None`` when any of them has none (an older record) or no reading was counted."""
    if not gpus or any(not g.stall_grid for g in gpus):
        return None
    total = sum(sum(g.stall_grid) for g in gpus)
    if total <= 0:
        return None
    # The grid counts cores busy against the allocated CPUs; with n threads per core, a
    # share of the physical cores is n times the share of the CPUs.
    per_core = max(settings.threads_per_core, 1)
    loose = sum(
        _grid_share(g.stall_grid, settings.low_duty_pct, settings.cpu_saturated_pct / per_core)
        for g in gpus
    )
    strict = sum(
        _grid_share(
            g.stall_grid,
            settings.dataloader_max_duty_pct,
            settings.cpu_saturated_strict_pct / per_core,
        )
        for g in gpus
    )
    return 100.0 * loose / total, 100.0 * strict / total


def job_metrics(
    job: JobRecord, nodes: Sequence[NodeRecord], settings: AnalysisSettings
) -> JobMetrics:
    """All metrics of one job. ``nodes`` may miss some of the job's nodes, or be empty."""
    gpus = tuple(
        gpu_metrics(
            g,
            node,
            settings,
            processes_readable(node, settings),
            idle_phases(node, i, settings),
            capabilities_of(node.source),
            kernel_span(node, i),
            power_floor(node, i),
        )
        for node in nodes
        for i, g in enumerate(node.gpus)
    )
    observed = [g for g in gpus if g.duty_mean_pct is not None]
    used = [g for g in observed if g.used]
    gpus_allocated = job.alloc_tres.gpus or 0
    elapsed = max(job.elapsed_s, 0)
    hours = elapsed / SECONDS_PER_HOUR
    if gpus_allocated == 0 and not gpus:
        status = DataStatus.NO_GPU
    elif elapsed < settings.min_elapsed_s:
        status = DataStatus.TOO_SHORT
    elif not observed:
        status = DataStatus.NO_TELEMETRY
    else:
        status = DataStatus.OK
    busy = duty_mean = None
    wasted = wasted_gpu_hours(gpus, elapsed)
    if observed:
        busy = sum((g.duty_mean_pct or 0.0) / 100.0 * hours for g in observed)
        duty_mean = _fmean(g.duty_mean_pct or 0.0 for g in observed)
    used_means = [g.duty_mean_pct or 0.0 for g in used]
    node_means = []
    for node in nodes:
        values = [g.duty_mean_pct or 0.0 for g in used if g.hostname == node.hostname]
        if values:
            node_means.append(_fmean(values))
    energies = [g.energy_kwh for g in gpus if g.energy_kwh is not None]
    nnodes = seff_nnodes(job)
    ncpus = seff_ncpus(job)
    used_uuids = {g.uuid for g in used}
    stall, stall_strict, peak = _stall_and_peak(job, nodes, used_uuids, nnodes, settings)
    from_readings = stall_shares_from_readings(
        [g for n in nodes for g in n.gpus if g.info.uuid in used_uuids], settings
    )
    if from_readings is not None:
        stall, stall_strict = from_readings
    fed = {g.uuid for g in observed if (g.used or g.starved) and g.enough_data}
    main_stall = main_process_stall_pct(nodes, fed, settings)
    rss = [n.host.rss_max_bytes for n in nodes if n.host and n.host.rss_max_bytes is not None]
    gpu_count = gpus_allocated or len(gpus)
    cput = seff_cpu_used_s(job)
    return JobMetrics(
        job_id=job.job_id,
        status=status,
        elapsed_s=elapsed,
        time_limit_s=job.time_limit_s,
        time_efficiency_pct=_ratio_pct(elapsed, job.time_limit_s) if elapsed else None,
        ncpus=ncpus,
        nnodes=nnodes,
        cpu_used_s=cput,
        cpu_efficiency_pct=seff_cpu_efficiency_pct(job),
        cores_busy_mean_per_node=cput / elapsed / nnodes if cput is not None and elapsed else None,
        mem_used_bytes=job.max_rss_bytes,
        mem_allocated_bytes=seff_mem_allocated_bytes(job),
        mem_efficiency_pct=seff_mem_efficiency_pct(job),
        gpus_allocated=gpus_allocated,
        gpus_observed=len(observed),
        gpus_used=len(used),
        gpu_hours_allocated=gpus_allocated * hours,
        gpu_hours_busy=busy,
        gpu_hours_wasted=wasted,
        duty_mean_pct=duty_mean,
        imbalance_spread_pct=_spread(used_means),
        imbalance_cv=_cv(used_means),
        node_spread_pct=_spread(node_means),
        energy_kwh=sum(energies) if energies else None,
        cpus_per_gpu=(job.alloc_cpus / gpu_count) if job.alloc_cpus and gpu_count else None,
        stall_share_pct=stall,
        stall_share_strict_pct=stall_strict,
        stall_from_readings=from_readings is not None,
        main_stall_share_pct=main_stall,
        host_cores_peak=peak,
        host_cores_allocated_per_node=(job.alloc_cpus / nnodes) if job.alloc_cpus else None,
        host_rss_peak_bytes=max(rss) if rss else None,
        whole_node=whole_node_allocation(job, settings),
        nodes_expected=max(len(job.nodelist), 1),
        nodes_with_record=len(nodes),
        gpus=gpus,
        steps=step_metrics(job, gpus_allocated, nnodes),
        source=combined(n.source for n in nodes),
        stacks=stack_metrics(nodes, elapsed),
        interval_s=max((n.interval_s for n in nodes if n.interval_s > 0), default=None),
        core_efficiency_pct=_core_efficiency(seff_cpu_efficiency_pct(job), settings),
        physical_cores=settings.threads_per_core > 0,
        node_failure=node_failure(job),
        gpu_hours_after_progress=_after_progress(job, gpus, gpus_allocated),
    )


def _core_efficiency(eff: float | None, settings: AnalysisSettings) -> float | None:
    """``JobMetrics.core_efficiency_pct`` from seff's CPU efficiency."""
    if eff is None:
        return None
    return min(100.0, eff * max(settings.threads_per_core, 1))


def _after_progress(
    job: JobRecord, gpus: Sequence[GpuMetrics], gpus_allocated: int
) -> float | None:
    """``JobMetrics.gpu_hours_after_progress``."""
    last = [g.active_last_s for g in gpus if g.active_last_s is not None]
    end = job.end_s if job.end_s is not None else (job.start_s or 0.0) + job.elapsed_s
    if not last or not job.start_s:
        return None
    return max(0.0, end - max(last)) * (gpus_allocated or len(gpus)) / SECONDS_PER_HOUR
