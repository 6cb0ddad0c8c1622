"""Writes each user's rendered ``gpueff`` reports where only that user (and root) can read them.

The layout, the modes and the reader are ``slurm_gpu.jobreport.reportfiles``'s. Run by the
collector, as root, after each committed batch (``prerender``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.jobreport.reportfiles import (
    DIR_FLAGS,
    FILE_FORMAT,
    FILE_MODE,
    ROOT_MODE,
    SUFFIX,
    USER_DIR_MODE,
    valid_id,
)

log = logging.getLogger("slurm_gpu.reportfiles")


@dataclass(frozen=True, slots=True)
class ReportFile:
    """One job's rendered report, for its owner."""

    uid: int
    typed_id: str
    render_key: str
    plain: str
    colour: str
    job: dict[str, Any]
    """The job's object of ``gpueff --json`` (``jsonout.job_json``)."""
    json_version: int
    """``jsonout.SCHEMA_VERSION`` of ``job``."""
    telemetry: dict[str, Any] | None = None
    """The job's ``model.Telemetry`` as ``dataclasses.asdict`` gives it (``None``: none), for
    the owner's full ``gpueff`` (``readers``)."""


def _private_group(uid: int) -> int | None:
    from slurm_gpu.capture.livefile import private_group_of

    return private_group_of(uid)


class ReportFileWriter:
    """Writes ``ReportFile``s under ``root`` (run as root by the collector).

    ``group_of`` gives the group that may read a uid's files, or ``None`` when that user must
    get none (a shared primary group); tests inject it, the collector uses the user's private
    group."""

    def __init__(
        self, root: str, *, group_of: Callable[[int], int | None] = _private_group
    ) -> None:
        self.root = root
        self._group_of = group_of
        self._groups: dict[int, int | None] = {}

    def _open_root(self) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, ROOT_MODE)
        fd = os.open(self.root, DIR_FLAGS)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise PermissionError(f"{self.root} is owned by uid {st.st_uid}")
            if stat.S_IMODE(st.st_mode) != ROOT_MODE:
                os.fchmod(fd, ROOT_MODE)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_user_dir(self, top: int, uid: int, gid: int) -> int:
        name = str(uid)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=top)
        fd = os.open(name, DIR_FLAGS, dir_fd=top)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_gid != gid:
                os.fchown(fd, os.geteuid(), gid)
            if stat.S_IMODE(st.st_mode) != USER_DIR_MODE:
                os.fchmod(fd, USER_DIR_MODE)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, reports: Sequence[ReportFile]) -> int:
        """Write (atomically replace) each report; returns how many were written. Never
        raises: a report not written is logged, and ``gpueff`` then falls back to the store.

        A batch at a time: every file is written under a temporary name first, then made
        durable, then renamed over its final name, so that a file visible under its final name
        is complete after a crash, as with one ``fsync`` per file. The durability step is one
        ``syncfs`` of the reports' file system for the whole batch (Linux), which costs about
        what a single ``fsync`` does; elsewhere each file is ``fsync``ed."""
        if not reports:
            return 0
        try:
            top = self._open_root()
        except OSError as exc:
            log.warning("reports directory %s unusable (%s); no report files", self.root, exc)
            return 0
        syncfs = _syncfs_function()
        # The last of a job's reports wins, as when they were written one after the other.
        reports = list({(r.uid, r.typed_id): r for r in reports}.values())
        staged: list[tuple[ReportFile, int, str, str]] = []  # report, user dir, tmp, final
        user_dirs: dict[int, int] = {}
        written = 0
        try:
            for report in reports:
                try:
                    done = self._stage(top, report, user_dirs, fsync_each=syncfs is None)
                except OSError as exc:
                    log.warning("job %s: report file not written (%s)", report.typed_id, exc)
                    continue
                if done is not None:
                    staged.append((report, *done))
            if staged and syncfs is not None:
                try:
                    syncfs(top)
                except OSError as exc:
                    log.warning("report files not written: syncfs failed (%s)", exc)
                    for _, user_dir, tmp, _ in staged:
                        with contextlib.suppress(OSError):
                            os.unlink(tmp, dir_fd=user_dir)
                    return 0
            for report, user_dir, tmp, name in staged:
                try:
                    os.rename(tmp, name, src_dir_fd=user_dir, dst_dir_fd=user_dir)
                    written += 1
                except OSError as exc:
                    log.warning("job %s: report file not written (%s)", report.typed_id, exc)
        finally:
            for fd in user_dirs.values():
                os.close(fd)
            os.close(top)
        return written

    def _stage(
        self, top: int, report: ReportFile, user_dirs: dict[int, int], *, fsync_each: bool
    ) -> tuple[int, str, str] | None:
        """Write ``report`` under a temporary name in its owner's directory (opened once per
        batch, kept in ``user_dirs``); returns (that directory, the temporary name, the final
        name), or ``None`` when the owner gets no file."""
        if report.uid == 0 or not valid_id(report.typed_id):
            return None
        if report.uid not in self._groups:
            self._groups[report.uid] = self._group_of(report.uid)
        gid = self._groups[report.uid]
        if gid is None:
            return None  # a shared primary group: its bits would open the file to others
        body = json.dumps(
            {
                "format": FILE_FORMAT,
                "render_key": report.render_key,
                "plain": report.plain,
                "colour": report.colour,
                "job": report.job,
                "json_version": report.json_version,
                "telemetry": report.telemetry,
            }
        ).encode()
        user_dir = user_dirs.get(report.uid)
        if user_dir is None:
            user_dir = user_dirs[report.uid] = self._open_user_dir(top, report.uid, gid)
        name = report.typed_id + SUFFIX
        tmp = f".{name}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=user_dir)
        fd = os.open(tmp, flags, 0o400, dir_fd=user_dir)
        try:
            os.fchown(fd, os.geteuid(), gid)
            os.fchmod(fd, FILE_MODE)
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            if fsync_each:
                os.fsync(fd)
        finally:
            os.close(fd)
        return user_dir, tmp, name


@functools.cache
def _syncfs_function() -> Callable[[int], None] | None:
    """``syncfs(2)`` (Linux: flush the file system that holds a descriptor's file, and wait),
    raising ``OSError``; ``None`` where the C library has none."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return syncfs
