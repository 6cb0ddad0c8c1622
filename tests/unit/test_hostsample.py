"""Job host sampling (capture.hostsample): cgroup trees as fixtures, /proc on real processes."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from slurm_gpu.capture.hostsample import (
    AutoHostSampler,
    Cgroup1HostSampler,
    Cgroup2HostSampler,
    NullHostSampler,
    ProcHostSampler,
    count_cpu_list,
    open_host_sampler,
    parse_blkio_v1,
    parse_io_stat_v2,
)


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def cgroup2_tree(root: Path, job: str = "42") -> Path:
    put(root, "cgroup.controllers", "cpuset cpu io memory pids\n")
    job_dir = root / "system.slice" / "slurmstepd.scope" / f"job_{job}"
    put(job_dir, "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    put(job_dir, "memory.current", "900000000\n")
    put(job_dir, "memory.stat", "anon 600000000\nfile 300000000\n")
    put(
        job_dir,
        "io.stat",
        "8:0 rbytes=1000 wbytes=2000 rios=1 wios=2 dbytes=0 dios=0\n"
        "259:0 rbytes=24 wbytes=76 rios=1 wios=1 dbytes=0 dios=0\n",
    )
    put(job_dir, "pids.current", "5\n")
    put(job_dir, "cpuset.cpus.effective", "0-3,8\n")
    return job_dir


def cgroup1_tree(root: Path, job: str = "42", uid: int = 1000) -> None:
    base = f"slurm/uid_{uid}/job_{job}"
    put(root, f"cpuacct/{base}/cpuacct.usage", "3500000000\n")
    put(root, f"cpuacct/{base}/tasks", "")
    put(root, f"cpuacct/{base}/step_batch/tasks", "100\n101\n")
    put(root, f"cpuacct/{base}/step_0/tasks", "200\n")
    put(root, f"memory/{base}/memory.stat", "cache 5\nrss 10\ntotal_cache 50\ntotal_rss 7000\n")
    put(
        root,
        f"blkio/{base}/blkio.throttle.io_service_bytes_recursive",
        "8:0 Read 100\n8:0 Write 200\n8:0 Sync 300\n8:0 Total 300\n8:16 Read 1\nTotal 301\n",
    )
    put(root, f"cpuset/{base}/cpuset.cpus", "2,4-5\n")


def test_cgroup2(tmp_path: Path) -> None:
    cgroup2_tree(tmp_path)
    sampler = open_host_sampler("42", 1000, cgroup_root=str(tmp_path))
    assert isinstance(sampler, Cgroup2HostSampler)
    s = sampler.sample(123.0)
    assert (s.time_s, s.cpu_time_s, s.rss_bytes) == (123.0, 2.5, 600_000_000)
    assert (s.io_read_bytes, s.io_write_bytes, s.process_count) == (1024, 2076, 5)
    assert s.method == "cgroup2"
    assert sampler.allocated_cores() == 5


def test_cgroup2_without_memory_stat_uses_memory_current(tmp_path: Path) -> None:
    job_dir = cgroup2_tree(tmp_path)
    (job_dir / "memory.stat").unlink()
    (job_dir / "io.stat").unlink()
    s = Cgroup2HostSampler(str(job_dir)).sample(1.0)
    assert s.rss_bytes == 900_000_000
    assert s.io_read_bytes is None


def test_cgroup1(tmp_path: Path) -> None:
    cgroup1_tree(tmp_path)
    sampler = open_host_sampler("42", 1000, cgroup_root=str(tmp_path))
    assert isinstance(sampler, Cgroup1HostSampler)
    s = sampler.sample(5.0)
    assert s.cpu_time_s == 3.5
    assert s.rss_bytes == 7000
    assert (s.io_read_bytes, s.io_write_bytes) == (101, 200)
    assert s.process_count == 3
    assert s.method == "cgroup1"
    assert sampler.allocated_cores() == 3


def test_cgroup1_any_uid_when_unknown(tmp_path: Path) -> None:
    cgroup1_tree(tmp_path, uid=2000)
    assert isinstance(open_host_sampler("42", None, cgroup_root=str(tmp_path)), Cgroup1HostSampler)
    # The wrong uid does not match another user's job directory.
    assert not isinstance(
        open_host_sampler("42", 1000, cgroup_root=str(tmp_path)), Cgroup1HostSampler
    )


def test_probe_order_and_fallbacks(tmp_path: Path) -> None:
    cgroup1_tree(tmp_path / "v1")
    assert isinstance(
        open_host_sampler("42", 1000, cgroup_root=str(tmp_path / "v1")), Cgroup1HostSampler
    )
    assert isinstance(
        open_host_sampler("43", 1000, cgroup_root=str(tmp_path / "v1")), ProcHostSampler
    )
    assert isinstance(
        open_host_sampler("43", 1000, cgroup_root=str(tmp_path), proc_root=str(tmp_path / "no")),
        NullHostSampler,
    )


def test_auto_sampler_switches_to_cgroup_when_it_appears(tmp_path: Path) -> None:
    auto = AutoHostSampler("42", 1000, cgroup_root=str(tmp_path))
    first = auto.sample(1.0)
    assert first.method == "proc" and first.process_count == 0
    cgroup2_tree(tmp_path)
    assert auto.sample(2.0).method == "cgroup2"
    assert auto.method == "cgroup2"


def test_parsers() -> None:
    assert parse_io_stat_v2("") == (0, 0)
    assert parse_blkio_v1("Total 0\n") == (0, 0)
    assert count_cpu_list("0-3,8,10-11") == 7
    assert count_cpu_list("") is None
    assert count_cpu_list("x") is None


# --------------------------------------------------------------------------- /proc, for real

BURN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    burn(float(sys.argv[1]))
    if len(sys.argv) > 2:
        # A child that burns and is reaped by this process: its time moves to our cutime.
        subprocess.run([sys.executable, __file__, sys.argv[2]], check=True)
    time.sleep(float(os.environ.get("LINGER", "0.6")))
    """
)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _under_stepd(tmp_path: Path, job: str, command: str) -> subprocess.Popen[bytes]:
    """``command`` run by a stand-in slurmstepd of ``job`` (a shell named ``slurmstepd``
    whose title is Slurm's ``slurmstepd: [<job>.0]``), as slurmstepd runs a job's task; the
    shell forks (``; exit``), so the task is its child."""
    exe = tmp_path / "slurmstepd"
    if not exe.exists():
        shutil.copy("/bin/sh", exe)
    return subprocess.Popen(
        [f"slurmstepd: [{job}.0]", "-c", f"{command}; exit $?"], executable=str(exe)
    )


def _spawn(tmp_path: Path, job: str, *args: str) -> subprocess.Popen[bytes]:
    script = tmp_path / "burn.py"
    if not script.exists():
        # Written once and put in place whole: rewriting it while an interpreter started
        # earlier opens it (truncate, then write) makes that one run an empty script and exit 0
        # having burnt nothing, which a slow machine hit in CI.
        part = tmp_path / "burn.py.part"
        part.write_text(BURN)
        part.rename(script)
    return _under_stepd(tmp_path, job, " ".join([sys.executable, str(script), *args]))


def _sample_until_done(sampler: ProcHostSampler, procs: list[subprocess.Popen[bytes]]) -> list:  # type: ignore[type-arg]
    readings = []
    while any(p.poll() is None for p in procs):
        readings.append(sampler.sample())
        time.sleep(0.1)
    readings.append(sampler.sample())
    return readings


def test_proc_counts_job_processes_cpu_and_stays_monotonic(tmp_path: Path) -> None:
    job = str(uuid.uuid4().int % 10**9 + 10**9)
    sampler = ProcHostSampler(job, os.getuid())
    assert sampler.sample().process_count == 0
    before = _children_cpu()
    other = _spawn(tmp_path, "1", "0.3")  # another job: must not count
    procs = [_spawn(tmp_path, job, "0.8"), _spawn(tmp_path, job, "0.4", "0.5")]
    readings = _sample_until_done(sampler, [*procs, other])
    for p in [*procs, other]:
        assert p.wait() == 0
    burned = _children_cpu() - before
    other_cpu = 0.3
    cpu = [r.cpu_time_s for r in readings]
    assert cpu == sorted(cpu), "CPU time went backwards"
    assert max(r.process_count for r in readings) >= 2
    assert max(r.rss_bytes for r in readings) > 1_000_000
    # Everything the job burned (0.8 + 0.4 + 0.5 s plus interpreter start-up) is counted once:
    # not lost when processes exit, not counted twice when a parent reaps a child.
    job_cpu = burned - other_cpu
    assert readings[-1].cpu_time_s == pytest.approx(job_cpu, abs=0.25)
    assert readings[-1].process_count == 0
    assert readings[-1].method == "proc"


def test_proc_ignores_other_uids(tmp_path: Path) -> None:
    job = str(uuid.uuid4().int % 10**9 + 10**9)
    proc = _spawn(tmp_path, job, "0.1")
    try:
        time.sleep(0.3)
        assert ProcHostSampler(job, uid=os.getuid() + 12345).sample().process_count == 0
        seen = ProcHostSampler(job, uid=os.getuid())
        assert seen.sample().process_count == 1
        assert seen.allocated_cores() == len(os.sched_getaffinity(0))
    finally:
        proc.wait()


def test_proc_keeps_job_files_open_until_close_and_notices_exits(tmp_path: Path) -> None:
    job = str(uuid.uuid4().int % 10**9 + 10**9)
    fds_before = len(os.listdir("/proc/self/fd"))
    short = _spawn(tmp_path, job, "0.1")
    long = _under_stepd(tmp_path, job, f"{sys.executable} -c 'import time; time.sleep(30)'")
    try:
        sampler = ProcHostSampler(job, os.getuid())
        time.sleep(0.3)
        assert sampler.sample().process_count == 2
        # stat and io of both processes and /proc/loadavg stay open between readings.
        assert len(os.listdir("/proc/self/fd")) == fds_before + 5
        assert short.wait() == 0
        reading = sampler.sample()
        assert reading.process_count == 1
        assert len(os.listdir("/proc/self/fd")) == fds_before + 3
        sampler.close()
        assert len(os.listdir("/proc/self/fd")) == fds_before
        # Closed, it goes on reading by path.
        assert sampler.sample().process_count == 1
        assert len(os.listdir("/proc/self/fd")) == fds_before
    finally:
        long.kill()
        long.wait()


# --------------------------------------------------------------------------- /proc, as a fixture


#: The pid of the stand-in slurmstepd in the fixtures' /proc trees.
STEPD_PID = 10


def _fake_pid(root: Path, pid: int, job: str | None, utime: int, start: int = 500) -> None:
    """A process of ``job`` (a child of its slurmstepd, made when missing) or, for ``None``,
    of nobody's job (a child of init). It holds ``SLURM_JOB_ID`` either way: the environment
    must not decide."""
    if job is not None and not (root / str(STEPD_PID)).exists():
        _fake_process(root, STEPD_PID, "slurmstepd", 1, 0, 100)
        put(root, f"{STEPD_PID}/cmdline", f"slurmstepd: [{job}.0]\0")
    _fake_process(root, pid, "python3", STEPD_PID if job else 1, utime, start)
    (root / str(pid) / "environ").write_bytes(f"PATH=/bin\0SLURM_JOB_ID={job or 77}\0".encode())


def _fake_process(root: Path, pid: int, comm: str, ppid: int, utime: int, start: int) -> None:
    # stat fields after "(comm) ": state ppid ... utime(14) stime(15) ... starttime(22) rss(24)
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), "0", "0", "0"] + ["0"] * 4
    fields += [str(start), "0", "10"] + ["0"] * 28
    put(root, f"{pid}/stat", f"{pid} ({comm}) " + " ".join(fields) + "\n")
    put(root, f"{pid}/io", "read_bytes: 100\nwrite_bytes: 50\n")


def test_proc_lists_only_when_a_pid_was_allocated(tmp_path: Path) -> None:
    put(tmp_path, "loadavg", "0.10 0.20 0.30 1/100 4000\n")
    _fake_pid(tmp_path, 4000, "77", utime=100)
    _fake_pid(tmp_path, 3000, None, utime=5)
    sampler = ProcHostSampler("77", os.getuid(), proc_root=str(tmp_path))
    first = sampler.sample()
    assert first.process_count == 1 and sampler.full_scans == 1
    # The other process gets its second look, which needs a listing.
    sampler.sample()
    assert sampler.full_scans == 2
    # Settled and no pid allocated: only the job's process is read, and its counters move.
    _fake_pid(tmp_path, 4000, "77", utime=300)
    reading = sampler.sample()
    assert sampler.full_scans == 2
    assert reading.process_count == 1 and reading.cpu_time_s == pytest.approx(3.0)
    # A new pid shows in loadavg: /proc is listed and the new job process is found.
    _fake_pid(tmp_path, 4001, "77", utime=100)
    put(tmp_path, "loadavg", "0.10 0.20 0.30 1/101 4001\n")
    reading = sampler.sample()
    assert sampler.full_scans == 3 and reading.process_count == 2
    # A job process that exits is noticed without a listing, and its time is kept.
    for name in ("stat", "io", "environ"):
        (tmp_path / "4001" / name).unlink()
    (tmp_path / "4001").rmdir()
    reading = sampler.sample()
    assert sampler.full_scans == 3 and reading.process_count == 1
    assert reading.cpu_time_s == pytest.approx(4.0)


def test_proc_without_loadavg_lists_every_time(tmp_path: Path) -> None:
    _fake_pid(tmp_path, 4000, "77", utime=100)
    sampler = ProcHostSampler("77", os.getuid(), proc_root=str(tmp_path))
    for _ in range(3):
        assert sampler.sample().process_count == 1
    assert sampler.full_scans == 3


# --------------------------------------------------------------------------- Slurm 26.05 SLUIDs

SLUID = "sBR1JB8J1YM400"  # the form Slurm's own sluid2str test prints


def test_cgroup2_directory_named_by_the_sluid_on_slurm_26_05(tmp_path: Path) -> None:
    """Slurm 26.05 names a job's cgroup v2 directory by its SLUID unless cgroup.conf sets
    CgroupJobIdPaths=yes: looking for job_<id> alone read /proc for every job there."""
    job_dir = cgroup2_tree(tmp_path)
    job_dir.rename(job_dir.with_name(SLUID))
    assert not isinstance(
        open_host_sampler("42", 1000, cgroup_root=str(tmp_path)), Cgroup2HostSampler
    )
    auto = AutoHostSampler("42", 1000, cgroup_root=str(tmp_path), sluid=SLUID)
    reading = auto.sample(5.0)
    assert reading.method == "cgroup2" and reading.cpu_time_s == 2.5


def test_the_prolog_hands_only_a_well_formed_sluid_to_the_sampler() -> None:
    from slurm_gpu.config import Settings
    from slurm_gpu.hooks.common import JobEnv
    from slurm_gpu.hooks.prolog import sampler_command
    from slurm_gpu.hooks.sampler import parse_args

    def sluid_of(value: str) -> str | None:
        env = JobEnv.from_environ({"SLURM_JOB_ID": "5", "SLURM_JOB_SLUID": value})
        cmd = sampler_command(Settings(), env, ["GPU-a"], "n1")
        return parse_args(cmd[cmd.index("slurm_gpu.hooks.sampler") + 1 :]).sluid  # type: ignore[no-any-return]

    assert sluid_of(SLUID) == SLUID
    for bad in ("../../etc", "job_5", "s*", SLUID + "0", "sbr1jb8j1ym400", ""):
        assert sluid_of(bad) is None, bad


def test_the_job_is_gone_once_slurm_removes_its_cgroup(tmp_path: Path) -> None:
    cgroup1_tree(tmp_path / "v1")
    v1 = AutoHostSampler("42", 1000, cgroup_root=str(tmp_path / "v1"))
    job_dir = cgroup2_tree(tmp_path / "v2")
    v2 = AutoHostSampler("42", 1000, cgroup_root=str(tmp_path / "v2"))
    assert v1.sample(1.0).method == "cgroup1" and v2.sample(1.0).method == "cgroup2"
    assert not v1.job_gone() and not v2.job_gone()
    import shutil

    shutil.rmtree(tmp_path / "v1" / "cpuacct" / "slurm" / "uid_1000" / "job_42")
    shutil.rmtree(job_dir)
    assert v1.job_gone() and v2.job_gone()
    # The /proc method cannot tell an ended job from a quiet one.
    assert not AutoHostSampler("43", 1000, cgroup_root=str(tmp_path / "none")).job_gone()
