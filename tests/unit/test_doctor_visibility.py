"""``slurm-gpu doctor``'s visibility check on a SQLite store: it fails where a user could read
other users' jobs under ``PrivateData=jobs`` and says how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu import doctor
from slurm_gpu.config import Settings, parse_settings
from slurm_gpu.store.visibility import private_data

JOBS = frozenset({"jobs"})


def _settings(tmp_path: Path, **gpueff: object) -> Settings:
    return parse_settings(
        {"paths": {"state_dir": str(tmp_path / "state")}, "gpueff": dict(gpueff)}, path=None
    )


def _store(tmp_path: Path, file_mode: int, dir_mode: int = 0o700) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(dir_mode)
    db = state / "slurm-gpu.db"
    db.write_bytes(b"")
    db.chmod(file_mode)
    return db


def test_doctor_fails_a_world_readable_store_under_private_data(tmp_path: Path) -> None:
    db = _store(tmp_path, 0o644, 0o755)
    check = doctor.check_visibility(_settings(tmp_path), lambda: JOBS)
    assert check.status is doctor.Status.FAIL
    assert f"{db} is readable by every user" in check.detail
    assert "can be listed by every user" in check.detail
    assert check.hint is not None and f"chmod 0600 {db}" in check.hint


def test_a_world_readable_store_without_private_data_is_only_a_warning(tmp_path: Path) -> None:
    _store(tmp_path, 0o644)
    check = doctor.check_visibility(_settings(tmp_path), lambda: frozenset())
    assert check.status is doctor.Status.WARN and "PrivateData=none" in check.detail


def test_slurm_not_answering_is_checked_as_private_data(tmp_path: Path) -> None:
    _store(tmp_path, 0o644)
    check = doctor.check_visibility(_settings(tmp_path), lambda: None)
    assert check.status is doctor.Status.FAIL and "PrivateData unknown" in check.detail


def test_a_closed_store_passes_and_without_report_files_users_are_warned(
    tmp_path: Path,
) -> None:
    _store(tmp_path, 0o600)
    assert doctor.check_visibility(_settings(tmp_path), lambda: JOBS).status is doctor.Status.OK
    off = doctor.check_visibility(_settings(tmp_path, cache_reports=False), lambda: JOBS)
    assert off.status is doctor.Status.WARN and "cache_reports" in (off.hint or "")


def test_a_listable_reports_directory_is_flagged(tmp_path: Path) -> None:
    _store(tmp_path, 0o600)
    reports = tmp_path / "state-reports"
    reports.mkdir()
    reports.chmod(0o755)
    check = doctor.check_visibility(_settings(tmp_path), lambda: JOBS)
    assert check.status is doctor.Status.FAIL and "chmod 0711" in (check.hint or "")


@pytest.mark.parametrize(
    ("line", "flags"),
    [
        ("PrivateData             = accounts,jobs,usage", {"accounts", "jobs", "usage"}),
        ("PrivateData             = none", set()),
        ("PrivateData = JOBS", {"jobs"}),
    ],
)
def test_private_data_is_read_from_scontrol(line: str, flags: set[str]) -> None:
    text = f"ClusterName             = c\n{line}\nProctrackType = proctrack/cgroup\n"
    assert private_data(text) == flags
    assert private_data("ClusterName = c\n") == frozenset()


def test_the_doctor_command_runs_the_visibility_check(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurm_gpu.cli.doctor_cmd import CHECKS, cli

    assert "visibility" in CHECKS
    _store(tmp_path, 0o644, 0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
        '[accounting]\nsacct_path = "/nonexistent/sacct"\n'
    )
    cfg.chmod(0o644)
    skip = [a for c in CHECKS if c not in ("visibility",) for a in ("--skip", c)]
    env = {"SLURM_GPU_CONFIG": str(cfg)}
    result = CliRunner().invoke(cli, skip, env=env, obj={"config": str(cfg)})
    # Root holds the file to the trust rule (tmp_path is root's, 0700): a trust regression
    # must fail here, not turn into a skip.
    assert "not trusted" not in result.output, result.output
    assert result.exit_code == 1, result.output
    assert "visibility" in result.output and "PrivateData unknown" in result.output
