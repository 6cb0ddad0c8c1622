"""The collector's state directory is root's alone.

The collector runs as root and keeps its lock, ``done/``, ``quarantine/``, the missing-pass
checkpoint and the default SQLite store in ``paths.state_dir``. If another account could
write that directory (or a directory above it) it could plant a symlink under a name root
opens, and root would write, truncate or delete its target. So the collector refuses to run
unless the directory is not a symlink, is owned by root (or the user running the collector)
and is writable by no one else, and every directory above it is owned by root (or that user)
and not writable by others, or sticky with a trusted owner for the next component (``/tmp``)
- the rule of ``slurm_gpu.trust`` for files, applied to a directory.

Readers of the store (``gpueff``, the mail program) need only read access: the store file may
be readable by a group; the directory is never writable by one.
"""

from __future__ import annotations

import os
import stat

from slurm_gpu.collector.safefs import OTHERS_WRITE
from slurm_gpu.errors import ConfigError
from slurm_gpu.trust import UntrustedPathError, open_trusted_dir

#: Names in the state directory that root opens by name through a library (SQLite) and
#: therefore must be, when they exist, regular files of this user with a single link.
STORE_NAMES = ("slurm-gpu.db", "slurm-gpu.db-journal")

_HINT = (
    "the collector's state directory must be root's alone: chown root, chmod 0755 (or 0700) "
    "it and every directory above it; the mail program keeps its state elsewhere "
    "([mail] settings)"
)


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _refuse(path: str, reason: str) -> ConfigError:
    return ConfigError(
        f"refusing to use the state directory {path}: {reason}",
        key="paths.state_dir",
        hint=_HINT,
    )


def open_state_dir(path: str) -> int:
    """A descriptor of the state directory, made (0755) when missing; ``ConfigError`` (exit
    code 3) when it is a symlink, not a directory, or writable or replaceable by an account
    other than root and the caller.

    The path is walked as configured (``slurm_gpu.trust.open_trusted_dir``): each directory
    opened without following links relative to its checked parent, missing ones made there,
    and the checks below run on the descriptor that is returned, so nothing is opened by
    name after it was checked."""
    if not os.path.isabs(path):
        raise _refuse(path, "not an absolute path")
    try:
        fd = open_trusted_dir(path, check_final=False, create_mode=0o755, final_link=False)
    except UntrustedPathError as exc:
        raise _refuse(path, exc.reason) from None
    try:
        st = os.fstat(fd)
        reason = None
        if not _trusted(st.st_uid):
            reason = f"it is owned by uid {st.st_uid}, not root"
        elif st.st_mode & OTHERS_WRITE:
            reason = f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        else:
            reason = _foreign_store_file(fd)
        if reason is not None:
            raise _refuse(path, reason)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _foreign_store_file(dir_fd: int) -> str | None:
    """A store file planted by another account (a symlink, a hard link, someone else's file)
    before the directory became private: SQLite would follow or write it as root."""
    for name in STORE_NAMES:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            return f"{name} is a symbolic link"
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or not _trusted(st.st_uid):
            return f"{name} is not a regular file of root with a single link"
    return None
