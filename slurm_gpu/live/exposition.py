"""The node's running jobs in Prometheus' text exposition format (version 0.0.4).

Names follow Prometheus' conventions: ``slurm_gpu_`` prefix, the unit in the name
(``_seconds``, ``_bytes``, ``_watts``, ``_joules``, ``_ratio`` for 0-1 fractions), ``_total``
on counters, ``_timestamp_seconds`` on unix times. Every series carries the labels
``job_id``, ``user``, ``account``, ``partition`` and ``host``; GPU series add ``gpu_uuid``
and, where it is known, ``gpu_index``: the number Slurm names the GPU by on this node (its
device minor number, or the telemetry source's index where the source knows none), which
``slurm-gpu police`` checks against the GPU indices Slurm allocated the job here. There is no
label per reading, so a node exposes ``len(JOB_METRICS)`` series per job and
``len(GPU_METRICS)`` per GPU at most; a job's series disappear with its live summary
(removed by the epilog, or left out once stale). Label values were cleaned where they were
read (``live.snapshot``) and are escaped here as the format requires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.records import LiveGpu, LiveJob, NodeSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family: its name, type, help text and how to read its value."""

    name: str
    type: str
    help: str
    value: Callable[[Any], float | int | None]
    """The value for a job (``JOB_METRICS``) or a GPU (``GPU_METRICS``); None: no sample."""


def _pct_ratio(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


JOB_METRICS: tuple[Metric, ...] = (
    Metric(
        "slurm_gpu_job_start_timestamp_seconds",
        "gauge",
        "When the job's sampler started on this host, unix seconds.",
        lambda j: j.started_s,
    ),
    Metric(
        "slurm_gpu_job_last_sample_timestamp_seconds",
        "gauge",
        "Time of the sampler's last reading on this host, unix seconds.",
        lambda j: j.updated_s,
    ),
    Metric(
        "slurm_gpu_job_sample_interval_seconds",
        "gauge",
        "Seconds between two readings of the job's sampler.",
        lambda j: j.interval_s,
    ),
    Metric(
        "slurm_gpu_job_gpus",
        "gauge",
        "GPUs the job holds on this host.",
        lambda j: len(j.gpus),
    ),
    Metric(
        "slurm_gpu_job_cpu_seconds_total",
        "counter",
        "CPU time (user + system) of the job on this host since it started, seconds.",
        lambda j: j.cpu_time_s,
    ),
    Metric(
        "slurm_gpu_job_memory_rss_bytes",
        "gauge",
        "Resident memory of the job on this host, bytes.",
        lambda j: j.rss_bytes,
    ),
    Metric(
        "slurm_gpu_job_cpus_allocated",
        "gauge",
        "CPU cores allocated to the job on this host.",
        lambda j: j.allocated_cores,
    ),
)

GPU_METRICS: tuple[Metric, ...] = (
    Metric(
        "slurm_gpu_gpu_available",
        "gauge",
        "1 when the GPU answered at the last reading, else 0.",
        lambda g: int(g.available),
    ),
    Metric(
        "slurm_gpu_gpu_utilization_ratio",
        "gauge",
        "Duty cycle (share of time a kernel ran) at the last reading, 0-1.",
        lambda g: _pct_ratio(g.utilization_pct),
    ),
    Metric(
        "slurm_gpu_gpu_utilization_recent_ratio",
        "gauge",
        "Mean duty cycle over the sampler's recent window (5 minutes), 0-1.",
        lambda g: _pct_ratio(g.utilization_recent_pct),
    ),
    Metric(
        "slurm_gpu_gpu_utilization_mean_ratio",
        "gauge",
        "Mean duty cycle since the job started, 0-1.",
        lambda g: _pct_ratio(g.utilization_mean_pct),
    ),
    Metric(
        "slurm_gpu_gpu_busy_seconds_total",
        "counter",
        "Seconds a kernel ran since the job started (duty cycle x time).",
        lambda g: g.busy_s,
    ),
    Metric(
        "slurm_gpu_gpu_sampled_seconds_total",
        "counter",
        "Seconds covered by readings with a duty cycle since the job started.",
        lambda g: g.sampled_s,
    ),
    Metric(
        "slurm_gpu_gpu_idle_since_timestamp_seconds",
        "gauge",
        "Start of the GPU's current idle run, unix seconds; absent while it is busy.",
        lambda g: g.idle_since_s,
    ),
    Metric(
        "slurm_gpu_gpu_first_active_timestamp_seconds",
        "gauge",
        "First reading above the idle threshold, unix seconds; absent: never used.",
        lambda g: g.active_first_s,
    ),
    Metric(
        "slurm_gpu_gpu_memory_used_bytes",
        "gauge",
        "GPU memory in use, bytes.",
        lambda g: g.memory_used_bytes,
    ),
    Metric(
        "slurm_gpu_gpu_memory_used_max_bytes",
        "gauge",
        "Most GPU memory in use at any reading since the job started, bytes.",
        lambda g: g.memory_used_max_bytes,
    ),
    Metric(
        "slurm_gpu_gpu_memory_total_bytes",
        "gauge",
        "GPU memory in total, bytes.",
        lambda g: g.memory_total_bytes,
    ),
    Metric(
        "slurm_gpu_gpu_power_watts",
        "gauge",
        "Power draw at the last reading, watts.",
        lambda g: g.power_w,
    ),
    Metric(
        "slurm_gpu_gpu_energy_joules_total",
        "counter",
        "Energy the GPU used since the job started, joules.",
        lambda g: g.energy_j,
    ),
)

SKIPPED_METRIC = "slurm_gpu_exporter_summaries_skipped"
JOBS_METRIC = "slurm_gpu_exporter_jobs"


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it: backslash, double quote and line feed
    escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(v: float | int) -> str:
    # Values are finite (``live.snapshot`` drops the rest); repr is Python's shortest
    # round-trip form, which Prometheus' parser reads exactly.
    return repr(v)


def job_labels(job: LiveJob) -> str:
    e = escape_label_value
    return (
        f'job_id="{e(job.job_id)}",user="{e(job.user)}",account="{e(job.account)}",'
        f'partition="{e(job.partition)}",host="{e(job.host)}"'
    )


def gpu_labels(job: str, gpu: LiveGpu) -> str:
    """A GPU series' labels: its job's (``job_labels``), ``gpu_uuid`` and, where known,
    ``gpu_index`` (a whole number, ``live.snapshot``)."""
    labels = f'{job},gpu_uuid="{escape_label_value(gpu.uuid)}"'
    return labels if gpu.gpu_index is None else f'{labels},gpu_index="{gpu.gpu_index:d}"'


def _family(metric: Metric, rows: Iterable[tuple[str, Any]]) -> list[str]:
    lines = [f"# HELP {metric.name} {_help(metric.help)}", f"# TYPE {metric.name} {metric.type}"]
    name, get = metric.name, metric.value
    for labels, obj in rows:
        v = get(obj)
        if v is not None:
            lines.append(f"{name}{{{labels}}} {_value(v)}")
    return lines


def render(snapshot: NodeSnapshot) -> str:
    """The exposition of ``snapshot``: every family with its HELP and TYPE, then the
    exporter's own two families (jobs exposed, summaries skipped by reason)."""
    jobs: Sequence[LiveJob] = snapshot.jobs
    job_rows = [(job_labels(j), j) for j in jobs]
    gpu_rows: list[tuple[str, LiveGpu]] = []
    for labels, j in job_rows:
        gpu_rows.extend((gpu_labels(labels, g), g) for g in j.gpus)
    lines: list[str] = []
    for metric in JOB_METRICS:
        lines += _family(metric, job_rows)
    for metric in GPU_METRICS:
        lines += _family(metric, gpu_rows)
    lines += [
        f"# HELP {JOBS_METRIC} Jobs with a fresh live summary on this host.",
        f"# TYPE {JOBS_METRIC} gauge",
        f"{JOBS_METRIC} {len(jobs)}",
        f"# HELP {SKIPPED_METRIC} Live summaries left out of this exposition, by reason.",
        f"# TYPE {SKIPPED_METRIC} gauge",
        f'{SKIPPED_METRIC}{{reason="stale"}} {snapshot.stale}',
        f'{SKIPPED_METRIC}{{reason="unreadable"}} {snapshot.unreadable}',
    ]
    return "\n".join(lines) + "\n"
