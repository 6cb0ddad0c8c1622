"""The live summary's new fields, the node exposition and ``slurm-gpu exporter``."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu.capture.livefile import read_live, write_live
from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.hooks.common import JobEnv
from slurm_gpu.live.exporter import MAX_REQUEST_BYTES, ExporterOptions, exposition, make_server
from slurm_gpu.live.exposition import GPU_METRICS, JOB_METRICS
from slurm_gpu.live.snapshot import read_node
from slurm_gpu.records import GpuInfo, GpuSample, HostSample

JOB_LABELS = {"job_id", "user", "account", "partition", "host"}


@dataclass(frozen=True)
class Family:
    """One metric family as Prometheus' own client library parsed it."""

    type: str
    samples: list[tuple[dict[str, str], float]]


def parse(text: str) -> dict[str, Family]:
    """The exposition through ``prometheus_client``'s parser, by the name each family is
    exposed under (a counter's with its ``_total``, which the parser strips). Raises
    ``ValueError`` on a line the format does not allow."""
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        assert name not in out, f"family {name} exposed twice"
        out[name] = Family(fam.type, [(dict(s.labels), s.value) for s in fam.samples])
    return out


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Source:
    """GPU-a busy at ``busy_pct``, GPU-b always idle; power 100 W, energy +1 J per second."""

    name = "fake"

    def __init__(self, clock: Clock, busy_pct: list[float]) -> None:
        self.clock, self.busy_pct, self.n = clock, busy_pct, 0

    def list_gpus(self) -> Sequence[GpuInfo]:
        return [GpuInfo(uuid=u, memory_total_bytes=80 << 30) for u in ("GPU-a", "GPU-b")]

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        util = self.busy_pct[min(self.n, len(self.busy_pct) - 1)]
        self.n += 1
        t = self.clock()
        return [
            GpuSample(
                uuid=u,
                time_s=t,
                utilization_pct=util if u == "GPU-a" else 0.0,
                memory_used_bytes=1 << 30,
                memory_total_bytes=80 << 30,
                power_w=100.0,
                energy_mj=int(t * 1000),
            )
            for u in uuids
        ]

    def close(self) -> None:
        pass


class Host:
    method = "proc"

    def sample(self, now_s: float | None = None) -> HostSample:
        t = now_s or 0.0
        return HostSample(t, t - 999_000.0, 2 << 30, 0, 0, 3, "proc")

    def allocated_cores(self) -> int | None:
        return 4

    def job_gone(self) -> bool:
        return False


def run_sampler(tmp_path: Path, busy_pct: list[float], readings: int, **kw: str) -> Sampler:
    clock = Clock()
    opts = SamplerOptions(
        job_id=kw.get("job_id", "42"),
        hostname="n1",
        uid=1000,
        gpu_uuids=("GPU-a", "GPU-b"),
        spool_dir=str(tmp_path / "spool"),
        interval_s=10.0,
        checkpoint_interval_s=600.0,
        idle_threshold_pct=1.0,
        timeline_points=64,
        user=kw.get("user", "alice"),
        account=kw.get("account", "physics"),
        partition=kw.get("partition", "gpu"),
    )
    source = Source(clock, busy_pct)
    sampler = Sampler(opts, lambda: source, Host(), clock=clock)
    sampler.open_spool()
    for _ in range(readings):
        sampler.read_once()
        clock.now += 10.0
    clock.now -= 10.0
    sampler.write_live()
    return sampler


def test_live_summary_has_recent_duty_idle_since_power_energy_and_labels(tmp_path: Path) -> None:
    # 40 readings at 10 s: busy 80 % for the first 20 (200 s), then 20 % for the last 20.
    sampler = run_sampler(tmp_path, [80.0] * 20 + [20.0] * 20, 40)
    body = read_live(sampler.paths.live)
    assert (body["user"], body["account"], body["partition"]) == ("alice", "physics", "gpu")
    a, b = body["gpus"]
    # The recent window (300 s back from the last reading) holds the last 31 readings: 20 at
    # 20 % and the 11 before them at 80 %.
    assert a["utilization_recent_pct"] == pytest.approx((20 * 20 + 11 * 80) / 31)
    assert a["utilization_mean_pct"] == pytest.approx(50.0)
    assert a["busy_s"] == pytest.approx(0.8 * 200 + 0.2 * 200)
    assert a["sampled_s"] == pytest.approx(400.0)
    assert a["idle_since_s"] is None and a["active_first_s"] == 1_000_000.0
    assert b["idle_since_s"] == 1_000_000.0 and b["active_first_s"] is None
    assert b["busy_s"] == 0.0
    assert a["power_w"] == 100.0 and a["energy_j"] == pytest.approx(390.0)
    assert a["memory_total_bytes"] == 80 << 30
    assert body["host"]["allocated_cores"] == 4 and body["host"]["rss_bytes"] == 2 << 30


def test_idle_since_restarts_when_the_gpu_works_again(tmp_path: Path) -> None:
    sampler = run_sampler(tmp_path, [0.0] * 5 + [50.0] + [0.0] * 5, 11)
    a = read_live(sampler.paths.live)["gpus"][0]
    assert a["idle_since_s"] == 1_000_000.0 + 60.0


def test_exposition_parses_with_units_types_and_bounded_labels(tmp_path: Path) -> None:
    run_sampler(tmp_path, [80.0] * 40, 40)
    run_sampler(tmp_path, [0.0] * 40, 40, job_id="43", user="bob")
    text = exposition(ExporterOptions(str(tmp_path / "spool"), 180.0), lambda: 1_000_390.0)
    families = parse(text)
    unit = ("_seconds", "_bytes", "_watts", "_joules", "_ratio", "_total", "_gpus", "_allocated")
    for metric in JOB_METRICS + GPU_METRICS:
        fam = families[metric.name]
        assert fam.type == metric.type
        assert metric.name.startswith("slurm_gpu_")
        assert metric.name.endswith(unit) or metric.name == "slurm_gpu_gpu_available"
        for labels, _value in fam.samples:
            expected = JOB_LABELS | ({"gpu_uuid"} if metric in GPU_METRICS else set())
            assert set(labels) == expected
    util = {
        (lb["job_id"], lb["gpu_uuid"]): v
        for lb, v in families["slurm_gpu_gpu_utilization_recent_ratio"].samples
    }
    assert util == {
        ("42", "GPU-a"): 0.8,
        ("42", "GPU-b"): 0.0,
        ("43", "GPU-a"): 0.0,
        ("43", "GPU-b"): 0.0,
    }
    idle = families["slurm_gpu_gpu_idle_since_timestamp_seconds"].samples
    assert {(lb["job_id"], lb["gpu_uuid"]) for lb, _v in idle} == {
        ("42", "GPU-b"),
        ("43", "GPU-a"),
        ("43", "GPU-b"),
    }
    users = {lb["user"] for lb, _v in families["slurm_gpu_job_gpus"].samples}
    assert users == {"alice", "bob"}
    # Bounded cardinality: a fixed number of series per job and per GPU, whatever the length.
    series = sum(len(f.samples) for f in families.values())
    assert series <= 2 * len(JOB_METRICS) + 4 * len(GPU_METRICS) + 3


def test_label_values_from_user_strings_are_escaped_and_cleaned(tmp_path: Path) -> None:
    hostile = 'phys"ics\\x\n} evil_metric 1\x1b[31m'
    run_sampler(tmp_path, [50.0] * 3, 3, account=hostile, partition='gpu"} 1\nx')
    text = exposition(ExporterOptions(str(tmp_path / "spool"), 180.0), lambda: 1_000_020.0)
    families = parse(text)  # strict: one line per sample, only the format's escapes
    assert not any(name.startswith("evil") for name in families)
    labels = families["slurm_gpu_job_gpus"].samples[0][0]
    # Control characters (the line feed, ESC) cleaned where read; quote and backslash kept
    # and escaped.
    assert labels["account"] == 'phys"ics\\x\ufffd} evil_metric 1\ufffd[31m'
    assert labels["partition"] == 'gpu"} 1\ufffdx'


def test_a_jobs_series_end_when_its_summary_is_removed(tmp_path: Path) -> None:
    gone = run_sampler(tmp_path, [50.0] * 3, 3, job_id="7")
    run_sampler(tmp_path, [50.0] * 3, 3, job_id="8")
    gone.paths.remove_live()
    families = parse(exposition(ExporterOptions(str(tmp_path / "spool"), 180.0), lambda: 1e6))
    jobs = {lb["job_id"] for f in families.values() for lb, _v in f.samples if "job_id" in lb}
    assert jobs == {"8"}


def test_a_stale_summary_is_left_out_and_counted(tmp_path: Path) -> None:
    run_sampler(tmp_path, [50.0] * 3, 3)
    families = parse(
        exposition(ExporterOptions(str(tmp_path / "spool"), 180.0), lambda: 1_000_020.0 + 181)
    )
    assert families["slurm_gpu_gpu_utilization_ratio"].samples == []
    skipped = {
        lb["reason"]: v for lb, v in families["slurm_gpu_exporter_summaries_skipped"].samples
    }
    assert skipped == {"stale": 1.0, "unreadable": 0.0}


def test_a_summary_that_is_a_link_or_garbage_is_unreadable_not_fatal(tmp_path: Path) -> None:
    sampler = run_sampler(tmp_path, [50.0] * 3, 3)
    live_job_dir = Path(sampler.paths.live_job_dir)
    (live_job_dir / "n2.json").write_bytes(b"{not json")
    os.symlink("/etc/passwd", live_job_dir / "n3.json")
    snap = read_node(str(tmp_path / "spool"), 1_000_020.0, 180.0)
    assert [j.host for j in snap.jobs] == ["n1"] and snap.unreadable == 2


def test_parser_rejects_an_unescaped_quote() -> None:
    # The parser is strict enough to catch the injection the exposition prevents.
    with pytest.raises(ValueError):
        parse('# HELP m h\n# TYPE m gauge\nm{a="x"y"} 1\n')


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    run_sampler(tmp_path, [50.0] * 3, 3)
    srv = make_server(ExporterOptions(str(tmp_path / "spool"), 1e12), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


def test_exporter_serves_get_metrics_over_http(server: tuple[str, int]) -> None:
    conn = http.client.HTTPConnection(*server, timeout=10)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type", "").startswith("text/plain; version=0.0.4")
    families = parse(resp.read().decode())
    assert len(families["slurm_gpu_gpu_power_watts"].samples) == 2


@pytest.mark.parametrize(
    ("method", "path", "status"), [("GET", "/", 404), ("POST", "/metrics", 405)]
)
def test_exporter_answers_only_get_metrics(
    server: tuple[str, int], method: str, path: str, status: int
) -> None:
    conn = http.client.HTTPConnection(*server, timeout=10)
    conn.request(method, path)
    assert conn.getresponse().status == status


def test_exporter_refuses_an_oversized_request_and_keeps_serving(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\nX-Pad: " + b"a" * MAX_REQUEST_BYTES + b"\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.0 431")
    conn = http.client.HTTPConnection(*server, timeout=10)
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 200


def test_exporter_textfile_is_written_whole(tmp_path: Path) -> None:
    run_sampler(tmp_path, [50.0] * 3, 3)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n[live]\nstale_after_s = 1e12\n')
    out = tmp_path / "slurm_gpu.prom"
    from slurm_gpu.cli.admin import cli

    result = CliRunner().invoke(cli, ["--config", str(cfg), "exporter", "--textfile", str(out)])
    assert result.exit_code == 0, result.output
    assert "slurm_gpu_gpu_busy_seconds_total" in parse(out.read_text())
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".slurm-gpu-")] == []


def test_prolog_hands_account_and_partition_to_the_sampler_as_single_arguments() -> None:
    from slurm_gpu.config import Settings
    from slurm_gpu.hooks.prolog import sampler_command
    from slurm_gpu.hooks.sampler import parse_args

    env = JobEnv.from_environ(
        {
            "SLURM_JOB_ID": "5",
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_ACCOUNT": "-physics",
            "SLURM_JOB_PARTITION": "gpu",
        }
    )
    cmd = sampler_command(Settings(), env, ["GPU-a"], "n1")
    args = parse_args(cmd[cmd.index("slurm_gpu.hooks.sampler") + 1 :])
    assert (args.user, args.account, args.partition) == ("alice", "-physics", "gpu")


def test_live_summary_stays_small_for_sixteen_gpus(tmp_path: Path) -> None:
    sampler = run_sampler(tmp_path, [50.0] * 3, 3)
    body = read_live(sampler.paths.live)
    body["gpus"] = body["gpus"][:1] * 16
    del body["schema"], body["version"]
    write_live(sampler.paths, body, None)
    assert os.path.getsize(sampler.paths.live) < 16 * 1024
    assert len(json.loads(Path(sampler.paths.live).read_bytes())["gpus"]) == 16


def test_numbers_are_plain_finite_ints_and_floats_and_nothing_else() -> None:
    from slurm_gpu.live.snapshot import parse_summary

    gpu = {
        "uuid": "GPU-a",
        "utilization_pct": 12,  # an int is a number
        "utilization_recent_pct": float("nan"),
        "utilization_mean_pct": float("inf"),
        "busy_s": True,  # a bool is not
        "sampled_s": "5",
        "power_w": 10**400,  # beyond a float: not a number (float() would overflow)
        "energy_j": -2.5,
        "memory_used_bytes": 3.9,
        "memory_total_bytes": -1,
    }
    body = {"job_id": "7", "hostname": "n1", "started_s": 1, "updated_s": 2.0, "gpus": [gpu]}
    g = parse_summary(body).gpus[0]
    assert g.utilization_pct == 12.0 and type(g.utilization_pct) is float
    assert g.utilization_recent_pct is None and g.utilization_mean_pct is None
    assert g.busy_s is None and g.sampled_s is None and g.power_w is None
    assert g.energy_j == -2.5
    assert g.memory_used_bytes == 3 and g.memory_total_bytes is None
