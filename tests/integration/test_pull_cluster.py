"""The pull pass on the real test cluster, with the accounting-only source (``slurm-tres``).

The cluster's GPUs are virtual: Slurm's NVML plugin does not run, so its accounting holds no
``gres/gpuutil`` or ``gres/gpumem`` (the parsing of those is tested on written fixtures in
the unit tests, tests/data/sacct_tres). What this test shows on the cluster's own sacct:

* the source's per-step query (its field list, delimiter and epoch times) is accepted by the
  real sacct and its steps are parsed (``batch``, ``extern``, one ``srun`` step, on the
  job's node);
* ``slurm-gpu collect --once`` with ``[source] default = "slurm-tres"`` finds the finished
  job through accounting alone (an empty spool: nothing comes from the hooks), and stores it
  with telemetry ``missing`` and its node listed missing, since the source had no GPU
  reading for it; nothing is judged from readings that do not exist;
* a second pass does not store it again (watermark in the private state directory), and a
  partition configured ``none`` is not collected at all.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.accounting.runner import SubprocessRunner
from slurm_gpu.accounting.sacct import SACCT_ENV
from slurm_gpu.sources.accounting import SlurmTresSource, parse_steps
from slurm_gpu.store import TELEMETRY_MISSING, Store

pytestmark = pytest.mark.cluster

SLURM_GPU = Path(slurmtools.venv_python()).parent / "slurm-gpu"


def _config(tmp_path: Path, source: str) -> Path:
    (tmp_path / "spool").mkdir(exist_ok=True)
    cfg = tmp_path / f"pull-{source}.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state-{source}"\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/state-{source}/store.db"\n'
        f'[source]\ndefault = "{source}"\npull_lookback_s = 1800.0\n'
    )
    return cfg


def _collect(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SLURM_GPU), "--config", str(cfg), "collect", "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_job_is_collected_from_slurm_accounting_alone(tmp_path: Path, job_dir: Path) -> None:
    job_id = slurmtools.submit(
        "#!/bin/sh\nsrun sleep 3\n",
        args=("--gres=gpu:1", f"--chdir={job_dir}", f"--output={job_dir}/%j.out", "--time=5"),
    )
    assert slurmtools.wait_done(job_id, timeout_s=300) == "COMPLETED"

    # The source's own query against the real sacct.
    source = SlurmTresSource()
    done = SubprocessRunner()(source.argv(job_id), env=SACCT_ENV, timeout_s=60)
    assert done.returncode == 0, done.stderr
    steps = parse_steps(done.stdout, job_id)
    assert {s.step_id for s in steps} >= {"batch", "0"}
    assert all(s.hosts == (slurmtools.node_name(),) for s in steps)
    assert all(s.util_pct is None for s in steps)  # virtual GPUs: Slurm records none

    cfg = _config(tmp_path, "slurm-tres")
    url = f"sqlite:///{tmp_path}/state-slurm-tres/store.db"
    # A job whose accounting is not settled yet, or a pass whose sacct failed, is retried by
    # the next pass (collector.pull); in a busy CI run one pass may meet either.
    reports = []
    deadline = time.monotonic() + 120
    while True:
        done_pass = _collect(cfg)
        assert done_pass.returncode == 0, done_pass.stderr
        reports.append(done_pass.stdout)
        with Store.open(url, migrate=False) as store:
            if store.get_job(job_id) is not None or time.monotonic() > deadline:
                break
        time.sleep(5)
    with Store.open(url, migrate=False) as store:
        got = store.get_job(job_id)
        assert got is not None, reports
        assert got.telemetry == TELEMETRY_MISSING
        assert tuple(got.missing_hosts) == (slurmtools.node_name(),)
        # Nothing judged from readings that do not exist (the job is also too short).
        codes = {f.code for f in got.findings}
        assert not codes & {"GPU_UNUSED", "IDLE_HEAD", "IDLE_TAIL", "LOW_PARALLELISM"}, codes
    again = _collect(cfg)
    assert again.returncode == 0, again.stderr
    assert f'"{job_id}"' not in again.stdout  # stored once; the next pass skips it

    none = _config(tmp_path, "none")
    assert _collect(none).returncode == 0
    with Store.open(f"sqlite:///{tmp_path}/state-none/store.db", migrate=False) as store:
        assert store.get_job(job_id) is None
