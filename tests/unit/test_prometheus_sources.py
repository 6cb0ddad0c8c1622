"""The Prometheus sources read back, from a real Prometheus, what the nodes' samplers saw.

A two-node job (and a neighbour job sharing node ``gpu2``) is scraped every 15 s for 20
minutes: each scrape's live summaries are written in dcgm-exporter's, the jobstats exporters'
and the project's exporter's shapes (``live.testshapes``, test-only), loaded into a throwaway
Prometheus with ``promtool tsdb create-blocks-from openmetrics``, and read back by each source.
The reference is the record the node's aggregates build from the very same readings. Series
missing for one node make that node missing; what a source cannot give stays ``None``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import make_job

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.live.testshapes import render_openmetrics
from slurm_gpu.prometheus.client import PrometheusClient, PrometheusUnavailableError, Sample
from slurm_gpu.records import (
    GpuInfo,
    GpuSample,
    HostSample,
    JobRecord,
    LiveGpu,
    LiveJob,
    NodeRecord,
)
from slurm_gpu.sourcecaps import CAPABILITIES
from slurm_gpu.sources.prometheus_common import PromSourceOptions, hosts_regex, short_host
from slurm_gpu.sources.prometheus_dcgm import DcgmExporterSource
from slurm_gpu.sources.prometheus_exporter import SlurmExporterSource
from slurm_gpu.sources.prometheus_jobstats import JobstatsSource

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
SCRAPE_S = 15.0
SCRAPES = 80
GIB = 1 << 30
TOTAL = 80 * GIB


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _duty(host: str, g: int, k: int) -> float:
    """A phased workload: idle head on gpu1's second GPU, a busy middle, a ragged tail."""
    if host == "gpu1" and g == 1 and k < 30:
        return 0.0
    return 20.0 + (k * 7 + g * 13) % 70 if k < 70 else 5.0


class Trace:
    """The readings of the job's GPUs and hosts at each scrape, and the live summaries an
    exporter would show then (cumulative counters since the job's start)."""

    def __init__(self, job_id: str, hosts: tuple[str, ...], gpus: int, start: float) -> None:
        self.job_id, self.hosts, self.gpus, self.start = job_id, hosts, gpus, start
        self.times = [start + SCRAPE_S * (k + 1) for k in range(SCRAPES)]

    def uuid(self, host: str, g: int) -> str:
        return f"GPU-{self.job_id}-{host}-{g}"

    def reading(self, host: str, g: int, k: int) -> tuple[float, int, float]:
        duty = _duty(host, g, k)
        return duty, int((4 + duty / 10) * GIB), 60.0 + 3.0 * duty

    def live(self, k: int) -> list[LiveJob]:
        out = []
        for host in self.hosts:
            gpus = []
            for g in range(self.gpus):
                duty, mem, power = self.reading(host, g, k)
                busy = sum(self.reading(host, g, i)[0] for i in range(k + 1)) * SCRAPE_S / 100
                energy = sum(self.reading(host, g, i)[2] for i in range(k + 1)) * SCRAPE_S
                gpus.append(
                    LiveGpu(
                        uuid=self.uuid(host, g),
                        available=True,
                        utilization_pct=duty,
                        utilization_recent_pct=None,
                        utilization_mean_pct=None,
                        recent_window_s=None,
                        busy_s=busy,
                        sampled_s=SCRAPE_S * (k + 1),
                        idle_since_s=None,
                        active_first_s=None,
                        memory_used_bytes=mem,
                        memory_total_bytes=TOTAL,
                        memory_used_max_bytes=None,
                        power_w=power,
                        energy_j=energy,
                    )
                )
            out.append(
                LiveJob(
                    job_id=self.job_id,
                    host=host,
                    user="alice",
                    account="physics",
                    partition="gpu",
                    uid=1001,
                    started_s=self.start,
                    updated_s=self.times[k],
                    interval_s=SCRAPE_S,
                    cpu_time_s=2.5 * SCRAPE_S * (k + 1),
                    rss_bytes=(2 + k % 5) * GIB,
                    allocated_cores=8,
                    gpus=tuple(gpus),
                )
            )
        return out

    def reference(self, host: str) -> NodeRecord:
        """What the node's sampler would have sealed from the same readings."""
        agg = NodeAggregator(
            job_id=self.job_id,
            hostname=host,
            uid=1001,
            interval_s=SCRAPE_S,
            source="virtual",
            gpus=[GpuInfo(uuid=self.uuid(host, g)) for g in range(self.gpus)],
            started_s=self.start,
            allocated_cores=8,
        )
        for k, t in enumerate(self.times):
            samples = []
            for g in range(self.gpus):
                duty, mem, power = self.reading(host, g, k)
                samples.append(
                    GpuSample(
                        uuid=self.uuid(host, g),
                        time_s=t,
                        utilization_pct=duty,
                        memory_used_bytes=mem,
                        power_w=power,
                        processes=(),
                    )
                )
            agg.add(
                t,
                samples,
                HostSample(
                    t, 2.5 * SCRAPE_S * (k + 1), (2 + k % 5) * GIB, None, None, 1, "cgroup2"
                ),
            )
        return agg.record(ended_s=self.times[-1], complete=True)


class RepeatingTrace(Trace):
    """A job whose exporter rewrites its live summary every third scrape only (as the
    sampler does every 10 s): Prometheus scrapes the same summary three times."""

    def live(self, k: int) -> list[LiveJob]:
        return super().live(k // 3 * 3)


START = 1_763_000_000.0
TRACE = Trace("4242", ("gpu1", "gpu2"), 2, START)
NEIGHBOUR = Trace("4243", ("gpu2",), 1, START)
REPEATING = RepeatingTrace("4244", ("gpu4",), 1, START)


def _job(trace: Trace, nodes: tuple[str, ...]) -> JobRecord:
    from dataclasses import replace

    job = make_job(trace.job_id, gpus=trace.gpus * len(nodes), nodes=nodes)
    return replace(job, start_s=trace.start, end_s=trace.times[-1], uid=1001)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusClient]:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("prometheus is not installed (make deps)")
    tmp = tmp_path_factory.mktemp("prom")
    om = tmp / "series.om"
    # Job 4243 shares node gpu2 (its GPU also has minor number 0 there: GPUs are told apart
    # by UUID too); no series ever came from node gpu3.
    scrapes = [
        (t, TRACE.live(k) + NEIGHBOUR.live(k) + REPEATING.live(k))
        for k, t in enumerate(TRACE.times)
    ]
    om.write_text(render_openmetrics(scrapes, own=True))
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp / "data")],
        check=True,
        capture_output=True,
    )
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    port = _free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp}/prometheus.yml",
            f"--storage.tsdb.path={tmp}/data",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=100y",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "Prometheus did not start"
                time.sleep(0.3)
        yield PrometheusClient(url, 30.0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


SOURCES = {
    "dcgm-exporter": DcgmExporterSource,
    "jobstats": JobstatsSource,
    "slurm-exporter": SlurmExporterSource,
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_source_reads_back_what_the_samplers_saw(client: PrometheusClient, name: str) -> None:
    source = SOURCES[name](client, PromSourceOptions())
    result = source.records_for(_job(TRACE, TRACE.hosts))
    assert result.missing_hosts == ()
    assert [n.hostname for n in result.nodes] == list(TRACE.hosts)
    for node in result.nodes:
        ref = TRACE.reference(node.hostname)
        assert node.source == name
        assert node.interval_s == pytest.approx(SCRAPE_S)
        assert {g.info.uuid for g in node.gpus} == {g.info.uuid for g in ref.gpus}
        by_uuid = {g.info.uuid: g for g in ref.gpus}
        for g in node.gpus:
            r = by_uuid[g.info.uuid]
            assert g.samples == r.samples == SCRAPES
            # The exporter's counters give the exact duty per scrape; dcgm and jobstats the
            # scrape's reading: the same numbers here.
            assert g.utilization.mean == pytest.approx(r.utilization.mean, abs=0.01)
            assert g.idle_samples == r.idle_samples
            assert g.active_first_time_s == r.active_first_time_s
            assert g.memory_used_max_bytes == pytest.approx(r.memory_used_max_bytes, rel=1e-6)
            assert g.power_mean_w == pytest.approx(r.power_mean_w)
            assert g.info.memory_total_bytes == TOTAL
            # Unknown, not zero: no process list from any of them.
            assert g.process_state is None
            assert g.sm_active_mean_pct is None
        if CAPABILITIES[name].host_series:
            assert node.host is not None and ref.host is not None
            assert node.host.cpu_time_s == pytest.approx(ref.host.cpu_time_s)
            assert node.host.rss_max_bytes == ref.host.rss_max_bytes
            assert node.host.allocated_cores == 8
            assert node.host.cpu_cores_busy.mean == pytest.approx(ref.host.cpu_cores_busy.mean)
        else:
            assert node.host is None


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_node_without_series_is_missing_and_the_neighbour_is_not_read(
    client: PrometheusClient, name: str
) -> None:
    source = SOURCES[name](client, PromSourceOptions())
    result = source.records_for(_job(TRACE, ("gpu1", "gpu2", "gpu3")))
    assert result.missing_hosts == ("gpu3",)
    assert [n.hostname for n in result.nodes] == ["gpu1", "gpu2"]
    neighbour = source.records_for(_job(NEIGHBOUR, ("gpu2",)))
    assert [g.info.uuid for n in neighbour.nodes for g in n.gpus] == [NEIGHBOUR.uuid("gpu2", 0)]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_job_outside_the_data_has_every_node_missing(client: PrometheusClient, name: str) -> None:
    from dataclasses import replace

    job = replace(_job(TRACE, TRACE.hosts), job_id="999", job_id_display="999")
    result = SOURCES[name](client, PromSourceOptions()).records_for(job)
    assert result.nodes == ()
    assert result.missing_hosts == TRACE.hosts


def test_long_windows_are_read_in_pieces_without_losing_or_doubling_samples(
    client: PrometheusClient,
) -> None:
    source = DcgmExporterSource(client, PromSourceOptions(chunk_s=7 * SCRAPE_S + 3))
    whole = DcgmExporterSource(client, PromSourceOptions()).records_for(_job(TRACE, TRACE.hosts))
    pieces = source.records_for(_job(TRACE, TRACE.hosts))
    assert [g.samples for n in pieces.nodes for g in n.gpus] == [
        g.samples for n in whole.nodes for g in n.gpus
    ]
    assert [g.utilization for n in pieces.nodes for g in n.gpus] == [
        g.utilization for n in whole.nodes for g in n.gpus
    ]


def test_an_unreachable_prometheus_raises_for_a_retry() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{_free_port()}", 2.0)
    with pytest.raises(PrometheusUnavailableError):
        DcgmExporterSource(client, PromSourceOptions()).records_for(_job(TRACE, TRACE.hosts))


def test_a_job_id_that_is_not_a_number_is_never_put_in_a_query() -> None:
    from dataclasses import replace

    def refuse(url: str, timeout_s: float) -> bytes:
        raise AssertionError("no query expected")

    job = replace(_job(TRACE, TRACE.hosts), job_id='1"} or up{x="')
    client = PrometheusClient("http://127.0.0.1:1", 1.0, fetch=refuse)
    for cls in SOURCES.values():
        result = cls(client, PromSourceOptions()).records_for(job)
        assert result.nodes == () and result.missing_hosts == TRACE.hosts


def test_host_labels_match_short_names_with_domain_or_port() -> None:
    import re

    rx = re.compile(hosts_regex(["gpu1", "a.b"]))
    assert rx.fullmatch("gpu1") and rx.fullmatch("gpu1.cluster.org")
    assert rx.fullmatch("gpu1:9400") and rx.fullmatch("gpu1.cluster:9306")
    assert not rx.fullmatch("gpu10") and not rx.fullmatch("xgpu1")
    assert short_host("gpu1.cluster.org:9445") == "gpu1"


def test_doctor_says_which_series_each_node_has(client: PrometheusClient) -> None:
    from slurm_gpu.doctor import SeriesNeeds, Status, check_prometheus_series, series_needs

    def query(promql: str) -> list[Sample]:
        return client.query(promql, at_s=TRACE.times[-1])  # the loaded data's "now"

    dcgm = check_prometheus_series(query, series_needs("dcgm-exporter"))
    # The virtual GPUs have no profiling counters: present everywhere but optional.
    assert dcgm.status is Status.WARN
    assert "3 node(s) with every required series" in dcgm.detail
    assert "gpu1 lacks" in dcgm.detail and "DCGM_FI_PROF_SM_ACTIVE" in dcgm.detail
    assert "DCGM_FI_DEV_GPU_UTIL" not in dcgm.detail
    own = check_prometheus_series(query, series_needs("slurm-exporter"))
    assert own.status is Status.OK, own.detail
    absent = SeriesNeeds("jobstats", "instance", ("nvidia_gpu_no_such_series",), ())
    failed = check_prometheus_series(query, absent)
    assert failed.status is Status.FAIL and "nvidia_gpu_no_such_series" in failed.detail


def test_doctor_fails_the_check_when_prometheus_is_unreachable() -> None:
    from slurm_gpu.doctor import Status, check_prometheus_series, series_needs

    client = PrometheusClient(f"http://127.0.0.1:{_free_port()}", 2.0)
    check = check_prometheus_series(client.query, series_needs("jobstats"))
    assert check.status is Status.FAIL and "unreachable" in check.detail


def test_our_exporters_repeated_summaries_count_once_weighted_by_their_readings(
    client: PrometheusClient,
) -> None:
    result = SlurmExporterSource(client, PromSourceOptions()).records_for(
        _job(REPEATING, REPEATING.hosts)
    )
    (node,) = result.nodes
    (gpu,) = node.gpus
    last = (SCRAPES - 1) // 3 * 3  # the last summary the scrapes saw
    duties = [REPEATING.reading("gpu4", 0, k)[0] for k in range(last + 1)]
    # One reading per sampler interval the counters moved over, at the counters' mean duty.
    assert gpu.samples == last + 1
    assert gpu.utilization.mean == pytest.approx(sum(duties) / len(duties), abs=0.01)


@pytest.mark.parametrize("readings", [1, 3, 2000])
def test_the_lab_shapes_take_the_newest_whole_spool_reading(tmp_path: Path, readings: int) -> None:
    from slurm_gpu.capture.spool import SpoolHeader, SpoolWriter
    from slurm_gpu.capture.spoolpaths import JobSpool
    from slurm_gpu.live.testshapes import last_reading

    paths = JobSpool(str(tmp_path), "77", "gpu1")
    Path(paths.job_dir).mkdir()
    header = SpoolHeader("77", "gpu1", 1001, 1.0, "virtual", (GpuInfo("GPU-a"),), 100.0)
    writer = SpoolWriter(paths.jsonl, header)
    for k in range(readings):
        writer.append(
            101.0 + k,
            [GpuSample("GPU-a", 101.0 + k, utilization_pct=float(k % 100))],
            HostSample(101.0 + k, 2.0 * k, 1 << 30, None, None, 1, "cgroup2"),
        )
    writer.close()
    with open(paths.jsonl, "ab") as fh:
        fh.write(b"[1e9, [[50")  # a line being written
    got = last_reading(str(tmp_path), "77", "gpu1")
    assert got is not None and got.time_s == 100.0 + readings
    assert got.gpus[0].utilization_pct == float((readings - 1) % 100)
    assert last_reading(str(tmp_path), "78", "gpu1") is None


def test_doctor_builds_one_check_per_prometheus_source() -> None:
    from slurm_gpu.doctor import Status, prometheus_checks

    checks = prometheus_checks(
        f"http://127.0.0.1:{_free_port()}", 2.0, ["virtual", "jobstats", "dcgm-exporter"]
    )
    assert sorted(checks) == ["prometheus:dcgm-exporter", "prometheus:jobstats"]
    assert all(c().status is Status.FAIL for c in checks.values())  # nothing listens there
    bad = prometheus_checks("not a url", 2.0, ["jobstats"])["prometheus:jobstats"]()
    assert bad.status is Status.FAIL and "not an http(s) URL" in bad.detail
