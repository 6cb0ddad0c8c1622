"""Who may open a SQLite store file: root alone, or root and one group of admins.

The store holds every user's jobs (names, working directories, telemetry, findings, rendered
reports), so under ``PrivateData=jobs`` a user who could open the file could read what Slurm
hides from them with ``sqlite3`` or Python, whatever ``gpueff`` does. The writer (the collector,
run as root) therefore creates the file ``0600`` before SQLite does (no window with the umask's
mode) and, at every open, narrows it and the state directory that holds it:

- ``[store] admin_group`` empty: file ``0600``, directory ``0700`` (root alone);
- set: file ``0640`` and directory ``0750``, group ``admin_group`` (admins; the mail program's
  SlurmUser, which reads the store, must be a member).

SQLite gives the ``-journal`` the file's mode. Users get their own reports from
``<reports_dir>/<uid>/`` instead (``slurm_gpu.jobreport.reportfiles``).
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass

from slurm_gpu.errors import StoreError

#: Modes without and with an admin group.
FILE_MODE_PRIVATE = 0o600
FILE_MODE_GROUP = 0o640
DIR_MODE_PRIVATE = 0o700
DIR_MODE_GROUP = 0o750


@dataclass(frozen=True, slots=True)
class Access:
    """The wanted group (``None``: the owner's alone) and modes of the file and directory."""

    gid: int | None
    file_mode: int
    dir_mode: int


def wanted_access(admin_group: str) -> Access:
    """The access ``[store] admin_group`` asks for; ``StoreError`` for an unknown group."""
    if not admin_group:
        return Access(None, FILE_MODE_PRIVATE, DIR_MODE_PRIVATE)
    try:
        gid = grp.getgrnam(admin_group).gr_gid
    except KeyError:
        raise StoreError(
            f"[store] admin_group {admin_group!r} is not a group on this host",
            hint="create the group, or set admin_group to an existing one (empty: root alone)",
        ) from None
    return Access(gid, FILE_MODE_GROUP, DIR_MODE_GROUP)


def _narrow(fd: int, access: Access, mode: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        return  # not ours to change (a reader, or a store an admin set up by hand)
    if access.gid is not None and st.st_gid != access.gid:
        os.fchown(fd, -1, access.gid)
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


def secure_sqlite_file(path: str, admin_group: str, *, state_dir: str | None = None) -> None:
    """Create the store file at ``path`` with mode 0600 when it does not exist, then give it
    (and ``state_dir`` when that is the directory holding it) the modes and group of
    ``wanted_access``. Only what the caller owns is changed. Links are not followed. Raises
    ``StoreError``."""
    access = wanted_access(admin_group)
    try:
        fd = os.open(
            path,
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            FILE_MODE_PRIVATE,
        )
    except OSError as exc:
        raise StoreError(
            f"cannot open the store file {path} ({exc.strerror})",
            hint="it must be a regular file (not a link) in a directory root owns",
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(f"store {path} is not a regular file", hint="remove it")
        _narrow(fd, access, access.file_mode)
    finally:
        os.close(fd)
    parent = os.path.dirname(os.path.abspath(path))
    if state_dir is None or os.path.realpath(state_dir) != os.path.realpath(parent):
        return
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreError(
            f"cannot open {parent} ({exc.strerror})", hint="check paths.state_dir"
        ) from None
    try:
        _narrow(dfd, access, access.dir_mode)
    finally:
        os.close(dfd)
