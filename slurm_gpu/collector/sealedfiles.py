"""Sealed records as the collector reads them: from the spool (or an inbox other accounts can
write) without following a link and bounded in size, or from the PostgreSQL inbox's rows.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from slurm_gpu.collector import safefs
from slurm_gpu.collector.ports import InboxRowLike, SealedLike
from slurm_gpu.errors import SpoolFormatError
from slurm_gpu.records import NodeRecord

log = logging.getLogger("slurm_gpu.collector")

#: Longest sealed record read (bytes): a 7-day, 8-GPU record at the most timeline points is far
#: below it; a file planted in an inbox cannot make root read without end.
MAX_RECORD_BYTES = 64 << 20
_JOB_ID = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True, slots=True)
class _InboxSealed:
    """A record of the PostgreSQL inbox in the collector's pass, in place of a file."""

    job_id: str
    hostname: str
    path: str
    """Where it is, for log lines (``postgresql inbox: <job>/<host>``)."""
    row: InboxRowLike


class _SpoolModule:
    """Sealed records read the way root may read a directory another account can write (an
    inbox that nodes ship into): under each of ``roots`` (the spool or inbox, and the state
    directory) every component is opened with ``O_NOFOLLOW`` from the root's descriptor, only
    regular files are listed and read, and a read stops at ``MAX_RECORD_BYTES``. The format
    itself is ``slurm_gpu.capture.spool``'s."""

    def __init__(self, roots: Sequence[str] = ()) -> None:
        self.roots = tuple(r.rstrip("/") or "/" for r in roots)

    def list_sealed(self, spool_dir: str) -> Sequence[SealedLike]:
        from slurm_gpu.capture.spool import SealedRecord

        out: list[SealedLike] = []
        try:
            top = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return out
        try:
            for job in _job_dirs(top):
                try:
                    job_fd = safefs.open_dir(job, dir_fd=top)
                except OSError:
                    continue  # removed since the listing, or replaced by a non-directory
                try:
                    for name in _regular_names(job_fd, os.path.join(spool_dir, job)):
                        if name.endswith(".record") and not name.startswith("."):
                            host = name[: -len(".record")]
                            out.append(SealedRecord(job, host, os.path.join(spool_dir, job, name)))
                finally:
                    os.close(job_fd)
        finally:
            os.close(top)
        return out

    def read_record(self, path: str) -> NodeRecord:
        from slurm_gpu.capture import spool

        try:
            parent, name = _open_parent(path, self.roots)
            try:
                data = safefs.read_bounded(name, dir_fd=parent, max_bytes=MAX_RECORD_BYTES)
            finally:
                os.close(parent)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise SpoolFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
        return spool.decode_record(data, where=path)


def _open_parent(path: str, roots: Sequence[str]) -> tuple[int, str]:
    """The descriptor of ``path``'s directory and the file's name. Below the first of
    ``roots`` (configured directories, opened as configured) that holds ``path``, each
    component is opened without following a symlink; elsewhere only the last one is."""
    head, name = os.path.split(path)
    for root in (r.rstrip("/") or "/" for r in roots):
        if head == root or head.startswith(root.rstrip("/") + "/"):
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                for part in head[len(root) :].split("/"):
                    if part:
                        sub = safefs.open_dir(part, dir_fd=fd)
                        os.close(fd)
                        fd = sub
            except BaseException:
                os.close(fd)
                raise
            return fd, name
    return os.open(head or ".", safefs.DIR_FLAGS), name


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _why(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symbolic link or a file where a directory or file of root is expected; refused"
    return str(exc.strerror or exc)


def _job_dirs(dir_fd: int) -> list[str]:
    """Job directories (decimal names, real directories) in ``dir_fd``, oldest id first."""
    with os.scandir(dir_fd) as it:
        names = [
            e.name for e in it if _JOB_ID.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
        ]
    return sorted(names, key=int)


def _regular_names(dir_fd: int, where: str) -> Iterator[str]:
    """Names of the regular files in ``dir_fd``, sorted; anything else is logged and skipped."""
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        if e.is_file(follow_symlinks=False):
            yield e.name
        elif e.name.endswith(".record"):
            log.warning("ignored %s/%s: not a regular file (never followed)", where, e.name)
