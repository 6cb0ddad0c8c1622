"""Numbered, named, ordered schema migrations.

The ``schema_version`` table holds one row per applied migration. ``migrate`` applies, in order
and each in its own transaction, every migration whose number is above the highest applied
one, so running it again is a no-op. A store whose version is above the newest migration this
release knows was written by a newer release: it is refused rather than guessed at.

Adding a migration: append ``Migration(N + 1, "what it does", function)`` to ``MIGRATIONS`` and
change ``slurm_gpu.store.schema`` to the resulting schema. Migration 1 creates the tables from
``schema.metadata``; the first migration that alters a table must freeze the version-1 table
definitions here so that a fresh store still passes through every step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Index, MetaData, Table, func, inspect, select, text

from slurm_gpu.errors import StoreError
from slurm_gpu.store import schema


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: its number, a short name, and the DDL it runs on a connection."""

    version: int
    name: str
    apply: Callable[[Connection], None]


def _v1_tables() -> list[Table]:
    """The version-1 tables: today's declarations without the columns (and the indexes on
    them) that later migrations add, in a metadata of their own."""
    frozen = MetaData()
    out = []
    for table in schema.metadata.sorted_tables:
        if table.name not in schema.V1_TABLES:
            continue
        later = set(schema.LATER_COLUMNS.get(table.name, ()))
        if not later:
            out.append(table.to_metadata(frozen))
            continue
        copy = Table(table.name, frozen, *(c._copy() for c in table.columns if c.name not in later))
        for index in table.indexes:
            names = [c.name for c in index.columns]
            if not later & set(names):
                Index(index.name, *(copy.c[n] for n in names), unique=index.unique)
        out.append(copy)
    return out


def _m1_create_tables(conn: Connection) -> None:
    # Only the version-1 tables and columns: a fresh store passes through every later step
    # too. Their indexes are created as declared now, so a later migration that adds an index
    # to them creates it only where it is missing (``checkfirst``).
    tables = _v1_tables()
    tables[0].metadata.create_all(conn, tables=tables)


def _m2_job_reports(conn: Connection) -> None:
    schema.metadata.create_all(conn, tables=[schema.job_reports])


def _m3_het_index(conn: Connection) -> None:
    schema.ix_jobs_het.create(conn, checkfirst=True)


#: Columns of migration 4: (table, column, SQL type).
_M4_COLUMNS = (
    ("jobs", "steps_json", "TEXT"),
    ("job_gpus", "process_list_unread", "INTEGER"),
    ("job_gpus", "stall_grid", "TEXT"),
)


def _add_missing_columns(conn: Connection, columns: tuple[tuple[str, str, str], ...]) -> None:
    """Add each (table, column, SQL type) only where the store lacks it: migration 1 creates
    its tables as declared now, with the later columns. Nullable columns without a default, so
    the change is instant on SQLite and PostgreSQL, and rows stored before keep NULL: not
    known."""
    for table, column, sql_type in columns:
        if column not in {c["name"] for c in inspect(conn).get_columns(table)}:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))


def _m4_steps_and_signals(conn: Connection) -> None:
    _add_missing_columns(conn, _M4_COLUMNS)


def _m5_row_security(conn: Connection) -> None:
    from slurm_gpu.store.visibility import enable_row_security

    enable_row_security(conn)


def _m6_timeline_pruned(conn: Connection) -> None:
    _add_missing_columns(conn, (("jobs", "timeline_pruned_s", "FLOAT"),))
    schema.ix_jobs_pruned_end.create(conn, checkfirst=True)


def _m7_live_actions(conn: Connection) -> None:
    from slurm_gpu.store.visibility import secure_live_actions

    schema.metadata.create_all(conn, tables=[schema.live_actions])
    secure_live_actions(conn)


def _m8_record_inbox(conn: Connection) -> None:
    from slurm_gpu.store.inbox import create_inbox

    create_inbox(conn)


def _m9_memory_utilization(conn: Connection) -> None:
    _add_missing_columns(conn, (("job_gpus", "memory_util_mean_pct", "FLOAT"),))


def _m10_inbox_hosts(conn: Connection) -> None:
    from slurm_gpu.store.inbox import bind_inbox_hosts

    bind_inbox_hosts(conn)


def _m11_request_text(conn: Connection) -> None:
    _add_missing_columns(
        conn,
        (
            ("jobs", "submit_line", "TEXT"),
            ("jobs", "batch_directives", "TEXT"),
            ("jobs", "reason", "TEXT"),
        ),
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "create jobs, job_hosts, job_gpus, timelines and findings", _m1_create_tables),
    Migration(2, "create job_reports (gpueff's rendered reports)", _m2_job_reports),
    Migration(3, "index jobs.het_job_id (typed-id lookups without a table scan)", _m3_het_index),
    Migration(
        4,
        "add jobs.steps_json (per-step CPUs, GPUs, state, exit code, CPU time), "
        "job_gpus.process_list_unread and job_gpus.stall_grid",
        _m4_steps_and_signals,
    ),
    Migration(
        5,
        "PostgreSQL: row-level security (each role reads the jobs Slurm shows it)",
        _m5_row_security,
    ),
    Migration(
        6,
        "add jobs.timeline_pruned_s and its index (retention: which jobs' timelines are gone)",
        _m6_timeline_pruned,
    ),
    Migration(
        7, "create live_actions (the live policy's warnings and cancellations)", _m7_live_actions
    ),
    Migration(
        8,
        "PostgreSQL: record inbox for nodes without a shared filesystem (insert-only role)",
        _m8_record_inbox,
    ),
    Migration(
        9,
        "add job_gpus.memory_util_mean_pct (memory bandwidth: busy-but-nearly-empty GPUs)",
        _m9_memory_utilization,
    ),
    Migration(
        10,
        "PostgreSQL: bind each inbox writer (node role) to the hosts it may push records for",
        _m10_inbox_hosts,
    ),
    Migration(
        11,
        "add jobs.submit_line, jobs.batch_directives and jobs.reason (the job's own request "
        "style and Slurm's state reason, for re-analysis from the store)",
        _m11_request_text,
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version


def current_version(conn: Connection) -> int:
    """The highest applied migration, 0 for an empty database."""
    if not inspect(conn).has_table("schema_version"):
        return 0
    version = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
    return int(version or 0)


def _lock(conn: Connection) -> None:
    """Serialise concurrent migrators (two collectors started at once)."""
    if conn.dialect.name == "postgresql":
        # Held until the transaction ends; the key is arbitrary but fixed.
        conn.execute(text("SELECT pg_advisory_xact_lock(7245031)"))
    # SQLite: the store begins write transactions with BEGIN IMMEDIATE, which already excludes
    # every other writer.


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that takes the write lock at once (SQLite: BEGIN IMMEDIATE)."""
    with engine.connect() as conn:
        conn.execution_options(sqlite_write=True)
        with conn.begin():
            yield conn


def migrate(engine: Engine) -> list[Migration]:
    """Bring the store to ``LATEST_VERSION``; return the migrations applied (empty: none)."""
    applied: list[Migration] = []
    with write_transaction(engine) as conn:
        _lock(conn)
        schema.schema_version.create(conn, checkfirst=True)
        version = current_version(conn)
    if version > LATEST_VERSION:
        raise StoreError(
            f"store schema version {version} is newer than this release knows ({LATEST_VERSION})",
            hint="upgrade slurm-gpu on this host to the release that wrote the store",
        )
    for migration in MIGRATIONS:
        with write_transaction(engine) as conn:
            _lock(conn)
            # Re-read inside the lock: another process may have applied it meanwhile.
            if migration.version <= current_version(conn):
                continue
            migration.apply(conn)
            conn.execute(
                schema.schema_version.insert().values(
                    version=migration.version, name=migration.name, applied_at_s=time.time()
                )
            )
        applied.append(migration)
    return applied
