"""The collector on the real test cluster: real jobs, real hooks, real sacct, into a store.

Each job is collected with ``collect --job`` into a private state directory and store, so
records of jobs that other tests submit are left alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurmtools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import dump_db

from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.capture.spool import list_sealed
from slurm_gpu.config import load_settings
from slurm_gpu.store import TELEMETRY_COMPLETE, Store

pytestmark = pytest.mark.cluster

SLURM_GPU = Path(slurmtools.venv_python()).parent / "slurm-gpu"


def _config(tmp_path: Path) -> Path:
    spool = load_settings(str(slurmtools.slurm_gpu_config_path())).paths.spool_dir
    cfg = tmp_path / "collector.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{spool}"\nstate_dir = "{tmp_path}/state"\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/state/store.db"\n'
    )
    return cfg


def _collect(cfg: Path, job_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SLURM_GPU), "--config", str(cfg), "collect", "--job", job_id, "--wait", "60"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _wait_sealed(spool: str, job_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(e.job_id == job_id for e in list_sealed(spool)):
            return
        time.sleep(0.5)
    raise AssertionError(f"no sealed record for job {job_id}")


def test_real_jobs_end_up_in_the_store_with_accounting_and_telemetry(
    tmp_path: Path, job_dir: Path
) -> None:
    cfg = _config(tmp_path)
    spool = load_settings(str(cfg)).paths.spool_dir
    common = (f"--chdir={job_dir}", f"--output={job_dir}/%j.out", "--time=5")
    jobs = {
        "single": slurmtools.submit("#!/bin/sh\nsleep 3\n", args=("--gres=gpu:1", *common)),
        "multi": slurmtools.submit("#!/bin/sh\nsleep 3\n", args=("--gres=gpu:2", *common)),
        "failed": slurmtools.submit("#!/bin/sh\nsleep 2\nexit 3\n", args=("--gres=gpu:1", *common)),
        "cancelled": slurmtools.submit("#!/bin/sh\nsleep 300\n", args=("--gres=gpu:1", *common)),
        "timeout": slurmtools.submit(
            "#!/bin/sh\nsleep 300\n",
            args=("--gres=gpu:1", f"--chdir={job_dir}", f"--output={job_dir}/%j.out", "--time=1"),
        ),
    }
    array = slurmtools.submit("#!/bin/sh\nsleep 2\n", args=("--gres=gpu:1", "--array=0-2", *common))
    # Cancel once it runs (its prolog started the sampler).
    deadline = time.monotonic() + 120
    while slurmtools.squeue_state(jobs["cancelled"]) != "RUNNING":
        assert time.monotonic() < deadline, "the job to cancel never started"
        time.sleep(0.5)
    time.sleep(2)
    slurmtools.run_as("sgtest1", ["scancel", jobs["cancelled"]])

    expected = {
        "single": "COMPLETED",
        "multi": "COMPLETED",
        "failed": "FAILED",
        "cancelled": "CANCELLED",
        "timeout": "TIMEOUT",
    }
    for name, job_id in jobs.items():
        assert slurmtools.wait_done(job_id, timeout_s=300) == expected[name], name
    tasks = SacctSource().get_jobs([array])
    assert len(tasks) == 3
    for task_id in tasks:
        assert slurmtools.wait_done(task_id, timeout_s=120) == "COMPLETED"
    raw_ids = {**jobs, **{f"array_{t.array_task_id}": t.job_id for t in tasks.values()}}
    for job_id in raw_ids.values():
        _wait_sealed(spool, job_id)

    # A corrupt record next to a good one: quarantined, and the job still stored.
    bad = Path(spool) / jobs["single"] / "bogus-node.record"
    bad.write_text('{"schema": "slurm-gpu/node-record", "version": 1, "record": {')
    for name, job_id in raw_ids.items():
        proc = _collect(cfg, job_id)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
    assert not bad.exists()
    assert (tmp_path / "state" / "quarantine" / f"{jobs['single']}.bogus-node.record").exists()

    url = f"sqlite:///{tmp_path}/state/store.db"
    gpus = {"single": 1, "multi": 2, "failed": 1, "cancelled": 1, "timeout": 1}
    with Store.open(url, migrate=False) as store:
        for name, job_id in raw_ids.items():
            got = store.get_job(job_id)
            assert got is not None, name
            assert got.telemetry == TELEMETRY_COMPLETE, name
            assert got.job.state == expected.get(name, "COMPLETED"), name
            assert got.job.user == "sgtest1"
            n_gpus = gpus.get(name, 1)
            assert got.job.alloc_tres.gpus == n_gpus, name
            assert len(got.gpus) == n_gpus, name
            assert all(g.info.uuid.startswith("GPU-") for _, g in got.gpus)
            assert got.job.req_tres.raw and got.job.alloc_tres.raw, name
        assert store.get_job(jobs["failed"]).job.exit_code == 3  # type: ignore[union-attr]
        array_tasks = sorted(
            store.get_job(t.job_id).job.array_task_id  # type: ignore[union-attr]
            for t in tasks.values()
        )
        assert array_tasks == ["0", "1", "2"]
        assert store.get_job(jobs["single"]).job.job_name == "sbatch"  # type: ignore[union-attr]

    # Re-running is a no-op: the records have left the spool, the store does not change.
    before = dump_db(url)
    for job_id in raw_ids.values():
        proc = subprocess.run(
            [str(SLURM_GPU), "--config", str(cfg), "collect", "--job", job_id, "--once"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0 and proc.stdout.startswith("0 stored"), proc.stdout
    assert dump_db(url) == before
