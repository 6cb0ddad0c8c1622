"""The prolog's move of its sampler out of the job's cgroup under PrologFlags=RunInJob
(slurm_gpu.hooks.jobcgroup), on /proc and /sys/fs/cgroup trees made in tmp_path. The lab test
tests/lab/test_lab_runinjob.py does the same on Slurm 24.11 and 26.05 with cgroup v1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu.hooks.jobcgroup import (
    escape_path,
    inside_job,
    move_out_of_job,
    parse_proc_cgroup,
)

# /proc/<sampler>/cgroup as seen on Slurm 24.11 with PrologFlags=Alloc,RunInJob (cgroup v1).
V1_RUN_IN_JOB = """\
9:name=systemd:/
8:pids:/
6:freezer:/slurm_t1/uid_1000/job_11
5:devices:/slurm_t1/uid_1000/job_11/step_extern
4:memory:/slurm_t1/uid_1000/job_11/step_extern
3:cpuset:/slurm_t1/uid_1000/job_11/step_extern
2:cpu,cpuacct:/system.slice/slurm/uid_1000/job_11/step_extern
0::/
"""


def _trees(tmp_path: Path, proc_cgroup: str, pid: int = 4242) -> tuple[Path, Path]:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(proc_cgroup)
    cg = tmp_path / "cgroup"
    for ctrl, target in [
        ("freezer", ""),
        ("devices", ""),
        ("memory", ""),
        ("cpuset", ""),
        ("cpu,cpuacct", "system.slice"),
    ]:
        (cg / ctrl / target).mkdir(parents=True, exist_ok=True)
        (cg / ctrl / target / "cgroup.procs").write_text("")
    return proc, cg


def test_only_the_job_lines_count() -> None:
    lines = parse_proc_cgroup(V1_RUN_IN_JOB + "garbage\n")
    assert len(lines) == 8
    assert [ln.controllers for ln in inside_job(lines, "11")] == [
        "freezer",
        "devices",
        "memory",
        "cpuset",
        "cpu,cpuacct",
    ]
    assert inside_job(lines, "1") == []  # job_11 is not job_1


def test_escape_path_is_where_slurms_tree_hangs() -> None:
    assert escape_path("/slurm_t1/uid_1000/job_11/step_extern", "11") == "/"
    assert escape_path("/system.slice/slurm/uid_1000/job_11/step_extern", "11") == "/system.slice"
    assert escape_path("/system.slice/slurmstepd.scope/job_11/step_extern", "11") == (
        "/system.slice/slurmstepd.scope"
    )


def test_runinjob_sampler_is_moved_out_of_every_v1_controller(tmp_path: Path) -> None:
    proc, cg = _trees(tmp_path, V1_RUN_IN_JOB)
    moved, failed = move_out_of_job(4242, "11", proc_root=str(proc), cgroup_root=str(cg))
    assert moved == ["freezer", "devices", "memory", "cpuset", "cpu,cpuacct"]
    assert failed == []
    assert (cg / "memory" / "cgroup.procs").read_text() == "4242\n"
    assert (cg / "cpu,cpuacct" / "system.slice" / "cgroup.procs").read_text() == "4242\n"


def test_runinjob_on_cgroup_v2_is_reported_not_moved(tmp_path: Path) -> None:
    proc, cg = _trees(tmp_path, "0::/system.slice/slurmstepd.scope/job_11/step_extern\n")
    moved, failed = move_out_of_job(4242, "11", proc_root=str(proc), cgroup_root=str(cg))
    assert moved == [] and failed == ["unified (cgroup v2)"]


def test_sampler_outside_the_job_is_left_alone(tmp_path: Path) -> None:
    proc, cg = _trees(tmp_path, "4:memory:/\n0::/\n")
    assert move_out_of_job(4242, "11", proc_root=str(proc), cgroup_root=str(cg)) == ([], [])
    assert (cg / "memory" / "cgroup.procs").read_text() == ""


def test_unwritable_target_is_reported(tmp_path: Path) -> None:
    proc, cg = _trees(tmp_path, "4:memory:/gone/slurm/uid_1/job_11/step_extern\n")
    moved, failed = move_out_of_job(4242, "11", proc_root=str(proc), cgroup_root=str(cg))
    assert moved == [] and len(failed) == 1 and failed[0].startswith("memory (")


def test_the_pid_file_appears_only_once_the_sampler_has_left_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers (the epilog, the lab test) take the pid file as a settled sampler: under RunInJob
    it must not name a sampler still inside the job's cgroup (a 26.05 CI run saw that race)."""
    from slurm_gpu.config import load_settings
    from slurm_gpu.hooks import prolog
    from slurm_gpu.hooks.common import JobEnv
    from slurm_gpu.telemetry.virtual_device import create_gpus

    vdir = tmp_path / "vgpu"
    create_gpus(vdir, 1)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
        f'log_file = "{tmp_path}/hooks.log"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\n'
        "[hooks]\nreap_stale_samplers = false\n"
    )
    settings = load_settings(str(cfg), trusted=False)
    env = JobEnv.from_environ(
        {"SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}
    )
    seen: list[bool] = []
    monkeypatch.setattr(prolog, "start_sampler", lambda *a, **k: os.getpid())
    monkeypatch.setattr(
        prolog,
        "leave_job_cgroup",
        lambda pid, job: seen.append(
            os.path.exists(
                prolog.JobSpool(settings.paths.spool_dir, "77", env.spool_hostname()).pid
            )
        ),
    )
    assert "started" in prolog.run_prolog(settings, env)
    assert seen == [False]
    assert os.path.exists(prolog.JobSpool(settings.paths.spool_dir, "77", env.spool_hostname()).pid)
