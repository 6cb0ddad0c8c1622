"""Trusted paths: files that privileged code may take its configuration from.

Code that runs as root or SlurmUser (the hooks, the sampler, the collector, the MailProg) reads
its configuration only from a file that no other account can write or replace. A file is
trusted when it is a regular file owned by root (or by the calling account), not writable by
group or others, and every directory on its resolved path is owned by root (or the caller) and
either not writable by group or others, or sticky (``/tmp``), in which case the next component
must itself be owned by root or the caller, since only its owner can rename or remove it there.
The same rule as OpenSSH's ``safe_path`` and sudo's ``sudo_secure_file``.
"""

from __future__ import annotations

import os
import stat

from slurm_gpu.errors import ConfigError

#: Mode bits that let an account other than the owner write.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _trusted_owners() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def untrusted_ancestry_reason(path: str, owner_uid: int) -> str | None:
    """Why a directory above ``path`` (an entry owned by ``owner_uid``) would let another
    account replace it, or None: each directory up to ``/`` must be root's (or the caller's)
    and not writable by group or others, unless it is sticky and the entry below it is root's
    (or the caller's)."""
    owners = _trusted_owners()
    child_uid = owner_uid
    directory = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            dst = os.stat(directory)
        except OSError as exc:
            return f"cannot stat {directory} ({exc.strerror})"
        if dst.st_uid not in owners:
            return f"directory {directory} is owned by uid {dst.st_uid}, not root"
        if dst.st_mode & _OTHERS_WRITE:
            sticky = bool(dst.st_mode & stat.S_ISVTX)
            if not sticky or child_uid not in owners:
                return f"directory {directory} is writable by group or others"
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        child_uid = dst.st_uid
        directory = parent


def untrusted_reason(path: str) -> str | None:
    """Why ``path`` is not a trusted file, or None when it is (see the module docstring)."""
    owners = _trusted_owners()
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        return f"cannot stat {real} ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"{real} is not a regular file"
    if st.st_uid not in owners:
        return f"{real} is owned by uid {st.st_uid}, not root"
    if st.st_mode & _OTHERS_WRITE:
        return f"{real} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return untrusted_ancestry_reason(real, st.st_uid)


def require_trusted_file(path: str) -> str:
    """The resolved path of ``path`` if it is trusted; ``ConfigError`` with a hint otherwise."""
    reason = untrusted_reason(path)
    if reason is not None:
        raise ConfigError(
            f"not a trusted file: {reason}",
            path=path,
            hint="privileged slurm-gpu code reads only root-owned files that no other account "
            "can write: chown root and chmod go-w the file and its directories",
        )
    return os.path.realpath(path)
