"""Commands that only read never create the store: on a fresh install with an empty 0700 state
directory, ``doctor`` and ``report weekly`` leave it empty, and ``store migrate`` creates the
file 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.admin import cli
from slurm_gpu.errors import StoreNotCreatedError
from slurm_gpu.store import Store


def _config(tmp_path: Path) -> tuple[Path, Path]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o711)
    config = tmp_path / "c.toml"
    config.write_text(
        f'[paths]\nstate_dir = "{state}"\nspool_dir = "{spool}"\nlog_file = ""\n'
        '[telemetry]\nbackend = "virtual"\n'
        f'virtual_dir = "{tmp_path / "vgpu"}"\n'
    )
    return config, state


def test_a_reader_does_not_create_a_missing_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "nodir" / "slurm-gpu.db"
    with pytest.raises(StoreNotCreatedError):
        Store.open(f"sqlite:///{path}", migrate=False)
    assert not path.parent.exists()


def test_doctor_leaves_an_empty_state_directory_empty(tmp_path: Path) -> None:
    config, state = _config(tmp_path)
    res = CliRunner().invoke(
        cli,
        [
            "--config",
            str(config),
            "doctor",
            "--skip",
            "telemetry",
            "--skip",
            "accounting",
            "--skip",
            "slurmconf",
        ],
    )
    assert "store" in res.output
    assert sorted(os.listdir(state)) == [], res.output
    # Before the first collection: a warning, like a spool not made yet, not a failure.
    assert "warn  store" in res.output and "does not exist yet" in res.output


def test_report_weekly_does_not_create_the_store(tmp_path: Path) -> None:
    config, state = _config(tmp_path)
    res = CliRunner().invoke(cli, ["--config", str(config), "report", "weekly"])
    assert res.exit_code == 6, res.output
    assert sorted(os.listdir(state)) == []


def test_store_migrate_creates_the_file_0600(tmp_path: Path) -> None:
    config, state = _config(tmp_path)
    old = os.umask(0o022)
    try:
        res = CliRunner().invoke(cli, ["--config", str(config), "store", "migrate"])
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    mode = stat.S_IMODE((state / "slurm-gpu.db").stat().st_mode)
    assert mode == 0o600, oct(mode)
