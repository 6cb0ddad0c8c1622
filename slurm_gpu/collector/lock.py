"""One collector at a time: an exclusive ``flock`` on ``<state_dir>/collect.lock``.

``flock`` is released by the kernel when the holder exits, however it exits (SIGKILL
included), so a crashed collector never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os

from slurm_gpu.errors import StoreError

LOCK_NAME = "collect.lock"


class CollectorLock:
    """A non-blocking exclusive lock; ``acquire`` returns False when another holder has it."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if it is free. Raises ``StoreError`` if the lock file cannot be made."""
        if self._fd is not None:
            return True
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(
                f"cannot open the collector lock {self.path} ({exc.strerror})",
                hint="run the collector as the user that owns paths.state_dir",
            ) from None
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
