"""NVIDIA dcgm-exporter's series, in HPC job-mapping mode, read back from Prometheus.

With ``--hpc-job-mapping-dir`` (a directory of files named by GPU index, each holding the ids
of the jobs on that GPU, written by the site's prolog/epilog), dcgm-exporter adds the label
``hpc_job="<job id>"`` to every series of a GPU a job holds. Its other labels: ``gpu`` (DCGM's
GPU index), ``UUID``, ``device`` (``nvidia<minor>``), ``modelName``, ``Hostname``. One query
per job (per ``chunk_s`` of its run) reads every field below for all its GPUs and nodes.

Units as dcgm-exporter writes them: ``DCGM_FI_DEV_GPU_UTIL`` percent (0-100), framebuffer
``FB_USED``/``FB_FREE`` MiB, ``POWER_USAGE`` watts, ``TOTAL_ENERGY_CONSUMPTION`` millijoules
(a counter since the driver loaded), ``DCGM_FI_PROF_*`` ratios (0-1, only where profiling
metrics are enabled), ``PROF_PCIE_*``/``PROF_NVLINK_*`` bytes per second, ``XID_ERRORS`` the
code of the last XID (0: none). No process list and no host series: those stay unknown.
"""

from __future__ import annotations

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

NAME = "dcgm-exporter"
#: The label dcgm-exporter writes in HPC job-mapping mode.
JOB_LABEL = "hpc_job"
HOST_LABEL = "Hostname"
MIB = 1 << 20

#: Metric name -> (``GpuReading`` field, factor to the records' unit).
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("memory_free", MIB),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
    # Memory utilization as NVML gives it (on in dcgm-exporter's default counters); the
    # profiling DRAM_ACTIVE below is preferred where both are scraped.
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("memory_copy_util", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("memory_utilization_pct", 100.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_per_s", 1.0),
}
#: The series without which a node reads as missing.
REQUIRED: tuple[str, ...] = ("DCGM_FI_DEV_GPU_UTIL",)
_INT_FIELDS = {"memory_used_bytes", "energy_mj", "sm_clock_mhz", "xid"}


def _minor(device: str) -> int | None:
    digits = device.removeprefix("nvidia")
    return int(digits) if digits.isdigit() else None


class DcgmExporterSource(PrometheusSource):
    """A job's node records from dcgm-exporter's job-mapped series (``TelemetrySource``)."""

    queries_per_job = 1
    """Queries per job (per ``chunk_s`` of its run)."""

    record_name = NAME

    def selector(self, job: JobRecord) -> str:
        return (
            f"{{__name__=~{promql_string(names_regex(FIELDS))},"
            f"{JOB_LABEL}={promql_string(job.job_id)},"
            f"{HOST_LABEL}=~{promql_string(hosts_regex(job.nodelist))}}}"
        )

    def records_for(self, job: JobRecord) -> SourceResult:
        if (unusable := self.unusable(job)) is not None:
            return unusable
        series, _ = read_window(self.client, self.selector(job), job, self.options)
        nodes: dict[str, NodeSeries] = {}
        free: dict[tuple[str, float, str], float] = {}
        copy_util: dict[tuple[str, float, str], float] = {}
        wanted = set(job.nodelist)
        for s in series:
            name = s.labels.get("__name__", "")
            host = short_host(s.labels.get(HOST_LABEL, ""))
            uuid = s.labels.get("UUID", "")
            if name not in FIELDS or host not in wanted or not uuid:
                continue
            node = nodes.setdefault(host, NodeSeries())
            if uuid not in node.gpus:
                node.gpus[uuid] = GpuInfo(
                    uuid=uuid,
                    index=_int(s.labels.get("gpu")),
                    minor_number=_minor(s.labels.get("device", "")),
                    name=s.labels.get("modelName") or None,
                )
            attr, factor = FIELDS[name]
            for t, v in s.points:
                if attr == "memory_free":
                    free[(host, t, uuid)] = v * factor
                    continue
                if attr == "memory_copy_util":
                    copy_util[(host, t, uuid)] = v * factor
                    continue
                value: float | int = v * factor
                if attr in _INT_FIELDS:
                    value = int(value)
                setattr(node.gpu(t, uuid), attr, value)
        for (host, t, uuid), copy in copy_util.items():
            reading: GpuReading = nodes[host].gpu(t, uuid)
            if reading.memory_utilization_pct is None:
                reading.memory_utilization_pct = copy
        for (host, t, uuid), free_b in free.items():
            r: GpuReading = nodes[host].gpu(t, uuid)
            if r.memory_used_bytes is not None:
                r.memory_total_bytes = int(r.memory_used_bytes + free_b)
        return result_of(
            job,
            nodes,
            NAME,
            self.options,
            ("no process list and no host series from dcgm-exporter",),
        )


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
