"""Shipping sealed records into the store's PostgreSQL inbox (``[ship] transport =
"postgresql"``), for clusters with no directory shared between the nodes and the collector.

Each sealed ``<job>/<host>.record`` in the node's spool is inserted into ``record_inbox`` with
its SHA-256 (the row's key with the job id and host), as a role that may only insert there
(``slurm_gpu.store.inbox``, ``docs/transport.md``). Every INSERT commits on its own
(autocommit); only after that commit are the node's files of the record removed. A node killed
between the commit and the removal pushes the same bytes again on the next pass, which the key
turns into a no-op (``ON CONFLICT DO NOTHING``); a node killed before the commit still has its
record. So a record is in the spool or in the store's server, never nowhere.

A node must never hang on the server: the connection has a connect timeout, every statement a
server-side ``statement_timeout``, and the socket TCP keepalives and ``tcp_user_timeout``, so a
silent network fails the pass (the records stay for the next) instead of blocking the timer.
psycopg is imported on first use: nodes on the directory transport never need it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_gpu.capture.ship import ShipResult, remove_local
from slurm_gpu.capture.spool import JobSpool, list_sealed
from slurm_gpu.errors import ConfigError

#: Largest record pushed (bytes): the inbox table's own bound (``store.inbox``).
MAX_RECORD_BYTES = 64 << 20
#: Largest password file read (bytes).
_MAX_PASSWORD_BYTES = 4096

INSERT_SQL = (
    "INSERT INTO record_inbox (job_id, host, digest, record) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT DO NOTHING"
)


@dataclass(frozen=True, slots=True)
class PgTarget:
    """Where and how a node connects (``[ship]`` settings)."""

    dsn: str
    """libpq connection string, without a password."""
    password_file: str = ""
    """Root's file holding the password; empty: peer or certificate authentication."""
    connect_timeout_s: int = 10
    statement_timeout_s: float = 30.0


def record_digest(data: bytes) -> str:
    """SHA-256 of a record's bytes, lower-case hex: the inbox key (``store.inbox`` too)."""
    return hashlib.sha256(data).hexdigest()


def read_password(path: str) -> str:
    """The password in ``path``: a regular file of root (or the caller) that no other account
    may read or write, in directories no other account may write (``slurm_gpu.trust``).
    Raises ``ConfigError``."""
    from slurm_gpu.trust import require_trusted_fd

    fd = require_trusted_fd(path, key="ship.password_file")
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise ConfigError(
                f"the password file is readable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o})",
                key="ship.password_file",
                path=path,
                hint="chmod 0600 it: it is the node's credential",
            )
        raw = fh.read(_MAX_PASSWORD_BYTES + 1)
    if len(raw) > _MAX_PASSWORD_BYTES:
        raise ConfigError("longer than a password", key="ship.password_file", path=path)
    return raw.decode("utf-8", "replace").strip("\r\n")


def connect_params(target: PgTarget) -> dict[str, Any]:
    """The keyword arguments of ``psycopg.connect`` for ``target``: the DSN's own keys, the
    password from its file, and the timeouts. Raises ``ConfigError`` for a DSN that cannot
    be parsed or that holds a password."""
    from psycopg.conninfo import conninfo_to_dict

    if not target.dsn:
        raise ConfigError(
            "no PostgreSQL server to ship to",
            key="ship.postgresql_dsn",
            hint="set it to the inbox role's connection string (host=... dbname=... user=...)",
        )
    try:
        params: dict[str, Any] = dict(conninfo_to_dict(target.dsn))
    except Exception as exc:  # psycopg.ProgrammingError, with libpq's reason
        raise ConfigError(
            f"not a libpq connection string ({exc})",
            key="ship.postgresql_dsn",
            hint="write it as host=... port=... dbname=... user=...",
        ) from None
    if "password" in params or "passfile" in params:
        raise ConfigError(
            "the connection string names a password",
            key="ship.postgresql_dsn",
            hint="the configuration file is readable by every user: put the password in "
            "ship.password_file (root's, 0600) or use peer or certificate authentication",
        )
    if target.password_file:
        params["password"] = read_password(target.password_file)
    statement_ms = int(target.statement_timeout_s * 1000)
    bound = f"-c statement_timeout={statement_ms} -c lock_timeout={statement_ms}"
    params["options"] = f"{params.get('options', '')} {bound}".strip()
    params.update(
        connect_timeout=target.connect_timeout_s,
        # A silent network: unacknowledged data fails the socket after the statement's
        # bound, an idle wait for an answer after the keepalives give up.
        tcp_user_timeout=statement_ms,
        keepalives=1,
        keepalives_idle=max(1, int(target.statement_timeout_s)),
        keepalives_interval=5,
        keepalives_count=3,
        application_name="slurm-gpu ship",
        autocommit=True,
    )
    return params


def _connect(target: PgTarget) -> Any:
    import psycopg

    return psycopg.connect(**connect_params(target))


def ship_postgresql(
    spool_dir: str, target: PgTarget, *, connect: Callable[[PgTarget], Any] | None = None
) -> ShipResult:
    """Push every sealed record in ``spool_dir`` into the inbox, then tidy the node's files.

    A record whose sampler is still running (a pid file) is left alone; a record that fails
    (too large, refused by the server) stays in the spool and the others go on; a connection
    that cannot be made or breaks fails the records not shipped yet. ``connect`` opens the
    connection (tests); raises ``ConfigError`` for bad settings.
    """
    shipped: list[str] = []
    failed: list[tuple[str, str]] = []
    todo = []
    for sealed in list_sealed(spool_dir):
        local = JobSpool(spool_dir, sealed.job_id, sealed.hostname)
        if not os.path.exists(local.pid):
            todo.append((sealed, local))
    if not todo:
        return ShipResult((), ())
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "ship.transport = postgresql, but psycopg is not installed on this node",
            key="ship.transport",
            hint="install slurm-gpu[postgresql] here, or use the directory transport",
        ) from None

    try:
        conn = (connect or _connect)(target)
    except psycopg.Error as exc:
        reason = f"cannot connect: {_one_line(exc)}"
        return ShipResult((), tuple((f"{s.job_id}/{s.hostname}", reason) for s, _ in todo))
    with conn:
        for i, (sealed, local) in enumerate(todo):
            name = f"{sealed.job_id}/{sealed.hostname}"
            try:
                data = _read_bounded(sealed.path)
            except OSError as exc:
                failed.append((name, exc.strerror or str(exc)))
                continue
            if len(data) > MAX_RECORD_BYTES:
                failed.append((name, f"larger than {MAX_RECORD_BYTES} bytes; left in the spool"))
                continue
            try:
                conn.execute(
                    INSERT_SQL, (sealed.job_id, sealed.hostname, record_digest(data), data)
                )
            except psycopg.Error as exc:
                failed.append((name, _one_line(exc)))
                if conn.closed or conn.broken:
                    reason = "not tried: the connection was lost"
                    failed += [(f"{s.job_id}/{s.hostname}", reason) for s, _ in todo[i + 1 :]]
                    break
                continue
            # Committed (autocommit): only now may the node's copy go.
            remove_local(local)
            shipped.append(name)
    return ShipResult(tuple(shipped), tuple(failed))


def _read_bounded(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(MAX_RECORD_BYTES + 1)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
