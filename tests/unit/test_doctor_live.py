"""``slurm-gpu doctor``'s live check: an exporter or a Prometheus listening on every interface
under ``PrivateData=jobs`` fails, with the fix. Prometheus' listen address is read with the
real client from a real HTTP server answering ``/api/v1/status/flags`` as Prometheus does."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonhttp import JsonServer

from slurm_gpu import doctor
from slurm_gpu.config import Settings, parse_settings
from slurm_gpu.prometheus.client import PrometheusClient, Sample

JOBS = frozenset({"jobs"})
NONE: frozenset[str] = frozenset()


def _settings(exporter_address: str = "127.0.0.1", prometheus_url: str = "") -> Settings:
    return parse_settings(
        {"live": {"exporter_address": exporter_address, "prometheus_url": prometheus_url}},
        path=None,
    )


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("0.0.0.0:9090", "0.0.0.0"),
        (":9090", ""),
        ("[::]:9090", "::"),
        ("::", "::"),
        ("127.0.0.1:9190", "127.0.0.1"),
        ("[::1]:9090", "::1"),
        ("10.1.0.5", "10.1.0.5"),
    ],
)
def test_listen_host(address: str, host: str) -> None:
    assert doctor.listen_host(address) == host


@pytest.mark.parametrize("address", ["0.0.0.0", "::", ""])
def test_an_exporter_on_every_interface_fails_under_private_data(address: str) -> None:
    check = doctor.check_live_exposure(_settings(address), lambda: JOBS)
    assert check.status is doctor.Status.FAIL
    assert "exporter listens on every interface" in check.detail
    assert check.hint and "exporter_address" in check.hint


def test_an_exporter_on_every_interface_without_private_data_is_a_warning() -> None:
    check = doctor.check_live_exposure(_settings("0.0.0.0"), lambda: NONE)
    assert check.status is doctor.Status.WARN and "PrivateData=none" in check.detail


def test_slurm_not_answering_is_checked_as_private_data() -> None:
    check = doctor.check_live_exposure(_settings("::"), lambda: None)
    assert check.status is doctor.Status.FAIL and "PrivateData unknown" in check.detail


def test_an_exporter_on_loopback_without_prometheus_passes() -> None:
    check = doctor.check_live_exposure(_settings(), lambda: JOBS)
    assert check.status is doctor.Status.OK and "exporter on 127.0.0.1" in check.detail


class _Flags:
    """A real HTTP server answering ``/api/v1/status/flags`` with one listen address."""

    def __init__(self) -> None:
        self.address = ""
        self.http = JsonServer(self._answer)
        self.url = self.http.url

    def _answer(self, path: str, _query: str) -> Any:
        if path != "/api/v1/status/flags":
            return None
        data = {"web.listen-address": self.address, "storage.tsdb.path": "x"}
        return {"status": "success", "data": data}


@pytest.fixture
def flags() -> Iterator[_Flags]:
    fake = _Flags()
    with fake.http:
        yield fake


def _check(flags: _Flags, address: str, private: frozenset[str] = JOBS) -> doctor.Check:
    flags.address = address
    settings = _settings(prometheus_url=flags.url)
    client = PrometheusClient(flags.url, 2.0)
    return doctor.check_live_exposure(settings, lambda: private, client.listen_address)


@pytest.mark.parametrize("address", ["0.0.0.0:9090", ":9090", "[::]:9090"])
def test_a_prometheus_on_every_interface_fails_under_private_data(
    flags: _Flags, address: str
) -> None:
    check = _check(flags, address)
    assert check.status is doctor.Status.FAIL
    assert f"--web.listen-address={address}" in check.detail
    assert check.hint and "--web.listen-address=127.0.0.1:9090" in check.hint


def test_a_prometheus_on_every_interface_without_private_data_is_a_warning(
    flags: _Flags,
) -> None:
    assert _check(flags, "0.0.0.0:9090", NONE).status is doctor.Status.WARN


def test_a_prometheus_on_loopback_warns_that_local_users_reach_it(flags: _Flags) -> None:
    check = _check(flags, "127.0.0.1:9190")
    assert check.status is doctor.Status.WARN
    assert "every user with a shell on its host" in check.detail


def test_a_prometheus_on_the_admin_network_passes(flags: _Flags) -> None:
    check = _check(flags, "10.1.0.5:9090")
    assert check.status is doctor.Status.OK and "Prometheus on 10.1.0.5:9090" in check.detail


def test_an_unreachable_prometheus_is_a_warning_not_a_crash() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    client = PrometheusClient(url, 2.0)
    check = doctor.check_live_exposure(
        _settings(prometheus_url=url), lambda: JOBS, client.listen_address
    )
    assert check.status is doctor.Status.WARN and "unreachable" in check.detail


def test_the_doctor_command_runs_the_live_check(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurm_gpu.cli.doctor_cmd import ACTING, CHECKS, cli

    assert "live" in CHECKS and "live" in ACTING
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[accounting]\nsacct_path = "/nonexistent/sacct"\n[live]\nexporter_address = "0.0.0.0"\n'
    )
    cfg.chmod(0o644)
    skip = [a for c in CHECKS if c != "live" for a in ("--skip", c)]
    env = {"SLURM_GPU_CONFIG": str(cfg)}
    result = CliRunner().invoke(cli, skip, env=env, obj={"config": str(cfg)})
    # Root holds the file to the trust rule (tmp_path is root's, 0700): a trust regression
    # must fail here, not turn into a skip.
    assert "not trusted" not in result.output, result.output
    assert result.exit_code == 1, result.output
    assert "exporter listens on every interface" in result.output


# ------------------------------------------------- identity: series bound to their target

PROM_CONFIG = """global:
  scrape_interval: 30s
scrape_configs:
- job_name: slurm-gpu
  honor_labels: {honor}
  static_configs:
  - targets:
    - gpu-01:9817
- job_name: node
  honor_labels: true
"""


def _series(host: str, instance: str) -> Sample:
    return Sample({"host": host, "instance": instance, "job": "slurm-gpu"}, 1.0)


def test_doctor_fails_honor_labels_on_the_exporters_scrape_job() -> None:
    bad = doctor.check_live_identity(
        lambda: PROM_CONFIG.format(honor="true"), lambda q: [], "slurm-gpu", "instance"
    )
    assert bad.status is doctor.Status.FAIL and "honor_labels: true" in bad.detail
    good = doctor.check_live_identity(
        lambda: PROM_CONFIG.format(honor="false"),
        # Every GPU series carries gpu_index: none answers the query for those without.
        lambda q: [] if "gpu_index" in q else [_series("gpu-01", "gpu-01.example.org:9817")],
        "slurm-gpu",
        "instance",
    )
    assert good.status is doctor.Status.OK, good.detail


def test_doctor_fails_series_whose_host_is_not_their_target() -> None:
    queries: list[str] = []

    def query(q: str) -> list[Sample]:
        queries.append(q)
        return [_series("gpu-01", "gpu-01:9817"), _series("gpu-02", "gpu-07:9817")]

    check = doctor.check_live_identity(
        lambda: PROM_CONFIG.format(honor="false"), query, "slurm-gpu", "instance"
    )
    assert check.status is doctor.Status.FAIL and "gpu-02 via gpu-07:9817" in check.detail
    assert queries == [
        "count by (host, job, instance) (slurm_gpu_job_last_sample_timestamp_seconds)",
        'count by (host) (slurm_gpu_gpu_available{job="slurm-gpu",gpu_index=""})',
    ]
    odd = doctor.check_live_identity(lambda: "", query, "slurm-gpu", "inst ance")
    assert odd.status is doctor.Status.FAIL
