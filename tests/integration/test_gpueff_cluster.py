"""``gpueff`` on the real test cluster: demo jobs submitted by sgtest1, collected into the store,
then reported as their owner and as another ordinary user."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.capture.spool import JobSpool
from slurm_gpu.config import load_settings

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "share" / "demo"


def _gpueff(user: str, *args: str) -> subprocess.CompletedProcess[str]:
    gpueff = slurmtools.venv_python().parent / "gpueff"
    cfg = str(slurmtools.slurm_gpu_config_path())
    return slurmtools.run_as(user, [str(gpueff), "--config", cfg, *args], check=False)


def _collect(job_id: str) -> None:
    slurm_gpu = slurmtools.venv_python().parent / "slurm-gpu"
    cfg = str(slurmtools.slurm_gpu_config_path())
    slurmtools.run_as(
        None,
        [str(slurm_gpu), "--config", cfg, "collect", "--job", job_id, "--wait", "60"],
        timeout_s=90,
    )


def _submit_demo(name: str, *extra: str) -> str:
    export = (
        f"--export=ALL,SLURM_GPU_PYTHON={slurmtools.venv_python()},"
        f"SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}"
    )
    out = slurmtools.user_dir("sgtest1")
    return slurmtools.submit(
        str(DEMO / f"{name}.sbatch"), "sgtest1", (export, f"--chdir={out}", *extra)
    )


def _private_jobs() -> bool:
    conf = slurmtools.run_as(None, ["scontrol", "show", "config"]).stdout
    line = next((ln for ln in conf.splitlines() if ln.startswith("PrivateData")), "")
    return "jobs" in line.lower()


@pytest.fixture(scope="module")
def idle_gpu_job() -> str:
    job_id = _submit_demo("idle-gpu")
    slurmtools.wait_done(job_id, timeout_s=180)
    _collect(job_id)
    return job_id


def test_completed_multi_gpu_job_as_owner(idle_gpu_job: str) -> None:
    res = _gpueff("sgtest1", idle_gpu_job)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"Job {idle_gpu_job}" in out and "COMPLETED" in out
    assert "(final, from the job's sealed record)" in out
    assert out.count("% busy") == 2
    assert "no process ever ran on this GPU" in out
    assert "#SBATCH" in out
    assert "\x1b[" not in out  # piped: no colour


def test_completed_job_json_as_owner(idle_gpu_job: str) -> None:
    res = _gpueff("sgtest1", "--json", idle_gpu_job)
    assert res.returncode == 0, res.stderr
    (job,) = json.loads(res.stdout)["jobs"]
    assert job["telemetry"] == "final" and job["gpus_allocated"] == 2
    assert sorted(g["process_seen"] for g in job["gpus"]) == [False, True]
    assert "GPU_UNUSED" in {f["code"] for f in job["findings"]}


def test_other_user(idle_gpu_job: str) -> None:
    # The cluster runs with PrivateData=jobs (slurm.conf and slurmdbd.conf): sacct hides
    # sgtest1's job from sgtest2, and so does gpueff, which asks accounting as the caller.
    assert _private_jobs()
    seen = slurmtools.run_as(
        "sgtest2", ["sacct", "-n", "-X", "-P", "-j", idle_gpu_job, "-o", "JobID"]
    )
    assert seen.stdout.strip() == ""
    res = _gpueff("sgtest2", idle_gpu_job)
    assert res.returncode == 4, res.stdout + res.stderr
    assert res.stderr.startswith(f"gpueff: job {idle_gpu_job} not found")
    assert res.stdout == ""
    # The owner, asking the same way, gets the report.
    mine = _gpueff("sgtest1", idle_gpu_job)
    assert mine.returncode == 0, mine.stderr
    assert f"Job {idle_gpu_job}" in mine.stdout


@pytest.fixture()
def counted_sacct() -> Iterator[tuple[Path, Path]]:
    """(config, log): the cluster's slurm-gpu config with ``sacct`` behind a wrapper that
    logs each call (as whichever user runs it) before running the real one."""
    real = shutil.which("sacct")
    assert real is not None
    base = Path(tempfile.mkdtemp(prefix="gpueff-sacct-"))
    try:
        base.chmod(0o755)
        log = base / "calls.log"
        log.touch(mode=0o666)
        log.chmod(0o666)  # whatever the umask: every user appends to it
        wrapper = base / "sacct"
        wrapper.write_text(f'#!/bin/sh\nid -un >> {log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
        text = slurmtools.slurm_gpu_config_path().read_text()
        assert "[accounting]" not in text
        config = base / "slurm-gpu.toml"
        config.write_text(f'{text}\n[accounting]\nsacct_path = "{wrapper}"\n')
        config.chmod(0o644)
        yield config, log
    finally:
        shutil.rmtree(base)


def _calls(log: Path) -> list[str]:
    return log.read_text().split()


def test_owner_report_runs_no_sacct(idle_gpu_job: str, counted_sacct: tuple[Path, Path]) -> None:
    config, log = counted_sacct
    gpueff = str(slurmtools.venv_python().parent / "gpueff")
    own = slurmtools.run_as("sgtest1", [gpueff, "--config", str(config), idle_gpu_job])
    assert f"Job {idle_gpu_job}" in own.stdout and "(final" in own.stdout
    assert _calls(log) == []  # the owner's settled, collected job: the store alone
    # The same job as JSON: from the store for its owner and for root (Slurm shows root every
    # job); the same.
    mine = slurmtools.run_as("sgtest1", [gpueff, "--config", str(config), "--json", idle_gpu_job])
    roots = slurmtools.run_as(None, [gpueff, "--config", str(config), "--json", idle_gpu_job])
    root_text = slurmtools.run_as(None, [gpueff, "--config", str(config), idle_gpu_job])
    assert _calls(log) == []
    assert json.loads(mine.stdout) == json.loads(roots.stdout)
    assert root_text.stdout == own.stdout
    # root asking for a job the store does not hold still asks sacct: its accounting and text
    # queries, at once (a person waits).
    slurmtools.run_as(None, [gpueff, "--config", str(config), "--json", "999999999"], check=False)
    assert _calls(log) == ["root", "root"]
    # Another user asks sacct, which (PrivateData=jobs) does not return the job: exit 4.
    other = slurmtools.run_as(
        "sgtest2", [gpueff, "--config", str(config), idle_gpu_job], check=False
    )
    assert _calls(log) == ["root", "root", "sgtest2", "sgtest2"]
    assert other.returncode == 4 and other.stdout == ""
    assert other.stderr.startswith(f"gpueff: job {idle_gpu_job} not found")


def test_owner_report_is_printed_from_the_collectors_rendering(idle_gpu_job: str) -> None:
    """The collector rendered the job's report into the store after storing it; the owner's
    ``gpueff`` prints that text without importing the report code or jinja2, and it is
    byte for byte what the full path (``SLURM_GPU_DEBUG=1``, which asks sacct) prints."""
    import os
    import sqlite3

    from slurm_gpu.config import load_settings
    from slurm_gpu.store.urls import sqlite_path

    cfg = str(slurmtools.slurm_gpu_config_path())
    path = sqlite_path(load_settings(cfg).store_url)
    assert path is not None
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT typed_id FROM job_reports WHERE job_id = ?", (idle_gpu_job,)
        ).fetchall()
    assert rows == [(idle_gpu_job,)]
    cached = _gpueff("sgtest1", idle_gpu_job)
    gpueff = str(slurmtools.venv_python().parent / "gpueff")
    full = slurmtools.run_as(
        "sgtest1",
        [gpueff, "--config", cfg, idle_gpu_job],
        env={**os.environ, "SLURM_GPU_DEBUG": "1"},
    )
    assert cached.returncode == 0 and f"Job {idle_gpu_job}" in cached.stdout
    # --debug adds each finding's internal keys on a "keys:" line; the rest is the same text.
    debug_only = [ln for ln in full.stdout.splitlines() if ln.strip().startswith("keys:")]
    assert debug_only, full.stdout
    shown = "".join(
        ln for ln in full.stdout.splitlines(keepends=True) if not ln.strip().startswith("keys:")
    )
    assert cached.stdout == shown
    code = (
        "import sys\n"
        "from slurm_gpu.cli import gpueff_entry\n"
        f"out = gpueff_entry.fast_path(['--config', {cfg!r}, {idle_gpu_job!r}])\n"
        "assert out, out\n"
        "print(sorted(m for m in ('jinja2', 'click', 'slurm_gpu.records') if m in sys.modules))\n"
    )
    probe = slurmtools.run_as("sgtest1", [str(slurmtools.venv_python()), "-c", code])
    assert probe.stdout.strip() == "[]"


def test_running_job_shows_live_numbers() -> None:
    job_id = _submit_demo("healthy")
    try:
        deadline = time.monotonic() + 120
        out = ""
        while time.monotonic() < deadline:
            res = _gpueff("sgtest1", job_id)
            out = res.stdout
            if "LIVE" in out:
                break
            time.sleep(1)
        assert "LIVE: the job is still running, numbers so far" in out, out
        assert "% busy" in out
        # The live summary is root's, readable through sgtest1's private group, 0440.
        spool_dir = load_settings(str(slurmtools.slurm_gpu_config_path())).paths.spool_dir
        live = os.stat(JobSpool(spool_dir, job_id, slurmtools.node_name()).live)
        assert live.st_uid == 0 and live.st_gid == pwd.getpwnam("sgtest1").pw_gid
        assert stat.S_IMODE(live.st_mode) == 0o440
    finally:
        slurmtools.run_as(None, ["scancel", job_id], check=False)


def test_cpu_only_job_says_no_gpu() -> None:
    script = "#!/bin/sh\n#SBATCH --time=00:02:00\n#SBATCH --mem=100M\nsleep 2\n"
    job_id = slurmtools.submit(script, "sgtest1", (f"--chdir={slurmtools.user_dir('sgtest1')}",))
    slurmtools.wait_done(job_id)
    res = _gpueff("sgtest1", job_id)
    assert res.returncode == 0, res.stderr
    assert "GPUs: No GPU was allocated to this job." in res.stdout
    assert "% busy" not in res.stdout


def test_failed_and_array_jobs() -> None:
    out_dir = f"--chdir={slurmtools.user_dir('sgtest1')}"
    failing = (
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --time=00:02:00\n#SBATCH --mem=100M\nexit 3\n"
    )
    failed = slurmtools.submit(failing, "sgtest1", (out_dir,))
    array = slurmtools.submit(
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --mem=100M\n#SBATCH --time=00:02:00\nsleep 1\n",
        "sgtest1",
        (out_dir, "--array=0-2"),
    )
    assert slurmtools.wait_done(failed) == "FAILED"
    res = _gpueff("sgtest1", failed)
    assert res.returncode == 0, res.stderr
    assert "FAILED (exit 3)" in res.stdout
    assert "too short for a GPU reading" in res.stdout
    for task in range(3):
        slurmtools.wait_done(f"{array}_{task}")
    res = _gpueff("sgtest1", array)
    assert res.returncode == 0, res.stderr
    assert f"Array {array}: 3 tasks" in res.stdout
    assert [ln.split()[0] for ln in res.stdout.splitlines() if ln.startswith(f"{array}_")] == [
        f"{array}_0",
        f"{array}_1",
        f"{array}_2",
    ]


def test_unknown_job_is_exit_4() -> None:
    res = _gpueff("sgtest1", "999999")
    assert res.returncode == 4
    assert "hint:" in res.stderr


def test_a_job_just_submitted_is_pending_not_not_found() -> None:
    """Seen on this cluster: ``gpueff`` on a job submitted a second before said "job N not
    found" while ``squeue`` showed it pending (slurmdbd had its record about 15 s later). A
    held job never starts, so it stays pending for the whole test."""
    script = "#!/bin/sh\n#SBATCH --time=00:02:00\n#SBATCH --gres=gpu:2\nsleep 2\n"
    out_dir = f"--chdir={slurmtools.user_dir('sgtest1')}"
    job_id = slurmtools.submit(script, "sgtest1", (out_dir, "--hold"))
    try:
        res = _gpueff("sgtest1", job_id)
        assert res.returncode == 0, res.stderr
        first = res.stdout.splitlines()[0]
        assert first.startswith(f"Job {job_id} ") and first.endswith("PENDING"), res.stdout
        assert "gpus 2" in res.stdout and "The job has not started yet." in res.stdout
        if _private_jobs():
            # PrivateData=jobs applies to squeue as to sacct: still not another user's.
            other = _gpueff("sgtest2", job_id)
            assert other.returncode == 4 and "not found" in other.stderr, other
    finally:
        slurmtools.run_as(None, ["scancel", job_id], check=False)
