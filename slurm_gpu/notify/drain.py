"""One drainer for every waiting END/FAIL mail, instead of one waiting process per mail.

A MailProg call for an END or FAIL mail only records the mail in the mail state
(``MailState.enqueue``, bounded by ``[mail] max_pending``) and tries to become the drainer: it
takes ``<mail.state_dir>/mail-drain.lock`` with a non-blocking ``flock``. A call that finds the lock
held exits at once, so a job array of ten thousand trivial tasks costs the controller ten
thousand short processes in a row and one waiting process, not ten thousand waiting ones.

The drainer looks at every waiting mail once per pass (``Notifier.advance``) and sleeps
``poll_interval_s`` between passes. When nothing waits it lets go of the lock and looks once
more: a call that enqueued while the lock was still held is seen there, so no mail is left
behind. A drainer that dies loses nothing either: the rows stay, and the next MailProg call or
``slurm-gpu mail --flush`` drains them. Each mail keeps its own bounded waits, counted from
its call (and from its admission for the record), so a late drainer sends at once what has
waited long enough, with what there is.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable

from slurm_gpu.errors import SlurmGpuError, StoreError
from slurm_gpu.notify.service import Notifier, Outcome, Progress
from slurm_gpu.notify.slurmcall import shown
from slurm_gpu.notify.state import PendingMail

#: The lock file's name, next to ``mail-state.db``.
LOCK_NAME = "mail-drain.lock"


class DrainLock:
    """The drainer's exclusive ``flock`` on ``<mail.state_dir>/mail-drain.lock`` (mode 0600,
    opened without following a symbolic link). The lock lives with the open file, so a
    forked child that keeps it open keeps the lock after its parent exits."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_NAME)
        try:
            self._fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            raise StoreError(
                f"cannot open the mail drain lock {self.path}: {exc.strerror}",
                hint="make mail.state_dir a directory of SlurmUser, which runs the mail program",
            ) from None
        self.held = False

    def try_acquire(self) -> bool:
        """Take the lock if no other process holds it; True when this one holds it now."""
        if not self.held:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self.held = True
        return True

    def release(self) -> None:
        """Let go of the lock (the file stays open for another try)."""
        if self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False

    def close(self) -> None:
        """Release and close."""
        self.release()
        os.close(self._fd)


def drain(
    notifier: Notifier,
    lock: DrainLock,
    *,
    fallback: Callable[[PendingMail], None],
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Deal with every waiting mail while holding ``lock``; returns how many were dealt with.

    ``fallback`` hands one mail to the site's mail program (not ours to enrich, or enriching
    failed); ``log`` takes one line. Returns with the lock released.
    """
    if not lock.try_acquire():
        return 0
    state = notifier.state
    progress: dict[str, Progress] = {}
    done = 0
    try:
        while True:
            waiting = state.pending()
            if not waiting:
                lock.release()
                # A call that enqueued while we held the lock found it taken and left its mail
                # to us: look once more, now that it would get the lock itself.
                if not state.pending() or not lock.try_acquire():
                    return done
                continue
            busy = False
            for row in waiting:
                p = progress.setdefault(row.key, Progress(row))
                outcome = _advance(notifier, p, log)
                if outcome is None:
                    busy = True
                    continue
                if outcome is Outcome.FALLBACK:
                    fallback(p.pending)
                state.finish(row.key)
                progress.pop(row.key, None)
                done += 1
            if busy:
                sleep(notifier.opts.poll_interval_s)
    finally:
        lock.release()


def _advance(notifier: Notifier, p: Progress, log: Callable[[str], None]) -> Outcome | None:
    """``Notifier.advance``, where any failure means the fallback (one line in the log): one
    bad mail must neither stop the drainer nor be tried again forever."""
    try:
        return notifier.advance(p)
    except SlurmGpuError as err:
        log(f"job {shown(p.pending.key)}: {err.message}; using the fallback")
    except Exception as exc:  # the drainer must go on with the other mails
        name = type(exc).__name__
        log(f"job {shown(p.pending.key)}: unexpected {name}: {exc}; using the fallback")
    return Outcome.FALLBACK
