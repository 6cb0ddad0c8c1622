"""What each telemetry source can tell, by the name it writes in ``NodeRecord.source``.

The analysis reads this table (it imports no adapter) so that a rule needing a signal that the
job's source does not have says "cannot tell from <source>" instead of guessing, and the
reports can say where the numbers came from. The node's own hooks (``nvml``, ``virtual``)
sample every few seconds with the process list and the host's cgroup; the sources that read a
site's existing monitoring (``slurm_gpu.sources``) have coarser, partial views.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceCapabilities:
    """The signals one telemetry source provides (``True``: it can; ``False``: never)."""

    name: str
    """As written in ``NodeRecord.source``."""
    label: str
    """How the reports name it (``dcgm-exporter via Prometheus``)."""
    typical_interval_s: float | None
    """Usual sampling interval in seconds (``None``: no series, per-step means only)."""
    timeline: bool
    """A time series per GPU (phases, idle head/tail, ragged tails can be seen)."""
    process_list: bool
    """Which processes held each GPU (never-used vs context-only vs shared GPUs)."""
    host_series: bool
    """Host CPU and memory of the job over time (data-loading stalls, CPU saturation)."""
    power: bool
    """GPU power draw (busy-but-empty by power)."""
    sm_activity: bool
    """SM / tensor activity (profiling metrics) where the GPU offers them."""
    memory: bool
    """GPU memory used."""


#: Every source the project knows. A name not listed reads as the hooks' full view (records
#: written before this table existed came from the hooks).
CAPABILITIES: dict[str, SourceCapabilities] = {
    c.name: c
    for c in (
        SourceCapabilities(
            "nvml", "the node's sampler (NVML)", 5.0, True, True, True, True, True, True
        ),
        SourceCapabilities(
            "virtual", "the node's sampler (virtual GPUs)", 5.0, True, True, True, True, True, True
        ),
        # NVIDIA's dcgm-exporter in HPC job-mapping mode: per-GPU series, no process list,
        # nothing of the host; SM and tensor activity only where profiling (DCGM_FI_PROF_*)
        # is on, which the record then says by its values (None without).
        SourceCapabilities(
            "dcgm-exporter",
            "dcgm-exporter via Prometheus",
            30.0,
            True,
            False,
            False,
            True,
            True,
            True,
        ),
        # Princeton's jobstats exporters: per-job GPU series and the job's cgroup (host) series;
        # no process list, no profiling fields.
        SourceCapabilities(
            "jobstats", "jobstats via Prometheus", 30.0, True, False, True, True, False, True
        ),
        # The project's own exporter (live summaries of the hooks' samplers) read back from
        # Prometheus: series at the scrape interval, without the per-reading process list.
        SourceCapabilities(
            "slurm-exporter",
            "the slurm-gpu exporter via Prometheus",
            15.0,
            True,
            False,
            True,
            True,
            True,
            True,
        ),
        # Slurm accounting alone: per-step means of gres/gpuutil and gres/gpumem
        # (TRESUsageInAve/Max), where Slurm's NVML plugin runs; no series of any kind.
        SourceCapabilities(
            "slurm-tres",
            "Slurm accounting (per-step GPU TRES)",
            None,
            False,
            False,
            False,
            False,
            False,
            True,
        ),
    )
}

#: The signals a rule may need, in the order the reports name them.
SIGNALS: tuple[str, ...] = (
    "timeline",
    "process_list",
    "host_series",
    "power",
    "sm_activity",
    "memory",
)


def capabilities_of(source: str) -> SourceCapabilities:
    """The capabilities of ``source`` (the hooks' full view for an unknown name)."""
    found = CAPABILITIES.get(source)
    if found is not None:
        return found
    return SourceCapabilities(source, source, None, True, True, True, True, True, True)


def combined(sources: Iterable[str]) -> SourceCapabilities:
    """What the records of one job can tell together: a signal counts only when every node's
    source has it (a job read partly from a coarser source is judged by the coarser one).
    The label names the sources that lack something; the interval is the coarsest one.
    No source at all reads as the hooks' full view."""
    caps = [capabilities_of(s) for s in dict.fromkeys(sources)]
    if not caps:
        return capabilities_of("nvml")
    if len(caps) == 1:
        return caps[0]
    intervals = [c.typical_interval_s for c in caps]
    flags = {sig: all(getattr(c, sig) for c in caps) for sig in SIGNALS}
    lacking = [c for c in caps if not all(getattr(c, sig) for sig in SIGNALS)] or caps
    return SourceCapabilities(
        name="+".join(c.name for c in caps),
        label=" and ".join(c.label for c in lacking),
        typical_interval_s=None if None in intervals else max(i for i in intervals if i),
        **flags,
    )


def missing_signals(caps: SourceCapabilities) -> tuple[str, ...]:
    """The signals of ``SIGNALS`` that ``caps`` lacks."""
    return tuple(sig for sig in SIGNALS if not getattr(caps, sig))
