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

The writer (``reportwriter``) runs as root in directories only root can write, and still works
relative to directory descriptors with ``O_NOFOLLOW``. The reader, here, is on ``gpueff``'s fast
path: it imports the standard library only (not even ``dataclasses`` or ``logging``), opens
without following links, and reads at most ``REPORT_MAX_BYTES``.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from typing import Any

#: Changes when what a report file holds changes meaning.
FILE_FORMAT = 1

#: Longest report file read (bytes): a 64-GPU job's three variants are far below it.
REPORT_MAX_BYTES = 4 << 20

#: Modes: the root lists nothing to others; a user's directory and files their group's alone.
ROOT_MODE = 0o711
USER_DIR_MODE = 0o750
FILE_MODE = 0o440

SUFFIX = ".report"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def reports_root(state_dir: str, reports_dir: str) -> str:
    """The configured ``[gpueff] reports_dir``, or ``<state_dir>-reports`` when empty."""
    return reports_dir or state_dir.rstrip("/") + "-reports"


def valid_id(typed: str) -> bool:
    """Whether ``typed`` is a job id as a file may be named after it (digits, one ``_`` or
    ``+`` and digits): nothing else ever becomes a path."""
    head, sep, tail = typed.replace("+", "_", 1).partition("_")
    return head.isdigit() and head.isascii() and (not sep or (tail.isdigit() and tail.isascii()))


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
            typed + SUFFIX,
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
    root: str, uid: int, typed_ids: Sequence[str], key: str | None
) -> list[dict[str, Any]] | None:
    """The report files of ``typed_ids`` in ``root/<uid>/``, in order; ``None`` unless every
    one exists, is a regular file of at most ``REPORT_MAX_BYTES`` and was rendered under
    ``key`` (``None``: under any key). Each is the file's object (``plain``, ``colour``,
    ``job``). Never raises."""
    if not typed_ids or not all(valid_id(t) for t in typed_ids):
        return None
    try:
        # O_PATH: the root is 0711, traversable but not readable by users.
        top = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        user_dir = os.open(str(uid), DIR_FLAGS, dir_fd=top)
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
                or (key is not None and body.get("render_key") != key)
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
