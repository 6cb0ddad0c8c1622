"""Attacks on the node side (hooks, sampler, spool, virtual GPUs) by an unprivileged user.

Real processes (other uids through ``os.setuid`` in a forked child), real files and the real
prolog run as slurmd runs it. Needs root, like the hooks themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from slurm_gpu.capture import hostsample
from slurm_gpu.capture.hostsample import AutoHostSampler, ProcHostSampler
from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.capture.spool import JobSpool, read_pidfile
from slurm_gpu.config import parse_settings
from slurm_gpu.hooks.common import short_hostname
from slurm_gpu.hooks.epilog import is_our_sampler
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.records import GpuInfo, GpuSample, JobRecord
from slurm_gpu.telemetry.virtual_device import create_gpus

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the node side runs as root")

ESC = "\x1b"


def _job_id() -> str:
    return str(uuid.uuid4().int % 10**9 + 10**9)


def _user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"needs the account {name}")


def _as_user(uid: int, gid: int) -> None:
    """preexec_fn: become ``uid`` (a job user, or another user) for good."""
    os.setgroups([gid])
    os.setgid(gid)
    os.setuid(uid)


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A world-traversable directory (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="node-side-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _wait_listed(pid: int) -> None:
    """Wait until ``pid`` has exec'd (its command line is no longer Python's fork)."""
    for _ in range(500):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"):
                return
        except OSError:
            pass
        time.sleep(0.01)


# --------------------------------------------------------------------------- class 4


BUSY = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_owners_busy_loop_outside_the_job_with_the_job_variable_is_not_counted(
    tmp_path: Path,
) -> None:
    """Issue 27, point 1: the job's owner starts a busy loop outside the job with
    ``SLURM_JOB_ID=<job>`` in its environment (same uid). It once counted as the job's CPU
    time (6.97 s on a ``sleep 15`` job) and hid the job's waste. Only processes under the
    job's own slurmstepd count; the environment is never read."""
    job = _job_id()
    stepd = _fake_stepd(tmp_path, job)  # the job itself: a sleeping task
    busy = subprocess.Popen(
        [sys.executable, "-c", BUSY + "time.sleep(30)"],
        env={"SLURM_JOB_ID": job, "SLURM_JOBID": job, "PATH": "/usr/bin:/bin"},
    )
    try:
        sampler = ProcHostSampler(job, os.getuid())
        first = sampler.sample()
        for _ in range(500):
            if _cpu_of(busy.pid) >= 0.5:
                break
            time.sleep(0.02)
        assert _cpu_of(busy.pid) >= 0.5
        last = sampler.sample()
        assert first.process_count == last.process_count == 1  # the job's sleep alone
        assert last.cpu_time_s < 0.25, "the owner's busy loop outside the job was counted"
        assert sampler.verified
    finally:
        busy.kill()
        busy.wait()
        _stop(stepd)


def test_owners_process_with_a_huge_environment_is_never_read(tmp_path: Path) -> None:
    """Variant: the same process with the variable first and megabytes of environment
    after it; nothing of it is read and it does not join, with or without the job's uid."""
    job = _job_id()
    filler = {f"PAD{i}": "x" * 100_000 for i in range(15)}
    proc = subprocess.Popen(["sleep", "30"], env={"SLURM_JOB_ID": job, **filler})
    try:
        _wait_listed(proc.pid)
        # Listed may still be before exec (the fork's environment is the test's): wait for it.
        deadline = time.monotonic() + 10
        while len(Path(f"/proc/{proc.pid}/environ").read_bytes()) <= 1_000_000:
            assert time.monotonic() < deadline, "sleep never ran with its huge environment"
            time.sleep(0.01)
        assert ProcHostSampler(job, os.getuid()).sample().process_count == 0
        assert ProcHostSampler(job, None).sample().process_count == 0
        assert not hasattr(hostsample, "environ_has")
    finally:
        proc.kill()
        proc.wait()


def _fake_proc_entry(
    root: Path, pid: int, job: str, *, comm: str = "python3", ppid: int = 2
) -> None:
    """A process of ``job``: a child of pid ``ppid``, the job's stand-in slurmstepd."""
    d = root / str(pid)
    d.mkdir()
    fields = ["S", str(ppid)] + ["0"] * 9 + ["10", "0", "0", "0"] + ["0"] * 4 + ["500"]
    fields += ["0", "10"] + ["0"] * 28
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    (d / "io").write_text("read_bytes: 1\nwrite_bytes: 1\n")
    (d / "cmdline").write_bytes(f"slurmstepd: [{job}.0]\0".encode())


def test_a_burst_of_new_processes_is_examined_a_bounded_number_per_reading(
    tmp_path: Path,
) -> None:
    """A job that creates processes faster than the sampler reads: each reading decides the
    membership of at most MAX_NEW_PIDS_PER_READING new processes; the rest come next."""
    count = 300
    first_pid = 1000 if not 1000 <= os.getpid() < 1000 + count else 2000  # never ours: excluded
    _fake_proc_entry(tmp_path, 2, "77", comm="slurmstepd", ppid=1)
    for pid in range(first_pid, first_pid + count):
        _fake_proc_entry(tmp_path, pid, "77")
    sampler = ProcHostSampler("77", os.getuid(), proc_root=str(tmp_path))
    first = sampler.sample().process_count
    assert first < count, "every new process was examined in one reading"
    # 256 examined: the job's processes, and slurmstepd itself when it was among them.
    assert hostsample.MAX_NEW_PIDS_PER_READING == 256
    assert first in (255, 256)
    assert sampler.sample().process_count == count


def test_detached_sampler_runs_under_resource_limits(site: dict[str, object]) -> None:
    """The default launcher gives the sampler a data-size and a descriptor limit."""
    run_hook(site, "prolog", "501", SLURM_JOB_GPUS="0")
    paths = paths_of(site, "501")
    found = read_pidfile(paths.pid)
    assert found is not None
    try:
        limits = Path(f"/proc/{found[0]}/limits").read_text()
        data = next(line for line in limits.splitlines() if line.startswith("Max data size"))
        assert data.split()[3:5] == ["268435456", "268435456"], data
        files = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert files.split()[3:5] == ["4096", "4096"], files
    finally:
        run_hook(site, "epilog", "501")


# --------------------------------------------------------------------------- class 9


def test_another_users_process_with_the_job_variable_does_not_join() -> None:
    """A process of another account sets SLURM_JOB_ID=<id>: it never counts for the job,
    whether or not the sampler knows the job's uid."""
    job = _job_id()
    nobody = _user("nobody")
    proc = subprocess.Popen(
        ["sleep", "30"],
        env={"SLURM_JOB_ID": job, "PATH": "/usr/bin:/bin"},
        preexec_fn=lambda: _as_user(nobody.pw_uid, nobody.pw_gid),
    )
    try:
        _wait_listed(proc.pid)
        assert os.stat(f"/proc/{proc.pid}").st_uid == nobody.pw_uid
        assert ProcHostSampler(job, None).sample().process_count == 0
        assert ProcHostSampler(job, os.getuid()).sample().process_count == 0
    finally:
        proc.kill()
        proc.wait()


def _fake_stepd(tmp: Path, job: str) -> subprocess.Popen[bytes]:
    """A root process named slurmstepd with Slurm's title for a step of ``job``, with one
    child (``sleep``), as slurmstepd runs a job's task."""
    exe = tmp / "slurmstepd"
    shutil.copy("/bin/bash", exe)
    proc = subprocess.Popen(
        [f"slurmstepd: [{job}.0]", "-c", "sleep 30 & wait"],
        executable=str(exe),
        env={"PATH": "/usr/bin:/bin"},
        start_new_session=True,
    )
    for _ in range(500):
        if _children(proc.pid):
            break
        time.sleep(0.01)
    return proc


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with_children = [proc.pid, *_children(proc.pid)]
    for pid in with_children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    proc.wait()


def test_a_forged_job_process_does_not_pin_the_proc_method(tmp_path: Path) -> None:
    """A process of the job's user outside the job sets SLURM_JOB_ID=<id> before the job's
    cgroup exists. It is not counted and does not pin the /proc method: the job's cgroup is
    used once it appears. A process under the job's own slurmstepd does pin it."""
    job = _job_id()
    forged = subprocess.Popen(["sleep", "30"], env={"SLURM_JOB_ID": job, "PATH": "/bin"})
    try:
        _wait_listed(forged.pid)
        auto = AutoHostSampler(job, os.getuid(), cgroup_root=str(tmp_path / "cg"))
        assert auto.sample(1.0).process_count == 0
        _cgroup2(tmp_path / "cg", job)
        reading = auto.sample(2.0)
        assert reading.method == "cgroup2" and auto.method == "cgroup2"
    finally:
        forged.kill()
        forged.wait()
    job2 = _job_id()
    stepd = _fake_stepd(tmp_path, job2)
    try:
        auto = AutoHostSampler(job2, os.getuid(), cgroup_root=str(tmp_path / "cg2"))
        assert auto.sample(1.0).process_count == 1  # the task, not slurmstepd itself
        _cgroup2(tmp_path / "cg2", job2)
        assert auto.sample(2.0).method == "proc"
    finally:
        _stop(stepd)


def _slurm_cgroup1_tree(root: Path) -> None:
    """Slurm's v1 tree on a node that enforces cgroups: another job's memory cgroup."""
    other = root / "memory" / "slurm_node1" / "uid_1000" / "job_1"
    other.mkdir(parents=True)
    (other / "memory.stat").write_text("rss 1\n")


def _cgroup1(root: Path, job: str) -> None:
    for controller in ("cpuacct", "memory"):
        job_dir = root / controller / "slurm_node1" / f"uid_{os.getuid()}" / f"job_{job}"
        job_dir.mkdir(parents=True)
    (
        root / "cpuacct" / "slurm_node1" / f"uid_{os.getuid()}" / f"job_{job}" / "cpuacct.usage"
    ).write_text("2000000000\n")


def test_tasks_forked_before_the_cpuacct_cgroup_do_not_pin_proc_on_a_cgroup_node(
    tmp_path: Path,
) -> None:
    """Slurm 24.11 lab on cgroup v1 (a clean-clone CI run): the job's task ran under its
    slurmstepd before jobacct_gather/cgroup had made the job's cpuacct directory; the sampler
    kept /proc for the whole job and the record said ``proc`` on a node enforcing cgroups.
    Where Slurm keeps a cgroup tree, the job's cgroup is awaited; where it never comes, /proc
    is kept after the grace period."""
    job = _job_id()
    _slurm_cgroup1_tree(tmp_path / "cg")
    stepd = _fake_stepd(tmp_path, job)
    try:
        auto = AutoHostSampler(job, os.getuid(), cgroup_root=str(tmp_path / "cg"))
        assert auto.sample(1.0).process_count == 1
        assert auto.method == "proc"
        _cgroup1(tmp_path / "cg", job)
        reading = auto.sample(2.0)
        assert reading.method == "cgroup1" and auto.method == "cgroup1"
        assert reading.cpu_time_s == 2.0

        late = AutoHostSampler(job, os.getuid(), cgroup_root=str(tmp_path / "cg-late"))
        _slurm_cgroup1_tree(tmp_path / "cg-late")
        for i in range(hostsample.CGROUP_GRACE_READINGS + 1):
            assert late.sample(float(i)).method == "proc"
        _cgroup1(tmp_path / "cg-late", job)
        assert late.sample(100.0).method == "proc"  # kept for the job once the grace ended
    finally:
        _stop(stepd)


def test_a_process_under_another_jobs_slurmstepd_does_not_join(tmp_path: Path) -> None:
    job, other = _job_id(), _job_id()
    stepd = _fake_stepd(tmp_path, other)
    try:
        assert ProcHostSampler(job, None).sample().process_count == 0
        assert ProcHostSampler(other, None).sample().process_count == 1
    finally:
        _stop(stepd)


def _cgroup2(root: Path, job: str) -> None:
    job_dir = root / "system.slice" / "slurmstepd.scope" / f"job_{job}"
    job_dir.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (job_dir / "cpu.stat").write_text("usage_usec 1000000\n")
    (job_dir / "memory.current").write_text("1000\n")


def test_a_user_made_job_cgroup_is_not_the_jobs(tmp_path: Path) -> None:
    """A cgroup named job_<id> that a user created (in a delegated subtree) is not used."""
    job = _job_id()
    _cgroup2(tmp_path, job)
    user = _user("nobody")
    os.chown(tmp_path / "system.slice" / "slurmstepd.scope" / f"job_{job}", user.pw_uid, -1)
    auto = AutoHostSampler(job, os.getuid(), cgroup_root=str(tmp_path), proc_root="/nonexistent")
    assert auto.sample(1.0).method != "cgroup2"


# --------------------------------------------------------------------------- class 6


class _OneGpu:
    name = "fake"

    def list_gpus(self) -> Sequence[GpuInfo]:
        return [GpuInfo(uuid="GPU-a", minor_number=0, name="fake")]

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        return [GpuSample(uuid=u, time_s=time.time(), utilization_pct=50.0) for u in uuids]

    def close(self) -> None:
        pass


def _write_live_as_sampler(spool_dir: Path, job: str, uid: int) -> JobSpool:
    opts = SamplerOptions(
        job_id=job,
        hostname="n1",
        uid=uid,
        gpu_uuids=("GPU-a",),
        spool_dir=str(spool_dir),
        interval_s=10.0,
        checkpoint_interval_s=60.0,
        idle_threshold_pct=1.0,
        timeline_points=64,
    )
    sampler = Sampler(opts, _OneGpu, None)
    sampler.paths.create_dir()
    sampler.read_once()
    sampler.write_live()
    return sampler.paths


def _try_as(user: pwd.struct_passwd, code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: _as_user(user.pw_uid, user.pw_gid),
        cwd="/",
        check=False,
    )
    return out.stdout.strip() + out.stderr.strip()[-300:]


WRITE_PROBE = textwrap.dedent(
    """
    import os, sys
    path = sys.argv[1] if len(sys.argv) > 1 else {path!r}
    results = []
    for what, act in (
        ("write", lambda: os.close(os.open(path, os.O_WRONLY | os.O_APPEND))),
        ("chmod", lambda: os.chmod(path, 0o644)),
        ("link", lambda: os.link(path, "/tmp/" + os.urandom(6).hex())),
        ("read", lambda: open(path, "rb").read(10)),
    ):
        try:
            act()
            results.append(what + "=ok")
        except OSError as exc:
            results.append(what + "=" + str(exc.errno))
    print(" ".join(results))
    """
)


def test_live_summary_is_roots_and_not_writable_by_the_user(shared_dir: Path) -> None:
    """The job's user can read their live summary but not write, chmod or hard-link it (a
    user-owned file let them fill the spool's file system and keep it after the job); another
    user can do nothing with it."""
    owner = _user("daemon")  # uid 1, private group daemon
    other = _user("nobody")
    paths = _write_live_as_sampler(shared_dir / "spool", _job_id(), owner.pw_uid)
    st = os.stat(paths.live)
    assert st.st_uid == 0, "the live summary is owned by the job's user"
    assert st.st_gid == owner.pw_gid and stat.S_IMODE(st.st_mode) == 0o440
    seen = _try_as(owner, WRITE_PROBE.format(path=paths.live))
    assert "write=13" in seen and "chmod=1" in seen and "read=ok" in seen, seen
    assert "link=ok" not in seen, seen
    seen = _try_as(other, WRITE_PROBE.format(path=paths.live))
    assert "read=13" in seen and "write=13" in seen, seen
    # The spool itself gives the job's user (and everyone else) nothing, not even a stat.
    assert stat.S_IMODE(os.stat(paths.spool_dir).st_mode) == 0o700


def _live_body(job: str, **extra: object) -> dict[str, object]:
    return {
        "schema": "slurm-gpu/live",
        "version": 1,
        "job_id": job,
        "hostname": f"n1{ESC}]0;owned{ESC}\\{ESC}[2J",
        "started_s": 1.0,
        "updated_s": 61.0,
        "interval_s": 1.0,
        "gpus": [
            {
                "uuid": f"GPU-{ESC}[31mred",
                "name": f"H100{ESC}[8m\u202ehidden",
                "utilization_mean_pct": 55.0,
                "samples": 60,
                "idle_samples": 6,
            }
        ],
        "host": None,
        **extra,
    }


def _place_live(spool_dir: Path, job: str, body: bytes) -> None:
    live = Path(JobSpool(str(spool_dir), job, "n1").live)
    live.parent.mkdir(parents=True, exist_ok=True)
    live.write_bytes(body)


def _running_job(job: str) -> JobRecord:
    """A running job of ``job`` on node n1 (the unit tests' job factory)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    import gpueff_factory

    made: JobRecord = gpueff_factory.job(
        job_id=job, job_id_display=job, nodelist=("n1",), state="RUNNING", end_s=None
    )
    return made


def test_escape_sequences_in_a_live_summary_are_cleaned_for_gpueff(tmp_path: Path) -> None:
    """Host and GPU names from a live summary (a user's own file before this release) reach
    an admin's terminal through gpueff: they arrive without ESC, C1 or bidi controls."""
    job = _job_id()
    spool_dir = tmp_path / "spool"
    _place_live(spool_dir, job, json.dumps(_live_body(job)).encode())
    settings = parse_settings(
        {"paths": {"state_dir": str(tmp_path), "spool_dir": str(spool_dir)}}, path=None
    )
    tel = StoreAndSpoolReader(settings).live(_running_job(job))
    assert tel is not None and len(tel.gpus) == 1
    line = tel.gpus[0]
    text = " ".join(str(v) for v in (line.node, line.uuid, line.name))
    assert "H100" in text and "red" in text
    assert ESC not in text and "\u202e" not in text, repr(text)


def test_an_oversized_live_summary_is_not_parsed(tmp_path: Path) -> None:
    job = _job_id()
    spool_dir = tmp_path / "spool"
    body = json.dumps(_live_body(job, padding="x" * 8_000_000)).encode()
    _place_live(spool_dir, job, body)
    settings = parse_settings(
        {"paths": {"state_dir": str(tmp_path), "spool_dir": str(spool_dir)}}, path=None
    )
    tel = StoreAndSpoolReader(settings).live(_running_job(job))
    # Not parsed: no GPU numbers, only the line saying none are available here.
    assert tel is not None and tel.gpus == () and tel.source == ""
    assert "not available from this host" in tel.notes[0]


# --------------------------------------------------------------------------- class 8 (hooks)


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, object]:
    vdir = tmp_path / "vgpu"
    infos = create_gpus(vdir, 4)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
        f'log_file = "{tmp_path}/log/hooks.log"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\ninterval_s = 0.1\n'
        "checkpoint_interval_s = 1\n[hooks]\nsampler_stop_timeout_s = 3\n"
    )
    return {"tmp": tmp_path, "cfg": cfg, "infos": infos, "vdir": vdir}


def run_hook(site: dict[str, object], hook: str, job: str, **env: str) -> None:
    full = {
        "SLURM_GPU_CONFIG": str(site["cfg"]),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_USER": "root",
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_gpu.hooks", hook], env=full, timeout=60, check=False
    )
    assert proc.returncode == 0


def paths_of(site: dict[str, object], job: str) -> JobSpool:
    return JobSpool(f"{site['tmp']}/spool", job, short_hostname())


def _started(site: dict[str, object], job: str) -> tuple[int, int | None]:
    paths = paths_of(site, job)
    deadline = time.monotonic() + 20
    while not os.path.exists(paths.state):
        assert time.monotonic() < deadline, "the sampler never checkpointed"
        time.sleep(0.05)
    found = read_pidfile(paths.pid)
    assert found is not None
    return found


def test_second_mig_slice_prolog_does_not_reap_the_first(site: dict[str, object]) -> None:
    """Two jobs on two MIG slices of one GPU, named MIG-GPU-<uuid>/<gi>/<ci>: the second
    job's prolog leaves the first job's sampler running and its record unsealed."""
    gpu = site["infos"][1].uuid  # type: ignore[index]
    run_hook(site, "prolog", "601", CUDA_VISIBLE_DEVICES=f"MIG-{gpu}/1/0")
    first = _started(site, "601")
    run_hook(site, "prolog", "602", CUDA_VISIBLE_DEVICES=f"MIG-{gpu}/2/0")
    try:
        assert is_our_sampler(first[0], first[1], "601"), "the first slice's sampler was reaped"
        assert not os.path.exists(paths_of(site, "601").record)
    finally:
        run_hook(site, "epilog", "602")
        run_hook(site, "epilog", "601")
    assert os.path.exists(paths_of(site, "601").record)


def test_a_running_jobs_sampler_is_never_reaped(site: dict[str, object]) -> None:
    """A GPU claimed by a job whose slurmstepd still runs (a shared GPU, a stale claim
    file): the next prolog on that GPU does not stop that job's sampler."""
    run_hook(site, "prolog", "611", SLURM_JOB_GPUS="2")
    first = _started(site, "611")
    stepd = _fake_stepd(Path(str(site["tmp"])), "611")
    try:
        run_hook(site, "prolog", "612", SLURM_JOB_GPUS="2")
        assert is_our_sampler(first[0], first[1], "611"), "a running job's sampler was reaped"
        log = Path(f"{site['tmp']}/log/hooks.log").read_text()
        assert "job 611: still running, left alone" in log
    finally:
        _stop(stepd)
        run_hook(site, "epilog", "612")
        run_hook(site, "epilog", "611")


# --------------------------------------------------------------------------- class 10


def test_spool_root_is_0700_and_an_open_one_is_tightened(tmp_path: Path) -> None:
    fresh = JobSpool(str(tmp_path / "fresh"), "1", "n1")
    fresh.create_dir()
    assert stat.S_IMODE(os.stat(fresh.spool_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(fresh.job_dir).st_mode) == 0o700
    old = tmp_path / "old"
    old.mkdir()
    old.chmod(0o711)
    JobSpool(str(old), "1", "n1").create_dir()
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o700


SAMPLE_VIRTUAL = textwrap.dedent(
    """
    import resource, sys
    # A bound on what the reader may use: the original reads /dev/zero until this stops it.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    from slurm_gpu.telemetry.virtual import VirtualGpuSource
    src = VirtualGpuSource(sys.argv[1])
    uuids = [g.uuid for g in src.list_gpus()]
    print(" ".join(str(s.available) for s in src.sample(uuids)), flush=True)
    """
)


def test_virtual_state_linked_to_dev_zero_reads_as_unavailable(tmp_path: Path) -> None:
    """A user replaces a virtual GPU's world-writable state.json with a link to /dev/zero,
    or with a FIFO: the (root) reader gives that GPU up at once, the others go on."""
    vdir = tmp_path / "vgpu"
    create_gpus(vdir, 3)
    (vdir / "0" / "state.json").unlink()
    (vdir / "0" / "state.json").symlink_to("/dev/zero")
    (vdir / "1" / "state.json").unlink()
    os.mkfifo(vdir / "1" / "state.json")
    try:
        out = subprocess.run(
            [sys.executable, "-c", SAMPLE_VIRTUAL, str(vdir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading the virtual GPUs hung")
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split() == ["False", "False", "True"]
