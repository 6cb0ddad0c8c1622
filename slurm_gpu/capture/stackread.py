"""Reading one stack of one of the job's Python processes with py-spy, with least privilege.

Which processes: those listed in the job's own cgroup (``cgroup.procs`` of its directory and
every directory below it), running as the job's uid (never root's: slurmstepd sits in the
job's cgroup too) with a Python interpreter as their executable. Never found by environment
variable. A pid is checked again after its dump (still in the job's cgroup, same start
time), so a pid reused by another process between the listing and the read is discarded.

How: ``py-spy dump --pid PID --json --nonblocking`` (the job is never paused), started by
the root sampler through ``setpriv`` as the job's uid and gid with no supplementary groups,
no new privileges, and at most ``CAP_SYS_PTRACE`` in its bounding, inheritable and ambient
sets (only where Yama's ``ptrace_scope`` demands it, unless configured otherwise). Before
exec, the child joins the cgroup of the process it reads (the job's limits and accounting
carry it), lowers its priority and takes ``RLIMIT_AS``. Its output is read up to a byte
bound and a deadline, then it is killed. Nothing here runs py-spy as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurm_gpu.capture.spoolpaths import read_small
from slurm_gpu.capture.stackclass import Frame

#: Most cgroup directories walked to list the job's processes.
MAX_CGROUP_DIRS = 1024
#: Most pids taken from the job's cgroup per listing.
MAX_LISTED_PIDS = 4096
#: Most frames kept of one stack (innermost first).
MAX_FRAMES = 256
#: Bytes of the reader's standard error kept to tell why it failed.
STDERR_MAX_BYTES = 4096

_PYTHON_EXE = re.compile(r"^python[0-9.]*$")


@dataclass(frozen=True, slots=True)
class JobProcess:
    """One process of the job's cgroup, as /proc says (the kernel's, not the user's word)."""

    pid: int
    ppid: int
    uid: int
    gid: int
    start: int
    """Start time, clock ticks since boot: with the pid, what tells a reused pid apart."""
    python: bool
    """Its executable's name is ``python``, ``python3``, ``python3.11``..."""


@dataclass(frozen=True, slots=True)
class Stack:
    """The main thread's stack of one process (innermost frame first)."""

    pid: int
    frames: tuple[Frame, ...]
    active: bool | None
    """Whether py-spy saw the thread running (``False``: blocked in the kernel)."""


@dataclass(frozen=True, slots=True)
class DumpResult:
    """One reader run: the stack, or why there is none."""

    stack: Stack | None
    error: str = ""
    """``timeout``, ``too_large``, ``permission_denied``, ``not_python``, ``failed``,
    ``unparsable``, ``reader_missing``; empty on success."""
    cpu_s: float = 0.0
    """CPU seconds the reader used (user + system)."""


def list_job_pids(cgroup_dir: str) -> list[int]:
    """Every pid in ``cgroup_dir`` and the directories below it (bounded), sorted."""
    pids: set[int] = set()
    dirs = 0
    for root, subdirs, files in os.walk(cgroup_dir, followlinks=False):
        dirs += 1
        if dirs > MAX_CGROUP_DIRS:
            subdirs[:] = []
            break
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(root, "cgroup.procs"), "rb") as fh:
                text = fh.read(65536)
        except OSError:
            continue
        for token in text.split():
            if token.isdigit() and len(pids) < MAX_LISTED_PIDS:
                pids.add(int(token))
    return sorted(pids)


def job_process(pid: int, proc_root: str = "/proc") -> JobProcess | None:
    """What /proc says of ``pid``; ``None`` once it is gone."""
    stat = read_small(f"{proc_root}/{pid}/stat", 8192)
    status = read_small(f"{proc_root}/{pid}/status", 8192)
    if stat is None or status is None:
        return None
    end = stat.rfind(b")")
    fields = stat[end + 2 :].split()
    uid = gid = None
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            uid = int(line.split()[1])
        elif line.startswith(b"Gid:"):
            gid = int(line.split()[1])
    try:
        ppid, start = int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None
    if uid is None or gid is None:
        return None
    try:
        exe = os.path.basename(os.readlink(f"{proc_root}/{pid}/exe"))
    except OSError:
        exe = ""
    return JobProcess(pid, ppid, uid, gid, start, bool(_PYTHON_EXE.match(exe)))


def ptrace_scope(path: str = "/proc/sys/kernel/yama/ptrace_scope") -> int:
    """Yama's ptrace_scope (0 without Yama): 1 or 2 need CAP_SYS_PTRACE, 3 forbids all."""
    text = read_small(path, 16)
    try:
        return int(text.strip()) if text else 0
    except ValueError:
        return 0


def default_reader_path() -> str:
    """``py-spy`` beside the interpreter that runs the sampler (the venv's ``bin``)."""
    return os.path.join(os.path.dirname(sys.executable), "py-spy")


def reader_argv(
    py_spy: str,
    target: JobProcess,
    *,
    setpriv: str,
    with_ptrace: bool,
    as_root: bool,
) -> list[str]:
    """The command that reads ``target``'s stack: through ``setpriv`` as the job's uid and gid
    with only ``CAP_SYS_PTRACE`` (or no capability) when the caller is root; as is otherwise
    (a caller that is not root has no privilege to drop)."""
    dump = [py_spy, "dump", "--pid", str(target.pid), "--json", "--nonblocking"]
    if not as_root:
        return dump
    caps = "-all,+sys_ptrace" if with_ptrace else "-all"
    return [
        setpriv,
        f"--reuid={target.uid}",
        f"--regid={target.gid}",
        "--clear-groups",
        f"--inh-caps={caps}",
        f"--ambient-caps={caps}",
        f"--bounding-set={caps}",
        "--no-new-privs",
        "--",
        *dump,
    ]


def cgroup_procs_files(
    pid: int, proc_root: str = "/proc", root: str = "/sys/fs/cgroup"
) -> list[str]:
    """The ``cgroup.procs`` files of ``pid``'s own cgroups (v2 line, or each v1 hierarchy)."""
    text = read_small(f"{proc_root}/{pid}/cgroup", 65536)
    out = []
    for line in (text or b"").decode("ascii", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/") or ".." in parts[2]:
            continue
        if parts[1] == "":
            base = root
        else:
            name = parts[1].split(",")[0]
            base = os.path.join(
                root, name[len("name=") :] if name.startswith("name=") else parts[1]
            )
        out.append(os.path.join(base, parts[2].lstrip("/"), "cgroup.procs"))
    return out


def child_setup(procs_files: Sequence[str], memory_max_bytes: int) -> Callable[[], None]:
    """What the reader's child does before exec (as root still): join the read process's
    cgroups, lower its priority, bound its address space."""

    def setup() -> None:
        for path in procs_files:
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"0\n")  # "0": the writing process itself
                finally:
                    os.close(fd)
        os.nice(19)
        resource.setrlimit(resource.RLIMIT_AS, (memory_max_bytes, memory_max_bytes))

    return setup


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_reader(
    argv: Sequence[str],
    *,
    timeout_s: float,
    output_max_bytes: int,
    preexec: Callable[[], None] | None,
) -> tuple[bytes | None, bytes, str, float]:
    """Run the reader: (stdout or ``None``, stderr head, error, CPU seconds). The output is
    read up to ``output_max_bytes`` and ``timeout_s``; past either the reader is killed."""
    before = _children_cpu_s()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            preexec_fn=preexec,  # runs in the child before exec
        )
    except OSError:
        return None, b"", "reader_missing", 0.0
    assert proc.stdout is not None and proc.stderr is not None
    out: list[bytes] = []
    err: list[bytes] = []
    size = 0
    error = ""
    deadline = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    open_streams = 2
    while open_streams:
        left = deadline - time.monotonic()
        if left <= 0:
            error = "timeout"
            break
        for key, _ in sel.select(left):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            if key.data is out:
                size += len(chunk)
                if size > output_max_bytes:
                    error = "too_large"
                    break
                out.append(chunk)
            elif sum(map(len, err)) < STDERR_MAX_BYTES:
                err.append(chunk)
        if error:
            break
    sel.close()
    if error:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGKILL)
    proc.stdout.close()
    proc.stderr.close()
    code = proc.wait()
    cpu = max(0.0, _children_cpu_s() - before)
    stderr = b"".join(err)[:STDERR_MAX_BYTES]
    if not error and code != 0:
        low = stderr.lower()
        if b"permission denied" in low or b"operation not permitted" in low:
            error = "permission_denied"
        elif b"python" in low and (b"failed to find" in low or b"version" in low):
            error = "not_python"
        else:
            error = "failed"
    return (None if error else b"".join(out)), stderr, error, cpu


def parse_dump(data: bytes, pid: int) -> Stack | None:
    """The main thread's stack from ``py-spy dump --json`` output; ``None`` if unusable. Only
    the file and function of each frame are taken."""
    try:
        threads = json.loads(data)
    except ValueError:
        return None
    if not isinstance(threads, list) or not threads:
        return None
    chosen = None
    for thread in threads:
        if isinstance(thread, dict) and thread.get("os_thread_id") == pid:
            chosen = thread
            break
    if chosen is None:
        chosen = threads[0] if isinstance(threads[0], dict) else None
    if chosen is None or not isinstance(chosen.get("frames"), list):
        return None
    frames = []
    for f in chosen["frames"][:MAX_FRAMES]:
        if not isinstance(f, dict):
            continue
        file, name = f.get("filename"), f.get("name")
        if isinstance(file, str) and isinstance(name, str):
            frames.append(Frame(file[:1024], name[:256]))
    active = chosen.get("active")
    return Stack(pid, tuple(frames), active if isinstance(active, bool) else None)
