"""Spool paths and the small files the epilog needs on its normal path.

``JobSpool`` names one job's files on one host; ``write_atomic`` writes any of them; the pid
file identifies the sampler by pid and start time. Kept apart from ``slurm_gpu.spool`` (which
re-exports everything here) so that the epilog, which runs between two jobs while slurmd
waits, does not import the record types and codecs unless it must recover a record.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from slurm_gpu.errors import SpoolFormatError

JOB_DIR_MODE = 0o711
FILE_MODE = 0o600
LIVE_MODE = 0o400

_JOB_ID_RE = re.compile(r"^[0-9]+$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

_JOB_ID_RE = re.compile(r"^[0-9]+$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

#: ``<spool_dir>/owners/<uuid>.json``: which job and uid hold each GPU right now.
OWNERS_DIR = "owners"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,:+-]")


def owner_file(spool_dir: str, uuid: str) -> str:
    """The ownership file of one GPU (the UUID made safe as a file name)."""
    name = _UNSAFE.sub("?", uuid)[:128] or "-"
    return os.path.join(spool_dir, OWNERS_DIR, f"{name}.json")


def check_job_id(job_id: str) -> str:
    """A raw Slurm job id (digits only), so it is safe as a directory name."""
    if not _JOB_ID_RE.match(job_id):
        raise SpoolFormatError(
            f"not a raw Slurm job id: {job_id!r}", hint="use JobIDRaw, digits only"
        )
    return job_id


def check_hostname(hostname: str) -> str:
    if not _HOST_RE.match(hostname) or ".." in hostname:
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
    def live(self) -> str:
        return self._file(".live.json")

    def create_dir(self) -> None:
        """Create ``<spool_dir>`` and the job dir, both 0711 and root-owned.

        0711 (traversable, not listable) lets a job's owner open the one file meant for them,
        ``<host>.live.json``, without seeing which other jobs exist; everything else is 0600.
        """
        if not os.path.isdir(self.spool_dir):
            os.makedirs(self.spool_dir, mode=JOB_DIR_MODE, exist_ok=True)
            os.chmod(self.spool_dir, JOB_DIR_MODE)  # makedirs' mode is filtered by the umask
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.job_dir, JOB_DIR_MODE)
        os.chmod(self.job_dir, JOB_DIR_MODE)


# --------------------------------------------------------------------------- atomic files


def write_atomic(path: str, data: bytes, *, mode: int = FILE_MODE, uid: int | None = None) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory, fsync, rename.

    Readers see the old file or the new one, never a part. ``uid`` chowns the file (root only).
    Raises ``OSError``.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            _write_all(fd, data)
            if uid is not None:
                os.fchown(fd, uid, -1)
            os.fchmod(fd, mode)
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


# --------------------------------------------------------------------------- pid file


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
