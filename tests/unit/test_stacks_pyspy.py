"""Stack sampling with the real reader (py-spy) against real Python programs.

Each program's main loop does one thing: waits on a queue fed by worker processes, writes
files, sleeps, or computes. The job's "cgroup" is a directory whose ``cgroup.procs`` lists
the program's processes (the discovery code reads it as it reads Slurm's); everything else
is the production path: ``/proc`` checks, ``setpriv`` to the job's uid when the tests run as
root (the programs then run as ``nobody``), py-spy, the classifier, the counts.

Needs py-spy (the ``stacks`` extra) and permission to read a process of one's own uid
(Yama ``ptrace_scope`` 0, or root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu.capture import stackread
from slurm_gpu.capture.stackclass import load_table
from slurm_gpu.capture.stacksampler import StackOptions, StackSampler
from slurm_gpu.records import StackSummary

PY_SPY = stackread.default_reader_path()
pytestmark = pytest.mark.skipif(
    not os.access(PY_SPY, os.X_OK),
    reason=f"py-spy is not beside the interpreter ({PY_SPY}): pip install slurm-gpu[stacks]",
)
AS_ROOT = os.geteuid() == 0
#: The job's uid: nobody when the tests run as root (the sampler then drops to it).
JOB_UID = 65534 if AS_ROOT else os.getuid()

PROGRAMS = {
    "queue": """
import multiprocessing as mp, time

def produce(q):
    while True:
        time.sleep(0.5)  # a slow input pipeline
        q.put(b"x" * 1000)

def train_loop(q):
    print("ready", flush=True)
    while True:
        batch = q.get()
        sum(batch)

if __name__ == "__main__":
    mp.set_start_method("fork")
    q = mp.Queue()
    for _ in range(2):
        mp.Process(target=produce, args=(q,), daemon=True).start()
    train_loop(q)
""",
    "writer": """
import io, json, os, shutil, sys, tempfile
d = tempfile.mkdtemp()
state = {"w": list(range(20000))}
blob = os.urandom(1 << 20)

def save_checkpoint(step):
    with open(os.path.join(d, "ckpt.json"), "w") as fh:
        json.dump(state, fh)
    with open(os.path.join(d, "ckpt.bin"), "wb") as fh:
        shutil.copyfileobj(io.BytesIO(blob), fh, 4096)

print("ready", flush=True)
step = 0
while True:
    save_checkpoint(step)
    step += 1
""",
    "sleeper": """
import time

def wait_for_work():
    time.sleep(0.5)

print("ready", flush=True)
while True:
    wait_for_work()
""",
    "compute": """
def forward(xs):
    return sum(x * x % 7 for x in xs)

print("ready", flush=True)
xs = list(range(100000))
while True:
    forward(xs)
""",
}


def descendants(pid: int) -> list[int]:
    out = [pid]
    for p in list(out):
        for tid in os.listdir(f"/proc/{p}/task"):
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    out += [int(c) for c in fh.read().split()]
            except OSError:
                continue
    return out


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Readable by nobody: the programs run as the job's uid.
    d = Path(tempfile.mkdtemp(prefix="stacks-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(workdir: Path, name: str) -> subprocess.Popen[str]:
    script = workdir / f"job_{name}.py"
    script.write_text(PROGRAMS[name])
    script.chmod(0o644)
    argv = [sys.executable, str(script)]
    if AS_ROOT:
        argv = ["setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_UID}", "--clear-groups", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd="/tmp")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # workers started, loop entered
    return proc


def stop(pids: list[int], proc: subprocess.Popen[str]) -> None:
    """Kill the program and its workers (daemonic children outlive a killed parent)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def job_cgroup(workdir: Path, pids: list[int]) -> str:
    cg = workdir / "job_1" / "step_0"
    cg.mkdir(parents=True)
    (cg / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return str(workdir / "job_1")


def pause(seconds: float) -> bool:
    """The burst's wait between samples (never a stop request here)."""
    time.sleep(seconds)
    return False


def sample(cgroup: str, samples: int = 12) -> StackSummary:
    opts = StackOptions(
        uid=JOB_UID,
        samples_per_burst=samples,
        sample_spacing_s=0.05,
        first_burst_s=0.0,
        py_spy=PY_SPY,
        setpriv=shutil.which("setpriv") or "/usr/bin/setpriv",
        charge_to_job=False,
    )
    sampler = StackSampler(opts, load_table(), lambda: cgroup, started_s=time.time())
    assert sampler.due(time.time())
    sampler.burst(time.time(), None, pause, time.time)
    return sampler.summary()


def share(summary: StackSummary, cls: str) -> float:
    return summary.counts[summary.classes.index(cls)] / max(summary.samples, 1)


@pytest.mark.parametrize(
    ("program", "cls", "deciding"),
    [
        ("queue", "input_wait", "queues.get"),
        ("writer", "checkpoint_io", None),
        ("sleeper", "sleep_idle", None),
        ("compute", "compute", "job_compute.forward"),
    ],
)
def test_a_real_programs_main_loop_is_classified(
    workdir: Path, program: str, cls: str, deciding: str | None
) -> None:
    proc = start(workdir, program)
    pids = descendants(proc.pid)
    try:
        summary = sample(job_cgroup(workdir, pids))
    finally:
        stop(pids, proc)
    assert summary.samples >= 10, summary
    # The program's main loop is its class most of the time, and no other class comes close
    # (a sample can land between two calls, as 'other', more often on a loaded machine).
    assert share(summary, cls) > 0.5, summary
    assert max(summary.counts) == summary.counts[summary.classes.index(cls)], summary
    if deciding is not None:
        assert deciding in summary.deciding[summary.classes.index(cls)], summary
    # Only the main process is counted; the queue program's workers are counted apart.
    assert [p.pid for p in summary.processes] == [proc.pid]
    if program == "queue":
        assert summary.worker_samples > 0
    assert summary.bursts == 1 and summary.reader_cpu_s > 0


def test_only_processes_listed_in_the_jobs_cgroup_are_read(workdir: Path) -> None:
    inside = start(workdir, "sleeper")
    outside = start(workdir, "compute")
    try:
        summary = sample(job_cgroup(workdir, [inside.pid]), samples=3)
    finally:
        for p in (inside, outside):
            p.kill()
            p.wait()
    assert [p.pid for p in summary.processes] == [inside.pid]
    assert summary.counts[summary.classes.index("compute")] == 0


@pytest.mark.skipif(not AS_ROOT, reason="needs two uids: run as root to have one for the job")
def test_a_process_of_another_uid_in_the_cgroup_is_never_read(workdir: Path) -> None:
    # Root's process in the job's cgroup (as slurmstepd is) is not read, nor is it attempted.
    script = workdir / "root.py"
    script.write_text(PROGRAMS["compute"])
    root_proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert root_proc.stdout is not None and root_proc.stdout.readline().strip() == "ready"
    try:
        cg = job_cgroup(workdir, [root_proc.pid])
        opts = StackOptions(uid=JOB_UID, first_burst_s=0.0, py_spy=PY_SPY, charge_to_job=False)
        sampler = StackSampler(opts, load_table(), lambda: cg, started_s=time.time())
        sampler.burst(time.time(), None, lambda s: False, time.time)
    finally:
        root_proc.kill()
        root_proc.wait()
    summary = sampler.summary()
    assert summary.samples == 0 and summary.bursts_failed == 1
    assert "no_python_process" in summary.notes


@pytest.mark.skipif(not AS_ROOT, reason="the drop to the job's uid happens only for root")
def test_the_reader_runs_as_the_jobs_uid_with_at_most_cap_sys_ptrace(workdir: Path) -> None:
    target = stackread.JobProcess(
        pid=os.getpid(), ppid=1, uid=JOB_UID, gid=JOB_UID, start=0, python=True
    )
    for with_ptrace, want in ((True, "0000000000080000"), (False, "0000000000000000")):
        argv = stackread.reader_argv(
            "/bin/cat", target, setpriv="setpriv", with_ptrace=with_ptrace, as_root=True
        )
        # The same privileges, with a program that shows them instead of py-spy.
        shown = subprocess.run(
            [*argv[: argv.index("--") + 1], "/bin/cat", "/proc/self/status"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        fields = dict(line.split(":\t", 1) for line in shown.splitlines() if ":\t" in line)
        assert fields["Uid"].split()[:2] == [str(JOB_UID)] * 2
        assert fields["Groups"].strip() == ""
        for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
            assert fields[cap].strip() == want, (cap, fields[cap])
        assert fields["NoNewPrivs"].strip() == "1"


def test_output_over_the_bound_is_discarded_and_the_reader_killed() -> None:
    out, _err, error, _cpu = stackread.run_reader(
        ["/bin/sh", "-c", "head -c 100000 /dev/zero; sleep 30"],
        timeout_s=10,
        output_max_bytes=4096,
        preexec=None,
    )
    assert out is None and error == "too_large"


def test_a_reader_that_hangs_is_killed_at_its_timeout() -> None:
    out, _err, error, _cpu = stackread.run_reader(
        ["/bin/sleep", "30"], timeout_s=0.3, output_max_bytes=4096, preexec=None
    )
    assert out is None and error == "timeout"


def test_the_reader_joins_the_read_processs_cgroup_before_exec(tmp_path: Path) -> None:
    # A regular file stands in for cgroup.procs: the child writes "0" (itself) before exec.
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    out, _err, error, _cpu = stackread.run_reader(
        ["/bin/cat", "/proc/self/stat"],
        timeout_s=10,
        output_max_bytes=4096,
        preexec=stackread.child_setup([str(procs)], 1 << 30),
    )
    assert error == "" and out is not None
    assert procs.read_text() == "0\n"
    # Niced to 19 (field 19 of /proc/self/stat) and bounded in address space.
    assert out.rsplit(b")", 1)[1].split()[16] == b"19"


def test_the_cgroup_files_of_a_process_are_those_the_kernel_names(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "7"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(
        "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"
        "4:cpu,cpuacct:/slurm/uid_1000/job_42/step_0\n"
        "2:name=systemd:/x\n"
        "1:memory:/../../etc\n"
    )
    files = stackread.cgroup_procs_files(7, str(tmp_path / "proc"), "/sys/fs/cgroup")
    assert files == [
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/user/task_0/cgroup.procs",
        "/sys/fs/cgroup/cpu,cpuacct/slurm/uid_1000/job_42/step_0/cgroup.procs",
        "/sys/fs/cgroup/systemd/x/cgroup.procs",
    ]


@pytest.mark.skipif(not AS_ROOT, reason="setpriv is used only by a root sampler")
def test_without_setpriv_nothing_is_read_and_never_as_root(workdir: Path) -> None:
    proc = start(workdir, "sleeper")
    try:
        cg = job_cgroup(workdir, [proc.pid])
        opts = StackOptions(
            uid=JOB_UID,
            first_burst_s=0.0,
            samples_per_burst=2,
            py_spy=PY_SPY,
            setpriv=str(workdir / "no-setpriv"),
            charge_to_job=False,
        )
        sampler = StackSampler(opts, load_table(), lambda: cg, started_s=time.time())
        sampler.burst(time.time(), None, pause, time.time)
    finally:
        stop([proc.pid], proc)
    summary = sampler.summary()
    assert summary.samples == 0 and "reader_missing" in summary.notes
