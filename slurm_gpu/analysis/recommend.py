"""Recommendations: concrete ``#SBATCH`` lines that would have fit this job and its similar
past jobs, with headroom over the observed peaks.

Safety rules: never propose less than the largest observed peak (this job and the similar
past ones) plus the configured headroom; propose a reduction only when that is still below
what was asked; never shorten ``--time`` when a similar job ran into its limit.

The set is built as a whole: the GPU count is decided first and the cores per GPU are computed
for the *proposed* count, so the proposed cores still cover the busiest cores observed. Only
warning or critical findings lead to a recommendation (an info note sits near its threshold),
and none reduces CPUs, memory or GPUs of a whole-node allocation, where asking for less
changes nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace

from slurm_gpu.analysis.findings import Code, Finding, Option, Recommendation, Severity
from slurm_gpu.analysis.history import PastJob
from slurm_gpu.analysis.metrics import JobMetrics
from slurm_gpu.analysis.request import (
    GPUS,
    GPUS_PER_NODE,
    GPUS_PER_TASK,
    Request,
    cpu_line,
    current_gpus,
    gpu_lines,
    mem_line,
    request_of,
)
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord

_MIG_NAME = re.compile(r"^(\d+)g\.(\d+)gb$")
#: Slices of a whole GPU in NVIDIA's MIG geometry (A100/H100: seven compute slices).
MIG_SLICES_PER_GPU = 7


def round_up(value: float, step: float) -> float:
    """``value`` rounded up to a multiple of ``step``."""
    return math.ceil(value / step - 1e-9) * step


def format_time(seconds: int) -> str:
    """Slurm's ``[D-]HH:MM:SS``."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


def format_mem(nbytes: int) -> str:
    """Whole GiB (``16G``) where exact, else MiB."""
    gib = 1024**3
    if nbytes % gib == 0:
        return f"{nbytes // gib}G"
    return f"{math.ceil(nbytes / 1024**2)}M"


def round_time_s(seconds: float, s: AnalysisSettings) -> int:
    """Round a duration up to the configured unit (coarser for long jobs)."""
    step = s.time_round_long_s if seconds > s.time_round_long_after_s else s.time_round_s
    return int(round_up(seconds, step))


def _codes(findings: Sequence[Finding]) -> set[Code]:
    """The codes of the findings a recommendation may act on (not info notes)."""
    return {f.code for f in findings if f.severity is not Severity.INFO}


def _gpu_type(req: Request) -> str:
    """The GPU type the user asked for, as a ``type:`` prefix; never one it did not ask for
    (AllocTRES names the type of every GPU given)."""
    return f"{req.gpu_type}:" if req.gpu_type else ""


def recommend_gpus(
    job: JobRecord, m: JobMetrics, findings: Sequence[Finding], past: Sequence[PastJob]
) -> list[Recommendation]:
    """Fewer GPUs when some never ran a kernel (and none did in similar jobs either); not when
    the site gives whole nodes, nor when ranks shared one GPU (the fix is binding them)."""
    codes = _codes(findings)
    if Code.GPU_UNUSED not in codes or m.gpus_allocated == 0 or m.whole_node:
        return []
    if Code.RANKS_SHARE_GPU in codes:
        return []
    if m.gpus_observed < m.gpus_allocated:
        return []  # a GPU we did not see may have been the busy one
    need = max([m.gpus_used, *(p.gpus_used for p in past if p.gpus_used is not None)])
    if need >= m.gpus_allocated:
        return []
    saved = (m.gpus_allocated - need) * m.elapsed_s / 3600.0
    req = request_of(job)
    if need == 0:
        lines: tuple[str, ...] = ()
        proposed = "0"
    else:
        # In the job's own form (--gres, --gpus, --gpus-per-node, --gpus-per-task) and type.
        lines, proposed = gpu_lines(req, need, m.nnodes)
    return [
        Recommendation(
            option=Option.GPUS,
            sbatch_lines=lines,
            current=current_gpus(req, m.gpus_allocated, m.nnodes),
            proposed=proposed,
            gpu_hours_saved=round(saved, 3),
            safe_because={"gpus_used_max": need, "gpus_allocated": m.gpus_allocated},
            based_on_jobs=1 + len(past),
            finding=Code.GPU_UNUSED,
        )
    ]


def _mig_memory_bytes(profile: str) -> tuple[int, int] | None:
    """(compute slices, memory bytes) from ``1g.10gb``; the name's GB read as 10⁹ bytes, which
    is below every real slice's memory, so the choice errs on the safe side."""
    match = _MIG_NAME.match(profile)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)) * 10**9


def recommend_mig(
    job: JobRecord,
    m: JobMetrics,
    findings: Sequence[Finding],
    past: Sequence[PastJob],
    s: AnalysisSettings,
) -> list[Recommendation]:
    """A MIG slice for a job that used a small part of a whole GPU, where the site has some."""
    if Code.GPU_OVERSIZED not in _codes(findings) or not s.mig_partitions or m.gpus_used < 1:
        return []
    peaks = [g.memory_peak_bytes for g in m.gpus if g.used and g.memory_peak_bytes is not None]
    peaks += [p.gpu_memory_peak_bytes for p in past if p.gpu_memory_peak_bytes is not None]
    if not peaks:
        return []
    peak = max(peaks)
    need = peak * (1 + s.headroom_gpu_mem_pct / 100.0)
    options = []
    for profile in s.mig_profiles:
        parsed = _mig_memory_bytes(profile)
        if parsed and parsed[1] >= need and parsed[0] < MIG_SLICES_PER_GPU:
            options.append((parsed[0], parsed[1], profile))
    if not options:
        return []
    slices, _mem, profile = min(options)
    n = m.gpus_used
    saved = n * m.elapsed_s / 3600.0 * (1 - slices / MIG_SLICES_PER_GPU)
    req = request_of(job)
    # The slice as a GPU type, in the job's own form of GPU request.
    flag = {GPUS: "--gpus", GPUS_PER_NODE: "--gpus-per-node"}.get(req.gpu_form or "")
    per_node = max(1, math.ceil(n / max(m.nnodes, 1)))
    if flag == "--gpus":
        gpu_line = f"#SBATCH --gpus={profile}:{n}"
    elif flag is not None or req.gpu_form == GPUS_PER_TASK:
        gpu_line = f"#SBATCH --{req.gpu_form}={profile}:{per_node if flag else 1}"
    else:
        gpu_line = f"#SBATCH --gres=gpu:{profile}:{per_node}"
    return [
        Recommendation(
            option=Option.MIG,
            sbatch_lines=(f"#SBATCH --partition={s.mig_partitions[0]}", gpu_line),
            current=current_gpus(req, m.gpus_allocated, m.nnodes),
            proposed=f"{profile}:{n}",
            gpu_hours_saved=round(saved, 3),
            safe_because={
                "gpu_memory_peak_bytes": peak,
                "headroom_pct": s.headroom_gpu_mem_pct,
            },
            based_on_jobs=1 + len(past),
            finding=Code.GPU_OVERSIZED,
        )
    ]


def _smaller_types(s: AnalysisSettings) -> list[tuple[int, str, str | None]]:
    """(memory bytes, type, partition or None) of ``smaller_gpu_types``, smallest first;
    entries that do not read as ``[partition:]type:memory_GiB`` are left out."""
    out = []
    for entry in s.smaller_gpu_types:
        parts = entry.split(":")
        if len(parts) not in (2, 3) or not parts[-1].strip().isdigit():
            continue
        partition = parts[0] if len(parts) == 3 else None
        out.append((int(parts[-1]) * 1024**3, parts[-2], partition))
    return sorted(out)


def recommend_smaller_gpu(
    job: JobRecord,
    m: JobMetrics,
    findings: Sequence[Finding],
    past: Sequence[PastJob],
    s: AnalysisSettings,
) -> list[Recommendation]:
    """The smallest GPU type of ``smaller_gpu_types`` that holds the GPU memory peak (this
    job and similar ones) plus ``headroom_gpu_mem_pct`` and is smaller than the GPU the job
    had, in the job's own form of GPU request, for a job found ``GPU_OVERSIZED``."""
    if Code.GPU_OVERSIZED not in _codes(findings) or m.gpus_used < 1:
        return []
    peaks = [g.memory_peak_bytes for g in m.gpus if g.used and g.memory_peak_bytes is not None]
    peaks += [p.gpu_memory_peak_bytes for p in past if p.gpu_memory_peak_bytes is not None]
    capacity = min((g.memory_capacity_bytes or 0) for g in m.gpus if g.used)
    if not peaks or not capacity:
        return []
    need = max(peaks) * (1 + s.headroom_gpu_mem_pct / 100.0)
    fits = [t for t in _smaller_types(s) if need <= t[0] < capacity]
    if not fits:
        return []
    memory, kind, partition = fits[0]
    req = replace(request_of(job), gpu_type=kind)
    if req.gpu_form == GPUS_PER_TASK:
        req = replace(req, gpu_form=None)  # a typed count per task: the plain form instead
    lines, proposed = gpu_lines(req, m.gpus_used, m.nnodes)
    if partition:
        lines = (f"#SBATCH --partition={partition}", *lines)
    return [
        Recommendation(
            option=Option.SMALLER_GPU,
            sbatch_lines=lines,
            current=current_gpus(request_of(job), m.gpus_allocated, m.nnodes),
            proposed=proposed,
            gpu_hours_saved=None,
            safe_because={
                "gpu_memory_peak_bytes": max(peaks),
                "headroom_pct": s.headroom_gpu_mem_pct,
                "gpu_memory_bytes": memory,
            },
            based_on_jobs=1 + len(past),
            finding=Code.GPU_OVERSIZED,
        )
    ]


def _cpu_line(job: JobRecord, m: JobMetrics, per_gpu: int, gpus_per_node: int) -> tuple[str, str]:
    """(line, value) giving each node ``per_gpu`` cores per GPU (or ``per_gpu`` cores for a job
    without GPUs), in the job's own form (``--cpus-per-task`` or ``--cpus-per-gpu``)."""
    req = request_of(job)
    per_node = gpus_per_node if m.gpus_allocated else 0
    line, value = cpu_line(req, per_gpu * max(per_node, 1), per_node, m.nnodes)
    return line, str(value)


def _proposed_gpus(m: JobMetrics, gpu_recs: Sequence[Recommendation]) -> int:
    """The job's GPU count once the GPU recommendation (if any) is followed."""
    for r in gpu_recs:
        if r.option is Option.GPUS:
            need = r.safe_because.get("gpus_used_max")
            if isinstance(need, int):
                return need
    return m.gpus_allocated


def recommend_cpus(
    job: JobRecord,
    m: JobMetrics,
    findings: Sequence[Finding],
    past: Sequence[PastJob],
    s: AnalysisSettings,
    gpus_proposed: int | None = None,
) -> list[Recommendation]:
    """More cores per GPU for an input-bound job; fewer for a job that left most idle.

    Cores per GPU are computed for ``gpus_proposed`` (the count after the GPU recommendation;
    the allocated count by default), and the cores they give a node (cores per GPU × GPUs on
    the node) never fall below the busiest cores observed on one node plus headroom."""
    codes = _codes(findings)
    if m.whole_node:
        return []  # the node's cores are the job's whatever it asks
    gpus_after = m.gpus_allocated if gpus_proposed is None else gpus_proposed
    gpus_per_node = m.gpus_allocated / m.nnodes if m.gpus_allocated else 0
    per = gpus_per_node or 1
    current = (m.host_cores_allocated_per_node or m.ncpus) / per
    if m.gpus_allocated and gpus_after == 0:
        return []  # no GPU left to count cores per: the GPU recommendation says it all
    # Fewest GPUs one node will hold after the change: the cores per GPU must feed its peak.
    per_after = max(1, gpus_after // m.nnodes) if m.gpus_allocated else 1
    peaks = [m.host_cores_peak, *(p.host_cores_peak for p in past)]
    known = [p for p in peaks if p is not None]
    floor = (
        math.ceil(max(known) * (1 + s.headroom_cpu_pct / 100.0) / per_after - 1e-9) if known else 1
    )
    main_process = any(
        f.code is Code.DATALOADER_BOUND and f.evidence.get("main_process") for f in findings
    )
    if main_process and Code.TOO_FEW_CPUS_PER_GPU not in codes:
        # One core per GPU worked while the others idled: the cores are there already; the
        # fix is in the code (DataLoader workers), not in the request.
        return []
    if codes & {Code.DATALOADER_BOUND, Code.TOO_FEW_CPUS_PER_GPU}:
        proposed = max(s.min_cpus_per_gpu, math.ceil(2 * current), floor)
        line, value = _cpu_line(job, m, proposed, per_after)
        return [
            Recommendation(
                option=Option.CPUS_PER_GPU,
                sbatch_lines=(line,),
                current=f"{current:g}",
                proposed=value,
                gpu_hours_saved=None,
                safe_because={
                    "cores_busy_peak": m.host_cores_peak,
                    "stall_share_pct": m.stall_share_pct,
                },
                based_on_jobs=1,
                finding=Code.DATALOADER_BOUND
                if Code.DATALOADER_BOUND in codes
                else Code.TOO_FEW_CPUS_PER_GPU,
            )
        ]
    if Code.CPU_OVERREQUESTED not in codes:
        return []
    if m.host_cores_peak is None or not known:
        return []  # a mean is not a peak: without one, no smaller request is safe
    peak = max(known)
    proposed = max(1, floor)
    # A reduction only: fewer cores on each node than now (per GPU, with the proposed GPUs).
    if proposed * per_after >= current * per:
        return []
    line, value = _cpu_line(job, m, proposed, per_after)
    return [
        Recommendation(
            option=Option.CPUS_PER_GPU,
            sbatch_lines=(line,),
            current=f"{current:g}",
            proposed=value,
            gpu_hours_saved=None,
            safe_because={"cores_busy_peak": round(peak, 2), "headroom_pct": s.headroom_cpu_pct},
            based_on_jobs=1 + len(past),
            finding=Code.CPU_OVERREQUESTED,
        )
    ]


def recommend_memory(
    job: JobRecord,
    m: JobMetrics,
    findings: Sequence[Finding],
    past: Sequence[PastJob],
    s: AnalysisSettings,
    gpus_proposed: int | None = None,
) -> list[Recommendation]:
    """Memory sized to the peak resident memory on a node plus headroom, in the job's own
    form: ``--mem`` (per node), ``--mem-per-gpu`` (for ``gpus_proposed``, the GPU count after
    the GPU recommendation) or ``--mem-per-cpu``."""
    codes = _codes(findings)
    if m.whole_node:
        return []  # the node's memory is the job's whatever it asks
    alloc_per_node = m.mem_allocated_bytes / m.nnodes if m.mem_allocated_bytes else None
    factor = 1 + s.headroom_mem_pct / 100.0
    if Code.HOST_OUT_OF_MEMORY in codes:
        base = max(
            v for v in (alloc_per_node, m.host_rss_peak_bytes, m.mem_used_bytes, 0) if v is not None
        )
        if not base:
            return []
        proposed = int(round_up(base * factor, s.mem_round_bytes))
        finding = Code.HOST_OUT_OF_MEMORY
    elif Code.MEMORY_OVERREQUESTED in codes and alloc_per_node:
        peaks = [m.host_rss_peak_bytes, m.mem_used_bytes, *(p.host_rss_peak_bytes for p in past)]
        known = [p for p in peaks if p is not None]
        if not known:
            return []
        base = max(known)
        proposed = int(round_up(base * factor, s.mem_round_bytes))
        if proposed >= alloc_per_node:
            return []
        finding = Code.MEMORY_OVERREQUESTED
    else:
        return []
    gpus_after = m.gpus_allocated if gpus_proposed is None else gpus_proposed
    gpus_per_node = math.ceil(gpus_after / max(m.nnodes, 1))
    cpus_per_node = int(m.host_cores_allocated_per_node or m.ncpus)
    line, each = mem_line(
        request_of(job), proposed, gpus_per_node, cpus_per_node, s.mem_round_bytes
    )
    return [
        Recommendation(
            option=Option.MEMORY,
            sbatch_lines=(line,),
            current=format_mem(int(alloc_per_node)) if alloc_per_node else None,
            proposed=format_mem(each),
            gpu_hours_saved=None,
            safe_because={"mem_peak_bytes": int(base), "headroom_pct": s.headroom_mem_pct},
            based_on_jobs=1 + (len(past) if finding is Code.MEMORY_OVERREQUESTED else 0),
            finding=finding,
        )
    ]


def recommend_time(
    job: JobRecord,
    m: JobMetrics,
    findings: Sequence[Finding],
    past: Sequence[PastJob],
    s: AnalysisSettings,
) -> list[Recommendation]:
    """``--time`` sized to the longest similar run plus headroom, rounded up."""
    if Code.TIME_OVERREQUESTED not in _codes(findings) or m.time_limit_s is None:
        return []
    if any(p.state == "TIMEOUT" for p in past):
        return []  # a similar job needed its whole limit, or more
    longest = max([m.elapsed_s, *(p.elapsed_s for p in past)])
    proposed = round_time_s(longest * (1 + s.headroom_time_pct / 100.0), s)
    if proposed >= m.time_limit_s:
        return []
    return [
        Recommendation(
            option=Option.TIME,
            sbatch_lines=(f"#SBATCH --time={format_time(proposed)}",),
            current=format_time(m.time_limit_s),
            proposed=format_time(proposed),
            gpu_hours_saved=None,
            safe_because={"elapsed_max_s": longest, "headroom_pct": s.headroom_time_pct},
            based_on_jobs=1 + len(past),
            finding=Code.TIME_OVERREQUESTED,
        )
    ]


def recommend(
    job: JobRecord,
    m: JobMetrics,
    findings: Sequence[Finding],
    s: AnalysisSettings,
    past: Sequence[PastJob] = (),
) -> tuple[Recommendation, ...]:
    """Every recommendation for a job, the ones that free GPU-hours first."""
    gpus = recommend_gpus(job, m, findings, past)
    after = _proposed_gpus(m, gpus)
    cpus = recommend_cpus(job, m, findings, past, s, after)
    if gpus and not cpus:
        cpus = cores_for_fewer_gpus(job, m, past, s, after)
    out = [
        *gpus,
        *recommend_mig(job, m, findings, past, s),
        *recommend_smaller_gpu(job, m, findings, past, s),
        *cpus,
        *recommend_memory(job, m, findings, past, s, after),
        *recommend_time(job, m, findings, past, s),
    ]
    return tuple(sorted(out, key=lambda r: -(r.gpu_hours_saved or 0.0)))


def cores_for_fewer_gpus(
    job: JobRecord,
    m: JobMetrics,
    past: Sequence[PastJob],
    s: AnalysisSettings,
    gpus_after: int,
) -> list[Recommendation]:
    """The CPU line a GPU cut needs where the job's cores come per GPU (``--cpus-per-gpu``, or
    ``--cpus-per-task`` with ``--gpus-per-task``): fewer GPUs would take their cores with
    them, below the busiest cores observed on a node plus headroom."""
    req = request_of(job)
    if not req.cores_per_gpu or not gpus_after or m.gpus_allocated == 0:
        return []
    known = [p for p in (m.host_cores_peak, *(p.host_cores_peak for p in past)) if p is not None]
    if not known:
        return []
    per_node_before = m.gpus_allocated / max(m.nnodes, 1)
    per_node_after = max(1, gpus_after // max(m.nnodes, 1))
    # What the job asked for per GPU (the allocation may hold more: whole cores, a minimum).
    cores_per_gpu = (m.host_cores_allocated_per_node or m.ncpus) / per_node_before
    if req.cpus_value:
        per_task_gpus = req.gpus_per_task if req.gpu_form == GPUS_PER_TASK else 1
        cores_per_gpu = req.cpus_value / (per_task_gpus or 1)
    need = math.ceil(max(known) * (1 + s.headroom_cpu_pct / 100.0) - 1e-9)
    if cores_per_gpu * per_node_after >= need:
        return []
    per_gpu = math.ceil(need / per_node_after)
    line, value = _cpu_line(job, m, per_gpu, per_node_after)
    return [
        Recommendation(
            option=Option.CPUS_PER_GPU,
            sbatch_lines=(line,),
            current=f"{cores_per_gpu:g}",
            proposed=value,
            gpu_hours_saved=None,
            safe_because={
                "cores_busy_peak": round(max(known), 2),
                "headroom_pct": s.headroom_cpu_pct,
            },
            based_on_jobs=1 + len(past),
            finding=Code.GPU_UNUSED,
        )
    ]
