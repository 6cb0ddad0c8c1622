"""slurm-gpu doctor: each check reports, with a hint, and never raises."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu import doctor
from slurm_gpu.cli.admin import cli
from slurm_gpu.config import parse_settings
from slurm_gpu.errors import AccountingError, StoreError, TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuSample, JobRecord


class FakeSource:
    name = "fake"

    def __init__(self, gpus: Sequence[GpuInfo], lost: set[str] = frozenset()) -> None:
        self.gpus, self.lost, self.closed = list(gpus), lost, False

    def list_gpus(self) -> Sequence[GpuInfo]:
        return self.gpus

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        return [GpuSample(uuid=u, time_s=0.0, available=u not in self.lost) for u in uuids]

    def close(self) -> None:
        self.closed = True


def test_telemetry_ok_lists_models_and_closes_the_source() -> None:
    src = FakeSource([GpuInfo("GPU-a", name="H100"), GpuInfo("GPU-b", name="H100")])
    result = doctor.check_telemetry(lambda: src)
    assert result.status is doctor.Status.OK and "2 GPU(s): H100" in result.detail
    assert src.closed


def test_telemetry_lost_gpu_fails_and_names_it() -> None:
    src = FakeSource([GpuInfo("GPU-a"), GpuInfo("GPU-b")], lost={"GPU-b"})
    result = doctor.check_telemetry(lambda: src)
    assert result.status is doctor.Status.FAIL and "GPU-b" in result.detail and result.hint


def test_telemetry_library_missing_fails_with_its_hint() -> None:
    def broken() -> FakeSource:
        raise TelemetryUnavailableError("NVML missing", hint="install the driver")

    result = doctor.check_telemetry(broken)
    assert (result.status, result.hint) == (doctor.Status.FAIL, "install the driver")


def test_spool_world_writable_fails(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    os.chmod(spool, 0o777)
    settings = parse_settings({"paths": {"spool_dir": str(spool)}}, path=None)
    result = doctor.check_spool(settings)
    assert result.status is doctor.Status.FAIL and "0777" in result.detail


def test_spool_low_space_warns(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o711)
    settings = parse_settings({"paths": {"spool_dir": str(tmp_path)}}, path=None)
    result = doctor.check_spool(settings, disk_free=lambda _p: 10 * 2**20)
    expected = doctor.Status.WARN if os.getuid() == 0 else doctor.Status.FAIL
    assert result.status is expected


def test_accounting_error_is_reported_not_raised() -> None:
    class Down:
        def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
            raise AssertionError

        def jobs_between(self, *_a: object, **_k: object) -> list[JobRecord]:
            raise AccountingError("slurmdbd down", hint="start slurmdbd")

    result = doctor.check_accounting(lambda: Down())
    assert (result.status, result.detail) == (doctor.Status.FAIL, "slurmdbd down")


def test_store_behind_warns_and_unopenable_fails() -> None:
    assert doctor.check_store(lambda: ("sqlite://", 1, 2)).status is doctor.Status.WARN

    def broken() -> tuple[str, int, int]:
        raise StoreError("cannot open", hint="check the URL")

    assert doctor.check_store(broken).status is doctor.Status.FAIL


def test_unexpected_exception_in_a_check_is_a_fail_not_a_crash() -> None:
    def boom() -> doctor.Check:
        raise RuntimeError("surprise")

    (result,) = doctor.run_checks([boom])
    assert result.status is doctor.Status.FAIL and "surprise" in result.detail


def test_cli_exit_code_follows_failures(tmp_path: Path) -> None:
    """With virtual GPUs and only local checks, doctor passes; a missing GPU dir fails it."""
    from slurm_gpu.telemetry.virtual import create_gpus

    spool = tmp_path / "spool"
    spool.mkdir(mode=0o711)
    vdir = tmp_path / "vgpu"
    create_gpus(vdir, count=2)
    config = tmp_path / "c.toml"
    config.write_text(
        f'[paths]\nspool_dir = "{spool}"\nlog_file = ""\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\n'
    )
    runner = CliRunner()
    args = ["--config", str(config), "doctor", "--skip", "accounting", "--skip", "store"]
    ok = runner.invoke(cli, args)
    assert ok.exit_code == (0 if os.getuid() == 0 else 1), ok.output
    assert "2 GPU(s)" in ok.output
    config.write_text(config.read_text().replace(str(vdir), str(tmp_path / "missing")))
    bad = runner.invoke(cli, args)
    assert bad.exit_code == 1 and "fail  telemetry" in bad.output and "hint:" in bad.output


@pytest.mark.parametrize("name", ["telemetry", "spool", "log", "accounting", "store"])
def test_every_check_can_be_skipped(name: str) -> None:
    result = CliRunner().invoke(cli, ["doctor", "--help"])
    assert name in result.output
