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
    assert again.exit_code == 0 and "already at schema version 11" in again.output
    info = runner.invoke(cli, ["--config", str(cfg), "store", "info", "--json"])
    assert info.exit_code == 0, info.output
    data = json.loads(info.output)
    assert data["schema_version"] == 11 and data["rows"]["jobs"] == 0
    assert data["rows"]["job_reports"] == 0


def test_collect_pulls_jobs_of_a_slurm_tres_partition_through_the_cli(tmp_path: Path) -> None:
    # sacct answers from rows (the fake prints every row in the fields each call asks for):
    # one finished GPU job with one srun step whose per-step GPU TRES are in Slurm's format
    # (written, as in tests/data/sacct_tres: the test cluster's virtual GPUs record none).
    import sacct_fixtures as F

    from slurm_gpu.store import TELEMETRY_COMPLETE, Store

    usage = {"NTasks": "1", "TRESUsageInAve": "", "TRESUsageInMax": ""}
    job = F.row(**usage)
    rows = [
        job,
        F.step(job, "batch", **usage),
        F.step(
            job,
            "0",
            NTasks="1",
            AllocTRES="cpu=2,gres/gpu=1,mem=1000M,node=1",
            TRESUsageInAve="cpu=00:00:10,energy=0,gres/gpumem=2000M,gres/gpuutil=40,mem=1024K",
            TRESUsageInMax="cpu=00:00:10,energy=0,gres/gpumem=3000M,gres/gpuutil=45,mem=1024K",
        ),
    ]
    sacct = F.write_fake_sacct(tmp_path, rows)
    cfg = _config(tmp_path)
    cfg.write_text(
        cfg.read_text()
        + f'[accounting]\nsacct_path = "{sacct}"\n'
        + "[collector]\nmissing_lookback_s = 3e8\nmissing_grace_s = 0.0\n"
        + '[source]\ndefault = "slurm-tres"\npull_lookback_s = 3e8\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--once", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.splitlines()[-1])
    assert report["ingested"] == ["101"] and report["missing_telemetry"] == []
    with Store.open(f"sqlite:///{tmp_path}/db/store.db", migrate=False) as store:
        got = store.get_job("101")
        assert got is not None and got.telemetry == TELEMETRY_COMPLETE
        [node] = got.nodes
        assert node.source == "slurm-tres" and node.hostname == "vm"
        assert node.gpus[0].memory_used_max_bytes == 3000 * 2**20


def test_an_unknown_source_name_exits_3_naming_the_key(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    cfg.write_text(cfg.read_text() + '[source]\npartitions = { gpu = "dgcm" }\n')
    result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--once"])
    assert result.exit_code == 3, result.output
    assert "source.partitions.gpu" in result.output and "Traceback" not in result.output
