"""What the Prometheus sources share: the window's queries and series -> node records.

A source asks Prometheus for a job's series with a range selector over the job's window
(``{__name__=~"...", <job label>="<id>"}[Ns]`` at the job's end), which Prometheus answers
with every raw sample as scraped: the series' own resolution, whatever the scrape interval,
and no step to guess. Windows longer than ``chunk_s`` are asked in consecutive pieces so that
no answer grows without bound. Each source turns its series into ``Reading`` values per node,
time and GPU (its own metric names and units converted here to the records' units), and
``build_node`` folds them, oldest first, through the same streaming aggregates the node's
sampler uses. What a source does not provide stays ``None``; the process list is never read
(``GpuSample.processes`` is ``None``), so "never used" and "shared" stay unknown.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.prometheus.client import PrometheusClient, Series
from slurm_gpu.records import GpuInfo, GpuSample, HostSample, JobRecord, NodeRecord
from slurm_gpu.sourcecaps import CAPABILITIES, SourceCapabilities
from slurm_gpu.sources.base import SourceResult

#: Raw-sample answers are asked at most this many seconds at a time (a 7-day job on 8 GPUs
#: with 12 series each at 15 s is ~4 million samples; a day of it is ~70 MB of JSON).
DEFAULT_CHUNK_S = 86400.0
_JOB_ID = re.compile(r"[0-9]{1,20}")
_HOST = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,253}")


@dataclass(frozen=True, slots=True)
class PromSourceOptions:
    """How a Prometheus source reads a job's window."""

    interval_s: float = 30.0
    """Scrape interval, seconds, used only when the data cannot tell it (one sample)."""
    margin_s: float = 60.0
    """Seconds read past the job's end (the last scrape comes after the job ended)."""
    chunk_s: float = DEFAULT_CHUNK_S
    idle_threshold_pct: float = 1.0
    timeline_points: int = 512


@dataclass(slots=True)
class GpuReading:
    """One GPU at one scrape, in the records' units; ``None``: not in the series."""

    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    sm_clock_mhz: int | None = None
    temperature_c: float | None = None
    memory_utilization_pct: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    xid: int | None = None
    """The last XID error the exporter reports (``0``: none)."""
    sm_active_pct: float | None = None
    tensor_active_pct: float | None = None
    busy_s: float | None = None
    """Cumulative kernel seconds (our exporter), for an exact duty cycle between scrapes."""
    sampled_s: float | None = None


@dataclass(slots=True)
class HostReading:
    """The job's processes on one node at one scrape."""

    cpu_time_s: float | None = None
    rss_bytes: int | None = None
    cpus: int | None = None


@dataclass(slots=True)
class NodeSeries:
    """Everything one source read for one node of the job."""

    gpus: dict[str, GpuInfo] = field(default_factory=dict)
    """By the source's own GPU key (UUID where it has one)."""
    gpu_readings: dict[float, dict[str, GpuReading]] = field(default_factory=dict)
    host_readings: dict[float, HostReading] = field(default_factory=dict)

    def gpu(self, t: float, key: str) -> GpuReading:
        return self.gpu_readings.setdefault(t, {}).setdefault(key, GpuReading())

    def host(self, t: float) -> HostReading:
        return self.host_readings.setdefault(t, HostReading())


class PrometheusSource:
    """What the Prometheus sources share: the client, the options, and the capabilities of the
    name their records carry (``record_name``, a key of ``sourcecaps.CAPABILITIES``)."""

    record_name = ""

    def __init__(self, client: PrometheusClient, options: PromSourceOptions) -> None:
        self.client = client
        self.options = options

    @property
    def capabilities(self) -> SourceCapabilities:
        return CAPABILITIES[self.record_name]

    def records_for(self, job: JobRecord) -> SourceResult:
        """The job's node records (each source reads its own series)."""
        raise NotImplementedError

    @staticmethod
    def unusable(job: JobRecord) -> SourceResult | None:
        """Every node missing when the job's id cannot go into a query; else ``None``."""
        if valid_job_id(job):
            return None
        return SourceResult((), tuple(job.nodelist), (f"job id {job.job_id!r} unusable",))


def valid_job_id(job: JobRecord) -> bool:
    """Whether the job's raw id can go into a query (digits only)."""
    return bool(_JOB_ID.fullmatch(job.job_id))


def short_host(value: str) -> str:
    """A node name as accounting writes it, from a label (``node1.cluster:9400`` -> ``node1``)."""
    host = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return host.split(".", 1)[0]


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def hosts_regex(hosts: Iterable[str]) -> str:
    """A label regex matching the given short names, with or without a domain or a port."""
    names = sorted({h for h in hosts if _HOST.fullmatch(h)})
    alts = "|".join(re.escape(h) for h in names) or "(?!)"
    return f"({alts})([.][^:]*)?(:[0-9]+)?"


def names_regex(names: Iterable[str]) -> str:
    return "|".join(sorted(set(names)))


def read_window(
    client: PrometheusClient, selector: str, job: JobRecord, options: PromSourceOptions
) -> tuple[list[Series], int]:
    """Every raw sample of ``selector`` from the job's start to its end (plus the margin),
    in pieces of at most ``chunk_s``; and the number of queries it took. A series cut by
    pieces comes back as one (points merged by its labels)."""
    if job.start_s is None or job.end_s is None:
        return [], 0
    start = job.start_s
    end = max(job.end_s, start) + options.margin_s
    merged: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    labels_of: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    queries = 0
    t = start
    while t < end:
        at = min(end, t + options.chunk_s)
        width = max(1, math.ceil(at - t))
        # A range selector covers (at - width, at]: the pieces neither overlap nor leave gaps.
        for s in client.query_matrix(f"{selector}[{width}s]", at):
            key = tuple(sorted(s.labels.items()))
            labels_of[key] = s.labels
            merged.setdefault(key, []).extend(p for p in s.points if p[0] >= start)
        queries += 1
        t = at
    return [Series(labels_of[k], tuple(sorted(v))) for k, v in merged.items()], queries


def _interval(times: Sequence[float], fallback: float) -> float:
    steps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return float(statistics.median(steps)) if steps else fallback


def build_node(
    *,
    job: JobRecord,
    host: str,
    source: str,
    series: NodeSeries,
    options: PromSourceOptions,
    allocated_cores: int | None,
) -> NodeRecord | None:
    """The node record of ``series`` (``None`` when it holds no GPU reading)."""
    times = sorted(series.gpu_readings)
    if not times or not series.gpus:
        return None
    interval = _interval(times, options.interval_s)
    # The record covers what the series saw: a first scrape late after the start, or a last
    # one early before the end (our exporter's last live summary goes with the epilog), is
    # an unknown edge, not an idle one.
    started = times[0] - interval
    ended = times[-1]
    if job.start_s is not None:
        started = max(job.start_s, started)
    if job.end_s is not None:
        ended = min(job.end_s, ended)
    for key, info in series.gpus.items():
        if info.memory_total_bytes is None:
            total = max(
                (r[key].memory_total_bytes or 0 for r in series.gpu_readings.values() if key in r),
                default=0,
            )
            if total:
                series.gpus[key] = replace(info, memory_total_bytes=total)
    keys = sorted(series.gpus, key=lambda k: (series.gpus[k].minor_number or 0, k))
    agg = NodeAggregator(
        job_id=job.job_id,
        hostname=host,
        uid=job.uid,
        interval_s=interval,
        source=source,
        gpus=[series.gpus[k] for k in keys],
        started_s=started,
        idle_threshold_pct=options.idle_threshold_pct,
        timeline_points=options.timeline_points,
        allocated_cores=allocated_cores,
    )
    host_times = sorted(series.host_readings)
    hi = 0
    prev: dict[str, tuple[float, GpuReading]] = {}
    nvlink: dict[str, list[float]] = {}
    last_xid: dict[str, int] = {}
    for t in times:
        samples = []
        for key, r in series.gpu_readings[t].items():
            gpu = series.gpus.get(key)
            if gpu is None:
                continue
            before = prev.get(key)
            samples.append(_sample(gpu.uuid, t, r, before, nvlink, last_xid, key))
            prev[key] = (t, r)
        # A host scrape (another target, other timestamps) joins the first GPU scrape at or
        # after it, so every host reading is counted once.
        hs: HostSample | None = None
        while hi < len(host_times) and host_times[hi] <= t:
            h = series.host_readings[host_times[hi]]
            hs = HostSample(
                time_s=host_times[hi],
                cpu_time_s=h.cpu_time_s,
                rss_bytes=h.rss_bytes,
                io_read_bytes=None,
                io_write_bytes=None,
                process_count=None,
                method="prometheus",
            )
            if h.cpus:
                agg.set_allocated_cores(h.cpus)
            hi += 1
        agg.add(t, samples, hs)
    return agg.record(ended_s=ended, complete=True, notes=(f"source:{source}",))


def _sample(
    uuid: str,
    t: float,
    r: GpuReading,
    before: tuple[float, GpuReading] | None,
    nvlink: dict[str, list[float]],
    last_xid: dict[str, int],
    key: str,
) -> GpuSample:
    util = r.utilization_pct
    if r.busy_s is not None and r.sampled_s is not None:
        # The exact duty cycle between two scrapes, from the exporter's counters (which count
        # from the job's start, so the first scrape's interval begins there).
        b_busy, b_sampled = 0.0, 0.0
        if before is not None and before[1].busy_s is not None and before[1].sampled_s is not None:
            b_busy, b_sampled = before[1].busy_s, before[1].sampled_s
        if r.sampled_s > b_sampled:
            util = 100.0 * max(0.0, r.busy_s - b_busy) / (r.sampled_s - b_sampled)
    tx = rx = None
    if r.nvlink_tx_bytes_per_s is not None or r.nvlink_rx_bytes_per_s is not None:
        # dcgm-exporter gives NVLink rates; the records count bytes: integrate over scrapes.
        acc = nvlink.setdefault(key, [0.0, 0.0])
        dt = t - before[0] if before is not None else 0.0
        acc[0] += (r.nvlink_tx_bytes_per_s or 0.0) * dt
        acc[1] += (r.nvlink_rx_bytes_per_s or 0.0) * dt
        tx, rx = int(acc[0]), int(acc[1])
    xids: tuple[int, ...] = ()
    if r.xid is not None:
        if r.xid and r.xid != last_xid.get(key, 0):
            xids = (r.xid,)
        last_xid[key] = r.xid
    return GpuSample(
        uuid=uuid,
        time_s=t,
        utilization_pct=None if util is None else min(100.0, max(0.0, util)),
        memory_utilization_pct=r.memory_utilization_pct,
        memory_used_bytes=r.memory_used_bytes,
        memory_total_bytes=r.memory_total_bytes,
        power_w=r.power_w,
        energy_mj=r.energy_mj,
        sm_clock_mhz=r.sm_clock_mhz,
        temperature_c=r.temperature_c,
        pcie_tx_bytes_per_s=r.pcie_tx_bytes_per_s,
        pcie_rx_bytes_per_s=r.pcie_rx_bytes_per_s,
        nvlink_tx_bytes=tx,
        nvlink_rx_bytes=rx,
        xid_events=xids,
        processes=None,
        sm_active_pct=r.sm_active_pct,
        tensor_active_pct=r.tensor_active_pct,
    )


def allocated_cores_fallback(job: JobRecord) -> int | None:
    """The job's cores on its one node, from accounting (``None`` for multi-node jobs:
    accounting does not say how they were spread)."""
    return job.alloc_cpus if len(job.nodelist) == 1 else None


def as_int(value: float | None) -> int | None:
    return None if value is None else int(value)


def result_of(
    job: JobRecord,
    nodes: dict[str, NodeSeries],
    source: str,
    options: PromSourceOptions,
    notes: tuple[str, ...],
) -> SourceResult:
    """The job's records from its nodes' series, in accounting's node order; a node with no
    GPU reading is missing."""
    records = []
    missing = []
    for host in job.nodelist:
        series = nodes.get(host)
        rec = None
        if series is not None:
            cores = max((h.cpus or 0 for h in series.host_readings.values()), default=0)
            rec = build_node(
                job=job,
                host=host,
                source=source,
                series=series,
                options=options,
                allocated_cores=cores or allocated_cores_fallback(job),
            )
        if rec is None:
            missing.append(host)
        else:
            records.append(rec)
    return SourceResult(tuple(records), tuple(missing), notes)
