"""Writes each user's rendered ``gpueff`` reports where only that user (and root) can read them.

The layout, the modes and the reader are ``slurm_gpu.jobreport.reportfiles``'s. Run by the
collector, as root, after each committed batch (``prerender``).
"""

from __future__ import annotations

import contextlib
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
    from slurm_gpu.capture.spool import private_group_of

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
        raises: a report not written is logged, and ``gpueff`` then falls back to the store."""
        if not reports:
            return 0
        try:
            top = self._open_root()
        except OSError as exc:
            log.warning("reports directory %s unusable (%s); no report files", self.root, exc)
            return 0
        written = 0
        try:
            for report in reports:
                try:
                    written += self._write_one(top, report)
                except OSError as exc:
                    log.warning("job %s: report file not written (%s)", report.typed_id, exc)
        finally:
            os.close(top)
        return written

    def _write_one(self, top: int, report: ReportFile) -> int:
        if report.uid == 0 or not valid_id(report.typed_id):
            return 0
        if report.uid not in self._groups:
            self._groups[report.uid] = self._group_of(report.uid)
        gid = self._groups[report.uid]
        if gid is None:
            return 0  # a shared primary group: its bits would open the file to others
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
        user_dir = self._open_user_dir(top, report.uid, gid)
        try:
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
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=user_dir, dst_dir_fd=user_dir)
        finally:
            os.close(user_dir)
        return 1
