"""``slurm-gpu live``: the view from the node's live files and from a real Prometheus, and the
recording rules (``share/prometheus``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.cli.admin import cli
from slurm_gpu.live.allocation import SlurmJob
from slurm_gpu.live.exporter import ExporterOptions, make_server
from slurm_gpu.live.snapshot import read_node
from slurm_gpu.live.view import build_rows
from slurm_gpu.prometheus.client import PrometheusClient, PrometheusUnavailableError, parse_vector
from slurm_gpu.prometheus.livejobs import live_jobs
from slurm_gpu.records import GpuInfo, GpuSample

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "share" / "prometheus" / "slurm-gpu.rules.yml"


class Source:
    """GPUs whose duty cycle is fixed per GPU (``util`` by UUID)."""

    name = "fake"

    def __init__(self, util: dict[str, float], clock: Clock) -> None:
        self.util, self.clock = util, clock

    def list_gpus(self) -> Sequence[GpuInfo]:
        return [GpuInfo(uuid=u) for u in self.util]

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        return [GpuSample(uuid=u, time_s=self.clock(), utilization_pct=self.util[u]) for u in uuids]

    def close(self) -> None:
        pass


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sampler_for(
    spool: Path, job_id: str, util: dict[str, float], clock: Clock, user: str = "alice"
) -> Sampler:
    opts = SamplerOptions(
        job_id=job_id,
        hostname="n1",
        uid=1000,
        gpu_uuids=tuple(util),
        spool_dir=str(spool),
        interval_s=10.0,
        checkpoint_interval_s=1e9,
        idle_threshold_pct=1.0,
        timeline_points=64,
        user=user,
        account="physics",
        partition="gpu",
    )
    sampler = Sampler(opts, lambda: Source(util, clock), None, clock=clock)
    sampler.open_spool()
    return sampler


def run_for(sampler: Sampler, clock: Clock, readings: int) -> None:
    for _ in range(readings):
        sampler.read_once()
        clock.now += 10.0
    clock.now -= 10.0
    sampler.write_live()


def test_live_lists_the_job_wasting_most_gpus_first_with_its_findings(tmp_path: Path) -> None:
    t0 = 2_000_000.0
    spool = tmp_path / "spool"
    # Job 10: one GPU busy, one never used. Job 11: two GPUs at 50 %. Job 12: healthy.
    for job, util in (
        ("10", {"GPU-a": 90.0, "GPU-b": 0.0}),
        ("11", {"GPU-c": 50.0, "GPU-d": 50.0}),
        ("12", {"GPU-e": 95.0}),
    ):
        clock = Clock(t0)
        run_for(sampler_for(spool, job, util, clock), clock, 120)  # 20 minutes
    now = t0 + 1190.0
    rows = build_rows(
        read_node(str(spool), now, 180.0).jobs, now, idle_min_s=900.0, stale_after_s=180.0
    )
    assert [r.job_id for r in rows] == ["10", "11", "12"]
    worst = rows[0]
    assert worst.gpus == 2 and worst.gpus_idle == 1 and worst.gpus_never_used == 1
    assert worst.gpus_wasted_now == pytest.approx(1.1)
    assert {f.key for f in worst.findings} == {"never_used", "idle_now"}
    assert rows[1].findings == () and rows[1].duty_since_start_pct == pytest.approx(50.0)
    assert rows[2].gpus_wasted_now == pytest.approx(0.05)


def test_stale_live_data_are_flagged_and_never_judged(tmp_path: Path) -> None:
    clock = Clock(2_000_000.0)
    run_for(sampler_for(tmp_path / "spool", "10", {"GPU-a": 0.0}, clock), clock, 120)
    now = clock.now + 600.0
    [row] = build_rows(
        read_node(str(tmp_path / "spool"), now, float("inf")).jobs,
        now,
        idle_min_s=60.0,
        stale_after_s=180.0,
    )
    assert row.stale and [f.key for f in row.findings] == ["stale"]


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> dict[str, SlurmJob]:
    """``slurm-gpu live`` asks Slurm for its running GPU jobs; here Slurm is this dict."""
    import slurm_gpu.cli.live_cmd as live_cmd

    jobs: dict[str, SlurmJob] = {}
    monkeypatch.setattr(live_cmd, "_slurm_jobs", lambda settings: dict(jobs))
    return jobs


def test_live_lists_a_running_gpu_job_whose_node_sends_nothing(
    tmp_path: Path, no_slurm: dict[str, SlurmJob]
) -> None:
    """Issue 25 item 5: with a node's exporter down, live printed "No running GPU job"."""
    no_slurm["77"] = SlurmJob("77", "bob", "bio", "gpu", "normal", ("n9",), 0.0, {"n9": (0, 1)})
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n')
    text = CliRunner().invoke(cli, ["--config", str(cfg), "live"]).output
    assert "No running GPU job" not in text
    assert "77" in text and "no live data from n9: not judged" in text
    [row] = json.loads(CliRunner().invoke(cli, ["--config", str(cfg), "live", "--json"]).output)
    assert row["gpus"] == 2 and [f["key"] for f in row["findings"]] == ["no_data"]


def test_live_cli_reads_the_node_files_without_prometheus(tmp_path: Path) -> None:
    clock = Clock(time.time() - 300.0)
    run_for(sampler_for(tmp_path / "spool", "10", {"GPU-a": 0.0}, clock), clock, 30)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n[live]\nidle_min_s = 60\n')
    result = CliRunner().invoke(cli, ["--config", str(cfg), "live", "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert row["job_id"] == "10" and row["user"] == "alice"
    assert [f["key"] for f in row["findings"]] == ["never_used", "idle_now"]
    text = CliRunner().invoke(cli, ["--config", str(cfg), "live"]).output
    assert "this node's live files" in text and "never used" in text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_live_cli_exits_7_when_prometheus_is_unreachable(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\n'
        f'[live]\nprometheus_url = "http://127.0.0.1:{free_port()}"\nprometheus_timeout_s = 2\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(cfg), "live"])
    assert result.exit_code == 7
    assert "unreachable" in result.output and "hint:" in result.output


def test_an_answer_that_is_not_a_vector_is_refused() -> None:
    with pytest.raises(PrometheusUnavailableError):
        parse_vector(b"<html>Prometheus</html>")
    with pytest.raises(PrometheusUnavailableError):
        parse_vector(json.dumps({"status": "success", "data": {"resultType": "matrix"}}).encode())


def test_prometheus_label_values_are_cleaned_where_they_enter() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"user": "a\x1b]0;x\x07b"}, "value": [1, "2"]}],
        },
    }
    [sample] = parse_vector(json.dumps(body).encode())
    assert sample.labels["user"] == "a\ufffd]0;x\ufffdb" and sample.value == 2.0


def test_a_non_http_prometheus_url_is_refused() -> None:
    with pytest.raises(PrometheusUnavailableError):
        PrometheusClient("file:///etc/passwd", 1.0)


# --------------------------------------------------------------------------- real Prometheus

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (make deps)")
def test_recording_rules_pass_promtool() -> None:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: bytes = resp.read()
    return data


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[PrometheusClient, Path]]:
    """A throwaway Prometheus on loopback scraping a real exporter every second; two jobs'
    samplers keep writing their live summaries meanwhile (job 20 busy, job 21 idle)."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (make deps)")
    spool = tmp_path / "spool"
    clock = Clock(time.time())
    samplers = [
        sampler_for(spool, "20", {"GPU-busy": 80.0}, clock),
        sampler_for(spool, "21", {"GPU-idle-1": 0.0, "GPU-idle-2": 0.0}, clock, user="bob"),
    ]
    stop = threading.Event()

    def keep_sampling() -> None:
        while not stop.is_set():
            clock.now = time.time()
            for s in samplers:
                s.read_once()
                s.write_live()
            stop.wait(0.5)

    sampling = threading.Thread(target=keep_sampling, daemon=True)
    sampling.start()
    server = make_server(ExporterOptions(str(spool), 60.0), "127.0.0.1", 0)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        "  - job_name: slurm-gpu\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{server.server_address[1]}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path}/data",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        client = PrometheusClient(f"http://127.0.0.1:{port}", 5.0)
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                if len(client.query("slurm_gpu_gpu:utilization:ratio_15m")) == 3:
                    break
            except PrometheusUnavailableError:
                pass
            assert time.monotonic() < deadline, "Prometheus never had the rules' series"
            time.sleep(0.5)
        yield client, tmp_path
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        stop.set()
        sampling.join()
        server.shutdown()
        server.server_close()
        serving.join()


def test_live_jobs_from_a_real_prometheus(prometheus: tuple[PrometheusClient, Path]) -> None:
    client, _tmp = prometheus
    jobs = {j.job_id: j for j in live_jobs(client)}
    assert set(jobs) == {"20", "21"}
    assert (jobs["21"].user, jobs["21"].account, jobs["21"].partition) == ("bob", "physics", "gpu")
    busy = jobs["20"].gpus[0]
    assert busy.uuid == "GPU-busy" and busy.utilization_recent_pct == pytest.approx(80.0)
    assert busy.idle_since_s is None and busy.active_first_s is not None
    idle = jobs["21"].gpus
    assert [g.uuid for g in idle] == ["GPU-idle-1", "GPU-idle-2"]
    assert all(g.utilization_recent_pct == 0.0 and g.idle_since_s for g in idle)
    rows = build_rows(list(jobs.values()), time.time(), idle_min_s=0.0, stale_after_s=60.0)
    assert [r.job_id for r in rows] == ["21", "20"]
    assert rows[0].gpus_wasted_now == pytest.approx(2.0)


def test_the_recording_rules_sum_wasted_gpus_per_job(
    prometheus: tuple[PrometheusClient, Path],
) -> None:
    client, _tmp = prometheus
    deadline = time.monotonic() + 30
    while True:
        wasted = {
            s.labels["job_id"]: s.value for s in client.query("slurm_gpu_job:gpus_wasted:sum_15m")
        }
        idle = {s.labels["job_id"]: s.value for s in client.query("slurm_gpu_job:gpus_idle:count")}
        if set(wasted) == {"20", "21"} and set(idle) == {"21"}:
            break
        assert time.monotonic() < deadline, (wasted, idle)
        time.sleep(0.5)
    assert wasted["21"] == pytest.approx(2.0) and wasted["20"] == pytest.approx(0.2)
    assert idle == {"21": 2.0}
    ages = client.query("slurm_gpu_job:sample_age:max_seconds")
    assert {s.labels["job_id"] for s in ages} == {"20", "21"}
    assert os.path.isdir(_tmp / "data")


def test_live_cli_says_when_summaries_could_not_be_read(tmp_path: Path) -> None:
    clock = Clock(time.time() - 300.0)
    sampler = sampler_for(tmp_path / "spool", "10", {"GPU-a": 0.0}, clock)
    run_for(sampler, clock, 3)
    (Path(sampler.paths.live_job_dir) / "n2.json").write_bytes(b"not json")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n')
    result = CliRunner().invoke(cli, ["--config", str(cfg), "live", "--json"])
    assert result.exit_code == 0
    assert [r["job_id"] for r in json.loads(result.stdout)] == ["10"]
    assert "1 live summaries could not be read" in result.stderr
