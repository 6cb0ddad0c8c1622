"""The live summary of a running job on one node: the small JSON file ``gpueff`` and the
exporter read while the job runs (``<spool_dir>-live/<job_id>/<host>.json``).

The sampler rewrites it at every reading (every 10 s by default) for the job's whole life,
so its cost counts: ``LiveWriter`` creates it once (a temporary file and a rename, in a
directory only root writes) and then rewrites it in place with one ``pwrite``. A rename over
an existing file on ext4 costs about 5 times the write itself in CPU (it forces the new
file's blocks to be allocated), and at every reading that was the larger part of the
sampler's cost.

A reader may then catch a rewrite half done. Every summary therefore ends with a CRC-32 of
everything before it, as the last key: ``...,"crc":"89abcdef"}``; the file is padded with
spaces to its longest length, never truncated, so a shorter summary leaves no stale tail.
``read_live`` checks the CRC and reads again (up to ``READ_TRIES`` times) when a rewrite
crossed its read: a torn summary is never taken for a whole one. A summary without the key
(one written whole by a rename, as earlier releases did) is taken as it is.
"""

from __future__ import annotations

import json
import os
import stat
import time
import zlib
from typing import Any

from slurm_gpu.capture.spoolpaths import (
    LIVE_GROUP_MODE,
    LIVE_MAX_BYTES,
    LIVE_MODE,
    JobSpool,
    read_bounded,
    write_all_at,
    write_atomic,
)
from slurm_gpu.errors import SpoolFormatError

LIVE_SCHEMA = "slurm-gpu/live"
LIVE_VERSION = 1

#: How a summary ends: the CRC-32 (8 lower-case hex digits) of every byte before this key.
_CRC_KEY = b',"crc":"'
#: Reads of one summary before a reader gives up on a file that changes under every read.
READ_TRIES = 4
#: Pause between those reads, seconds (a rewrite is one ``pwrite`` of a few kB).
_RETRY_PAUSE_S = 0.002


def encode_live(summary: dict[str, Any]) -> bytes:
    """The live summary's bytes, its CRC last; ``ValueError`` over ``LIVE_MAX_BYTES``."""
    body = {"schema": LIVE_SCHEMA, "version": LIVE_VERSION, **summary}
    head = json.dumps(body, separators=(",", ":")).encode()[:-1]
    data = b'%s%s%08x"}' % (head, _CRC_KEY, zlib.crc32(head))
    if len(data) > LIVE_MAX_BYTES:
        raise ValueError(f"live summary of {len(data)} bytes over {LIVE_MAX_BYTES}")
    return data


def live_intact(data: bytes) -> bool:
    """Whether ``data`` is one whole summary: its CRC matches, or it has none (written whole
    by a rename). Trailing spaces are the padding of a longer earlier summary."""
    text = data.rstrip(b" ")
    at = text.rfind(_CRC_KEY)
    if at < 0:
        return True
    tail = text[at + len(_CRC_KEY) :]
    return tail == b'%08x"}' % zlib.crc32(text[:at])


class LiveWriter:
    """Keeps one job's live summary on this node: root's (never the user's: they could chmod
    it, write into it and fill the spool's file system, or keep it with a hard link), group
    ``gid`` and 0440 when given (the job user's private group, ``private_group_of``), else
    0400, in a directory only root writes.

    The first ``write`` makes and checks the directories and creates the file by a rename;
    later ones rewrite it in place through the descriptor kept open. When the file is gone
    (the epilog's ``remove_live`` at the job's end) the next write creates it again. Not
    fsynced: the summary describes a running job; after a crash of the machine there is no
    running job to describe.
    """

    def __init__(self, paths: JobSpool, gid: int | None) -> None:
        self.paths = paths
        self.gid = gid
        self._fd: int | None = None
        self._size = 0

    def write(self, summary: dict[str, Any]) -> None:
        """Write ``summary``. Raises ``OSError``, and ``ValueError`` over ``LIVE_MAX_BYTES``;
        after an ``OSError`` the next write starts again from the directories."""
        data = encode_live(summary)
        fd = self._fd
        if fd is not None and os.fstat(fd).st_nlink == 0:
            self.close()
            fd = None
        if fd is None:
            self._create(data)
            return
        try:
            # Padded to the longest summary so far: the file never shrinks, so a reader
            # never sees the stale tail of a longer one after the closing brace.
            write_all_at(fd, data.ljust(self._size, b" "), 0)
        except OSError:
            self.close()
            raise
        self._size = max(self._size, len(data))

    def _create(self, data: bytes) -> None:
        _write_whole(self.paths, data, self.gid)
        # Opened by name in a directory only root writes, just after the rename: nobody
        # else can have put anything there, and a link is refused all the same.
        fd = os.open(self.paths.live, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise OSError(f"{self.paths.live}: not the file just written")
        self._fd, self._size = fd, len(data)

    def close(self) -> None:
        """Let go of the file (it stays; ``JobSpool.remove_live`` removes it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def write_live(paths: JobSpool, summary: dict[str, Any], gid: int | None) -> None:
    """Write the live summary once, whole, by a rename (``LiveWriter`` for the rewrites of a
    running sampler). Raises ``OSError``, and ``ValueError`` over ``LIVE_MAX_BYTES``."""
    _write_whole(paths, encode_live(summary), gid)


def _write_whole(paths: JobSpool, data: bytes, gid: int | None) -> None:
    """Make and check the live directories, then write ``data`` by a rename: group ``gid``
    and 0440 when given, else 0400."""
    mode = LIVE_GROUP_MODE if gid is not None else LIVE_MODE
    paths.create_live_dir(gid)
    write_atomic(paths.live, data, mode=mode, gid=gid, sync=False)


def private_group_of(uid: int | None) -> int | None:
    """The primary group of ``uid`` when it is that user's private group (named after the
    user, no listed members), else ``None``: only such a group lets the live summary be read
    by its user and nobody else with plain permissions. Looked up once, by the sampler."""
    import grp
    import pwd

    if uid is None:
        return None
    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(user.pw_gid)
    except (KeyError, OSError):
        return None
    if group.gr_name != user.pw_name or any(m != user.pw_name for m in group.gr_mem):
        return None
    return int(user.pw_gid)


def read_live(path: str) -> dict[str, Any]:
    """The live summary; ``SpoolFormatError`` when unreadable, not a regular file (links are
    not followed), over ``LIVE_MAX_BYTES``, of an unknown version, or changing under each of
    ``READ_TRIES`` reads. Read by ``gpueff`` and the exporter: its strings are cleaned by the
    caller (``jobreport.readers``, ``live.snapshot``)."""
    for attempt in range(READ_TRIES):
        data = _read_once(path)
        if live_intact(data):
            break
        if attempt + 1 < READ_TRIES:
            time.sleep(_RETRY_PAUSE_S)
    else:
        raise SpoolFormatError(f"{path}: live summary rewritten during each read; try again")
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise SpoolFormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("schema") != LIVE_SCHEMA:
        raise SpoolFormatError(f"{path}: not a live summary")
    if body.get("version") != LIVE_VERSION:
        raise SpoolFormatError(f"{path}: live summary version {body.get('version')!r} unknown")
    body.pop("crc", None)
    return body


def _read_once(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SpoolFormatError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpoolFormatError(f"{path}: not a regular file")
        data = read_bounded(fd, LIVE_MAX_BYTES + 1)
    except OSError as exc:
        raise SpoolFormatError(f"{path}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > LIVE_MAX_BYTES:
        raise SpoolFormatError(f"{path}: live summary over {LIVE_MAX_BYTES} bytes")
    return data
