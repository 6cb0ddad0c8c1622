"""Job host sampling: the job's CPU time, resident memory and I/O on this node over time.

Three methods, probed in this order and recorded in every ``HostSample.method``:

``cgroup2``
    The job's cgroup v2 directory (Slurm 22.05+ puts it under
    ``system.slice/slurmstepd.scope/job_<id>``): ``cpu.stat`` usage, ``memory.stat`` anon
    (else ``memory.current``), ``io.stat``.
``cgroup1``
    ``cpuacct/slurm*/uid_<uid>/job_<id>/cpuacct.usage``, ``memory/.../memory.stat`` rss,
    ``blkio/.../blkio.throttle.io_service_bytes``.
``proc``
    When Slurm tracks processes without cgroups (``proctrack/linuxproc``): the job's
    processes, summing ``/proc/<pid>/stat`` and ``io``. A process is the job's when it runs as
    the job's uid and descends from a slurmstepd of this job (root's, ``slurmstepd:
    [<id>.<step>]``); its environment never decides (the job's owner can set ``SLURM_JOB_ID``
    on any process of theirs), and another user's process never is. Counters are kept
    monotonic when processes exit (see ``ProcHostSampler``).

A job's cgroup directory counts only when root (or the sampler's account) owns it: a user may
create cgroups in a subtree delegated to them. The /proc method is kept for the whole job only
once a process descending from the job's slurmstepd was seen; until then the cgroups are
probed again at every reading.

Nothing here raises for one unreadable file: a value that cannot be read is ``None``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from slurm_gpu.capture.spoolpaths import read_small
from slurm_gpu.records import HostSample

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_text(path: str) -> str | None:
    # os.open/os.read rather than open(): no buffered text wrapper for a file read once; this
    # runs for every job process at every reading. 64 KiB covers every /proc and cgroup file
    # read here in one read (they are generated whole on the first read).
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:
            chunks.append(os.read(fd, 65536))
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", errors="replace")


def _kv_file(path: str) -> dict[str, int]:
    """Parse ``key value`` lines (cpu.stat, memory.stat) into ints; empty if unreadable."""
    text = _read_text(path)
    out: dict[str, int] = {}
    if text is None:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def _int_file(path: str) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def count_cpu_list(text: str) -> int | None:
    """Number of CPUs in a Linux CPU list such as ``0-3,8,10-11``; ``None`` if unparsable."""
    total = 0
    text = text.strip()
    if not text:
        return None
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                total += int(hi) - int(lo) + 1
            else:
                int(part)
                total += 1
    except ValueError:
        return None
    return total or None


# --------------------------------------------------------------------------- cgroup v2


def parse_io_stat_v2(text: str) -> tuple[int, int]:
    """Sum ``rbytes``/``wbytes`` over devices of a cgroup v2 ``io.stat``."""
    read = write = 0
    for line in text.splitlines():
        for token in line.split()[1:]:
            key, _, value = token.partition("=")
            if key == "rbytes":
                read += int(value)
            elif key == "wbytes":
                write += int(value)
    return read, write


def parse_blkio_v1(text: str) -> tuple[int, int]:
    """Sum Read/Write bytes over devices of a cgroup v1 ``blkio.throttle.io_service_bytes``."""
    read = write = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            if parts[1] == "Read":
                read += int(parts[2])
            elif parts[1] == "Write":
                write += int(parts[2])
    return read, write


def find_cgroup2_dir(cgroup_root: str, job_id: str, sluid: str | None = None) -> str | None:
    """The job's cgroup v2 directory, or ``None`` (also when the root is cgroup v1).

    Slurm names it ``job_<id>``, and from 26.05 by the job's SLUID alone (``sBR1JB8J1YM400``)
    unless cgroup.conf sets ``CgroupJobIdPaths=yes``; ``sluid`` (already checked to have a
    SLUID's form) is looked for too."""
    if not os.path.exists(os.path.join(cgroup_root, "cgroup.controllers")):
        return None
    names = [f"job_{job_id}"] + ([sluid] if sluid else [])
    scope = os.path.join(cgroup_root, "system.slice", "slurmstepd.scope")
    candidates = [os.path.join(scope, name) for name in names]
    # Sites running several slurmd per host, or a non-systemd slurmd, use other parents.
    for name in names:
        candidates += sorted(glob.glob(os.path.join(cgroup_root, "*", "*", name)))
        candidates += sorted(glob.glob(os.path.join(cgroup_root, "*", name)))
    for path in candidates:
        if os.path.isdir(path) and _trusted_dir(path):
            return path
    return None


def _trusted_dir(path: str) -> bool:
    """Whether root (or this account) owns ``path``: Slurm's job cgroups are root's, while a
    user may create cgroups named ``job_<id>`` in a subtree delegated to them."""
    try:
        return os.stat(path).st_uid in (0, os.geteuid())
    except OSError:
        return False


def find_cgroup1_dirs(cgroup_root: str, job_id: str, uid: int | None) -> dict[str, str] | None:
    """Controller -> job directory for cgroup v1 (``cpuacct`` required), or ``None``."""
    uid_part = f"uid_{uid}" if uid is not None else "uid_*"
    found: dict[str, str] = {}
    for controller in ("cpuacct", "memory", "blkio", "cpuset"):
        base = os.path.join(cgroup_root, controller)
        if not os.path.isdir(base) and controller == "cpuacct":
            base = os.path.join(cgroup_root, "cpu,cpuacct")
        matches = sorted(glob.glob(os.path.join(base, "slurm*", uid_part, f"job_{job_id}")))
        matches = [m for m in matches if _trusted_dir(m)]
        if matches:
            found[controller] = matches[0]
        elif controller == "cpuacct":
            # Required: without it the others are not looked for (the sampler probes at
            # every reading until the job's cgroup or process shows up).
            return None
    return found


class Cgroup2HostSampler:
    """Reads one job's cgroup v2 directory."""

    method = "cgroup2"

    def __init__(self, job_dir: str) -> None:
        self.job_dir = job_dir

    def _path(self, name: str) -> str:
        return os.path.join(self.job_dir, name)

    def sample(self, now_s: float | None = None) -> HostSample:
        now = time.time() if now_s is None else now_s
        cpu = _kv_file(self._path("cpu.stat")).get("usage_usec")
        mem_stat = _kv_file(self._path("memory.stat"))
        rss: int | None = mem_stat.get("anon")
        if rss is None:
            rss = _int_file(self._path("memory.current"))
        io_text = _read_text(self._path("io.stat"))
        io_r, io_w = parse_io_stat_v2(io_text) if io_text is not None else (None, None)
        return HostSample(
            time_s=now,
            cpu_time_s=cpu / 1e6 if cpu is not None else None,
            rss_bytes=rss,
            io_read_bytes=io_r,
            io_write_bytes=io_w,
            process_count=_int_file(self._path("pids.current")),
            method=self.method,
        )

    def allocated_cores(self) -> int | None:
        text = _read_text(self._path("cpuset.cpus.effective"))
        return count_cpu_list(text) if text else None

    def job_gone(self) -> bool:
        """Whether Slurm has removed the job's cgroup: the job has ended on this node."""
        return not os.path.isdir(self.job_dir)

    def close(self) -> None:
        """Nothing is kept open."""


class Cgroup1HostSampler:
    """Reads one job's cgroup v1 directories (one per controller)."""

    method = "cgroup1"

    def __init__(self, dirs: dict[str, str]) -> None:
        self.dirs = dirs

    def sample(self, now_s: float | None = None) -> HostSample:
        now = time.time() if now_s is None else now_s
        usage_ns = _int_file(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))
        rss: int | None = None
        if "memory" in self.dirs:
            stat = _kv_file(os.path.join(self.dirs["memory"], "memory.stat"))
            # total_rss is hierarchical (covers the step sub-cgroups); rss is this level only.
            rss = stat.get("total_rss", stat.get("rss"))
        io_r = io_w = None
        if "blkio" in self.dirs:
            for name in (
                "blkio.throttle.io_service_bytes_recursive",
                "blkio.throttle.io_service_bytes",
            ):
                text = _read_text(os.path.join(self.dirs["blkio"], name))
                if text is not None:
                    io_r, io_w = parse_blkio_v1(text)
                    break
        procs = 0
        for _dirpath, _dirs, files in os.walk(self.dirs["cpuacct"]):
            if "tasks" in files:
                text = _read_text(os.path.join(_dirpath, "tasks"))
                procs += len(text.split()) if text else 0
        return HostSample(
            time_s=now,
            cpu_time_s=usage_ns / 1e9 if usage_ns is not None else None,
            rss_bytes=rss,
            io_read_bytes=io_r,
            io_write_bytes=io_w,
            process_count=procs,
            method=self.method,
        )

    def allocated_cores(self) -> int | None:
        if "cpuset" not in self.dirs:
            return None
        text = _read_text(os.path.join(self.dirs["cpuset"], "cpuset.cpus"))
        return count_cpu_list(text) if text else None

    def job_gone(self) -> bool:
        """Whether Slurm has removed the job's cgroup: the job has ended on this node."""
        return not os.path.isdir(self.dirs["cpuacct"])

    def close(self) -> None:
        """Nothing is kept open."""


# --------------------------------------------------------------------------- /proc


#: Job processes whose ``stat`` and ``io`` are kept open between readings (two descriptors
#: each); processes beyond it are read by path, which costs two more system calls per file.
MAX_KEPT_PROCESSES = 256


def _pread(fd: int) -> bytes | None:
    """Re-read a kept /proc file from offset 0 (procfs regenerates it); ``None`` once the
    process has been reaped (ESRCH) or on any other error."""
    try:
        return os.pread(fd, 65536, 0) or None
    except OSError:
        return None


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


@dataclass(slots=True)
class _ProcState:
    """What the proc sampler remembers about one job process between readings."""

    start: int
    """Start time in clock ticks: with the pid, what tells a process from a reused pid."""
    ppid: int
    cpu_s: float
    """Own + reaped children's user+system time at the last reading, seconds."""
    io_read: int
    io_write: int
    stat_fd: int = -1
    """``/proc/<pid>/stat`` kept open (-1: read by path). A descriptor stays bound to its
    process: once that is reaped it reads ESRCH, even if the pid is reused."""
    io_fd: int = -1


#: Most new processes whose membership is decided in one reading (one look at their
#: ancestry each); the others wait for the next reading. Bounds the work a
#: user can cause by creating processes.
MAX_NEW_PIDS_PER_READING = 256
#: Most ancestors looked at to find the job's slurmstepd above a process.
MAX_ANCESTRY_DEPTH = 64
_STEPD_COMM = b"slurmstepd"


def _comm_and_ppid(text: bytes) -> tuple[bytes, int] | None:
    """(command name, ppid) from /proc/pid/stat."""
    start = text.find(b"(")
    end = text.rfind(b")")
    if start < 0 or end < start:
        return None
    fields = text[end + 2 :].split(None, 2)
    try:
        return text[start + 1 : end], int(fields[1])
    except (ValueError, IndexError):
        return None


def _parse_stat(text: bytes) -> tuple[int, int, float, float, bytes, int] | None:
    """(ppid, starttime ticks, own cpu s, reaped children's cpu s, state, rss pages) from
    /proc/pid/stat."""
    # The command name is in parentheses and may hold spaces or ')'; split after the last ')'.
    end = text.rfind(b")")
    if end < 0:
        return None
    fields = text[end + 2 :].split(None, 22)  # up to rss; the rest left unsplit
    if len(fields) < 22:
        return None
    try:
        state = fields[0]
        ppid = int(fields[1])
        own = (int(fields[11]) + int(fields[12])) / _CLK_TCK
        children = (int(fields[13]) + int(fields[14])) / _CLK_TCK
        start = int(fields[19])
        rss_pages = int(fields[21])
    except ValueError:
        return None
    return ppid, start, own, children, state, rss_pages


def _parse_proc_io(text: bytes) -> tuple[int, int]:
    # "rchar: N\nwchar: N\n...read_bytes: N\nwrite_bytes: N\n...": one split, two lookups.
    tokens = text.split()
    try:
        read = int(tokens[tokens.index(b"read_bytes:") + 1])
    except (ValueError, IndexError):
        read = 0
    try:
        write = int(tokens[tokens.index(b"write_bytes:") + 1])
    except (ValueError, IndexError):
        write = 0
    return read, write


class ProcHostSampler:
    """Sums the job's processes from /proc, keeping counters monotonic.

    A process belongs to the job when it runs as the job's ``uid`` (any uid when ``uid`` is
    None) and descends from a slurmstepd of this job: its parents, followed through
    ``/proc/<pid>/stat``, reach a root-owned ``slurmstepd`` whose command line is
    ``slurmstepd: [<id>.<step>]``. The environment is never read: the job's owner can start a
    process outside the job with ``SLURM_JOB_ID=<id>`` and make an idle job look busy. A
    process seen under the slurmstepd stays the job's when it is later re-parented (a daemon
    started by the job); one that detached before the first look is not counted.
    ``verified`` tells whether a job process was seen. At most
    ``MAX_NEW_PIDS_PER_READING`` new processes are looked at per reading. Processes are
    keyed by (pid, start time) so that a reused pid is a new process.

    Why the bookkeeping: ``/proc/<pid>/stat`` shows a process's own CPU time and, in
    cutime/cstime, that of the children it has reaped. Summing own+children over live job
    processes counts everything once, as long as a process that exits is reaped by a live job
    process (its time then moves into the parent's counters). When it is reaped by someone
    outside the job (slurmstepd, init), its last seen value is kept in ``_exited``. The same holds
    for ``/proc/<pid>/io``, which also includes reaped children.

    On the real ``/proc`` the job's ``stat`` and ``io`` files and ``/proc/loadavg`` stay open
    and are re-read with one ``pread`` each (instead of open, read, close); ``close`` releases
    them.
    """

    method = "proc"

    def __init__(
        self,
        job_id: str,
        uid: int | None = None,
        proc_root: str = "/proc",
        *,
        exclude_pids: frozenset[int] = frozenset(),
    ) -> None:
        self.job_id = job_id
        self.uid = uid
        self.proc_root = proc_root
        self._stepd_prefixes = (
            f"slurmstepd: [{job_id}.".encode(),
            f"slurmstepd: [{job_id}]".encode(),
        )
        # pid -> (start ticks, whether it descends from this job's slurmstepd): what the
        # ancestry walk learnt, kept while the pid is listed.
        self._ancestry: dict[int, tuple[int, bool]] = {}
        self._deferred = False
        self.verified = False
        """Whether a process descending from this job's slurmstepd has been seen."""
        self._exclude = exclude_pids | {os.getpid()}
        # pid -> the process tracked under that pid (its start time inside).
        self._tracked: dict[int, _ProcState] = {}
        # pid -> (start ticks, whether it belongs to the job, whether that is final);
        # membership is decided on two looks per process (slurmstepd forks, then sets the
        # job's uid and execs).
        self._membership: dict[int, tuple[int | None, bool, bool]] = {}
        # /proc entry names settled as not the job's (and non-pid entries such as "self").
        self._skip: set[str] = set()
        self._exited_cpu_s = 0.0
        self._exited_io_read = 0
        self._exited_io_write = 0
        self._last_cpu_s = 0.0
        self._last_io = (0, 0)
        self._last_pid: int | None = None
        # The last pid the kernel handed out when /proc was last listed (``/proc/loadavg``);
        # ``None`` when unknown. See ``sample``.
        self._last_created: bytes | None = None
        # Files are kept open only on procfs, which regenerates them at every read from offset
        # 0 and fails them once the process is gone (a regular file would not).
        self._keep = os.path.realpath(proc_root) == "/proc"
        self._kept = 0
        self._loadavg_fd = -1
        self.full_scans = 0
        """Readings that listed /proc (the others only re-read the known job processes)."""

    def close(self) -> None:
        """Close the files kept open between readings (the sampler goes on reading by path)."""
        for st in self._tracked.values():
            _close(st.stat_fd)
            _close(st.io_fd)
            st.stat_fd = st.io_fd = -1
        self._kept = 0
        _close(self._loadavg_fd)
        self._loadavg_fd = -1
        self._keep = False

    def _last_created_pid(self) -> bytes | None:
        """The last field of ``/proc/loadavg``: the most recently allocated pid."""
        text = None
        if self._loadavg_fd >= 0:
            text = _pread(self._loadavg_fd)
        if text is None:
            _close(self._loadavg_fd)
            self._loadavg_fd = -1
            path = f"{self.proc_root}/loadavg"
            if self._keep:
                with contextlib.suppress(OSError):
                    self._loadavg_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    text = _pread(self._loadavg_fd)
            else:
                text = read_small(path)
            if text is None:
                return None
        last = text.rsplit(None, 1)[-1] if text.strip() else b""
        return last if last.isdigit() else None

    def _is_job_stepd(self, pid: int) -> bool:
        """Whether ``pid`` (named ``slurmstepd``) is a slurmstepd of this job: root's, with the
        job id in its command line (a user cannot give a root process a name). The sampler's
        own account counts as root, as in ``slurm_gpu.trust``: the sampler runs as root."""
        path = f"{self.proc_root}/{pid}"
        try:
            if os.stat(path).st_uid not in (0, os.geteuid()):
                return False
        except OSError:
            return False
        cmdline = read_small(f"{path}/cmdline", 4096)
        return cmdline is not None and cmdline.startswith(self._stepd_prefixes)

    def _descends_from_stepd(self, ppid: int) -> bool:
        """Whether the process whose parent is ``ppid`` descends from this job's slurmstepd."""
        walked: list[tuple[int, int]] = []
        found = False
        pid = ppid
        for _ in range(MAX_ANCESTRY_DEPTH):
            if pid <= 1:
                break
            text = read_small(f"{self.proc_root}/{pid}/stat")
            parsed = _parse_stat(text) if text else None
            named = _comm_and_ppid(text) if text else None
            if parsed is None or named is None:
                break
            start = parsed[1]
            known = self._ancestry.get(pid)
            if known is not None and known[0] == start:
                found = known[1]
                break
            walked.append((pid, start))
            if named[0] == _STEPD_COMM:
                # The first slurmstepd above decides: one of another job is not ours.
                found = self._is_job_stepd(pid)
                break
            pid = named[1]
        for p, start in walked:
            self._ancestry[p] = (start, found)
        return found

    def _is_job_process(self, pid: int, ppid: int) -> bool:
        path = f"{self.proc_root}/{pid}"
        if self.uid is not None:
            try:
                if os.stat(path).st_uid != self.uid:
                    return False  # never another user's process
            except OSError:
                return False
        if self._descends_from_stepd(ppid):
            self.verified = True
            return True
        return False  # never by environment: the owner sets SLURM_JOB_ID where they like

    def sample(self, now_s: float | None = None) -> HostSample:
        now = time.time() if now_s is None else now_s
        # No pid allocated since the last listing (the kernel's last pid is unchanged) and no
        # process waiting for its second look: no new process can have appeared, so only the
        # job's known processes are read. Allocating any pid (fork, clone, a thread) changes
        # it; a process that only execs keeps its pid, which is why a pending second look
        # forces a listing. (Equal only after exactly pid_max allocations in one interval.)
        created = self._last_created_pid()
        if (
            created is not None
            and created == self._last_created
            and not self._deferred
            and not any(not m[1] and not m[2] for m in self._membership.values())
        ):
            return self._read(now, list(self._tracked))
        self.full_scans += 1
        try:
            present = set(os.listdir(self.proc_root))
        except OSError:
            present = set()
        # Read before listing: a pid allocated in between forces the next listing.
        self._last_created = created
        # Entries known not to be the job's are dropped in two set operations (in C), so a
        # reading costs about 0.1 us per /proc entry plus the job's own processes. A pid
        # that is gone leaves the set and is looked at afresh if it comes back. (A pid freed
        # and reused between two readings would be missed; with sequential pid allocation
        # that takes pid_max process creations within one interval.)
        self._skip &= present
        if self._ancestry:  # a few entries: looked up by name, not the whole listing by pid
            self._ancestry = {p: a for p, a in self._ancestry.items() if str(p) in present}
        pids = []
        for name in present - self._skip:
            if not name.isdigit() or int(name) in self._exclude:
                self._skip.add(name)
            else:
                pids.append(int(name))
        return self._read(now, pids)

    def _read(self, now: float, pids: list[int]) -> HostSample:
        root = self.proc_root
        tracked = self._tracked
        seen: dict[int, _ProcState] = {}
        rss_pages = 0
        membership: dict[int, tuple[int | None, bool, bool]] = {}
        examined = 0
        self._deferred = False
        for pid in pids:
            st = tracked.get(pid)
            known = self._membership.get(pid)
            if st is None and (known is None or not known[1]):
                # Its membership is to be decided: bounded per reading, the rest next time.
                if examined >= MAX_NEW_PIDS_PER_READING:
                    self._deferred = True
                    continue
                examined += 1
            stat_text = _pread(st.stat_fd) if st is not None and st.stat_fd >= 0 else None
            if stat_text is None:
                # Not kept open, or its process is gone (the pid may have a new process).
                stat_text = read_small(f"{root}/{pid}/stat")
            parsed = _parse_stat(stat_text) if stat_text else None
            if parsed is None:
                continue
            ppid, start, own, children, state, rss = parsed
            if known is None or known[0] != start:
                known = (start, self._is_job_process(pid, ppid), False)
            elif not known[1]:
                # Second look at a process first judged not the job's: slurmstepd forks, then
                # sets the job's uid and environment and execs, so a first look may have come
                # between.
                known = (start, self._is_job_process(pid, ppid), True)
                if not known[1]:
                    self._skip.add(str(pid))  # final: not read again while it is listed
                    continue
            membership[pid] = known
            if not known[1]:
                continue
            if st is not None and st.start == start:
                io_text = _pread(st.io_fd) if st.io_fd >= 0 else None
                if io_text is None:
                    io_text = read_small(f"{root}/{pid}/io")
                st.ppid = ppid
                st.cpu_s = own + children
            else:
                st = _ProcState(start, ppid, own + children, 0, 0)
                io_text = self._open_kept(st, pid)
            if io_text:
                st.io_read, st.io_write = _parse_proc_io(io_text)
            seen[pid] = st
            if state != b"Z":
                rss_pages += rss  # stat's rss field: the same resident pages as statm's
            self._last_pid = pid
        # Only pids listed now are kept, so the cache stays as small as the process table.
        self._membership = membership
        for pid, old in tracked.items():
            if seen.get(pid) is old:
                continue
            # Gone. If a live job process was its parent, the parent reaped it and now carries
            # its time in cutime/cstime; otherwise keep its last value ourselves.
            if old.ppid not in seen:
                self._exited_cpu_s += old.cpu_s
                self._exited_io_read += old.io_read
                self._exited_io_write += old.io_write
            if old.stat_fd >= 0:
                _close(old.stat_fd)
                _close(old.io_fd)
                self._kept -= 1
        self._tracked = seen
        cpu = self._exited_cpu_s
        io_r = self._exited_io_read
        io_w = self._exited_io_write
        for s in seen.values():
            cpu += s.cpu_s
            io_r += s.io_read
            io_w += s.io_write
        # The last seen value of a process reaped outside the job lags its final value by at
        # most one interval, and a reap by a parent can lag by a tick; never go backwards.
        cpu = max(cpu, self._last_cpu_s)
        io_r = max(io_r, self._last_io[0])
        io_w = max(io_w, self._last_io[1])
        self._last_cpu_s = cpu
        self._last_io = (io_r, io_w)
        return HostSample(
            time_s=now,
            cpu_time_s=cpu,
            rss_bytes=rss_pages * _PAGE_BYTES,
            io_read_bytes=io_r,
            io_write_bytes=io_w,
            process_count=len(seen),
            method=self.method,
        )

    def _open_kept(self, st: _ProcState, pid: int) -> bytes | None:
        """Open a new job process's ``stat`` and ``io`` to keep (when allowed and below
        ``MAX_KEPT_PROCESSES``); returns its ``io`` contents, read either way."""
        io_path = f"{self.proc_root}/{pid}/io"
        if not self._keep or self._kept >= MAX_KEPT_PROCESSES:
            return read_small(io_path)
        try:
            stat_fd = os.open(f"{self.proc_root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return read_small(io_path)
        try:
            io_fd = os.open(io_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(stat_fd)
            return read_small(io_path)
        # Opened after the stat read: if the pid was reused in between, the start time
        # read through the kept file differs and the next reading treats it as a new one.
        st.stat_fd, st.io_fd = stat_fd, io_fd
        self._kept += 1
        return _pread(io_fd)

    def allocated_cores(self) -> int | None:
        """CPUs a job process may run on (its affinity), once one has been seen."""
        if self._last_pid is None:
            return None
        text = _read_text(f"{self.proc_root}/{self._last_pid}/status")
        if not text:
            return None
        for line in text.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return count_cpu_list(line.split(":", 1)[1])
        return None


class NullHostSampler:
    """No way to see the job's processes: every reading is ``None`` with method ``none``."""

    method = "none"

    def sample(self, now_s: float | None = None) -> HostSample:
        return HostSample(
            time_s=time.time() if now_s is None else now_s,
            cpu_time_s=None,
            rss_bytes=None,
            io_read_bytes=None,
            io_write_bytes=None,
            process_count=None,
            method=self.method,
        )

    def allocated_cores(self) -> int | None:
        return None

    def close(self) -> None:
        """Nothing is kept open."""


CGROUP_GRACE_READINGS = 30
"""Readings (30 s at the default 1 s interval) that a job already seen in /proc under its
slurmstepd waits for its cgroup where Slurm keeps cgroups on the node."""


def slurm_cgroup_tree_exists(cgroup_root: str) -> bool:
    """Whether slurmd keeps job cgroups under ``cgroup_root``: a v2 ``slurmstepd.scope`` or a
    root-owned v1 ``<controller>/slurm*`` directory (``slurm_<node>`` with several slurmd per
    host)."""
    if os.path.isdir(os.path.join(cgroup_root, "system.slice", "slurmstepd.scope")):
        return True
    return any(_trusted_dir(d) for d in glob.glob(os.path.join(cgroup_root, "*", "slurm*")))


class AutoHostSampler:
    """Probes for the job's cgroup until the job shows up, then sticks to one method.

    The prolog starts the sampler before slurmstepd has created the job's cgroup (with
    ``PrologFlags=Alloc`` the prolog runs at allocation), so a single probe at start would fall
    back to /proc for good. Until a cgroup appears or /proc shows a process descending from
    the job's slurmstepd (``ProcHostSampler.verified``), every reading probes again. Where
    Slurm keeps a cgroup tree on the node, even a verified process pins /proc only after
    ``CGROUP_GRACE_READINGS`` readings without the job's cgroup (the readings meanwhile are
    /proc's).
    """

    def __init__(
        self,
        job_id: str,
        uid: int | None,
        *,
        cgroup_root: str = "/sys/fs/cgroup",
        proc_root: str = "/proc",
        methods: tuple[str, ...] = ("cgroup2", "cgroup1", "proc"),
        sluid: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.uid = uid
        self.sluid = sluid
        self.cgroup_root = cgroup_root
        self.methods = methods
        self._proc: ProcHostSampler | None = (
            ProcHostSampler(job_id, uid, proc_root)
            if "proc" in methods and os.path.isdir(proc_root)
            else None
        )
        self._chosen: Cgroup2HostSampler | Cgroup1HostSampler | ProcHostSampler | None = None
        self._verified_readings = 0

    @property
    def method(self) -> str:
        if self._chosen is not None:
            return self._chosen.method
        return "proc" if self._proc is not None else "none"

    def _probe_cgroups(self) -> Cgroup2HostSampler | Cgroup1HostSampler | None:
        if "cgroup2" in self.methods:
            found2 = find_cgroup2_dir(self.cgroup_root, self.job_id, self.sluid)
            if found2 is not None:
                return Cgroup2HostSampler(found2)
        if "cgroup1" in self.methods:
            found1 = find_cgroup1_dirs(self.cgroup_root, self.job_id, self.uid)
            if found1 is not None:
                return Cgroup1HostSampler(found1)
        return None

    def sample(self, now_s: float | None = None) -> HostSample:
        if self._chosen is not None:
            return self._chosen.sample(now_s)
        cgroup = self._probe_cgroups()
        if cgroup is not None:
            self._chosen = cgroup
            return cgroup.sample(now_s)
        if self._proc is None:
            return NullHostSampler().sample(now_s)
        reading = self._proc.sample(now_s)
        if reading.process_count and self._proc.verified:
            # Where Slurm keeps cgroups on this node, its tasks run under the job's slurmstepd
            # a moment before every controller has the job's directory (jobacct_gather/cgroup
            # makes cpuacct's once the tasks are forked; seen on Slurm 24.11): the cgroup is
            # awaited for a grace period before /proc is kept for the job.
            self._verified_readings += 1
            if (
                not slurm_cgroup_tree_exists(self.cgroup_root)
                or self._verified_readings > CGROUP_GRACE_READINGS
            ):
                self._chosen = self._proc
        return reading

    def allocated_cores(self) -> int | None:
        if self._chosen is not None:
            return self._chosen.allocated_cores()
        return None

    def cgroup_dir(self) -> str | None:
        """The job's cgroup directory once found (v2: the job's; v1: its ``cpuacct`` one),
        whose processes stack sampling may read; ``None`` with the /proc method or before."""
        chosen = self._chosen
        if isinstance(chosen, Cgroup2HostSampler):
            return chosen.job_dir
        if isinstance(chosen, Cgroup1HostSampler):
            return chosen.dirs["cpuacct"]
        return None

    def job_gone(self) -> bool:
        """Whether the job's cgroup, once found, has been removed (the job ended on this node);
        ``False`` with the /proc method, which cannot tell an ended job from a quiet one."""
        chosen = self._chosen
        return isinstance(chosen, Cgroup1HostSampler | Cgroup2HostSampler) and chosen.job_gone()

    def close(self) -> None:
        """Close what the /proc method keeps open."""
        if self._proc is not None:
            self._proc.close()


HostSampler = (
    Cgroup2HostSampler | Cgroup1HostSampler | ProcHostSampler | NullHostSampler | AutoHostSampler
)


def open_host_sampler(
    job_id: str,
    uid: int | None = None,
    *,
    cgroup_root: str = "/sys/fs/cgroup",
    proc_root: str = "/proc",
    methods: tuple[str, ...] = ("cgroup2", "cgroup1", "proc"),
    exists: Callable[[str], bool] = os.path.isdir,
) -> HostSampler:
    """Probe cgroup v2, then v1, then /proc for the job, and return the first that applies.

    The proc method always applies when /proc is readable; ``NullHostSampler`` is the last
    resort.
    """
    if "cgroup2" in methods:
        found2 = find_cgroup2_dir(cgroup_root, job_id)
        if found2 is not None:
            return Cgroup2HostSampler(found2)
    if "cgroup1" in methods:
        found1 = find_cgroup1_dirs(cgroup_root, job_id, uid)
        if found1 is not None:
            return Cgroup1HostSampler(found1)
    if "proc" in methods and exists(proc_root):
        return ProcHostSampler(job_id, uid, proc_root)
    return NullHostSampler()
