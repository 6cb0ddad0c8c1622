"""The mail program's small state: what was sent to whom and when, the digest queue, and the
mails waiting for the drainer.

A SQLite file (stdlib ``sqlite3``, not the store: the mail program runs as SlurmUser on the
controller, thousands of times in a burst, and must not take the store's write lock or load
its libraries). One short transaction per decision, under SQLite's own locking, so concurrent
mail programs for the tasks of one array agree on who sends and who queues.

It holds recipients and job ids, so it is created mode 0600 (and a wider existing file of ours
is narrowed), opened without following a symbolic link.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

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
CREATE TABLE IF NOT EXISTS pending (
    key TEXT PRIMARY KEY, subject TEXT NOT NULL, recipient TEXT NOT NULL, env TEXT NOT NULL,
    enqueued_s REAL NOT NULL, admitted_s REAL, address TEXT
);
"""

#: Default bound on the mails waiting for the drainer ([mail] max_pending).
MAX_PENDING = 10000

#: ``sent.kind`` values.
KIND_JOB = "job"
KIND_DIGEST = "digest"
KIND_POLICY = "policy"


@dataclass(frozen=True, slots=True)
class PendingMail:
    """One MailProg call waiting for the drainer, as it was made (all times in seconds).

    ``key`` names the job (``array:N`` for a whole-array mail), so a call Slurm repeats is
    held once. ``admitted_s`` is set, in the same transaction as the send decision, once burst
    control let it through; from then on only its record is waited for.
    """

    key: str
    subject: str
    recipient: str
    env: Mapping[str, str] = field(default_factory=dict)
    enqueued_s: float = 0.0
    admitted_s: float | None = None
    address: str | None = None


class Enqueued(StrEnum):
    """What ``MailState.enqueue`` did."""

    ADDED = "added"
    DUPLICATE = "duplicate"
    """The same mail already waits (Slurm called again)."""
    FULL = "full"
    """``max_pending`` mails wait already: this one is not held."""


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
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            _create_private(path)
            self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
            self._db.executescript(_SCHEMA)
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the mail state file {path}: {exc}",
                hint="make mail.state_dir a directory of SlurmUser, which runs the mail program",
            ) from None

    def load_copy_of(self, path: str) -> None:
        """Make this state a copy of the one at ``path`` (read only; nothing if it is missing):
        a dry run's scratch state decides as the real one would, and what it records stays
        here. ``StoreError`` when ``path`` cannot be read."""
        if not os.path.exists(path):
            return
        from urllib.parse import quote

        try:
            src = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=30.0)
            try:
                src.backup(self._db)
            finally:
                src.close()
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot read the mail state file {path}: {exc}",
                hint="run the dry run as root or SlurmUser, who own mail.state_dir",
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
        pending_key: str | None = None,
    ) -> bool:
        """Whether to send this job's message now (and record it); otherwise queue it.

        At most ``max_per_window`` single messages per user in any ``window_s``; the rest wait
        for a digest. A job already sent or queued is not admitted twice. ``pending_key``: the
        waiting mail this decision is about, marked admitted in the same transaction (so a
        drainer that dies after the decision leaves a mail that is still sent, not dropped).
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
                if pending_key is not None:
                    db.execute(
                        "UPDATE pending SET admitted_s=?, address=? WHERE key=?",
                        (now_s, recipient, pending_key),
                    )
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

    def enqueue(self, mail: PendingMail, *, max_pending: int = MAX_PENDING) -> Enqueued:
        """Hold ``mail`` for the drainer, unless it waits already or ``max_pending`` do."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM pending WHERE key=?", (mail.key,)).fetchone():
                return Enqueued.DUPLICATE
            (count,) = db.execute("SELECT COUNT(*) FROM pending").fetchone()
            if count >= max_pending:
                return Enqueued.FULL
            db.execute(
                "INSERT INTO pending VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    mail.key,
                    mail.subject,
                    mail.recipient,
                    json.dumps(dict(mail.env), sort_keys=True),
                    mail.enqueued_s,
                    mail.admitted_s,
                    mail.address,
                ),
            )
            return Enqueued.ADDED

    def pending(self) -> list[PendingMail]:
        """The mails waiting for the drainer, oldest first."""
        rows = self._db.execute(
            "SELECT key, subject, recipient, env, enqueued_s, admitted_s, address FROM pending "
            "ORDER BY enqueued_s, key"
        ).fetchall()
        out = []
        for key, subject, recipient, env, enqueued_s, admitted_s, address in rows:
            try:
                parsed = json.loads(env)
            except ValueError:
                parsed = {}
            env_map = (
                {str(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}
            )
            out.append(
                PendingMail(key, subject, recipient, env_map, enqueued_s, admitted_s, address)
            )
        return out

    def finish(self, key: str) -> None:
        """The waiting mail ``key`` was dealt with (sent, queued, or handed to the fallback)."""
        with self._tx() as db:
            db.execute("DELETE FROM pending WHERE key=?", (key,))

    def queued(self) -> Sequence[Queued]:
        """Everything queued, for tests and ``--flush`` reporting."""
        rows = self._db.execute(
            "SELECT user, recipient, job_id, time_s FROM queued ORDER BY time_s"
        ).fetchall()
        return [Queued(*row) for row in rows]


def _create_private(path: str) -> None:
    """Create ``path`` mode 0600 if it is missing, without following a symbolic link; narrow
    an existing file of ours that others could read. ``StoreError`` when it is no plain file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreError(
            f"cannot open the mail state file {path}: {exc.strerror}",
            hint="it must be a plain file (not a symbolic link) in a directory SlurmUser writes",
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"the mail state file {path} is not a regular file")
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


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
