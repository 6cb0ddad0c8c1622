"""Trusted paths: files and directories that privileged code may take as root's own.

Code that runs as root or SlurmUser (the hooks, the sampler, the collector, the MailProg) reads
its configuration only from a file that no other account can write or replace. A file is
trusted when it is a regular file owned by root (or by the calling account), not writable by
group or others, and every directory traversed to reach it is owned by root (or the caller)
and either not writable by group or others, or sticky (``/tmp``), in which case the entry
below it must itself be owned by root or the caller, since only its owner can rename or
remove it there. The same rule as OpenSSH's ``safe_path`` and sudo's ``sudo_secure_file``.

The path is walked as configured, one component at a time, each directory opened with
``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's descriptor and checked with ``fstat``
(never ``realpath`` first: a link in a directory another account owns would then never be
examined). A symbolic link is followed only when the directory holding it passed the check
(so only a trusted account could have put it there; in a sticky directory the link itself
must be a trusted account's), and its target is walked the same way. The caller gets the
descriptor that was checked, never a name to open again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass

from slurm_gpu.errors import ConfigError

#: Mode bits that let an account other than the owner write.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
#: Open a directory without following a link in its last component.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Open a file: no link, and a FIFO planted in its place does not block.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Most symbolic links followed in one walk (the kernel's own limit, ``MAXSYMLINKS``).
MAX_LINKS = 40

_HINT = (
    "privileged slurm-gpu code reads only root-owned files that no other account "
    "can write: chown root and chmod go-w the file and its directories"
)


class UntrustedPathError(Exception):
    """A path that another account could write or replace; ``reason`` says where. ``denied``:
    the walk was refused a look (EACCES, EPERM), which says nothing against the path when the
    caller is not the account that uses it (an ordinary user running ``doctor``)."""

    def __init__(self, reason: str, *, denied: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.denied = denied


@dataclass(frozen=True, slots=True)
class _Dir:
    """One directory of the walk: its descriptor, its path as walked, and whether entries
    in it must be a trusted account's (sticky and writable by others)."""

    fd: int
    shown: str
    owned_entries_only: bool


def _trusted_owners() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def _join(parent: str, name: str) -> str:
    return parent.rstrip("/") + "/" + name


def _dir_verdict(st: os.stat_result, shown: str) -> str | None:
    """Why directory ``st`` would let another account change what it holds, or None."""
    if st.st_uid not in _trusted_owners():
        return f"directory {shown} is owned by uid {st.st_uid}, not root"
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        return f"directory {shown} is writable by group or others"
    return None


def _entries_owned_only(st: os.stat_result) -> bool:
    return bool(st.st_mode & _OTHERS_WRITE)  # sticky, or _dir_verdict refused it


def _components(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def _walk(
    path: str,
    *,
    directory: bool,
    check_final: bool = True,
    create_mode: int | None = None,
    final_link: bool = True,
) -> int:
    """The descriptor of ``path`` (a directory when ``directory``), every directory traversed
    on the way checked (module docstring); the final entry checked as a trusted file, or as a
    trusted directory when ``check_final``. ``create_mode``: missing directories are made
    with it (relative to their checked parent). ``final_link``: whether the last component
    of ``path`` itself may be a link (one in a checked directory). Raises
    ``UntrustedPathError``."""
    if not os.path.isabs(path):
        raise UntrustedPathError(f"{path} is not an absolute path")
    stack: list[_Dir] = []
    try:
        stack.append(_open_root())
        parts = _components(path)
        links = 0
        while parts:
            name = parts.pop(0)
            here = stack[-1]
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop().fd)
                continue
            shown = _join(here.shown, name)
            last = not parts
            st = _lstat(name, here, shown, create_mode if (directory or not last) else None)
            if here.owned_entries_only and st.st_uid not in _trusted_owners():
                raise UntrustedPathError(
                    f"{shown} is owned by uid {st.st_uid} in the shared directory {here.shown}"
                )
            if stat.S_ISLNK(st.st_mode):
                if last and not final_link and links == 0:
                    raise UntrustedPathError(f"{shown} is a symbolic link")
                links += 1
                if links > MAX_LINKS:
                    raise UntrustedPathError(f"{path}: too many levels of symbolic links")
                target = os.readlink(name, dir_fd=here.fd)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop().fd)
                parts = _components(target) + parts
                continue
            if last and not directory:
                return _open_file(name, here, shown, st)
            fd = _open_checked(name, here.fd, _DIR_FLAGS, shown, st)
            dst = os.fstat(fd)
            stack.append(_Dir(fd, shown, _entries_owned_only(dst)))
            if not last or check_final:
                reason = _dir_verdict(dst, shown)
                if reason is not None:
                    raise UntrustedPathError(reason)
        if not directory:
            raise UntrustedPathError(f"{path} is not a regular file")
        top = stack.pop()
        return top.fd
    except OSError as exc:
        raise UntrustedPathError(
            f"cannot open {path} ({exc.strerror})",
            denied=exc.errno in (errno.EACCES, errno.EPERM),
        ) from None
    finally:
        for d in stack:
            os.close(d.fd)


def _open_root() -> _Dir:
    fd = os.open("/", _DIR_FLAGS)
    st = os.fstat(fd)
    reason = _dir_verdict(st, "/")
    if reason is not None:
        os.close(fd)
        raise UntrustedPathError(reason)
    return _Dir(fd, "/", _entries_owned_only(st))


def _lstat(name: str, here: _Dir, shown: str, create_mode: int | None) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=here.fd, follow_symlinks=False)
    except FileNotFoundError:
        if create_mode is None:
            raise UntrustedPathError(f"cannot stat {shown} (No such file or directory)") from None
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, create_mode, dir_fd=here.fd)
    return os.stat(name, dir_fd=here.fd, follow_symlinks=False)


def _open_checked(name: str, dir_fd: int, flags: int, shown: str, seen: os.stat_result) -> int:
    """Open ``name`` without following a link; the descriptor must be the entry looked at."""
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UntrustedPathError(f"{shown} is not a directory") from None
        raise
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        raise UntrustedPathError(f"{shown} changed while being checked")
    return fd


def _open_file(name: str, here: _Dir, shown: str, seen: os.stat_result) -> int:
    if not stat.S_ISREG(seen.st_mode):
        raise UntrustedPathError(f"{shown} is not a regular file")
    fd = _open_checked(name, here.fd, _FILE_FLAGS, shown, seen)
    st = os.fstat(fd)
    reason = None
    if not stat.S_ISREG(st.st_mode):
        reason = f"{shown} is not a regular file"
    elif st.st_uid not in _trusted_owners():
        reason = f"{shown} is owned by uid {st.st_uid}, not root"
    elif st.st_mode & _OTHERS_WRITE:
        reason = f"{shown} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if reason is not None:
        os.close(fd)
        raise UntrustedPathError(reason)
    return fd


def open_trusted_file(path: str) -> int:
    """A read-only descriptor of ``path`` if it is a trusted file (module docstring): the
    descriptor checked, to read from. ``UntrustedPathError`` otherwise."""
    return _walk(path, directory=False)


def open_trusted_dir(
    path: str,
    *,
    check_final: bool = True,
    create_mode: int | None = None,
    final_link: bool = True,
) -> int:
    """A descriptor of directory ``path`` whose every directory above is trusted, and, with
    ``check_final``, the directory itself (root's or the caller's, not writable by group or
    others unless sticky). Without it the directory may be another account's (SlurmUser's
    job queue) but is still opened without following a link. ``create_mode``: missing
    directories are created with that mode. ``final_link=False`` refuses a ``path`` whose
    last component is a symbolic link. ``UntrustedPathError`` otherwise."""
    return _walk(
        path,
        directory=True,
        check_final=check_final,
        create_mode=create_mode,
        final_link=final_link,
    )


def untrusted(path: str) -> UntrustedPathError | None:
    """Why ``path`` is not a trusted file (with whether the walk was refused a look), or None
    when it is (see the module docstring)."""
    try:
        os.close(open_trusted_file(path))
    except UntrustedPathError as exc:
        return exc
    return None


def untrusted_reason(path: str) -> str | None:
    """Why ``path`` is not a trusted file, or None when it is (see the module docstring)."""
    found = untrusted(path)
    return None if found is None else found.reason


def untrusted_dir_reason(path: str, *, check_final: bool = True) -> str | None:
    """Why directory ``path`` (or, without ``check_final``, a directory above it) would let
    another account change what it holds, or None."""
    try:
        os.close(open_trusted_dir(path, check_final=check_final))
    except UntrustedPathError as exc:
        return exc.reason
    return None


def require_trusted_fd(path: str, *, key: str | None = None) -> int:
    """``open_trusted_file`` with a ``ConfigError`` (exit code 3) and a hint on refusal."""
    try:
        return open_trusted_file(path)
    except UntrustedPathError as exc:
        raise ConfigError(
            f"not a trusted file: {exc.reason}", key=key, path=path, hint=_HINT
        ) from None


def require_trusted_file(path: str) -> str:
    """``path`` if it is trusted; ``ConfigError`` with a hint otherwise. Prefer
    ``require_trusted_fd``: a name checked and opened again is a second look."""
    os.close(require_trusted_fd(path))
    return path
