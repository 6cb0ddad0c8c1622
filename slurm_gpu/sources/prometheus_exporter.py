"""The project's own node exporter (``slurm_gpu.live.exposition``), read back from Prometheus.

For sites that run ``slurm-gpu exporter`` on their nodes and scrape it, but collect no sealed
records (the exporter reads the samplers' live summaries, so the hooks still run there; this
source is for a collector host that only sees Prometheus). One query per job (per
``chunk_s`` of its run) over the series labelled ``job_id`` and ``host``; GPU series add
``gpu_uuid``. The duty cycle between two scrapes is exact: the difference of
``slurm_gpu_gpu_busy_seconds_total`` over that of ``slurm_gpu_gpu_sampled_seconds_total``
(the first scrape: the two counters themselves, which count from the job's start). Scrapes
that saw no new live summary are left out. Units are the exposition's: ratios 0-1, bytes,
watts, joules, seconds.
"""

from __future__ import annotations

from dataclasses import replace

from slurm_gpu.records import GpuInfo, JobRecord
from slurm_gpu.sources.base import SourceResult
from slurm_gpu.sources.prometheus_common import (
    GpuReading,
    NodeSeries,
    PrometheusSource,
    hosts_regex,
    names_regex,
    promql_string,
    read_window,
    result_of,
    short_host,
)

NAME = "slurm-exporter"
GPU_FIELDS: dict[str, tuple[str, float]] = {
    "slurm_gpu_gpu_utilization_ratio": ("utilization_pct", 100.0),
    "slurm_gpu_gpu_busy_seconds_total": ("busy_s", 1.0),
    "slurm_gpu_gpu_sampled_seconds_total": ("sampled_s", 1.0),
    "slurm_gpu_gpu_memory_used_bytes": ("memory_used_bytes", 1.0),
    "slurm_gpu_gpu_memory_total_bytes": ("memory_total_bytes", 1.0),
    "slurm_gpu_gpu_power_watts": ("power_w", 1.0),
    "slurm_gpu_gpu_energy_joules_total": ("energy_mj", 1000.0),
}
HOST_FIELDS: dict[str, str] = {
    "slurm_gpu_job_cpu_seconds_total": "cpu_time_s",
    "slurm_gpu_job_memory_rss_bytes": "rss_bytes",
    "slurm_gpu_job_cpus_allocated": "cpus",
}
#: The sampler's interval on the node, seconds (job series).
INTERVAL_METRIC = "slurm_gpu_job_sample_interval_seconds"
REQUIRED: tuple[str, ...] = (
    "slurm_gpu_gpu_busy_seconds_total",
    "slurm_gpu_gpu_sampled_seconds_total",
)
#: Most readings one scrape stands for (a scrape after an hour-long gap is not an hour).
MAX_EXPAND = 360
_INT_FIELDS = {"memory_used_bytes", "memory_total_bytes", "energy_mj", "rss_bytes", "cpus"}


class SlurmExporterSource(PrometheusSource):
    """A job's node records from the project's exporter series (``TelemetrySource``)."""

    queries_per_job = 1
    """Queries per job (per ``chunk_s`` of its run)."""

    record_name = NAME

    def selector(self, job: JobRecord) -> str:
        names = names_regex([*GPU_FIELDS, *HOST_FIELDS, INTERVAL_METRIC])
        return (
            f"{{__name__=~{promql_string(names)},job_id={promql_string(job.job_id)},"
            f"host=~{promql_string(hosts_regex(job.nodelist))}}}"
        )

    def records_for(self, job: JobRecord) -> SourceResult:
        if (unusable := self.unusable(job)) is not None:
            return unusable
        wanted = set(job.nodelist)
        series, _ = read_window(self.client, self.selector(job), job, self.options)
        nodes: dict[str, NodeSeries] = {}
        intervals: dict[str, float] = {}
        for s in series:
            name = s.labels.get("__name__", "")
            host = short_host(s.labels.get("host", ""))
            if host not in wanted:
                continue
            if name == INTERVAL_METRIC:
                positive = [v for _, v in s.points if v > 0]
                if positive:
                    intervals[host] = min(positive)
            elif name in GPU_FIELDS:
                uuid = s.labels.get("gpu_uuid", "")
                if not uuid:
                    continue
                node = nodes.setdefault(host, NodeSeries())
                node.gpus.setdefault(uuid, GpuInfo(uuid=uuid))
                attr, factor = GPU_FIELDS[name]
                for t, v in s.points:
                    value: float | int = v * factor
                    if attr in _INT_FIELDS:
                        value = int(value)
                    setattr(node.gpu(t, uuid), attr, value)
            elif name in HOST_FIELDS:
                hattr = HOST_FIELDS[name]
                node = nodes.setdefault(host, NodeSeries())
                for t, v in s.points:
                    setattr(node.host(t), hattr, int(v) if hattr in _INT_FIELDS else v)
        for host, node in nodes.items():
            _drop_repeats(node)
            if host in intervals:
                _expand(node, intervals[host])
        return result_of(
            job, nodes, NAME, self.options, ("no process list from the project's exporter",)
        )


def _drop_repeats(node: NodeSeries) -> None:
    """Leave out the scrapes that saw no new reading: the exporter shows the sampler's live
    summary, rewritten every 10 s or so, and Prometheus may scrape it several times between
    two rewrites; counting those again would weigh each summary by the scrapes it met. A
    GPU's scrape is new when its ``sampled_s`` counter moved."""
    last: dict[str, float] = {}
    for t in sorted(node.gpu_readings):
        readings = node.gpu_readings[t]
        for key in list(readings):
            sampled = readings[key].sampled_s
            if sampled is None:
                continue
            if key in last and sampled <= last[key]:
                del readings[key]
            else:
                last[key] = sampled
        if not readings:
            del node.gpu_readings[t]


def _expand(node: NodeSeries, interval_s: float) -> None:
    """Give each new scrape the weight of the sampler's readings it stands for: the counters
    moved by ``Δsampled`` seconds, i.e. ``Δsampled / interval_s`` readings, all at the duty
    ``Δbusy / Δsampled`` (their mean), placed one interval apart ending at the scrape. The
    job's mean duty is then the counters' exact one; the spread within an interval is lost."""
    last: dict[str, tuple[float, float]] = {}
    out: dict[float, dict[str, GpuReading]] = {}
    for t in sorted(node.gpu_readings):
        for key, r in node.gpu_readings[t].items():
            if r.busy_s is None or r.sampled_s is None:
                out.setdefault(t, {})[key] = r
                continue
            b0, s0 = last.get(key, (0.0, 0.0))
            last[key] = (r.busy_s, r.sampled_s)
            span = r.sampled_s - s0
            if span <= 0:
                continue
            duty = 100.0 * max(0.0, r.busy_s - b0) / span
            n = max(1, min(MAX_EXPAND, round(span / interval_s)))
            for i in range(n):
                out.setdefault(t - (n - 1 - i) * interval_s, {})[key] = replace(
                    r, utilization_pct=duty, busy_s=None, sampled_s=None
                )
    node.gpu_readings = out
