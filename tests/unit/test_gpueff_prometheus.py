"""``gpueff RUNNING_JOB`` from a host without the job's live summary: Prometheus answers.

The real reader (``jobreport.readers``) and the real Prometheus client talk HTTP to a real
server on loopback that answers like Prometheus' ``/api/v1/query`` (the fake is at the HTTP
seam: the series are what the node exporter would expose). Accounting is faked at its seam
as one calling user, as in ``test_gpueff_cli.py``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import gpueff_factory as F
import jsonschema
import pytest
from click.testing import CliRunner, Result
from jsonhttp import JsonServer
from test_gpueff_cli import FakeAccounting

from slurm_gpu.cli.gpueff import BACKENDS_KEY, cli
from slurm_gpu.config import load_settings
from slurm_gpu.jobreport.jsonout import SCHEMA
from slurm_gpu.jobreport.model import LIVE_SOURCE_PROMETHEUS, LIVE_SOURCE_SPOOL, TelemetryStatus
from slurm_gpu.jobreport.readers import make_reader
from slurm_gpu.jobreport.terminal import status_label
from slurm_gpu.records import JobRecord

GIB = 1024**3


def running(job_id: str = "2001", nodes: tuple[str, ...] = ("node1",)) -> JobRecord:
    """sgtest1's running 2-GPU job."""
    return F.job(
        job_id=job_id,
        job_id_display=job_id,
        state="RUNNING",
        end_s=None,
        exit_code=None,
        elapsed_s=1800,
        nodelist=nodes,
    )


def gpu_series(job_id: str, host: str, uuid: str, duty: float, updated_s: float) -> list[Any]:
    """The raw series the exporter gives one GPU (and its job on that host), as Prometheus
    answers them: ``(labels, value)``."""
    base = {
        "job_id": job_id,
        "user": "sgtest1",
        "account": "research",
        "partition": "gpu",
        "host": host,
    }
    g = {**base, "gpu_uuid": uuid}
    sampled = 1800.0
    return [
        ({**base, "__name__": "slurm_gpu_job_start_timestamp_seconds"}, updated_s - sampled),
        ({**base, "__name__": "slurm_gpu_job_last_sample_timestamp_seconds"}, updated_s),
        ({**g, "__name__": "slurm_gpu_gpu_busy_seconds_total"}, sampled * duty / 100.0),
        ({**g, "__name__": "slurm_gpu_gpu_sampled_seconds_total"}, sampled),
        ({**g, "__name__": "slurm_gpu_gpu_utilization_ratio"}, duty / 100.0),
        ({**g, "__name__": "slurm_gpu_gpu_memory_used_max_bytes"}, 12 * GIB),
        ({**g, "__name__": "slurm_gpu_gpu_memory_total_bytes"}, 40 * GIB),
        ({**g, "__name__": "slurm_gpu_gpu_energy_joules_total"}, 200.0 * sampled),
    ]


class FakePrometheus:
    """An HTTP server answering ``GET /api/v1/query`` from a list of series; it records
    every query it is sent."""

    def __init__(self) -> None:
        self.series: list[Any] = []
        self.recent: list[Any] = []
        self.queries: list[str] = []
        self.http = JsonServer(self._answer)
        self.url = self.http.url

    def _answer(self, path: str, query: str) -> Any:
        self.queries.append(query)
        if path != "/api/v1/query":
            return None
        if query.startswith("{__name__"):
            found = self.series
        elif query.startswith("slurm_gpu_gpu:utilization:ratio_15m"):
            found = self.recent
        else:
            found = []
        result = [{"metric": labels, "value": [time.time(), repr(float(v))]} for labels, v in found]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    with fake.http:
        yield fake


def login_config(tmp_path: Path, prometheus_url: str) -> Path:
    """A login node's configuration: the spool is an empty directory (no job runs here)."""
    (tmp_path / "spool").mkdir(exist_ok=True)
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
        f'[live]\nprometheus_url = "{prometheus_url}"\nprometheus_timeout_s = 2\n'
        "stale_after_s = 180\n"
    )
    return cfg


def gpueff(cfg: Path, args: list[str], accounting: FakeAccounting) -> Result:
    reader = make_reader(load_settings(str(cfg)))
    return CliRunner().invoke(
        cli,
        ["--config", str(cfg), "--no-color", *args],
        obj={BACKENDS_KEY: (accounting, reader)},
        catch_exceptions=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_owner_gets_the_running_job_from_prometheus_naming_the_source_and_age(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    now = time.time()
    prom.series = gpu_series("2001", "node1", "GPU-a", 80.0, now - 20) + gpu_series(
        "2001", "node1", "GPU-b", 0.0, now - 20
    )
    res = gpueff(login_config(tmp_path, prom.url), ["2001"], FakeAccounting([running()]))
    assert res.exit_code == 0, res.output
    assert "LIVE: the job is still running" in res.output
    label = next(ln for ln in res.output.splitlines() if ln.startswith("GPUs ("))
    assert "from Prometheus" in label and " s old" in label
    age = int(label.split(", ")[-1].split(" s old")[0])
    assert 20 <= age < 20 + 60
    assert "80 % busy" in res.output and " 0 % busy" in res.output
    # Prometheus was asked about this job only, in every query.
    assert prom.queries and all('job_id="2001"' in q for q in prom.queries)


def test_json_says_the_source_and_keeps_unknown_numbers_null(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    now = time.time()
    prom.series = gpu_series("2001", "node1", "GPU-a", 50.0, now - 5) + gpu_series(
        "2001", "node2", "GPU-c", 0.0, now - 900
    )
    job = running(nodes=("node1", "node2", "node3"))
    res = gpueff(login_config(tmp_path, prom.url), ["--json", "2001"], FakeAccounting([job]))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, SCHEMA)
    [j] = doc["jobs"]
    assert j["telemetry"] == "live" and j["live_source"] == "prometheus"
    assert j["live_updated_s"] == pytest.approx(now - 5, abs=1)
    by_uuid = {g["uuid"]: g for g in j["gpus"]}
    assert by_uuid["GPU-a"]["duty_mean_pct"] == pytest.approx(50.0)
    assert by_uuid["GPU-a"]["memory_peak_bytes"] == 12 * GIB
    assert by_uuid["GPU-a"]["power_mean_w"] == pytest.approx(200.0)
    # node2's data are 15 min old: unknown, never idle (0 %).
    assert by_uuid["GPU-c"]["duty_mean_pct"] is None and by_uuid["GPU-c"]["energy_j"] is None
    notes = " ".join(j["notes"])
    assert "node2: Prometheus' data are 00:15:00 old" in notes
    assert "no live data in Prometheus from node3" in notes


def test_text_report_shows_stale_gpus_as_unknown_with_the_reason(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    prom.series = gpu_series("2001", "node1", "GPU-a", 0.0, time.time() - 3600)
    res = gpueff(login_config(tmp_path, prom.url), ["2001"], FakeAccounting([running()]))
    assert res.exit_code == 0, res.output
    assert "n/a busy" in res.output and "0 % busy" not in res.output
    assert "its GPUs are shown as unknown" in res.output


def test_series_dated_ahead_of_this_hosts_clock_are_unknown(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    # The last-sample time is the node's clock: an hour ahead, a stopped sampler's last
    # numbers would pass for current ones for an hour.
    prom.series = gpu_series("2001", "node1", "GPU-a", 0.0, time.time() + 3600)
    res = gpueff(login_config(tmp_path, prom.url), ["2001"], FakeAccounting([running()]))
    assert res.exit_code == 0, res.output
    assert "n/a busy" in res.output and "0 % busy" not in res.output
    assert "node1: Prometheus' data are dated 01:00:00 ahead of this host's clock" in res.output
    assert " 0 s old" not in res.output, res.output  # no age is told that cannot be


def test_another_user_is_refused_and_prometheus_is_never_asked(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    prom.series = gpu_series("2001", "node1", "GPU-a", 80.0, time.time())
    res = gpueff(
        login_config(tmp_path, prom.url), ["2001"], FakeAccounting([running()], caller="sgtest2")
    )
    assert res.exit_code == 4
    assert "not found" in res.output and "GPU-a" not in res.output
    assert prom.queries == []


def test_series_of_other_jobs_in_an_answer_are_dropped(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    now = time.time()
    prom.series = gpu_series("2001", "node1", "GPU-a", 80.0, now) + gpu_series(
        "2002", "node1", "GPU-other", 0.0, now
    )
    res = gpueff(login_config(tmp_path, prom.url), ["--json", "2001"], FakeAccounting([running()]))
    [j] = json.loads(res.stdout)["jobs"]
    assert [g["uuid"] for g in j["gpus"]] == ["GPU-a"]


def test_no_series_in_prometheus_is_said_not_shown_as_idle(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    res = gpueff(login_config(tmp_path, prom.url), ["--json", "2001"], FakeAccounting([running()]))
    assert res.exit_code == 0
    [j] = json.loads(res.stdout)["jobs"]
    assert j["telemetry"] == "no_telemetry" and j["gpus"] == []
    assert "Prometheus holds no fresh series of this job" in j["notes"][0]


def test_without_prometheus_the_report_says_live_numbers_are_not_available_here(
    tmp_path: Path,
) -> None:
    res = gpueff(login_config(tmp_path, ""), ["2001"], FakeAccounting([running()]))
    assert res.exit_code == 0, res.output
    assert "no live GPU summary is readable" in res.output
    assert "Live numbers are not available from this host" in res.output
    assert "prometheus_url" in res.output


def test_an_unreachable_prometheus_keeps_exit_0_and_says_so(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = gpueff(login_config(tmp_path, url), ["2001"], FakeAccounting([running()]))
    assert res.exit_code == 0, res.output
    assert "Live numbers are not available from this host" in res.output
    assert "unreachable" in res.output


def test_a_password_file_it_cannot_use_keeps_exit_0_and_says_so(tmp_path: Path) -> None:
    """A Prometheus behind a password whose file this caller cannot use (another account can
    write it; an ordinary user cannot read root's): the report, without live numbers, and
    why."""
    secret = tmp_path / "prometheus.password"
    secret.write_text("s3cret\n")
    secret.chmod(0o622)
    cfg = login_config(tmp_path, f"http://slurmgpu@127.0.0.1:{free_port()}")
    cfg.write_text(cfg.read_text() + f'prometheus_password_file = "{secret}"\n')
    res = gpueff(cfg, ["2001"], FakeAccounting([running()]))
    assert res.exit_code == 0, res.output
    assert "Live numbers are not available from this host" in res.output
    assert "live.prometheus_password_file" in res.output and "s3cret" not in res.output


def test_the_label_names_the_node_summary_as_source() -> None:
    from slurm_gpu.jobreport.adapter import accounting_report

    base = replace(
        accounting_report(running()),
        telemetry=TelemetryStatus.LIVE,
        live_updated_s=1000.0,
        live_source=LIVE_SOURCE_SPOOL,
    )
    assert status_label(base, now_s=1012.0).endswith("from the node's live summary, 12 s old")
    prom = replace(base, live_source=LIVE_SOURCE_PROMETHEUS)
    assert status_label(prom, now_s=1012.0).endswith("from Prometheus, 12 s old")


def test_json_of_series_dated_ahead_has_no_age_and_keeps_the_schema(
    tmp_path: Path, prom: FakePrometheus
) -> None:
    prom.series = gpu_series("2001", "node1", "GPU-a", 50.0, time.time() + 3600)
    job = running(nodes=("node1",))
    res = gpueff(login_config(tmp_path, prom.url), ["--json", "2001"], FakeAccounting([job]))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, SCHEMA)
    [j] = doc["jobs"]
    assert j["live_updated_s"] is None and j["gpus"][0]["duty_mean_pct"] is None
    assert "ahead of this host's clock" in " ".join(j["notes"])
