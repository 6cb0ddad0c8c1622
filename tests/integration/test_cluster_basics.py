"""The local test cluster does what every other cluster test relies on: GPU jobs of ordinary
users get their GPUs, are accounted with typed GPU TRES, run the project's prolog and epilog,
and leave the node usable."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import slurmtools

pytestmark = pytest.mark.cluster

GPU_ENV_SCRIPT = """#!/bin/bash
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
echo "SLURM_JOB_GPUS=${SLURM_JOB_GPUS:-}"
echo "USER=$(id -un)"
"""


def _env_lines(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _node_usable() -> None:
    state = slurmtools.node_state()
    assert not state.startswith(("drain", "down", "fail")), f"node is {state}"


def test_node_offers_four_typed_gpus() -> None:
    proc = slurmtools.run_as(None, ["sinfo", "-h", "-N", "-o", "%G"])
    assert proc.stdout.split()[0] == "gpu:a100:4"


def test_gpu_job_of_a_user_gets_two_gpus_and_is_accounted(job_dir: Path) -> None:
    job_id = slurmtools.submit(
        GPU_ENV_SCRIPT,
        user="sgtest1",
        args=("--gres=gpu:2", f"--output={job_dir}/%j.out", "--job-name=basics-gpu"),
    )
    assert slurmtools.wait_done(job_id, timeout_s=120) == "COMPLETED"

    env = _env_lines(job_dir / f"{job_id}.out")
    assert env["USER"] == "sgtest1"
    visible = env["CUDA_VISIBLE_DEVICES"].split(",")
    gpus = env["SLURM_JOB_GPUS"].split(",")
    assert len(visible) == 2 and len(set(visible)) == 2
    assert len(gpus) == 2 and all(g in {"0", "1", "2", "3"} for g in gpus)

    acct = slurmtools.sacct_fields(job_id, ["User", "Account", "State", "AllocTRES"])
    assert acct["User"] == "sgtest1"
    assert acct["Account"] == "physics"
    assert acct["State"] == "COMPLETED"
    tres = dict(item.split("=", 1) for item in acct["AllocTRES"].split(","))
    assert tres["gres/gpu"] == "2"
    assert tres["gres/gpu:a100"] == "2"
    _node_usable()


def test_failing_job_is_accounted_as_failed_and_node_stays_up() -> None:
    out_dir = slurmtools.user_dir("sgtest2")
    job_id = slurmtools.submit(
        "#!/bin/bash\nexit 3\n", user="sgtest2", args=("--gres=gpu:1", f"--output={out_dir}/%j")
    )
    assert slurmtools.wait_done(job_id) == "FAILED"
    acct = slurmtools.sacct_fields(job_id, ["User", "Account", "ExitCode"])
    assert acct == {"User": "sgtest2", "Account": "biology", "ExitCode": "3:0"}
    shutil.rmtree(out_dir)
    _node_usable()


def test_job_comment_is_kept_in_accounting(job_dir: Path) -> None:
    job_id = slurmtools.submit(
        "#!/bin/bash\ntrue\n",
        args=("--comment=basics comment", f"--output={job_dir}/%j"),
    )
    assert slurmtools.wait_done(job_id) == "COMPLETED"
    assert slurmtools.sacct_fields(job_id, ["Comment"])["Comment"] == "basics comment"


def test_test_users_can_run_the_project_interpreter(job_dir: Path) -> None:
    # Demo workloads run the venv's Python inside jobs as ordinary users.
    python = slurmtools.venv_python()
    script = f"#!/bin/bash\n{python} -c 'import slurm_gpu; print(slurm_gpu.__version__)'\n"
    job_id = slurmtools.submit(script, args=(f"--output={job_dir}/%j.out",))
    assert slurmtools.wait_done(job_id) == "COMPLETED"
    assert (job_dir / f"{job_id}.out").read_text().strip()


def test_prolog_and_epilog_run_for_a_gpu_job(job_dir: Path) -> None:
    hooks = slurmtools.tc_root() / "hooks"
    for name in ("slurm-gpu-prolog", "slurm-gpu-epilog"):
        text = (hooks / name).read_text()
        assert "@PYTHON@" not in text and "@CONFIG@" not in text
        assert str(slurmtools.slurm_gpu_config_path()) in text
    job_id = slurmtools.submit(
        "#!/bin/bash\nsleep 3\n", args=("--gres=gpu:1", f"--output={job_dir}/%j")
    )
    assert slurmtools.wait_done(job_id) == "COMPLETED"
    log = (slurmtools.tc_root() / "log" / "hooks.log").read_text().splitlines()
    for hook in ("prolog", "epilog"):
        lines = [line for line in log if f" job={job_id} {hook}:" in line]
        assert lines, f"no {hook} line for job {job_id} in hooks.log"
        assert not any("failed" in line for line in lines), lines
    # The prolog creates the job's spool directory and the epilog seals a record in it.
    spool = slurmtools.tc_root() / "spool" / job_id
    assert spool.is_dir()
    assert list(spool.glob("*.record")), sorted(p.name for p in spool.iterdir())
    _node_usable()


def test_start_is_idempotent() -> None:
    proc = subprocess.run(
        [str(slurmtools.START_SCRIPT)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert slurmtools.controller_up()
    _node_usable()


def test_wait_done_on_an_array_waits_for_every_task(job_dir: Path) -> None:
    array_id = slurmtools.submit(
        "#!/bin/bash\nsleep $((SLURM_ARRAY_TASK_ID * 2))\n",
        args=("--array=0-2", f"--output={job_dir}/%A_%a"),
    )
    assert slurmtools.wait_done(array_id) == "COMPLETED"
    proc = slurmtools.run_as(None, ["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "State"])
    assert proc.stdout.split() == ["COMPLETED"] * 3
