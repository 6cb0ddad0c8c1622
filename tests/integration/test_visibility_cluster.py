"""Who sees what on the real test cluster (``PrivateData=jobs``, the default SQLite store):
every way an ordinary user has to read another user's job fails, the owner still gets it
through ``gpueff`` (and ``--json``), and root sees everything.

sgtest1 runs a demo GPU job; the collector (root) stores it. sgtest2 then tries the
``sqlite3`` client, Python's ``sqlite3``, and plain reads of the spool, the state directory
(store, ``done/``) and the report files; each must fail with a permission error and print
nothing of the job.
"""

from __future__ import annotations

import json
import pwd
import subprocess
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.config import load_settings
from slurm_gpu.jobreport.reportfiles import reports_root

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "share" / "demo"
JOB_NAME = "vis-secret-name"


def _paths() -> tuple[Path, Path, Path, Path]:
    """(store file, state dir, spool dir, reports root) of the cluster's configuration."""
    s = load_settings(str(slurmtools.slurm_gpu_config_path()))
    state = Path(s.paths.state_dir)
    root = Path(reports_root(s.paths.state_dir, s.gpueff.reports_dir))
    return state / "slurm-gpu.db", state, Path(s.paths.spool_dir), root


def _gpueff(user: str, *args: str) -> subprocess.CompletedProcess[str]:
    gpueff = slurmtools.venv_python().parent / "gpueff"
    cfg = str(slurmtools.slurm_gpu_config_path())
    return slurmtools.run_as(user, [str(gpueff), "--config", cfg, *args], check=False)


@pytest.fixture(scope="module")
def stored_job() -> str:
    export = (
        f"--export=ALL,SLURM_GPU_PYTHON={slurmtools.venv_python()},"
        f"SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}"
    )
    out = slurmtools.user_dir("sgtest1")
    job_id = slurmtools.submit(
        str(DEMO / "idle-gpu.sbatch"),
        "sgtest1",
        (export, f"--chdir={out}", f"--job-name={JOB_NAME}"),
    )
    slurmtools.wait_done(job_id, timeout_s=180)
    slurm_gpu = slurmtools.venv_python().parent / "slurm-gpu"
    cfg = str(slurmtools.slurm_gpu_config_path())
    slurmtools.run_as(
        None,
        [str(slurm_gpu), "--config", cfg, "collect", "--job", job_id, "--wait", "60"],
        timeout_s=90,
    )
    return job_id


def _fails_quietly(res: subprocess.CompletedProcess[str]) -> None:
    assert res.returncode != 0, res.stdout
    assert JOB_NAME not in res.stdout and JOB_NAME not in res.stderr


def test_private_data_is_on() -> None:
    conf = slurmtools.run_as(None, ["scontrol", "show", "config"]).stdout
    assert "jobs" in next(ln for ln in conf.splitlines() if ln.startswith("PrivateData"))


@pytest.mark.parametrize("user", ["sgtest2", "sgtest1"])
def test_an_ordinary_user_cannot_open_the_store_with_the_sqlite3_client(
    stored_job: str, user: str
) -> None:
    db, *_ = _paths()
    query = f"SELECT job_id, job_name FROM jobs WHERE job_id = '{stored_job}'"
    res = slurmtools.run_as(user, ["sqlite3", "-readonly", str(db), query], check=False)
    _fails_quietly(res)
    assert "unable to open" in res.stderr or "authorization" in res.stderr.lower()


def test_another_user_cannot_open_the_store_with_python(stored_job: str) -> None:
    db, *_ = _paths()
    code = (
        "import sqlite3, sys\n"
        f"c = sqlite3.connect('file:{db}?mode=ro', uri=True)\n"
        "print(c.execute('SELECT job_name FROM jobs').fetchall())\n"
    )
    res = slurmtools.run_as(
        "sgtest2", [str(slurmtools.venv_python()), "-I", "-c", code], check=False
    )
    _fails_quietly(res)
    # Refused by the file's permissions, not failed for any other reason (a typo, a missing
    # module): SQLite's own refusal, raised at the first statement.
    assert "sqlite3.OperationalError: unable to open database file" in res.stderr, res.stderr


def test_another_user_cannot_read_the_spool_state_or_report_files(stored_job: str) -> None:
    db, state, spool, root = _paths()
    uid1 = pwd.getpwnam("sgtest1").pw_uid
    for argv in (
        ["ls", str(state)],
        ["ls", str(state / "done")],
        ["cat", str(db)],
        ["ls", str(spool)],
        ["ls", str(spool / stored_job)],
        ["ls", str(root)],
        ["ls", str(root / str(uid1))],
        ["cat", str(root / str(uid1) / f"{stored_job}.report")],
    ):
        res = slurmtools.run_as("sgtest2", argv, check=False)
        _fails_quietly(res)
        assert "Permission denied" in res.stderr, (argv, res.stderr)
    inbox = load_settings(str(slurmtools.slurm_gpu_config_path())).paths.inbox_dir
    if inbox:
        _fails_quietly(slurmtools.run_as("sgtest2", ["ls", inbox], check=False))


def test_another_user_gets_not_found_from_gpueff(stored_job: str) -> None:
    res = _gpueff("sgtest2", stored_job)
    assert res.returncode == 4, res.stdout + res.stderr
    assert JOB_NAME not in res.stdout


def test_the_owner_still_gets_the_job_from_gpueff(stored_job: str) -> None:
    res = _gpueff("sgtest1", stored_job)
    assert res.returncode == 0, res.stderr
    assert f"Job {stored_job}" in res.stdout and JOB_NAME in res.stdout
    assert "(final, from the job's sealed record)" in res.stdout
    as_json = _gpueff("sgtest1", "--json", stored_job)
    assert as_json.returncode == 0, as_json.stderr
    (job,) = json.loads(as_json.stdout)["jobs"]
    assert job["job_id"] == stored_job and job["telemetry"] == "final"
    # It came from sgtest1's report file: 0440, root's, sgtest1's private group.
    *_, root = _paths()
    st = (root / str(pwd.getpwnam("sgtest1").pw_uid) / f"{stored_job}.report").stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o440, 0)


def test_root_sees_everything(stored_job: str) -> None:
    db, *_ = _paths()
    assert _gpueff("root", stored_job).returncode == 0
    res = slurmtools.run_as(
        None,
        [
            "sqlite3",
            "-readonly",
            str(db),
            f"SELECT job_name FROM jobs WHERE job_id = '{stored_job}'",
        ],
    )
    assert JOB_NAME in res.stdout


def test_doctor_finds_nothing_readable(stored_job: str) -> None:
    slurm_gpu = slurmtools.venv_python().parent / "slurm-gpu"
    cfg = str(slurmtools.slurm_gpu_config_path())
    skip = [a for c in ("telemetry", "accounting", "backend") for a in ("--skip", c)]
    res = slurmtools.run_as(None, [str(slurm_gpu), "--config", cfg, "doctor", *skip], check=False)
    line = next(ln for ln in res.stdout.splitlines() if " visibility " in ln)
    assert line.strip().startswith("ok"), res.stdout
