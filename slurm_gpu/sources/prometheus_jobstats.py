"""The series of Princeton's jobstats exporters, read back from Prometheus.

Two exporters per node, two queries per job (per ``chunk_s`` of its run):

* the GPU exporter (``nvidia_gpu_prometheus_exporter``, jobstats' fork): ``nvidia_gpu_*``
  with labels ``minor_number``, ``name``, ``uuid`` (and Prometheus' ``instance``,
  ``host:port``). The job is not a label: ``nvidia_gpu_jobId`` carries the id of the job on
  that GPU as its *value* (``nvidia_gpu_jobUid`` the owner's uid). So the GPU query reads the
  series of the job's nodes over its window, ``nvidia_gpu_jobId`` included, and keeps a GPU's
  scrape only where ``nvidia_gpu_jobId`` of that scrape equals the job's id (a node shared by
  several jobs gives each only its own GPUs). Units: ``duty_cycle`` percent (0-100),
  ``memory_*_bytes`` bytes, ``power_usage_milliwatts`` milliwatts,
  ``temperature_celsius``.
* the cgroup exporter (``cgroup_exporter``): ``cgroup_*`` with label ``jobid`` (and ``step``,
  ``task``; the job's own cgroup has both empty): ``cgroup_cpu_total_seconds`` (user + system
  CPU seconds, a counter), ``cgroup_memory_rss_bytes``, ``cgroup_cpus`` (cores allocated).

No process list, no power-independent SM activity, no energy counter (energy is the integral
of power), no XID: those stay unknown.
"""

from __future__ import annotations

from slurm_gpu.records import GpuInfo, JobRecord
from slurm_gpu.sources.base import SourceResult
from slurm_gpu.sources.prometheus_common import (
    NodeSeries,
    PrometheusSource,
    hosts_regex,
    names_regex,
    promql_string,
    read_window,
    result_of,
    short_host,
)

NAME = "jobstats"
JOB_ID_METRIC = "nvidia_gpu_jobId"
#: GPU metric -> (``GpuReading`` field, factor to the records' unit).
GPU_FIELDS: dict[str, tuple[str, float]] = {
    "nvidia_gpu_duty_cycle": ("utilization_pct", 1.0),
    "nvidia_gpu_memory_used_bytes": ("memory_used_bytes", 1.0),
    "nvidia_gpu_memory_total_bytes": ("memory_total_bytes", 1.0),
    "nvidia_gpu_power_usage_milliwatts": ("power_w", 0.001),
    "nvidia_gpu_temperature_celsius": ("temperature_c", 1.0),
}
#: cgroup metric -> ``HostReading`` field.
HOST_FIELDS: dict[str, str] = {
    "cgroup_cpu_total_seconds": "cpu_time_s",
    "cgroup_memory_rss_bytes": "rss_bytes",
    "cgroup_cpus": "cpus",
}
#: The series without which a node reads as missing.
REQUIRED: tuple[str, ...] = ("nvidia_gpu_duty_cycle", JOB_ID_METRIC)
_INT_FIELDS = {"memory_used_bytes", "memory_total_bytes", "rss_bytes", "cpus"}


class JobstatsSource(PrometheusSource):
    """A job's node records from the jobstats GPU and cgroup exporters (``TelemetrySource``)."""

    queries_per_job = 2
    """Queries per job (per ``chunk_s`` of its run): the GPU series and the cgroup series."""

    record_name = NAME

    def gpu_selector(self, job: JobRecord) -> str:
        names = names_regex([*GPU_FIELDS, JOB_ID_METRIC])
        return (
            f"{{__name__=~{promql_string(names)},"
            f"instance=~{promql_string(hosts_regex(job.nodelist))}}}"
        )

    def host_selector(self, job: JobRecord) -> str:
        return (
            f"{{__name__=~{promql_string(names_regex(HOST_FIELDS))},"
            f'jobid={promql_string(job.job_id)},step="",task="",'
            f"instance=~{promql_string(hosts_regex(job.nodelist))}}}"
        )

    def records_for(self, job: JobRecord) -> SourceResult:
        if (unusable := self.unusable(job)) is not None:
            return unusable
        wanted = set(job.nodelist)
        job_number = int(job.job_id)
        gpu_series, _ = read_window(self.client, self.gpu_selector(job), job, self.options)
        # (host, minor, uuid) -> scrape times at which the GPU was this job's.
        owned: dict[tuple[str, str, str], set[float]] = {}
        for s in gpu_series:
            if s.labels.get("__name__") == JOB_ID_METRIC:
                key = _gpu_key(s.labels)
                owned.setdefault(key, set()).update(t for t, v in s.points if int(v) == job_number)
        nodes: dict[str, NodeSeries] = {}
        for s in gpu_series:
            name = s.labels.get("__name__", "")
            if name not in GPU_FIELDS:
                continue
            host = short_host(s.labels.get("instance", ""))
            minor = s.labels.get("minor_number", "")
            times = owned.get(_gpu_key(s.labels), set())
            if host not in wanted or not times:
                continue
            uuid = s.labels.get("uuid") or f"{host}/gpu{minor}"
            attr, factor = GPU_FIELDS[name]
            node = None
            for t, v in s.points:
                if t not in times:
                    continue
                if node is None:
                    node = nodes.setdefault(host, NodeSeries())
                    if uuid not in node.gpus:
                        node.gpus[uuid] = GpuInfo(
                            uuid=uuid,
                            minor_number=int(minor) if minor.isdigit() else None,
                            name=s.labels.get("name") or None,
                        )
                value: float | int = v * factor
                if attr in _INT_FIELDS:
                    value = int(value)
                setattr(node.gpu(t, uuid), attr, value)
        host_series, _ = read_window(self.client, self.host_selector(job), job, self.options)
        for s in host_series:
            name = s.labels.get("__name__", "")
            host = short_host(s.labels.get("instance", ""))
            if name not in HOST_FIELDS or host not in nodes:
                continue  # no GPU series there: the node is missing whatever its cgroup says
            attr = HOST_FIELDS[name]
            for t, v in s.points:
                setattr(nodes[host].host(t), attr, int(v) if attr in _INT_FIELDS else v)
        return result_of(
            job, nodes, NAME, self.options, ("no process list and no SM activity from jobstats",)
        )


def _gpu_key(labels: dict[str, str]) -> tuple[str, str, str]:
    return (
        short_host(labels.get("instance", "")),
        labels.get("minor_number", ""),
        labels.get("uuid", ""),
    )
