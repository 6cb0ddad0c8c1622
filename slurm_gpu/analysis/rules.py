"""Diagnosis rules: one small function per signal pattern.

Each rule reads the job's metrics (and, for accounting facts, its record) and returns zero or
more findings. Rules never hard-code a threshold: every number comes from ``AnalysisSettings``
(the ``[analysis]`` section of the configuration). ``docs/analysis.md`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurm_gpu.analysis.findings import CODES, Code, Finding, Number, Scope, Severity
from slurm_gpu.analysis.metrics import DataStatus, GpuMetrics, JobMetrics
from slurm_gpu.analysis.outcomes import NODE_DOWN_REASONS
from slurm_gpu.analysis.stacks import stack_evidence
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord
from slurm_gpu.sourcecaps import SIGNALS as NEEDS_SIGNALS

Rule = Callable[[JobMetrics, JobRecord, AnalysisSettings], list[Finding]]

#: XID codes that point at the hardware or the driver rather than the user's program (NVIDIA's
#: XID catalogue: 48 double-bit ECC, 61/62 internal micro-controller, 63/64 page retirement,
#: 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained
#: ECC, 119/120 GSP). Application faults (13, 31, 43) are the user's and are not listed.
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})

#: Job states in which "it ended well before its limit" says the limit was too long.
FINISHED_NORMALLY = frozenset({"COMPLETED"})


def _used(m: JobMetrics, s: AnalysisSettings) -> list[GpuMetrics]:
    """The GPUs the rules diagnose: used, or starved (kernels through the job, too few to
    lift the mean duty cycle: fed too slowly, not unused)."""
    return [g for g in m.gpus if (g.used or g.starved) and g.enough_data]


def _r(value: float | None, digits: int = 1) -> Number:
    return None if value is None else round(value, digits)


def _diagnosable(m: JobMetrics) -> bool:
    return m.status is DataStatus.OK


def grade_below(value: float, threshold: float, s: AnalysisSettings) -> Severity | None:
    """The severity of a finding that fires when ``value`` falls below ``threshold``.

    ``None`` at or above the threshold; ``info`` (a note, not a diagnosis: no recommendation
    follows and it counts as no alarm) within ``near_threshold_band_pct`` of it; ``warning``
    further below. A job at 24.99 % against a 25 % threshold is then no different in effect
    from one at 25.00 %: both get no warning, and the first gets a note that names the line.
    """
    if value >= threshold:
        return None
    if value >= threshold * (1.0 - s.near_threshold_band_pct / 100.0):
        return Severity.INFO
    return Severity.WARNING


@dataclass(frozen=True, slots=True)
class RankSharing:
    """Ranks sharing GPUs on one node, and what showed it."""

    busy: GpuMetrics
    """The GPU the shared ranks ran on (the busiest with the most processes)."""
    context_only: list[GpuMetrics]
    """The node's GPUs that held a context only (none when every GPU was shared)."""
    processes: int | None
    """Compute processes on the busy GPU (``None``: no process list, told from accounting)."""
    tasks_per_node: float | None
    """The step's ranks per node (accounting's ``NTasks``), where that told it."""


def _ranks_share_gpu(
    m: JobMetrics, hostname: str, s: AnalysisSettings | None = None
) -> RankSharing | None:
    """Several ranks on one GPU of ``hostname``, or ``None``. With a readable process list:
    a used GPU with ≥ 2 compute processes while another allocated GPU held only a context, or
    ≥ ``ranks_per_gpu_min`` processes on every used GPU (time-sliced ranks). Without one
    (dcgm-exporter, other monitoring): a step ran more ranks per node than the node had GPUs
    with kernels, while its other GPUs held a small context (GPU memory used, no kernel)."""
    on_node = [g for g in m.gpus if g.hostname == hostname and g.enough_data]
    if not on_node:
        return None
    used = [g for g in on_node if g.used]
    if not used:
        return None
    if all(g.processes_known for g in on_node):
        shared = [g for g in used if g.max_processes >= 2]
        context_only = [g for g in on_node if not g.used and g.process_seen]
        if shared and context_only:
            top = max(shared, key=lambda g: g.max_processes)
            return RankSharing(top, context_only, top.max_processes, None)
        least = min(g.max_processes for g in used)
        if s is not None and least >= s.ranks_per_gpu_min and not context_only:
            top = max(used, key=lambda g: g.max_processes)
            return RankSharing(top, [], top.max_processes, None)
        return None
    tasks = m.steps.tasks_per_node_max if m.steps is not None else None
    context_only = [g for g in on_node if not g.used and (g.memory_peak_bytes or 0) > 0]
    if tasks is None or not context_only or tasks <= len(used):
        return None
    return RankSharing(max(used, key=lambda g: g.duty_mean_pct or 0.0), context_only, None, tasks)


# --------------------------------------------------------------------------- data quality


def too_short(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The job ran too briefly for a diagnosis."""
    if m.status is not DataStatus.TOO_SHORT:
        return []
    ev = {"elapsed_s": m.elapsed_s, "min_elapsed_s": s.min_elapsed_s}
    return [Finding(Code.TOO_SHORT, Severity.INFO, ev)]


def no_telemetry(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """GPUs were allocated but nothing was recorded about them."""
    if m.status is not DataStatus.NO_TELEMETRY:
        return []
    ev = {"gpus_allocated": m.gpus_allocated, "nodes_with_record": m.nodes_with_record}
    return [Finding(Code.NO_TELEMETRY, Severity.INFO, ev)]


def node_record_missing(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Some but not all of a multi-node job's nodes left a record."""
    if not (0 < m.nodes_with_record < m.nodes_expected) or m.gpus_allocated == 0:
        return []
    ev = {"nodes_expected": m.nodes_expected, "nodes_with_record": m.nodes_with_record}
    return [Finding(Code.NODE_RECORD_MISSING, Severity.INFO, ev)]


def gpu_lost(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """A GPU stopped answering during the job (fell off the bus, driver reset)."""
    out = []
    for g in m.gpus:
        if g.samples_available < g.samples:
            ev = {"samples": g.samples, "samples_available": g.samples_available}
            out.append(Finding(Code.GPU_LOST, Severity.WARNING, ev, Scope.GPU, g.uuid))
    return out


# --------------------------------------------------------------------------- cause 6


#: Longest subject a finding may name (the store's column is 255 characters).
SUBJECT_MAX_CHARS = 255


def name_gpus(uuids: Sequence[str]) -> str:
    """The GPUs a grouped finding is about, as its subject: their UUIDs, comma-separated;
    shortened to the UUIDs' first 12 characters (as ``nvidia-smi -L`` prints them, enough to
    tell a node's GPUs apart) when the full list would not fit ``SUBJECT_MAX_CHARS``, and cut
    with a count of the rest when even that does not."""
    full = ", ".join(uuids)
    if len(full) <= SUBJECT_MAX_CHARS:
        return full
    out: list[str] = []
    for i, u in enumerate(uuids):
        rest = f" and {len(uuids) - i} more"
        if len(", ".join([*out, u[:12]])) + len(rest) > SUBJECT_MAX_CHARS:
            return ", ".join(out) + rest
        out.append(u[:12])
    return ", ".join(out)


def gpu_unused(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Allocated GPUs that never ran a kernel (with or without a process on them): one finding
    for all of them that share what is known of them (a process seen, none, unknown), naming
    the GPUs, since they share the cause and the remedy. GPUs that held a context while ranks
    shared another GPU of their node are ``RANKS_SHARE_GPU``'s (the same cause, the binding as
    the remedy), not repeated here."""
    if not _diagnosable(m):
        return []
    hours = m.elapsed_s / 3600.0
    groups: dict[Number, list[GpuMetrics]] = {}
    for g in m.gpus:
        if g.used or g.starved or not g.enough_data:
            continue
        sharing = _ranks_share_gpu(m, g.hostname, s)
        if sharing is not None and g in sharing.context_only:
            continue
        # 1 seen, 0 none seen, None: the node's process list could not be read.
        seen: Number = int(g.process_seen) if g.process_seen or g.processes_known else None
        groups.setdefault(seen, []).append(g)
    out = []
    for seen, gpus in groups.items():
        ev = {
            "duty_mean_pct": _r(max(g.duty_mean_pct or 0.0 for g in gpus)),
            "process_seen": seen,
            "gpus_unused": len(gpus),
            "gpu_hours_wasted": _r(hours * len(gpus), 3),
            "gpus_allocated": m.gpus_allocated,
            "gpus_used": m.gpus_used,
            "whole_node": int(m.whole_node),
            "ranks_share_gpu": 0,
        }
        subject = name_gpus([g.uuid for g in gpus])
        out.append(Finding(Code.GPU_UNUSED, Severity.CRITICAL, ev, Scope.GPU, subject))
    return out


def ranks_share_gpu(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Several processes (ranks) ran their kernels on one GPU while the node's other allocated
    GPUs only held a context (the ranks were not bound to their own GPUs), or every GPU ran
    many ranks time-sliced; told from the process list, or, without one, from the step's
    ranks per node in accounting."""
    if not _diagnosable(m):
        return []
    out = []
    for hostname in dict.fromkeys(g.hostname for g in m.gpus):
        hit = _ranks_share_gpu(m, hostname, s)
        if hit is None:
            continue
        on_node = [g for g in m.gpus if g.hostname == hostname]
        power = [g.power_mean_of_limit_pct for g in on_node if g.used]
        known_power = [p for p in power if p is not None]
        ev = {
            "processes_on_busy_gpu": hit.processes,
            "tasks_per_node": _r(hit.tasks_per_node),
            # The context-only GPUs idled the whole job (GPU_UNUSED leaves them to this).
            "gpu_hours_wasted": _r(m.elapsed_s / 3600.0 * len(hit.context_only), 3),
            "busy_gpu_duty_mean_pct": _r(hit.busy.duty_mean_pct),
            "gpus_context_only": len(hit.context_only),
            "gpus_on_node": len(on_node),
            "power_mean_of_limit_pct": _r(sum(known_power) / len(known_power))
            if known_power
            else None,
        }
        # Allocated GPUs idle the whole job, as GPU_UNUSED would say: as severe.
        severity = Severity.CRITICAL if hit.context_only else Severity.WARNING
        if not hit.context_only:
            # Every GPU time-sliced between ranks: a fault only where the GPUs stayed far
            # from full (low duty or low power); otherwise a note (MPS jobs run this way).
            duty = _used_duty(m, s) or 0.0
            low_power = bool(known_power) and max(known_power) < s.busy_low_power_pct
            if duty >= s.low_duty_pct and not low_power:
                severity = Severity.INFO
        out.append(Finding(Code.RANKS_SHARE_GPU, severity, ev, Scope.NODE, hostname))
    return out


def _edge(m: JobMetrics, s: AnalysisSettings, which: str) -> tuple[float, float] | None:
    used = _used(m, s)
    values = [getattr(g, which) for g in used if getattr(g, which) is not None]
    if not values or m.elapsed_s <= 0:
        return None
    # The job's GPU work starts when its first GPU starts and ends when its last GPU ends.
    edge = min(values)
    pct = 100.0 * edge / m.elapsed_s
    # Long enough in absolute terms, or so large a share of a short job that the absolute
    # floor would hide it (a 900 s job idle for its last 500 s).
    long_enough = edge >= s.idle_edge_min_s or pct >= s.idle_edge_major_pct
    if long_enough and pct >= s.idle_edge_min_pct:
        return edge, pct
    return None


def _edge_thresholds(s: AnalysisSettings) -> dict[str, Number]:
    return {
        "idle_edge_min_s": s.idle_edge_min_s,
        "idle_edge_min_pct": s.idle_edge_min_pct,
        "idle_edge_major_pct": s.idle_edge_major_pct,
    }


def idle_head(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The GPUs sat idle for a long time after the job started (staging, setup on CPU)."""
    if not _diagnosable(m) or (hit := _edge(m, s, "idle_head_s")) is None:
        return []
    ev = {
        "idle_head_s": round(hit[0]),
        "idle_head_pct": _r(hit[1]),
        "elapsed_s": m.elapsed_s,
        "gpu_hours_idle": _r(hit[0] / 3600.0 * len(_used(m, s)), 3),
        "gpus_used": m.gpus_used,
        **_edge_thresholds(s),
    }
    return [Finding(Code.IDLE_HEAD, Severity.WARNING, ev)]


def idle_tail(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The GPUs sat idle for a long time before the job ended (CPU post-processing, a hang)."""
    if not _diagnosable(m) or (hit := _edge(m, s, "idle_tail_s")) is None:
        return []
    ev = {
        "idle_tail_s": round(hit[0]),
        "idle_tail_pct": _r(hit[1]),
        "elapsed_s": m.elapsed_s,
        "gpu_hours_idle": _r(hit[0] / 3600.0 * len(_used(m, s)), 3),
        "gpus_used": m.gpus_used,
        **_edge_thresholds(s),
    }
    return [Finding(Code.IDLE_TAIL, Severity.WARNING, ev)]


def idle_phases(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The GPUs went idle again and again in mid-job (a step post-processing on CPU, writing
    results, waiting for I/O): ``idle_phases_min_count`` or more phases of at least
    ``idle_phase_min_s`` on one GPU, adding up to ``idle_phases_min_pct`` of the used GPUs'
    time. Reported with what the host did meanwhile."""
    used = _used(m, s)
    if not _diagnosable(m) or not used or m.elapsed_s <= 0:
        return []
    if communication_wait(m, job, s):
        return []  # idle while NVLink traffic flows: waiting on communication (cause 5)
    if _main_process_bound(m, s) or any(g.sparse_kernels for g in used):
        return []  # the idle runs are the waits between batches, not phases
    most = max(g.idle_phases for g in used)
    idle_s = sum(g.idle_phases_s for g in used)
    share = 100.0 * idle_s / (m.elapsed_s * len(used))
    if most < s.idle_phases_min_count or share < s.idle_phases_min_pct:
        return []
    with_phases = [g for g in used if g.idle_phases]
    phases = sum(g.idle_phases for g in with_phases)
    cores_in = [g.idle_phase_cores for g in with_phases if g.idle_phase_cores is not None]
    cores_out = [g.busy_cores for g in with_phases if g.busy_cores is not None]
    ev = {
        "idle_phases_max_per_gpu": most,
        "idle_phases": phases,
        "gpus_with_phases": len(with_phases),
        "gpus_used": len(used),
        "idle_phase_mean_s": round(idle_s / phases) if phases else None,
        "gpu_hours_idle_phases": _r(idle_s / 3600.0, 3),
        "idle_phases_pct": _r(share),
        "cores_busy_in_phases": _r(sum(cores_in) / len(cores_in), 2) if cores_in else None,
        "cores_busy_otherwise": _r(sum(cores_out) / len(cores_out), 2) if cores_out else None,
        "idle_phase_min_s": s.idle_phase_min_s,
        "idle_phases_min_count": s.idle_phases_min_count,
    }
    return [Finding(Code.IDLE_PHASES, Severity.WARNING, ev)]


def ragged_tail(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Some GPUs finished long before the job's last one: for a while only k of n GPUs still
    worked (uneven shares of work, a straggler, a task farm's last tasks)."""
    used = [g for g in _used(m, s) if g.active_last_s is not None]
    if not _diagnosable(m) or len(used) < 2 or m.gpu_hours_allocated <= 0:
        return []
    if any(g.sparse_kernels for g in used):
        return []  # batches now and then: a GPU's last busy reading says little of its end
    last = max(g.active_last_s or 0.0 for g in used)
    early = [g for g in used if last - (g.active_last_s or 0.0) >= s.idle_phase_min_s]
    if not early:
        return []
    idle_s = sum(last - (g.active_last_s or 0.0) for g in early)
    share = 100.0 * idle_s / 3600.0 / m.gpu_hours_allocated
    if share < s.ragged_tail_min_pct:
        return []
    # The last stretch: from the latest time an early GPU stopped, only the rest worked.
    stretch = last - max(g.active_last_s or 0.0 for g in early)
    ev = {
        "gpus_used": len(used),
        "gpus_still_working": len(used) - len(early),
        "ragged_span_s": round(last - min(g.active_last_s or 0.0 for g in early)),
        "last_stretch_s": round(stretch),
        "gpu_hours_ragged": _r(idle_s / 3600.0, 3),
        "ragged_pct": _r(share),
        "ragged_tail_min_pct": s.ragged_tail_min_pct,
    }
    return [Finding(Code.RAGGED_TAIL, Severity.WARNING, ev)]


def time_overrequested(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The job finished far inside its time limit (hurts backfill and the user's wait)."""
    if m.status is DataStatus.TOO_SHORT or job.state not in FINISHED_NORMALLY:
        return []
    if m.time_limit_s is None or m.time_efficiency_pct is None:
        return []
    unused = m.time_limit_s - m.elapsed_s
    severity = grade_below(m.time_efficiency_pct, s.time_used_max_pct, s)
    if severity is None or unused < s.time_unused_min_s:
        return []
    ev = {
        "elapsed_s": m.elapsed_s,
        "time_limit_s": m.time_limit_s,
        "time_efficiency_pct": _r(m.time_efficiency_pct),
        "time_used_max_pct": s.time_used_max_pct,
    }
    return [Finding(Code.TIME_OVERREQUESTED, severity, ev)]


def _cores_idle_unexplained(m: JobMetrics, s: AnalysisSettings) -> bool:
    """Underused GPUs and no host readings over time: idle cores may be the DataLoader
    workers the job lacks (``DATALOADER_BOUND`` in the main process), which only the host's
    timeline can tell; fewer cores would then be the wrong advice."""
    duty = _used_duty(m, s)
    return (
        _diagnosable(m) and not m.source.host_series and duty is not None and duty < s.low_duty_pct
    )


def cpu_overrequested(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Most allocated cores did nothing (CPU efficiency as seff computes it)."""
    if _cores_idle_unexplained(m, s):
        return []  # SOURCE_CANNOT_TELL names it (cannot_tell_CPU_OVERREQUESTED)
    return _cpu_overrequested(m, s)


def _cpu_overrequested(m: JobMetrics, s: AnalysisSettings) -> list[Finding]:
    eff = m.cpu_efficiency_pct
    if m.status is DataStatus.TOO_SHORT or eff is None or m.cpu_used_s is None:
        return []
    if m.whole_node:
        return []  # the site gives whole nodes: asking for fewer cores changes nothing
    if m.steps is not None and _steps_cpu_bound(m, s):
        return []  # the steps were bound to too few cores, not given too many
    if _diagnosable(m) and m.source.host_series and _main_process_bound(m, s):
        return []  # the cores idled because the loader ran in the main process: they are needed
    idle_cores = m.ncpus - m.cpu_used_s / m.elapsed_s
    severity = grade_below(eff, s.cpu_efficiency_max_pct, s)
    if severity is None or idle_cores < s.cpu_idle_min_cores:
        return []
    # Mean and peak in one scope: cores busy on one node.
    ev = {
        "cpu_efficiency_pct": _r(eff, 2),
        "cpu_efficiency_max_pct": s.cpu_efficiency_max_pct,
        "cpus_allocated": m.ncpus,
        "nodes": m.nnodes,
        "cpus_allocated_per_node": _r(m.host_cores_allocated_per_node, 2),
        "cores_busy_mean_per_node": _r(m.cores_busy_mean_per_node, 2),
        "cores_busy_peak_per_node": _r(m.host_cores_peak, 2),
    }
    return [Finding(Code.CPU_OVERREQUESTED, severity, ev)]


def memory_overrequested(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The job used a small part of the memory it asked for (memory efficiency as seff)."""
    eff = m.mem_efficiency_pct
    if m.status is DataStatus.TOO_SHORT or eff is None or job.state == "OUT_OF_MEMORY":
        return []
    if m.whole_node:
        return []  # the site gives whole nodes: asking for less memory changes nothing
    assert m.mem_allocated_bytes is not None and m.mem_used_bytes is not None
    used = m.mem_used_bytes
    if m.host_rss_peak_bytes is not None:
        # MaxRSS is one task's peak; on several nodes the per-node peak against the per-node
        # allocation is the fairer test. Take whichever says the job used more.
        per_node = m.mem_allocated_bytes / m.nnodes
        used = max(used, m.host_rss_peak_bytes)
        eff = max(eff, 100.0 * m.host_rss_peak_bytes / per_node)
        if per_node - m.host_rss_peak_bytes < s.mem_unused_min_bytes:
            return []
    elif not m.source.host_series and m.nnodes > 1:
        # No host series from this source: MaxRSS, one task's peak, is at least what one
        # node used; judged against one node's allocation it never overstates the waste.
        per_node = m.mem_allocated_bytes / m.nnodes
        eff = max(eff, 100.0 * used / per_node)
        if per_node - used < s.mem_unused_min_bytes:
            return []
    severity = grade_below(eff, s.mem_efficiency_max_pct, s)
    if severity is None:
        return []
    if m.mem_allocated_bytes - used < s.mem_unused_min_bytes:
        return []
    ev = {
        "mem_efficiency_pct": _r(m.mem_efficiency_pct, 2),
        "mem_efficiency_judged_pct": _r(eff, 2),
        "mem_efficiency_max_pct": s.mem_efficiency_max_pct,
        "mem_used_bytes": m.mem_used_bytes,
        "host_rss_peak_bytes": m.host_rss_peak_bytes,
        "mem_allocated_bytes": m.mem_allocated_bytes,
    }
    return [Finding(Code.MEMORY_OVERREQUESTED, severity, ev)]


def gpu_oversized(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Little GPU memory and little GPU time: a smaller GPU or a MIG slice would do."""
    used = [g for g in _used(m, s) if not g.is_mig]
    if not _diagnosable(m) or not used or _input_bound(m, s):
        # Input-bound: the GPU time says how fast data came, not how much GPU the work needs.
        return []
    peaks = [g.memory_peak_pct for g in used]
    duties = [g.duty_mean_pct or 0.0 for g in used]
    if any(p is None for p in peaks):
        return []
    peak = max(p for p in peaks if p is not None)
    duty = sum(duties) / len(duties)
    if peak >= s.oversized_memory_pct or duty >= s.oversized_duty_pct:
        return []
    ev = {
        "memory_peak_pct": _r(peak),
        "memory_peak_bytes": max(g.memory_peak_bytes or 0 for g in used),
        "memory_capacity_bytes": min(g.memory_capacity_bytes or 0 for g in used),
        "duty_mean_pct": _r(duty),
    }
    return [Finding(Code.GPU_OVERSIZED, Severity.WARNING, ev)]


# --------------------------------------------------------------------------- cause 2


def _main_process_bound(m: JobMetrics, s: AnalysisSettings) -> bool:
    """The GPUs, below ``low_duty_pct``, waited without a kernel while one core per GPU
    worked, for ``stall_share_pct`` of the time: batches made one after another in the main
    process (``num_workers=0``), however many cores the job had."""
    duty = _used_duty(m, s)
    share = m.main_stall_share_pct
    return (
        duty is not None
        and duty < s.low_duty_pct
        and share is not None
        and share >= s.stall_share_pct
    )


def _input_bound(m: JobMetrics, s: AnalysisSettings) -> bool:
    if not m.source.host_series:
        return False  # nothing of the host over time: data loading cannot be asserted
    return _cores_bound(m, s) or _main_process_bound(m, s)


def _cores_bound(m: JobMetrics, s: AnalysisSettings) -> bool:
    """The GPUs below full use while the job's cores were saturated as a whole."""
    duty = _used_duty(m, s)
    if duty is None:
        return False
    if duty >= s.low_duty_pct:
        # Moderate or high duty, at any level: the readings in which the GPUs were below
        # ``dataloader_max_duty_pct`` while the cores were pinned (a molecular-dynamics job at
        # 55-75 % with every physical core busy). Without a timeline nothing says they
        # coincide: then the cores pinned over the whole job, below full GPU use.
        strict = m.stall_share_strict_pct
        if strict is not None:
            return strict >= s.stall_share_pct
        eff = m.core_efficiency_pct
        return (
            duty < s.dataloader_max_duty_pct
            and eff is not None
            and eff >= s.cpu_saturated_strict_pct
        )
    if m.stall_share_pct is not None:
        return m.stall_share_pct >= s.stall_share_pct
    # No timeline: saturated cores over the whole job are the only (weaker) sign.
    eff = m.core_efficiency_pct
    return eff is not None and eff >= s.cpu_saturated_pct


def _used_duty(m: JobMetrics, s: AnalysisSettings) -> float | None:
    used = _used(m, s)
    if not used:
        return None
    return sum(g.duty_mean_pct or 0.0 for g in used) / len(used)


def dataloader_bound(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The GPUs wait while the job's CPUs are saturated: data loading is the bottleneck."""
    if not _diagnosable(m) or not _input_bound(m, s):
        return []
    moderate = (_used_duty(m, s) or 0.0) >= s.low_duty_pct
    main = not _cores_bound(m, s)
    stall = m.stall_share_strict_pct if moderate else m.stall_share_pct
    ev = {
        "stall_share_pct": _r(m.main_stall_share_pct if main else stall),
        "stall_share_min_pct": s.stall_share_pct,
        "duty_mean_pct": _r(_used_duty(m, s), 2),
        "cpu_efficiency_pct": _r(m.cpu_efficiency_pct, 2),
        "cpus_per_gpu": _r(m.cpus_per_gpu),
        "stall_from_readings": int(m.stall_from_readings and not main),
        # 1: one core per GPU worked while the others sat idle (the cores were there).
        "main_process": int(main),
        "cores_busy_mean": _r(m.cores_busy_mean_per_node, 2),
        "cpus_allocated_per_node": _r(m.host_cores_allocated_per_node),
        "gpus_used": len(_used(m, s)),
        "physical_cores": int(m.physical_cores),
        "low_duty_pct": s.low_duty_pct,
    }
    return [Finding(Code.DATALOADER_BOUND, Severity.WARNING, ev)]


def _steps_cpu_bound(m: JobMetrics, s: AnalysisSettings) -> bool:
    """The job's steps kept the cores they were bound to pinned while the GPUs were below full
    use, and were bound to fewer cores than the node gave the job (otherwise the job-wide
    rules already see it): a task farm of one-core steps is CPU-bound per step although most
    of the node's cores sat idle."""
    st = m.steps
    duty = _used_duty(m, s)
    if st is None or st.cpu_efficiency_pct is None or duty is None:
        return False
    if duty >= s.dataloader_max_duty_pct or st.cpu_efficiency_pct < s.cpu_saturated_strict_pct:
        return False
    per_node = m.host_cores_allocated_per_node
    return per_node is None or st.cpus_max is None or st.cpus_max < per_node


def _cpu_unknown(m: JobMetrics) -> bool:
    """Nothing measured the job's CPUs: no host series and no CPU time in accounting."""
    return not m.source.host_series and m.cpu_efficiency_pct is None


def _tasks_known(m: JobMetrics) -> bool:
    """Accounting gave the task count of some step (ranks per node)."""
    return m.steps is not None and m.steps.tasks_per_node_max is not None


def _step_cpu_unknown(m: JobMetrics) -> bool:
    """The job's steps were bound to fewer cores than the node gave it, and accounting gave
    none of their CPU times: whether they kept their cores busy is unknown (the job-wide CPU
    time divides by cores the steps never had)."""
    st = m.steps
    if st is None or st.cpu_efficiency_pct is not None or st.cpus_max is None:
        return False
    per_node = m.host_cores_allocated_per_node
    return per_node is not None and st.cpus_max < per_node


def steps_cpu_bound(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Each step's cores were saturated while its GPU waited: judged against what the steps
    were bound to, not against the job's whole allocation."""
    if not _diagnosable(m) or _input_bound(m, s) or not _steps_cpu_bound(m, s):
        return []
    st = m.steps
    assert st is not None
    ev = {
        "step_cpu_efficiency_pct": _r(st.cpu_efficiency_pct),
        "cpu_saturated_strict_pct": s.cpu_saturated_strict_pct,
        "step_cpus_max": st.cpus_max,
        "steps": st.total,
        "cpus_allocated_per_node": _r(m.host_cores_allocated_per_node, 2),
        "duty_mean_pct": _r(_used_duty(m, s)),
        "whole_node": int(m.whole_node),
    }
    return [Finding(Code.STEPS_CPU_BOUND, Severity.WARNING, ev)]


def steps_failed(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Steps that failed on their own (``outcomes.StepEnd.OWN_FAILURE``), with the GPU-hours
    they spent; also inside a job that says COMPLETED (its batch script exited 0 after its
    ``srun`` steps failed). Steps Slurm ended (time limit, node failure, ``scancel``, the
    job's end) are not the user's failures and are left to those findings. Critical when
    every step failed."""
    st = m.steps
    if st is None or st.failed == 0:
        return []
    ev = {
        "steps": st.total,
        "steps_failed": st.failed,
        "steps_ended_by_slurm": st.time_limit + st.node_failed + st.user_cancelled + st.job_end,
        "first_failed_exit_code": st.first_failed_exit_code,
        "gpu_hours_failed": _r(st.gpu_hours_failed, 3),
        "gpu_hours_estimated": int(st.gpu_hours_estimated),
        "job_completed": int(job.state == "COMPLETED"),
        "derived_exit_code": job.derived_exit_code,
    }
    severity = Severity.CRITICAL if st.failed == st.total else Severity.WARNING
    return [Finding(Code.STEPS_FAILED, severity, ev)]


def too_few_cpus_per_gpu(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Input-bound with fewer cores per GPU than the site recommends."""
    if not _diagnosable(m) or m.cpus_per_gpu is None or not _input_bound(m, s):
        return []
    if m.cpus_per_gpu >= s.min_cpus_per_gpu:
        return []
    ev = {"cpus_per_gpu": _r(m.cpus_per_gpu), "min_cpus_per_gpu": s.min_cpus_per_gpu}
    return [Finding(Code.TOO_FEW_CPUS_PER_GPU, Severity.WARNING, ev)]


# --------------------------------------------------------------------------- causes 1 and 3


def low_parallelism(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Steadily low duty cycle with little GPU memory and idle CPUs: too little work per
    kernel launch (small batches); or busy duty cycle with low SM activity (tiny kernels)."""
    used = _used(m, s)
    if not _diagnosable(m) or not used or _input_bound(m, s) or _steps_cpu_bound(m, s):
        return []
    duty = sum(g.duty_mean_pct or 0.0 for g in used) / len(used)
    peaks = [g.memory_peak_pct for g in used if g.memory_peak_pct is not None]
    idle = [g.idle_share_pct for g in used if g.idle_share_pct is not None]
    sm = [g.sm_active_mean_pct for g in used if g.sm_active_mean_pct is not None]
    steady_low = (
        duty < s.low_duty_pct
        and bool(peaks)
        and max(peaks) < s.small_memory_pct
        and bool(idle)
        and max(idle) <= s.steady_max_idle_pct
    )
    sm_mean = sum(sm) / len(sm) if sm else None
    power = [g.power_mean_of_limit_pct for g in used if g.power_mean_of_limit_pct is not None]
    power_mean = sum(power) / len(power) if power else None
    mem_util = [g.memory_util_mean_pct for g in used if g.memory_util_mean_pct is not None]
    mem_util_mean = sum(mem_util) / len(mem_util) if mem_util else None
    busy = duty >= s.low_duty_pct
    # Busy but nearly empty: SM activity where the GPU reports it; otherwise (no DCGM/GPM
    # profiling) power drawn against the limit is the proxy, with memory bandwidth where the
    # source reports it (a memory-bound kernel draws little power too, but keeps the memory
    # controller busy); the evidence holds the signals that decided (a value of None: the
    # source does not report it).
    if sm_mean is not None:
        tiny_kernels = busy and sm_mean < s.low_sm_active_pct
    else:
        tiny_kernels = (
            busy
            and power_mean is not None
            and power_mean < s.busy_low_power_pct
            and (mem_util_mean is None or mem_util_mean < s.busy_low_memory_util_pct)
        )
    if not (steady_low or tiny_kernels):
        return []
    if not m.source.host_series and (m.core_efficiency_pct or 0.0) >= s.cpu_saturated_pct:
        return []  # saturated cores and no host series: input-bound cannot be ruled out
    ev = {
        "duty_mean_pct": _r(duty),
        "memory_peak_pct": _r(max(peaks)) if peaks else None,
        "sm_active_mean_pct": _r(sm_mean),
        "low_sm_active_pct": s.low_sm_active_pct,
        "power_mean_of_limit_pct": _r(power_mean),
        "busy_low_power_pct": s.busy_low_power_pct,
        "memory_util_mean_pct": _r(mem_util_mean),
        "busy_low_memory_util_pct": s.busy_low_memory_util_pct,
        "busy_nearly_empty": int(tiny_kernels),
        "cpu_efficiency_pct": _r(m.cpu_efficiency_pct, 2),
        "gpus_used": m.gpus_used,
        "whole_node": int(m.whole_node),
    }
    return [Finding(Code.LOW_PARALLELISM, Severity.WARNING, ev)]


def tensor_cores_idle(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Busy GPUs with tensor cores that never use them (no mixed precision / TF32)."""
    if not _diagnosable(m):
        return []
    cands = [
        g
        for g in _used(m, s)
        if g.compute_capability is not None
        and g.compute_capability[0] >= s.tensor_min_compute_major
        and g.tensor_active_mean_pct is not None
        and (g.duty_mean_pct or 0.0) >= s.tensor_busy_min_duty_pct
    ]
    # Tensor activity is a share of all cycles; relative to the duty cycle it is the share of
    # the GPU's busy time the tensor cores worked, which does not shrink on a half-idle GPU.
    rel = [100.0 * (g.tensor_active_mean_pct or 0.0) / (g.duty_mean_pct or 1.0) for g in cands]
    if not cands or max(rel) > s.tensor_idle_pct:
        return []
    cc = cands[0].compute_capability
    assert cc is not None
    ev = {
        "tensor_active_mean_pct": _r(max(g.tensor_active_mean_pct or 0.0 for g in cands)),
        "tensor_active_of_busy_pct": _r(max(rel)),
        "sm_active_mean_pct": _r(
            max(
                (g.sm_active_mean_pct for g in cands if g.sm_active_mean_pct is not None),
                default=None,
            )
        ),
        "duty_mean_pct": _r(sum(g.duty_mean_pct or 0.0 for g in cands) / len(cands)),
        "compute_capability": float(f"{cc[0]}.{cc[1]}"),
    }
    return [Finding(Code.TENSOR_CORES_IDLE, Severity.WARNING, ev)]


# --------------------------------------------------------------------------- cause 4


def gpu_memory_near_full(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """A GPU's memory peak came close to its capacity (one step from CUDA out-of-memory)."""
    if m.status is DataStatus.TOO_SHORT:
        return []
    full = [
        g
        for g in m.gpus
        if g.memory_peak_pct is not None and g.memory_peak_pct >= s.near_full_memory_pct
    ]
    if not full:
        return []
    top = max(full, key=lambda g: g.memory_peak_pct or 0.0)
    ev = {
        "memory_peak_pct": _r(top.memory_peak_pct),
        "memory_peak_bytes": top.memory_peak_bytes,
        "memory_capacity_bytes": top.memory_capacity_bytes,
        "gpus_near_full": len(full),
    }
    severity = Severity.CRITICAL if job.state == "FAILED" else Severity.WARNING
    return [Finding(Code.GPU_MEMORY_NEAR_FULL, severity, ev)]


def host_out_of_memory(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Slurm ended the job for exceeding its memory allocation on the host."""
    if job.state != "OUT_OF_MEMORY":
        return []
    ev = {"mem_used_bytes": m.mem_used_bytes, "mem_allocated_bytes": m.mem_allocated_bytes}
    return [Finding(Code.HOST_OUT_OF_MEMORY, Severity.CRITICAL, ev)]


# --------------------------------------------------------------------------- cause 5


def gpu_imbalance(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The used GPUs (or nodes) of one job worked very unequally: the others wait."""
    if not _diagnosable(m):
        return []
    spread = m.imbalance_spread_pct
    node_spread = m.node_spread_pct
    hit = (spread is not None and spread >= s.imbalance_spread_pct) or (
        node_spread is not None and node_spread >= s.imbalance_spread_pct
    )
    if not hit:
        return []
    duties = [g.duty_mean_pct or 0.0 for g in _used(m, s)]
    ev = {
        "imbalance_spread_pct": _r(spread),
        "imbalance_cv": _r(m.imbalance_cv, 3),
        "node_spread_pct": _r(node_spread),
        "duty_max_pct": _r(max(duties, default=None)),
        "duty_min_pct": _r(min(duties, default=None)),
        "gpus_used": m.gpus_used,
    }
    return [Finding(Code.GPU_IMBALANCE, Severity.WARNING, ev)]


def communication_wait(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """GPUs idle while NVLink traffic flows: waiting on collective communication."""
    if not _diagnosable(m) or m.gpus_used < 2:
        return []
    shares = [g.nvlink_idle_share_pct for g in _used(m, s) if g.nvlink_idle_share_pct is not None]
    if not shares or max(shares) < s.comm_idle_traffic_pct:
        return []
    total = sum(g.nvlink_bytes or 0 for g in _used(m, s))
    ev = {
        "nvlink_idle_share_pct": _r(max(shares)),
        "nvlink_bytes": total,
        "duty_mean_pct": _r(_used_duty(m, s)),
        "gpus_used": m.gpus_used,
    }
    return [Finding(Code.COMMUNICATION_WAIT, Severity.WARNING, ev)]


# --------------------------------------------------------------------------- the site's


#: Known for at least this share of the job reads as known for the whole job (the first
#: reading's interval and capped gaps make the known time fall a little short of the span).
_THROTTLE_WHOLE_JOB_PCT = 99.0


#: Power drawn at or above this share of the enforced limit, at the job's peak reading,
#: means the GPU reached its power cap (readings are 1 s means; a few percent under the cap
#: is the cap's own control band).
_AT_POWER_LIMIT_PCT = 95.0


def _reached_power_limit(g: GpuMetrics) -> bool:
    """Its peak reading at the cap, or, for a GPU busy in bursts shorter than a reading, its
    estimated draw while kernels ran (``GpuMetrics.power_busy_w``)."""
    if not g.power_limit_w:
        return False
    return any(
        w is not None and 100.0 * w / g.power_limit_w >= _AT_POWER_LIMIT_PCT
        for w in (g.power_max_w, g.power_busy_w)
    )


def throttled(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Clocks held down by the power cap or by heat for a large share of the job: of the
    time the driver said whether they were (never raised where it never did: unknown is
    not 0 %, and not a finding either). ``throttle_known_pct`` is in the evidence when the
    reasons were known for only part of the job."""
    if m.status is DataStatus.TOO_SHORT:
        return []
    out = []
    for g in m.gpus:
        for code, pct in (
            (Code.GPU_THROTTLED_POWER, g.throttle_power_pct),
            (Code.GPU_THROTTLED_THERMAL, g.throttle_thermal_pct),
        ):
            if pct is not None and pct >= s.throttle_min_pct:
                ev = {
                    "throttled_pct": _r(pct),
                    "power_mean_w": _r(g.power_mean_w),
                    "power_limit_w": _r(g.power_limit_w),
                    "power_max_w": _r(g.power_max_w),
                }
                known = g.throttle_known_pct
                if known is not None and known < _THROTTLE_WHOLE_JOB_PCT:
                    ev["throttle_known_pct"] = _r(known)
                severity = Severity.WARNING
                if code is Code.GPU_THROTTLED_POWER and _reached_power_limit(g):
                    # The GPU drew its full budget and the driver held its clocks there: how a
                    # GPU runs compute-bound work (seen on an H100 at 700 W under bf16 matrix
                    # products, 87 % of the job), not a fault. Said, not warned.
                    severity = Severity.INFO
                    ev["at_power_limit"] = 1
                    if g.power_busy_w is not None:
                        ev["power_busy_w"] = _r(g.power_busy_w)
                out.append(Finding(code, severity, ev, Scope.GPU, g.uuid))
    return out


def hardware_errors(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Uncorrected ECC errors or hardware XID events during the job."""
    out = []
    for g in m.gpus:
        xids = sorted(x for x in g.xid_events if x in HARDWARE_XIDS)
        if (g.ecc_uncorrected or 0) > 0 or xids:
            ev: dict[str, Number] = {
                "ecc_uncorrected": g.ecc_uncorrected,
                "ecc_corrected": g.ecc_corrected,
                "xid_count": len(xids),
            }
            ev.update({f"xid_{i}": x for i, x in enumerate(xids)})
            out.append(Finding(Code.GPU_HARDWARE_ERRORS, Severity.CRITICAL, ev, Scope.GPU, g.uuid))
    return out


def node_failed(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """A node of the job failed: the job ended NODE_FAIL, or it says FAILED with a NODE_FAIL
    step or a node-down reason (``outcomes.node_failure``). The site's problem, not the
    user's: the GPU-hours the job had spent are reported as lost (work since its last
    checkpoint is gone, which the records cannot date), with the GPU-hours it held after its
    GPUs' last kernel (the failure's own cost)."""
    if not m.node_failure:
        return []
    steps_down = m.steps.node_failed if m.steps is not None else 0
    ev = {
        "gpu_hours_lost": _r(m.gpu_hours_allocated, 3),
        "gpu_hours_after_progress": _r(m.gpu_hours_after_progress, 3),
        "gpus_allocated": m.gpus_allocated,
        "nodes": m.nnodes,
        "elapsed_s": m.elapsed_s,
        "steps_node_failed": steps_down,
        "job_node_failed": int(job.state == "NODE_FAIL"),
        "job_state_failed": int(job.state == "FAILED"),
        "node_down_reason": int(job.reason in NODE_DOWN_REASONS),
    }
    return [Finding(Code.NODE_FAILED, Severity.CRITICAL, ev)]


def time_limit_reached(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """The job reached its time limit and Slurm ended it (and its running steps): the time
    limit is the message, not the steps it ended."""
    if job.state != "TIMEOUT":
        return []
    ev = {
        "time_limit_s": m.time_limit_s,
        "elapsed_s": m.elapsed_s,
        "steps_ended_by_time_limit": m.steps.time_limit if m.steps is not None else 0,
        "gpu_hours_allocated": _r(m.gpu_hours_allocated, 3),
        "gpu_hours_after_progress": _r(m.gpu_hours_after_progress, 3),
    }
    return [Finding(Code.TIME_LIMIT_REACHED, Severity.WARNING, ev)]


def steps_ended_with_job(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> list[Finding]:
    """Steps Slurm ended because the job ended (its batch script returned) or because they
    were cancelled (``scancel``): said, as they are not failures; nothing when the time limit
    or a node failure ended them (those findings say it)."""
    st = m.steps
    if st is None or st.user_cancelled + st.job_end == 0:
        return []
    ev = {
        "steps": st.total,
        "steps_cancelled": st.user_cancelled,
        "steps_ended_with_job": st.job_end,
        "job_cancelled": int(job.state == "CANCELLED"),
    }
    return [Finding(Code.STEPS_ENDED_WITH_JOB, Severity.INFO, ev)]


#: The signals (``sourcecaps.SIGNALS``) each rule needs. A rule whose job's source lacks one
#: of them is not run (it would judge an absent signal as zero) and ``cannot_tell`` names it
#: instead. Rules not listed need only what every source has (the duty cycle, GPU memory)
#: or accounting, or read signals that are ``None`` where missing and then stay silent.
NEEDS: dict[str, tuple[str, ...]] = {
    "idle_head": ("timeline",),
    "idle_tail": ("timeline",),
    "idle_phases": ("timeline",),
    "ragged_tail": ("timeline",),
    "dataloader_bound": ("host_series", "timeline"),
    "too_few_cpus_per_gpu": ("host_series", "timeline"),
    "low_parallelism": ("timeline",),
    "tensor_cores_idle": ("sm_activity",),
}

#: The finding code of each rule in ``NEEDS`` (the evidence key of ``SOURCE_CANNOT_TELL``).
NEEDS_CODE: dict[str, Code] = {
    "ranks_share_gpu": Code.RANKS_SHARE_GPU,
    "idle_head": Code.IDLE_HEAD,
    "idle_tail": Code.IDLE_TAIL,
    "idle_phases": Code.IDLE_PHASES,
    "ragged_tail": Code.RAGGED_TAIL,
    "dataloader_bound": Code.DATALOADER_BOUND,
    "too_few_cpus_per_gpu": Code.TOO_FEW_CPUS_PER_GPU,
    "low_parallelism": Code.LOW_PARALLELISM,
    "tensor_cores_idle": Code.TENSOR_CORES_IDLE,
}


def _lacks(m: JobMetrics, rule: Rule) -> tuple[str, ...]:
    """The signals ``rule`` needs that the job's source does not have."""
    return tuple(sig for sig in NEEDS.get(rule.__name__, ()) if not getattr(m.source, sig))


def cannot_tell(
    m: JobMetrics,
    skipped: Sequence[Rule],
    found: Sequence[Finding],
    withheld: Sequence[Code] = (),
) -> list[Finding]:
    """One note naming what the job's source cannot tell: the rules not run for want of a
    signal (evidence ``cannot_tell_<CODE>`` = 1), the signals it lacks (``lacks_<signal>`` =
    1), and, for a GPU found unused, whether a process held it when there is no process list.
    The subject is the source's label, as the reports name it (``dcgm-exporter via
    Prometheus``). Only for a diagnosable job: a job without data has ``NO_TELEMETRY``."""
    if not _diagnosable(m):
        return []
    ev: dict[str, Number] = {f"cannot_tell_{NEEDS_CODE[r.__name__].value}": 1 for r in skipped}
    ev.update({f"cannot_tell_{code.value}": 1 for code in withheld})
    if not m.source.process_list and any(f.code is Code.GPU_UNUSED for f in found):
        ev["cannot_tell_process_on_unused_gpu"] = 1
    if not ev:
        return []
    for sig in NEEDS_SIGNALS:
        if not getattr(m.source, sig):
            ev[f"lacks_{sig}"] = 1
    if _step_cpu_unknown(m):
        ev["lacks_step_cpu_time"] = 1
    if _cpu_unknown(m):
        ev["lacks_job_cpu_time"] = 1
    # The records' own interval (a site may scrape every 60 s where 30 s is usual).
    interval = m.interval_s if m.interval_s else m.source.typical_interval_s
    ev["source_interval_s"] = interval
    return [Finding(Code.SOURCE_CANNOT_TELL, Severity.INFO, ev, Scope.JOB, m.source.label)]


#: Every rule, in evaluation order. ``unexplained`` runs after them (it needs their results).
RULES: Sequence[Rule] = (
    too_short,
    no_telemetry,
    node_record_missing,
    gpu_lost,
    gpu_unused,
    ranks_share_gpu,
    idle_head,
    idle_tail,
    idle_phases,
    ragged_tail,
    dataloader_bound,
    too_few_cpus_per_gpu,
    steps_cpu_bound,
    low_parallelism,
    tensor_cores_idle,
    gpu_memory_near_full,
    host_out_of_memory,
    gpu_oversized,
    gpu_imbalance,
    communication_wait,
    time_overrequested,
    cpu_overrequested,
    memory_overrequested,
    throttled,
    hardware_errors,
    node_failed,
    time_limit_reached,
    steps_failed,
    steps_ended_with_job,
)

#: Causes a specific rule can explain low utilization with; without one, say so (cause 7).
_EXPLAINING = frozenset({1, 2, 3, 4, 5})
#: Cause-6 findings that explain low utilization too (the GPUs sat idle for a stated time).
_EXPLAINING_CODES = frozenset({Code.IDLE_HEAD, Code.IDLE_TAIL, Code.IDLE_PHASES, Code.RAGGED_TAIL})


def _explains(code: Code) -> bool:
    """Whether a finding of ``code`` explains low utilization (``unexplained`` then stays)."""
    return CODES[code].cause in _EXPLAINING or code in _EXPLAINING_CODES


def unexplained(
    m: JobMetrics, job: JobRecord, s: AnalysisSettings, found: Sequence[Finding]
) -> list[Finding]:
    """Low utilization that no specific rule explains: point at the profiler (cause 7)."""
    duty = _used_duty(m, s)
    if not _diagnosable(m) or duty is None or duty >= s.low_duty_pct:
        return []
    if any(f.cause in _EXPLAINING or f.code in _EXPLAINING_CODES for f in found):
        return []
    ev = {"duty_mean_pct": _r(duty), "gpus_used": m.gpus_used}
    return [Finding(Code.LOW_UTILIZATION_UNEXPLAINED, Severity.WARNING, ev)]


def diagnose(m: JobMetrics, job: JobRecord, s: AnalysisSettings) -> tuple[Finding, ...]:
    """Every finding about a job, most severe first (stable within a severity)."""
    found: list[Finding] = []
    skipped: list[Rule] = []
    for rule in RULES:
        if _lacks(m, rule):
            skipped.append(rule)
            continue
        found.extend(rule(m, job, s))
    found = stack_evidence(m, s, found)  # evidence from inside the job (analysis/stacks.py)
    if not any(_explains(NEEDS_CODE[r.__name__]) for r in skipped):
        # A rule that could have explained low utilization did not run for want of a
        # signal: "no rule explains it" would be a guess; the cannot-tell note says why.
        found.extend(unexplained(m, job, s, found))
    # Findings a rule held back because the source cannot tell what would excuse them.
    withheld = [f.code for f in _cpu_overrequested(m, s) if _cores_idle_unexplained(m, s)]
    if not m.source.process_list and _diagnosable(m) and not _tasks_known(m):
        # No process list and no step task count: ranks sharing a GPU cannot be told.
        withheld.append(Code.RANKS_SHARE_GPU)
    if _cpu_unknown(m) and _diagnosable(m):
        # Neither the job's CPU time nor its host series: "the CPUs were not the bottleneck"
        # (steady LOW_PARALLELISM) would be said of CPUs nobody measured.
        held = [
            f
            for f in found
            if f.code is Code.LOW_PARALLELISM and not f.evidence.get("busy_nearly_empty")
        ]
        found = [f for f in found if f not in held]
        withheld.extend(f.code for f in held)
    if _step_cpu_unknown(m) and _diagnosable(m):
        # Steps bound to fewer cores than the node, without their CPU time: whether they were
        # CPU-bound on their cores is unknown, so neither "the CPUs were not the bottleneck"
        # (steady LOW_PARALLELISM) nor "too many cores" may be said.
        held = [
            f
            for f in found
            if f.code is Code.CPU_OVERREQUESTED
            or (f.code is Code.LOW_PARALLELISM and not f.evidence.get("busy_nearly_empty"))
        ]
        found = [f for f in found if f not in held]
        found = [f for f in found if f.code is not Code.LOW_UTILIZATION_UNEXPLAINED]
        withheld.extend(f.code for f in held)
        duty = _used_duty(m, s)
        if duty is not None and duty < s.dataloader_max_duty_pct:
            withheld.append(Code.STEPS_CPU_BOUND)
    found.extend(cannot_tell(m, skipped, found, list(dict.fromkeys(withheld))))
    found = _oversized_remedy(found, s)
    return tuple(sorted(found, key=lambda f: -f.severity.rank))


def _oversized_remedy(found: list[Finding], s: AnalysisSettings) -> list[Finding]:
    """``GPU_OVERSIZED`` says which cause its remedy belongs to: with ``LOW_PARALLELISM`` the
    small work is cause 1's, whose remedy (more work per GPU) comes first; and a smaller GPU
    or a MIG slice is named only where the site has them (``mig_partitions``,
    ``smaller_gpu_types``): elsewhere the finding is a note."""
    small = any(f.code is Code.LOW_PARALLELISM for f in found)
    has_smaller = bool(s.mig_partitions or s.smaller_gpu_types)
    out = []
    for f in found:
        if f.code is Code.GPU_OVERSIZED:
            ev = {
                **f.evidence,
                "with_low_parallelism": int(small),
                "site_has_smaller": int(has_smaller),
            }
            severity = f.severity if has_smaller else Severity.INFO
            f = Finding(f.code, severity, ev, f.scope, f.subject)
        out.append(f)
    return out
