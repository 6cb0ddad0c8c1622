"""A read-only path to a SQLite store over the standard library's ``sqlite3``, for ``gpueff``.

``Store`` needs SQLAlchemy, whose import alone costs 0.4 s on the reference VM, longer than
``seff`` takes to answer (``docs/performance.md``). This reader runs the same queries as
``Store.get_job`` with ``sqlite3`` and hands the rows to the converters of
``slurm_gpu.store.rows``, so it returns the very same ``StoredJob`` records (a contract test
checks it). PostgreSQL stores keep the SQLAlchemy path.

The file is opened ``mode=ro``: a user who may read the file but not write its directory can
open it because the store uses a rollback journal, not WAL (``docs/store.md``). Every read of
several tables runs in one transaction, so it sees one committed state even while the
collector commits.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from slurm_gpu.errors import (
    StoreBehindError,
    StoreDeniedError,
    StoreError,
    StoreNotCreatedError,
)
from slurm_gpu.store import rows
from slurm_gpu.store.rows import StoredJob
from slurm_gpu.store.urls import readonly_uri
from slurm_gpu.store.urls import sqlite_path as sqlite_path

#: The schema version these queries are written for; a test keeps it equal to
#: ``migrations.LATEST_VERSION``, so a new migration cannot forget this reader.
SCHEMA_VERSION = 11

#: Ids per ``IN (...)`` list, as in ``Store``.
_CHUNK = 500

#: What a read returns of the timelines: none (``False``), every column (``True``), or GPU
#: utilization alone (``"utilization"``: what a report's sparklines use, decoded in about half
#: the time; ``codec.decode_timeline``).
Timelines = bool | Literal["utilization"]


def _row_factory(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Any:
    # Rows with the columns as attributes, like SQLAlchemy's, for the shared converters.
    row_type: Any = _ROW_TYPES.get(cursor.description)
    if row_type is None:
        row_type = _ROW_TYPES[cursor.description] = _new_row_type(
            [d[0] for d in cursor.description]
        )
    return row_type(*row)


def _new_row_type(names: list[str]) -> Any:
    return namedtuple("StoreRow", names, rename=True)


#: Row classes by the column names of a query (one per query shape).
_ROW_TYPES: dict[Any, Any] = {}


class SqliteReader:
    """Read stored jobs from a SQLite store file without SQLAlchemy. Never writes.

    Open with ``SqliteReader.open(path)``; raises ``StoreError`` like ``Store``.
    """

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: str, *, busy_timeout_s: float = 30.0) -> SqliteReader:
        """Open ``path`` read-only and check its schema version (``StoreError`` when the file
        cannot be read, is not a store, or is behind this release)."""
        try:
            os.stat(path)
        except FileNotFoundError:
            raise StoreNotCreatedError(
                f"store {path} does not exist yet",
                hint="the first 'slurm-gpu collect' creates it",
            ) from None
        except OSError as exc:
            # Not "not created": the mail program would wait for it forever.
            denied = exc.errno in (errno.EACCES, errno.EPERM)
            raise (StoreDeniedError if denied else StoreError)(
                f"store {path}: {exc.strerror}",
                hint="the store is readable by root and [store] admin_group only; users get "
                "their own ended jobs from the report files the collector writes for them "
                "(docs/gpueff.md, 'Who can see what')",
            ) from None
        uri = readonly_uri(path)
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise _error(path, exc) from None
        conn.row_factory = _row_factory
        reader = cls(conn, path)
        try:
            version = reader._schema_version()
        except StoreError:
            conn.close()
            raise
        if version < SCHEMA_VERSION:
            conn.close()
            raise StoreBehindError(
                f"store at {path} is at schema version {version}, "
                f"this release needs {SCHEMA_VERSION}",
                hint="run: slurm-gpu store migrate",
            )
        return reader

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> SqliteReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _schema_version(self) -> int:
        try:
            found = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
            ).fetchone()
            if found is None:
                return 0
            (version,) = self._conn.execute("SELECT max(version) FROM schema_version").fetchone()
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        return int(version or 0)

    # ----------------------------------------------------------------- reads

    def get_job(self, job_id: str, *, timelines: Timelines = False) -> StoredJob | None:
        """The stored job, or ``None`` when it is not in the store (as ``Store.get_job``)."""
        jobs = self._load("job_id = ?", (job_id,), timelines=timelines)
        return jobs[0] if jobs else None

    def jobs_for_ids(self, ids: Iterable[str], *, timelines: Timelines = False) -> list[StoredJob]:
        """Every stored job that a user-typed id may name: the job itself, the tasks of an
        array and the components of a heterogeneous job (``1234``), one array task
        (``1234_7``) or one component (``1234+0``). Oldest end first.

        Callers match the result against what accounting returned: it may hold more jobs than
        the ids strictly name (an id that is both a job and an array id).
        """
        plain: list[str] = []
        tasks: list[tuple[str, str]] = []
        components: list[tuple[str, int]] = []
        for text in dict.fromkeys(ids):
            job, _, task = text.partition("_")
            if task:
                if task.isdigit():
                    tasks.append((job, task))
                else:
                    plain.append(job)  # a range: every task, matched later
                continue
            het, _, offset_text = text.partition("+")
            if offset_text.isdigit():
                components.append((het, int(offset_text)))
            elif text.isdigit():
                plain.append(text)
        out: list[StoredJob] = []
        for chunk in _chunks(plain):
            marks = ",".join("?" * len(chunk))
            where = f"job_id IN ({marks}) OR array_job_id IN ({marks}) OR het_job_id IN ({marks})"
            out += self._load(where, (*chunk, *chunk, *chunk), timelines=timelines)
        for job, task in tasks:
            out += self._load(
                "array_job_id = ? AND array_task_id = ?", (job, task), timelines=timelines
            )
        for het, het_offset in components:
            out += self._load(
                "het_job_id = ? AND het_job_offset = ?", (het, het_offset), timelines=timelines
            )
        return out

    def user_jobs(
        self,
        user: str,
        start_s: float,
        end_s: float,
        *,
        limit: int,
        timelines: Timelines = False,
    ) -> list[StoredJob]:
        """The newest (by submit time) ``limit`` stored jobs of ``user`` that ended at or after
        ``start_s`` and were submitted before ``end_s``; oldest end first."""
        return self._load(
            "job_id IN (SELECT job_id FROM jobs WHERE user = ? AND end_s >= ? AND "
            "(submit_s IS NULL OR submit_s <= ?) ORDER BY submit_s DESC, job_id DESC LIMIT ?)",
            (user, start_s, end_s, limit),
            timelines=timelines,
        )

    def _load(self, where: str, params: Sequence[Any], *, timelines: Timelines) -> list[StoredJob]:
        """The jobs matching ``where`` with their child rows, read in one transaction (one
        consistent snapshot), in the order ``Store`` reads them."""
        ids = f"SELECT job_id FROM jobs WHERE {where}"
        conn = self._conn
        try:
            conn.execute("BEGIN")
            try:
                job_rows = conn.execute(
                    f"SELECT * FROM jobs WHERE {where} ORDER BY end_s, job_id", params
                ).fetchall()
                if not job_rows:
                    return []
                hosts = rows.group_by_job(
                    conn.execute(
                        f"SELECT * FROM job_hosts WHERE job_id IN ({ids}) ORDER BY job_id, host",
                        params,
                    ).fetchall()
                )
                gpus = rows.group_by_job(
                    conn.execute(
                        f"SELECT * FROM job_gpus WHERE job_id IN ({ids}) "
                        "ORDER BY job_id, host, position",
                        params,
                    ).fetchall()
                )
                findings = rows.group_by_job(
                    conn.execute(
                        f"SELECT * FROM findings WHERE job_id IN ({ids}) ORDER BY job_id, seq",
                        params,
                    ).fetchall()
                )
                tls = (
                    rows.group_by_job(
                        conn.execute(
                            f"SELECT * FROM timelines WHERE job_id IN ({ids})", params
                        ).fetchall()
                    )
                    if timelines
                    else {}
                )
                # The live policy's actions on these jobs (schema version 7), for the report.
                actions = rows.group_by_job(
                    conn.execute(
                        f"SELECT * FROM live_actions WHERE job_id IN ({ids}) "
                        "ORDER BY job_id, at_s, id",
                        params,
                    ).fetchall()
                )
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        return [
            rows.stored_job(
                r,
                hosts.get(r.job_id, []),
                gpus.get(r.job_id, []),
                findings.get(r.job_id, []),
                tls.get(r.job_id, []),
                utilization_only=timelines == "utilization",
                action_rows=actions.get(r.job_id, []),
            )
            for r in job_rows
        ]


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _error(path: str, exc: sqlite3.Error) -> StoreError:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    hint = "check that the store file exists and that you may read it, then ask your admins"
    if "readonly" in detail or "read-only" in detail:
        # A WAL store of an earlier release, or a commit the collector left half done (a hot
        # journal): both need one write by the owner, which any collector run does.
        hint = (
            "the store needs its owner to open it once (WAL mode from an earlier release, or "
            "an interrupted commit): run `slurm-gpu store migrate` as the collector's user"
        )
    return StoreError(f"store {path}: {detail}", hint=hint)
