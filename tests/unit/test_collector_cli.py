"""``slurm-gpu collect`` and ``slurm-gpu store`` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from slurm_gpu.cli.admin import cli
from slurm_gpu.collector import CollectorLock


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/db/store.db"\n'
    )
    return cfg


def test_a_second_collector_exits_at_once_with_status_0(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    lock = CollectorLock(str(tmp_path / "state"))
    assert lock.acquire()
    try:
        result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--once"])
    finally:
        lock.release()
    assert result.exit_code == 0, result.output
    assert "another collector is running" in result.output


def test_job_must_be_a_raw_id(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--job", "12_3"])
    assert result.exit_code == 2
    assert "raw job id" in result.output


def test_store_migrate_then_info(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    runner = CliRunner()
    info = runner.invoke(cli, ["--config", str(cfg), "store", "info"])
    assert info.exit_code == 6 and "store migrate" in info.output
    first = runner.invoke(cli, ["--config", str(cfg), "store", "migrate"])
    assert first.exit_code == 0 and "applied migration 1" in first.output
    assert "applied migration 2: create job_reports" in first.output
    again = runner.invoke(cli, ["--config", str(cfg), "store", "migrate"])
    assert again.exit_code == 0 and "already at schema version 8" in again.output
    info = runner.invoke(cli, ["--config", str(cfg), "store", "info", "--json"])
    assert info.exit_code == 0, info.output
    data = json.loads(info.output)
    assert data["schema_version"] == 8 and data["rows"]["jobs"] == 0
    assert data["rows"]["job_reports"] == 0
