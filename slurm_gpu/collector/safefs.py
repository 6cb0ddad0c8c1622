"""File operations relative to an open directory that never follow a symbolic link.

Root must not resolve a name that another account could have replaced: every operation here
takes a directory descriptor and a single name (no ``/``), opens with ``O_NOFOLLOW``, and
checks what it opened with ``fstat``. A symlink where a file or directory is expected fails
with ``OSError`` (``ELOOP``, ``ENOTDIR`` or ``EINVAL``), which the caller logs and refuses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

#: Open a directory without following a symlink in its last component.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Open a file for reading: no symlink, and a FIFO planted in its place does not block.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Mode bits that let an account other than the owner write.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_CHUNK = 1 << 20


def _one_name(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise OSError(errno.EINVAL, "not a single path component", name)
    return name


def open_dir(name: str, *, dir_fd: int | None) -> int:
    """Open directory ``name`` (relative to ``dir_fd``) without following a symlink."""
    return os.open(_one_name(name), DIR_FLAGS, dir_fd=dir_fd)


def open_private_dir(name: str, *, dir_fd: int, create: bool = False, mode: int = 0o700) -> int:
    """Open (with ``create``, make first) a directory that must be owned by this process's
    user and writable by no one else. Raises ``OSError``: ``ELOOP``/``ENOTDIR`` for a symlink
    or a file in its place, ``EPERM`` when another account owns or may write it."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(_one_name(name), mode, dir_fd=dir_fd)
    fd = open_dir(name, dir_fd=dir_fd)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & OTHERS_WRITE:
        os.close(fd)
        raise OSError(
            errno.EPERM,
            f"owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}, "
            "not private to this user",
            name,
        )
    return fd


def read_bounded(name: str, *, dir_fd: int, max_bytes: int) -> bytes:
    """The content of regular file ``name``, at most ``max_bytes`` bytes. Raises ``OSError``
    for a symlink or a non-regular file, ``EFBIG`` when the file is longer than the bound."""
    fd = os.open(_one_name(name), READ_FLAGS, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", name)
        parts: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise OSError(errno.EFBIG, f"longer than {max_bytes} bytes", name)
        return b"".join(parts)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_new(name: str, data: bytes, *, dir_fd: int, mode: int = 0o600, sync: bool = True) -> None:
    """Create ``name`` (``O_EXCL``: ``FileExistsError`` if anything, a symlink included, has
    that name) and write ``data`` (then ``fsync`` it, unless ``sync`` is false)."""
    fd = os.open(
        _one_name(name),
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        mode,
        dir_fd=dir_fd,
    )
    try:
        _write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_replace(
    name: str, data: bytes, *, dir_fd: int, mode: int = 0o600, sync: bool = True
) -> None:
    """Atomically replace ``name`` with ``data`` (a new temporary file, then ``rename``, which
    replaces a symlink itself, never its target); ``sync``: ``fsync`` before the rename."""
    tmp = f".{_one_name(name)}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    write_new(tmp, data, dir_fd=dir_fd, mode=mode, sync=sync)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def move(
    name: str, *, src_fd: int, dst_fd: int, dst_name: str, max_bytes: int | None = None
) -> None:
    """Move ``name`` from one directory to another. ``rename`` moves a symlink itself; across
    filesystems (``EXDEV``) a regular file is copied (at most ``max_bytes``, with a temporary
    name, fsync, rename), then unlinked. Raises ``OSError``."""
    try:
        os.rename(_one_name(name), _one_name(dst_name), src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    fd = os.open(name, READ_FLAGS, dir_fd=src_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", name)
        tmp = f".{dst_name}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dst_fd)
        out = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dst_fd,
        )
        try:
            copied = 0
            while chunk := os.read(fd, _CHUNK):
                copied += len(chunk)
                if max_bytes is not None and copied > max_bytes:
                    raise OSError(errno.EFBIG, f"longer than {max_bytes} bytes", name)
                _write_all(out, chunk)
            os.fsync(out)
        except BaseException:
            os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dst_fd)
            raise
        os.close(out)
        os.replace(tmp, dst_name, src_dir_fd=dst_fd, dst_dir_fd=dst_fd)
    finally:
        os.close(fd)
    os.unlink(name, dir_fd=src_fd)


def lstat_at(name: str, *, dir_fd: int) -> os.stat_result | None:
    """``lstat`` of ``name`` in ``dir_fd``, or None when nothing has that name."""
    try:
        return os.stat(_one_name(name), dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
