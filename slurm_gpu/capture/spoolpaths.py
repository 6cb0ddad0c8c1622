"""Spool paths and the small files the epilog needs on its normal path.

``JobSpool`` names one job's files on one host; ``write_atomic`` writes any of them; the pid
file identifies the sampler by pid and start time. Kept apart from ``capture.spool`` (which
re-exports everything here) so that the epilog, which runs between two jobs while slurmd
waits, does not import the record types and codecs unless it must recover a record.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from dataclasses import dataclass

from slurm_gpu.errors import SpoolFormatError

#: The spool root and every job directory in it: root's alone. Nothing in the spool is meant
#: for users (their live summary is in the live directory, ``live_dir_of``), so other accounts
#: can neither list nor stat what is there.
JOB_DIR_MODE = 0o700
SPOOL_ROOT_MODE = 0o700
FILE_MODE = 0o600
#: The live summary: root's, readable by the job user's private group (``LIVE_GROUP_MODE``)
#: or, when the user has no private group, by root only.
LIVE_MODE = 0o400
LIVE_GROUP_MODE = 0o440
#: The live directory's root: traversable, not listable. A job's live directory in it is
#: ``LIVE_JOB_DIR_GROUP_MODE`` with the private group, else ``JOB_DIR_MODE``.
LIVE_ROOT_MODE = 0o711
LIVE_JOB_DIR_GROUP_MODE = 0o750
#: Largest live summary written or read, bytes (a 16-GPU summary is about 7 KB).
LIVE_MAX_BYTES = 64 * 1024
#: What follows the spool directory's name to name the live directory beside it.
LIVE_DIR_SUFFIX = "-live"

_JOB_ID_RE = re.compile(r"[0-9]+")
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: ``<spool_dir>/owners/<uuid>.json``: which job and uid hold each GPU right now.
OWNERS_DIR = "owners"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,:+-]")


def owner_file(spool_dir: str, uuid: str) -> str:
    """The ownership file of one GPU (the UUID made safe as a file name)."""
    name = _UNSAFE.sub("?", uuid)[:128] or "-"
    return os.path.join(spool_dir, OWNERS_DIR, f"{name}.json")


def check_job_id(job_id: str) -> str:
    """A raw Slurm job id (digits only), so it is safe as a directory name."""
    if not _JOB_ID_RE.fullmatch(job_id):
        raise SpoolFormatError(
            f"not a raw Slurm job id: {job_id!r}", hint="use JobIDRaw, digits only"
        )
    return job_id


def check_hostname(hostname: str) -> str:
    if not _HOST_RE.fullmatch(hostname) or ".." in hostname:
        raise SpoolFormatError(f"unusable host name: {hostname!r}")
    return hostname


@dataclass(frozen=True, slots=True)
class JobSpool:
    """Paths of one job's spool files on one host."""

    spool_dir: str
    job_id: str
    hostname: str

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        check_hostname(self.hostname)

    @property
    def job_dir(self) -> str:
        return os.path.join(self.spool_dir, self.job_id)

    def _file(self, suffix: str) -> str:
        return os.path.join(self.job_dir, f"{self.hostname}{suffix}")

    @property
    def jsonl(self) -> str:
        return self._file(".jsonl")

    @property
    def pid(self) -> str:
        return self._file(".pid")

    @property
    def state(self) -> str:
        return self._file(".state")

    @property
    def record(self) -> str:
        return self._file(".record")

    @property
    def live_job_dir(self) -> str:
        """The job's directory in the live directory (``live_dir_of``)."""
        return os.path.join(live_dir_of(self.spool_dir), self.job_id)

    @property
    def live(self) -> str:
        """``<live_dir>/<job_id>/<host>.json``: the live summary ``gpueff`` reads."""
        return os.path.join(self.live_job_dir, f"{self.hostname}.json")

    def create_dir(self) -> None:
        """Create ``<spool_dir>`` and the job dir, both 0700 and root-owned.

        An existing spool root that is more open (0711 before this release) is tightened: no
        file in it is meant for another account. Raises ``OSError`` (``EPERM`` when a
        directory is another account's).
        """
        ensure_root_dir(self.spool_dir, SPOOL_ROOT_MODE)
        ensure_dir_at(self.spool_dir, self.job_id, JOB_DIR_MODE)

    def create_live_dir(self, gid: int | None) -> None:
        """Create the live root (0711) and the job's live directory: root-owned, group
        ``gid`` and 0750 when given (the job user's private group), else 0700."""
        root = live_dir_of(self.spool_dir)
        ensure_root_dir(root, LIVE_ROOT_MODE)
        if gid is None:
            ensure_dir_at(root, self.job_id, JOB_DIR_MODE)
        else:
            ensure_dir_at(root, self.job_id, LIVE_JOB_DIR_GROUP_MODE, gid=gid)

    def remove_live(self) -> None:
        """Remove this host's live summary and, once empty, the job's live directory (the
        epilog: ``gpueff`` reads the store for ended jobs). Names are removed relative to a
        directory opened without following links."""
        try:
            fd = os.open(self.live_job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            for name in os.listdir(fd):
                if name == f"{self.hostname}.json" or (
                    name.startswith(f".{self.hostname}.json.") and name.endswith(".tmp")
                ):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(self.live_job_dir)


def live_dir_of(spool_dir: str) -> str:
    """The live directory beside ``spool_dir`` (``/var/spool/slurm-gpu`` ->
    ``/var/spool/slurm-gpu-live``): apart from the spool, because users must reach their own
    summary there and nothing else."""
    return spool_dir.rstrip("/") + LIVE_DIR_SUFFIX


# --------------------------------------------------------------------------- directories


def _our_dir(fd: int, path: str, mode: int, gid: int | None) -> None:
    """Check that the open directory ``fd`` is ours, then set its mode (and group)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise PermissionError(errno.EPERM, "directory owned by another account", path)
    if gid is not None and st.st_gid != gid:
        os.fchown(fd, -1, gid)
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


def ensure_root_dir(path: str, mode: int) -> None:
    """Create ``path`` (and its parents) if missing and make it ``mode``; it must be owned
    by this account. The configured path itself may be a link an admin made."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=mode, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _our_dir(fd, path, mode, None)
    finally:
        os.close(fd)


def ensure_dir_at(parent: str, name: str, mode: int, *, gid: int | None = None) -> None:
    """Create ``parent/name`` if missing, never following a link there, and make it
    ``mode`` (and group ``gid``); it must be owned by this account."""
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=pfd)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=pfd)
        try:
            _our_dir(fd, os.path.join(parent, name), mode, gid)
        finally:
            os.close(fd)
    finally:
        os.close(pfd)


# --------------------------------------------------------------------------- atomic files


def write_atomic(
    path: str, data: bytes, *, mode: int = FILE_MODE, gid: int | None = None, sync: bool = True
) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory, fsync, rename.

    Readers see the old file or the new one, never a part. The file stays the writer's;
    ``gid`` sets its group (root only). ``sync=False`` leaves out the fsync, for a file
    that need not survive a crash of the machine (it only orders the data before the
    rename on disk; running readers never see a part either way). Raises ``OSError``.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            _write_all(fd, data)
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_all_at(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (``pwrite`` until done)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def read_bounded(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``fd``."""
    chunks = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- pid file


def read_small(path: str, limit: int = 65536) -> bytes | None:
    """A small /proc file in one ``os.read`` of at most ``limit`` bytes (the kernel generates
    it whole on the first read; no file object); ``None`` when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def process_start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22); with
    the pid it identifies a process even after the pid is reused. ``None`` if gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    end = text.rfind(b")")
    try:
        return int(text[end + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def write_pidfile(path: str, pid: int) -> None:
    """Write ``<pid> <start ticks>`` atomically, root 0600."""
    start = process_start_ticks(pid)
    write_atomic(path, f"{pid} {start if start is not None else '-'}\n".encode())


def read_pidfile(path: str) -> tuple[int, int | None] | None:
    """(pid, start ticks or None) from a pid file; ``None`` if missing or unparsable."""
    try:
        with open(path, encoding="ascii") as fh:
            parts = fh.read().split()
        pid = int(parts[0])
        start = int(parts[1]) if len(parts) > 1 and parts[1] != "-" else None
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    return (pid, start) if pid > 1 else None
