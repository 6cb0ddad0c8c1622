"""One collector at a time: an exclusive ``flock`` on ``<state_dir>/collect.lock``.

``flock`` is released by the kernel when the holder exits, however it exits (SIGKILL
included), so a crashed collector never leaves a stale lock behind.

The lock file is opened relative to the state directory's descriptor, after the directory was
found root's alone (``statedir.open_state_dir``), with ``O_NOFOLLOW``: a symlink planted as
``collect.lock`` is refused, never followed. The holder's pid is written into it only when it
is a regular file of this user with a single link, so no other file is ever truncated.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from slurm_gpu.collector.statedir import open_state_dir
from slurm_gpu.errors import StoreError

LOCK_NAME = "collect.lock"
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_HINT = (
    "remove it (rm {path}) and run again; only the collector creates it, as a regular file of root"
)


class CollectorLock:
    """A non-blocking exclusive lock; ``acquire`` returns False when another holder has it."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if it is free. Raises ``ConfigError`` when the state directory is not
        root's alone and ``StoreError`` when the lock file cannot be made or is not one."""
        if self._fd is not None:
            return True
        dir_fd = open_state_dir(self.state_dir)
        try:
            fd = os.open(LOCK_NAME, _FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise StoreError(
                f"cannot open the collector lock {self.path} ({why})",
                hint=_HINT.format(path=self.path)
                if exc.errno == errno.ELOOP
                else "run the collector as the user that owns paths.state_dir",
            ) from None
        finally:
            os.close(dir_fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            os.close(fd)
            raise StoreError(
                f"refusing the collector lock {self.path}: not a regular file of this user "
                "with a single link",
                hint=_HINT.format(path=self.path),
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        # Who holds it, for an admin looking at a stuck collector.
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CollectorLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
