"""``slurm-gpu doctor``'s exporter check: an exporter that answers a local user who is not
allowed, or a textfile every user can read, fails under ``PrivateData=jobs``. The probe is
real where root can run it: a real exporter, asked from this host's own address by a child
process running as ``nobody``."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_live_exporter import run_sampler

from slurm_gpu import doctor
from slurm_gpu.config import Settings, parse_settings
from slurm_gpu.live.exporter import ExporterOptions, make_server

JOBS = frozenset({"jobs"})
NONE: frozenset[str] = frozenset()


def _settings(address: str = "127.0.0.1", port: int = 9817) -> Settings:
    return parse_settings({"live": {"exporter_address": address, "exporter_port": port}}, path=None)


def _answers(status: int | None) -> Callable[[str, int], int | None]:
    return lambda _host, _port: status


def test_an_exporter_that_serves_a_local_user_fails_under_private_data() -> None:
    check = doctor.check_exporter_local_users(
        _settings("10.1.0.5"), lambda: JOBS, _answers(200), ["10.1.0.5"], []
    )
    assert check.status is doctor.Status.FAIL
    assert "10.1.0.5:9817 answers a local user who is not allowed" in check.detail
    assert check.hint and "exporter_allowed_users" in check.hint


def test_the_same_without_private_data_is_a_warning() -> None:
    check = doctor.check_exporter_local_users(
        _settings(), lambda: NONE, _answers(200), ["127.0.0.1"], []
    )
    assert check.status is doctor.Status.WARN


@pytest.mark.parametrize(("status", "word"), [(403, "answers a local user 403"), (None, "nothing")])
def test_an_exporter_that_refuses_local_users_or_none_at_all_passes(
    status: int | None, word: str
) -> None:
    check = doctor.check_exporter_local_users(
        _settings(), lambda: JOBS, _answers(status), ["127.0.0.1"], []
    )
    assert check.status is doctor.Status.OK and word in check.detail


def test_without_root_the_exporter_is_not_probed_but_the_textfile_is(tmp_path: Path) -> None:
    prom = tmp_path / "slurm_gpu.prom"
    prom.write_text('slurm_gpu_job_gpus{job_id="1",user="alice"} 1\n')
    prom.chmod(0o644)
    check = doctor.check_exporter_local_users(
        _settings(), lambda: JOBS, None, ["127.0.0.1"], [str(prom)]
    )
    assert check.status is doctor.Status.FAIL
    assert f"{prom} is readable by every user (mode 0644)" in check.detail
    assert "not probed (needs root)" not in check.detail  # the failure is what is said
    prom.chmod(0o600)
    check = doctor.check_exporter_local_users(
        _settings(), lambda: JOBS, None, ["127.0.0.1"], [str(prom)]
    )
    assert check.status is doctor.Status.OK and "not probed (needs root)" in check.detail


def test_only_textfiles_holding_our_series_are_checked(tmp_path: Path) -> None:
    (tmp_path / "slurm_gpu.prom").write_text("slurm_gpu_exporter_jobs 0\n")
    (tmp_path / "other.prom").write_text("node_thing 1\n")
    (tmp_path / "notes.txt").write_text("slurm_gpu_exporter_jobs 0\n")
    found = doctor.exporter_textfiles([str(tmp_path), str(tmp_path / "missing")])
    assert found == [str(tmp_path / "slurm_gpu.prom")]


def own_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))
        except OSError:
            pytest.skip("this host has no address but loopback")
        return str(s.getsockname()[0])


@contextmanager
def exporter(tmp_path: Path, address: str, uids: frozenset[int] | None) -> Iterator[int]:
    run_sampler(tmp_path, [50.0] * 3, 3)
    srv = make_server(ExporterOptions(str(tmp_path / "spool"), 1e12, uids), address, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to probe as nobody")
@pytest.mark.parametrize(("uids", "status"), [(None, "fail"), (frozenset({0}), "ok")])
def test_the_real_probe_as_nobody_from_the_nodes_own_address(
    tmp_path: Path, uids: frozenset[int] | None, status: str
) -> None:
    from slurm_gpu.cli.doctor_cmd import _exporter_targets, _probe_as_nobody

    address = own_address()
    # uids None: an exporter with the peer check off, on the scrape network's address.
    with exporter(tmp_path, "0.0.0.0", uids) as port:
        targets = _exporter_targets("0.0.0.0")
        assert "127.0.0.1" in targets and address in targets
        check = doctor.check_exporter_local_users(
            _settings("0.0.0.0", port), lambda: JOBS, _probe_as_nobody, targets, []
        )
    assert check.status.value == status, check.detail
    if status == "ok":
        assert f"{address}:{port} answers a local user 403" in check.detail


def test_the_doctor_command_has_the_exporter_check() -> None:
    from slurm_gpu.cli.doctor_cmd import CHECKS, _exporter_targets

    assert "exporter" in CHECKS
    assert _exporter_targets("10.1.0.5") == ["10.1.0.5"]
    assert _exporter_targets("[::1]:9817") == ["::1"]
