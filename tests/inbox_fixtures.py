"""A PostgreSQL store with a record inbox and a node role, on the server of ``share/testpg``.

Each ``inbox_db`` is a fresh schema of the test database (migrated by the collector's role,
which owns it) and a fresh login role granted the inbox (``slurm-gpu store grant-node``), with
its password in a root-only file; both are dropped afterwards. Roles are cluster-wide, so they
are created as the ``postgres`` superuser over the server's socket (peer authentication) with
a random name.
"""

from __future__ import annotations

import functools
import glob
import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from store_fixtures import _pg_exec, _schema_url, postgres_url

from slurm_gpu.capture.pgship import PgTarget

RUN_DIR = "/var/lib/slurm-gpu-testpg/run"


@functools.cache
def base_url() -> str:
    """The test database's URL, asked of ``share/testpg/start`` once per process (it alters
    the collector role's password each time; two at once can fail)."""
    return postgres_url()


def superuser(sql: str) -> None:
    """Run ``sql`` as the ``postgres`` superuser (peer authentication over the socket)."""
    psql = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))[-1]
    url = make_url(base_url())
    port = str(url.port or 5432)
    argv = ["runuser", "-u", "postgres", "--", psql, "-h", RUN_DIR, "-p", port]
    argv += ["-d", str(url.database), "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql]
    subprocess.run(
        argv,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )


@dataclass(frozen=True)
class InboxDb:
    """The collector's store URL, the node role and how a node connects as it."""

    url: str
    schema: str
    role: str
    dsn: str
    password_file: str

    def target(self, **kwargs: object) -> PgTarget:
        return PgTarget(dsn=self.dsn, password_file=self.password_file, **kwargs)  # type: ignore[arg-type]

    def node_sql(self, sql: str) -> list[tuple[object, ...]]:
        """Run ``sql`` as the node role (psycopg, autocommit); the rows it returns."""
        import psycopg

        from slurm_gpu.capture.pgship import connect_params

        with psycopg.connect(**connect_params(self.target())) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def scalar(self, sql: str) -> object:
        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                return conn.exec_driver_sql(sql).scalar()
        finally:
            engine.dispose()


@contextmanager
def inbox_db(tmp: Path, hosts: tuple[str, ...] = ("n1", "n2", "n3")) -> Iterator[InboxDb]:
    """A migrated store in its own schema and a node role granted its inbox, bound to
    ``hosts`` (the tests' role stands in for every node they push as)."""
    from slurm_gpu.store import Store
    from slurm_gpu.store.inbox import grant_node_role

    base = base_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    role = f"sgnode{secrets.token_hex(4)}"
    password = secrets.token_hex(16)
    _pg_exec(base, f"CREATE SCHEMA {schema}")
    superuser(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        url = _schema_url(base, schema)
        with Store.open(url) as store:
            grant_node_role(store.engine, role, hosts)
        parsed = make_url(base)
        password_file = tmp / f"{role}.password"
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        dsn = (
            f"host={parsed.host} port={parsed.port} dbname={parsed.database} user={role} "
            f"options='-csearch_path={schema}'"
        )
        yield InboxDb(url, schema, role, dsn, str(password_file))
    finally:
        _pg_exec(base, f"DROP SCHEMA {schema} CASCADE")
        superuser(f"DROP ROLE IF EXISTS {role}")
