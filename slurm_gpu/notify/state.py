"""The mail program's small state: what was sent to whom and when, and the digest queue.

A SQLite file (stdlib ``sqlite3``, not the store: the mail program runs as SlurmUser on the
controller, thousands of times in a burst, and must not take the store's write lock or load
its libraries). One short transaction per decision, under SQLite's own locking, so concurrent
mail programs for the tasks of one array agree on who sends and who queues.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from slurm_gpu.errors import StoreError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sent (
    user TEXT NOT NULL, kind TEXT NOT NULL, job_id TEXT NOT NULL, time_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sent_user_time ON sent (user, kind, time_s);
CREATE TABLE IF NOT EXISTS queued (
    user TEXT NOT NULL, recipient TEXT NOT NULL, job_id TEXT NOT NULL, time_s REAL NOT NULL,
    PRIMARY KEY (user, job_id)
);
"""

#: ``sent.kind`` values.
KIND_JOB = "job"
KIND_DIGEST = "digest"
KIND_POLICY = "policy"


@dataclass(frozen=True, slots=True)
class Queued:
    """A job whose message waits for the user's next digest."""

    user: str
    recipient: str
    job_id: str
    time_s: float


class MailState:
    """Open with ``MailState(path)``; every method is one transaction."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the mail state file {path}: {exc}",
                hint="make paths.state_dir writable by SlurmUser, which runs the mail program",
            ) from None

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front: two mail programs deciding at once
        # are serialised instead of both reading "0 sent" and both sending.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def admit(
        self,
        user: str,
        recipient: str,
        job_id: str,
        *,
        now_s: float,
        window_s: float,
        max_per_window: int,
    ) -> bool:
        """Whether to send this job's message now (and record it); otherwise queue it.

        At most ``max_per_window`` single messages per user in any ``window_s``; the rest wait
        for a digest. A job already sent or queued is not admitted twice.
        """
        with self._tx() as db:
            dup = db.execute(
                "SELECT 1 FROM sent WHERE user=? AND job_id=? AND kind=? "
                "UNION SELECT 1 FROM queued WHERE user=? AND job_id=?",
                (user, job_id, KIND_JOB, user, job_id),
            ).fetchone()
            if dup:
                return False
            (count,) = db.execute(
                "SELECT COUNT(*) FROM sent WHERE user=? AND kind IN (?, ?) AND time_s > ?",
                (user, KIND_JOB, KIND_DIGEST, now_s - window_s),
            ).fetchone()
            if count < max_per_window:
                db.execute("INSERT INTO sent VALUES (?, ?, ?, ?)", (user, KIND_JOB, job_id, now_s))
                return True
            db.execute(
                "INSERT OR IGNORE INTO queued VALUES (?, ?, ?, ?)",
                (user, recipient, job_id, now_s),
            )
            return False

    def take_due_digests(self, *, now_s: float, window_s: float) -> dict[str, list[Queued]]:
        """Remove and return, per user, the queue of every user whose oldest queued job has
        waited a whole window (so one digest covers a burst); records the digests as sent."""
        with self._tx() as db:
            users = [
                u
                for (u,) in db.execute(
                    "SELECT user FROM queued GROUP BY user HAVING MIN(time_s) <= ?",
                    (now_s - window_s,),
                )
            ]
            out: dict[str, list[Queued]] = {}
            for user in users:
                rows = db.execute(
                    "SELECT user, recipient, job_id, time_s FROM queued WHERE user=? "
                    "ORDER BY time_s, job_id",
                    (user,),
                ).fetchall()
                out[user] = [Queued(*row) for row in rows]
                db.execute("DELETE FROM queued WHERE user=?", (user,))
                db.execute(
                    "INSERT INTO sent VALUES (?, ?, ?, ?)",
                    (user, KIND_DIGEST, ",".join(q.job_id for q in out[user])[:1000], now_s),
                )
            return out

    def admit_policy(self, user: str, job_id: str, *, now_s: float, period_s: float) -> bool:
        """Whether the site-policy mail about ``job_id`` may go to ``user`` (at most one per
        user per ``period_s``); records it when admitted."""
        with self._tx() as db:
            recent = db.execute(
                "SELECT 1 FROM sent WHERE user=? AND kind=? AND time_s > ?",
                (user, KIND_POLICY, now_s - period_s),
            ).fetchone()
            if recent:
                return False
            db.execute("INSERT INTO sent VALUES (?, ?, ?, ?)", (user, KIND_POLICY, job_id, now_s))
            return True

    def forget_before(self, cutoff_s: float) -> None:
        """Drop sent-records older than ``cutoff_s`` (they no longer affect any decision)."""
        with self._tx() as db:
            db.execute("DELETE FROM sent WHERE time_s < ?", (cutoff_s,))

    def queued(self) -> Sequence[Queued]:
        """Everything queued, for tests and ``--flush`` reporting."""
        rows = self._db.execute(
            "SELECT user, recipient, job_id, time_s FROM queued ORDER BY time_s"
        ).fetchall()
        return [Queued(*row) for row in rows]


def read_opt_out(path: str) -> frozenset[str]:
    """User names, one per line (``#`` comments), who never get policy mails; empty if no file."""
    if not path:
        return frozenset()
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return frozenset()
    except OSError as exc:
        raise StoreError(f"cannot read the opt-out list {path}: {exc.strerror}") from None
    return frozenset(ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip())
