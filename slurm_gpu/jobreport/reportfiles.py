"""Each user's rendered ``gpueff`` reports, in files only that user (and root) can read.

Under ``PrivateData=jobs`` the store is not readable by ordinary users (``[store]
admin_group``). Their answer reaches them through the kernel's permission check instead: the
collector writes each stored job's report for its owner into

    <reports_dir>/              root:root 0711  (nobody else lists it)
    <reports_dir>/<uid>/        root:<the user's private group> 0750
    <reports_dir>/<uid>/<id>.report   root:<the user's private group> 0440

where ``<id>`` is the id as users type it (``1234``, ``1234_7``, ``1234+0``). Only the uid's
private group (the user alone) and root can open the directory, so the check "is this the
caller's job" is made by the kernel, not by ``gpueff``. Like the live summary
(``capture.spool``), a user whose primary group is shared with others gets no files: the
group bits would open them to every member.

A file is one JSON object: ``format``, the ``render_key`` it was rendered under
(``reportcache``), the terminal text without and with colour and the job's ``--json`` object.
``gpueff`` uses it only while the key matches its own, as for the reports in the store.

The writer runs as root in directories only root can write, and still works relative to
directory descriptors with ``O_NOFOLLOW``. The reader is on ``gpueff``'s fast path: it imports
the standard library only, opens without following links, and reads at most
``REPORT_MAX_BYTES``.
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

log = logging.getLogger("slurm_gpu.reportfiles")

#: Changes when what a report file holds changes meaning.
FILE_FORMAT = 1

#: Longest report file read (bytes): a 64-GPU job's three variants are far below it.
REPORT_MAX_BYTES = 4 << 20

#: Modes: the root lists nothing to others; a user's directory and files their group's alone.
ROOT_MODE = 0o711
USER_DIR_MODE = 0o750
FILE_MODE = 0o440

_SUFFIX = ".report"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def reports_root(state_dir: str, reports_dir: str) -> str:
    """The configured ``[gpueff] reports_dir``, or ``<state_dir>-reports`` when empty."""
    return reports_dir or state_dir.rstrip("/") + "-reports"


def valid_id(typed: str) -> bool:
    """Whether ``typed`` is a job id as a file may be named after it (digits, one ``_`` or
    ``+`` and digits): nothing else ever becomes a path."""
    head, sep, tail = typed.replace("+", "_", 1).partition("_")
    return head.isdigit() and head.isascii() and (not sep or (tail.isdigit() and tail.isascii()))


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
        fd = os.open(self.root, _DIR_FLAGS)
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
        fd = os.open(name, _DIR_FLAGS, dir_fd=top)
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
            }
        ).encode()
        user_dir = self._open_user_dir(top, report.uid, gid)
        try:
            name = report.typed_id + _SUFFIX
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


def _read_bounded(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _read_one(user_dir: int, typed: str) -> dict[str, Any] | None:
    try:
        fd = os.open(
            typed + _SUFFIX,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=user_dir,
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read_bounded(fd, REPORT_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > REPORT_MAX_BYTES:
        return None
    body = json.loads(data)
    return body if isinstance(body, dict) else None


def read_reports(
    root: str, uid: int, typed_ids: Sequence[str], key: str
) -> list[dict[str, Any]] | None:
    """The report files of ``typed_ids`` in ``root/<uid>/``, in order; ``None`` unless every
    one exists, is a regular file of at most ``REPORT_MAX_BYTES`` and was rendered under
    ``key``. Each is the file's object (``plain``, ``colour``, ``job``). Never raises."""
    if not typed_ids or not all(valid_id(t) for t in typed_ids):
        return None
    try:
        # O_PATH: the root is 0711, traversable but not readable by users.
        top = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        user_dir = os.open(str(uid), _DIR_FLAGS, dir_fd=top)
    except OSError:
        return None
    finally:
        os.close(top)
    out: list[dict[str, Any]] = []
    try:
        for typed in typed_ids:
            body = _read_one(user_dir, typed)
            if (
                body is None
                or body.get("format") != FILE_FORMAT
                or body.get("render_key") != key
                or not isinstance(body.get("plain"), str)
                or not isinstance(body.get("colour"), str)
                or not isinstance(body.get("job"), dict)
            ):
                return None
            out.append(body)
    except (OSError, ValueError):
        return None
    finally:
        os.close(user_dir)
    return out
