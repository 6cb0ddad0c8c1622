"""The spool's emptied job directories, removed by a thread of their own during the pass.

Once a stored job's files have moved to ``done/``, the collector removes the job's directory
from the spool (only when empty: other nodes' files may still be arriving). Removing a
directory can wait on the disk even though it costs almost no CPU: where the file system
discards freed blocks synchronously (ext4 mounted with ``discard`` and no journal, as on the
2-core VM of ``docs/performance.md``) each removal waits for the device to acknowledge a
discard, 0.05 ms on a quiet disk and 2–4 ms on a busy one, which was up to half of a 4-GPU
job's ingest; on a network file system (a shared inbox) each is a round trip. The thread
waits instead of the collector's thread, which goes on reading, storing and moving the next
jobs meanwhile (a waiting system call does not hold the interpreter lock).

``DirRemover.close`` (the collector calls it when its pass ends) returns once every queued
directory has been removed or found not empty, so the spool looks after the pass as it did
when each directory was removed in line. A collector killed in the pass may leave some emptied
job directories behind, as it could before between the moves and the removal; an empty job
directory is never read as a job (``sealedfiles``) and the next job of that id reuses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading

log = logging.getLogger("slurm_gpu.collector")

_END = None


class DirRemover:
    """Removes directories of ``parent`` (names of one component, no symlink followed:
    ``rmdir`` never follows one) on a thread started by the first ``remove``."""

    def __init__(self, parent: str) -> None:
        self.parent = parent
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.removed = 0
        """How many directories were removed (the thread's count, read after ``close``)."""

    def remove(self, name: str) -> None:
        """Remove directory ``name`` of the parent when empty, soon; never raises."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="spool-tidy", daemon=True)
            self._thread.start()
        self._queue.put(name)

    def close(self) -> None:
        """Wait until every directory handed over is removed (or left, not empty), then end
        the thread. The remover may be used again afterwards (a new thread)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(_END)
        thread.join()

    def _run(self) -> None:
        try:
            top: int | None = os.open(self.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("spool job directories not removed: %s: %s", self.parent, exc)
            top = None
        try:
            while (name := self._queue.get()) is not _END:
                if top is None or "/" in name or name in ("", ".", ".."):
                    continue
                # Only when empty (ENOTEMPTY otherwise): other nodes' files may be arriving.
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=top)
                    self.removed += 1
        finally:
            if top is not None:
                os.close(top)
