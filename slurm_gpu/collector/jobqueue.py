"""The controller's queue of ended jobs, and the one drainer that stores them.

EpilogSlurmctld runs as SlurmUser once per ended job. Starting a root collector per job that
waits for the job's record would put one waiting process per job on the controller (a job
array of trivial tasks would exhaust its memory or pids). Instead the script only creates an
empty file named by the job id in ``paths.queue_dir`` and starts ``slurm-gpu collect --queue``
when no drainer holds the queue's lock; that single drainer takes every queued id, collects
them as a batch until each is stored or has waited ``collector.queue_wait_s``, and exits when
the queue is empty.

The queue directory belongs to SlurmUser, so root treats it as untrusted: it only lists
names, accepts those that are raw job ids (decimal, no leading zero; at most ``max_take`` per
look), and unlinks them through the directory's descriptor; it never opens, reads or follows
an entry.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from slurm_gpu.errors import ConfigError
from slurm_gpu.trust import UntrustedPathError, open_trusted_dir

log = logging.getLogger("slurm_gpu.collector")

#: Most job ids taken from the queue in one look (a burst beyond it is taken by the next look).
MAX_TAKE = 10_000
#: Seconds between two passes of the drainer while queued jobs are not stored yet.
POLL_S = 5.0
_JOB_ID = re.compile(r"[1-9][0-9]{0,19}")


class JobQueue:
    """``paths.queue_dir`` as root sees it: names to take, nothing to read."""

    def __init__(self, path: str, *, max_take: int = MAX_TAKE) -> None:
        self.path = path
        self.max_take = max_take

    def take(self) -> list[str]:
        """Remove and return up to ``max_take`` queued job ids (ascending); an empty list when
        the queue is empty or missing. ``ConfigError`` when it is a symlink or not a directory,
        or lies below a directory that an account other than root could change."""
        if not self.path:
            return []
        if not os.path.lexists(self.path):
            return []
        try:
            # Walked as configured: every directory above checked on its descriptor; the
            # queue itself (SlurmUser's) opened without following a link.
            fd = open_trusted_dir(self.path, check_final=False, final_link=False)
        except UntrustedPathError as exc:
            link = exc.reason.endswith("is a symbolic link")
            raise self._refuse(
                exc.reason + (": a symlink is never followed" if link else "")
            ) from None
        try:
            return self._take(fd)
        finally:
            os.close(fd)

    def _refuse(self, reason: str) -> ConfigError:
        return ConfigError(
            f"job queue {self.path} not read: {reason}",
            key="paths.queue_dir",
            hint="make it a real directory of SlurmUser, mode 0700, inside a root-owned "
            "directory (install -d -o slurm -m 0700 DIR)",
        )

    def _take(self, fd: int) -> list[str]:
        ids: set[str] = set()
        with os.scandir(fd) as entries:
            for entry in entries:
                if len(ids) >= self.max_take:
                    break
                if not _JOB_ID.fullmatch(entry.name) or entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    log.warning("job queue entry %s not removed: %s", entry.name, exc.strerror)
                    continue
                ids.add(entry.name)
        return sorted(ids, key=int)


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What one drainer run did (job ids)."""

    stored: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    """Not stored within ``wait_s`` (no GPU record, or accounting not settled): left to the
    periodic collector, which stores every record in the spool."""
    passes: int = 0


Collect = Callable[[frozenset[str]], Collection[str] | None]
"""One collector pass over the given job ids; the ids it stored, or None when another
collector holds the collector's lock."""


def drain(
    queue: JobQueue,
    collect: Collect,
    *,
    wait_s: float,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainReport:
    """Take queued ids and collect them as one batch per pass until every id is stored or has
    waited ``wait_s`` seconds since it was taken, looking at the queue again before each pass;
    return when the queue and the batch are both empty."""
    pending: dict[str, float] = {}
    stored: list[str] = []
    dropped: list[str] = []
    passes = 0
    while True:
        now = clock()
        for job_id in queue.take():
            pending.setdefault(job_id, now)
        if not pending:
            return DrainReport(tuple(stored), tuple(dropped), passes)
        done = collect(frozenset(pending))
        passes += 1
        for job_id in sorted(set(done or ()) & pending.keys(), key=int):
            del pending[job_id]
            stored.append(job_id)
        now = clock()
        for job_id, since in sorted(pending.items(), key=lambda kv: int(kv[0])):
            if now - since >= wait_s:
                del pending[job_id]
                dropped.append(job_id)
                log.info("job %s: not stored after %.0f s; left to the timer", job_id, wait_s)
        if pending:
            sleep(poll_s)
