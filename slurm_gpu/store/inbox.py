"""The PostgreSQL inbox: sealed node records pushed into the store's own server.

Sites that will not share a directory between the nodes and the collector (an NFS inbox needs
root on every node to write it, so no ``root_squash``) set ``[ship] transport = "postgresql"``:
each node's ``slurm-gpu ship`` inserts its sealed records into ``record_inbox``
(``slurm_gpu.capture.pgship``) as a role that may do nothing else, and the collector takes them
from there (``PgInbox``) in the transaction that stores their job.

Migration 8 (PostgreSQL only; nothing on SQLite) creates:

- ``record_inbox``: one row per pushed record, keyed by (job id, host, SHA-256 of the bytes):
  a re-push of the same record (a node killed between the commit and removing its file) is a
  conflict that ``ON CONFLICT DO NOTHING`` turns into a no-op. Checks bound what a node can
  put there (a decimal job id, a short host name, at most ``MAX_RECORD_BYTES``).
- ``record_quarantine``: records the collector could not ingest (corrupt, wrong digest, or
  refused by the accounting cross-check), with the reason; never retried, never fatal.
- ``inbox_writers``: the roles granted the inbox (``grant_node_role``). Migration 5 lets every
  role read the job tables under row-level security (and ``visibility``, ``visibility_policy``
  and ``schema_version`` whole); a restrictive policy now hides every row of those from the
  inbox writers, so a node's credential reads nothing, even where ``PrivateData`` is off.

The node role gets ``INSERT`` on four columns of ``record_inbox`` and nothing else: it cannot
read, change or delete a record (its own included), and cannot set the time received or the
sender, which the server fills in.

Migration 10 binds each inbox writer to the host names it may push for
(``inbox_writer_hosts``; by default the role's own name, ``grant_node_role(..., hosts=)``
otherwise). The collector takes only rows whose sender is bound to the row's host and whose
sealed record names that host; any other row of an inbox writer is quarantined with the
reason and logged, never stored (``sender_refusal``): one node's credential no longer pushes
records for another node.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from slurm_gpu.errors import SpoolFormatError, StoreError

log = logging.getLogger(__name__)

#: Largest record the inbox accepts (bytes), the collector's bound on a record file.
MAX_RECORD_BYTES = 64 << 20

#: Tables of migrations 5 and 7 that every role may read (``GRANT SELECT ... TO PUBLIC``), now
#: hidden from inbox writers by a policy.
PUBLIC_TABLES = (
    "jobs",
    "job_hosts",
    "job_gpus",
    "timelines",
    "findings",
    "job_reports",
    "live_actions",
    "visibility",
    "visibility_policy",
    "schema_version",
)
#: Tables of migrations 8 and 10.
INBOX_TABLES = ("record_inbox", "record_quarantine", "inbox_writers", "inbox_writer_hosts")
#: A host name as ``record_inbox.host`` accepts it.
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
#: The columns a node role may insert.
NODE_COLUMNS = ("job_id", "host", "digest", "record")

_DDL = (
    f"""
CREATE TABLE IF NOT EXISTS record_inbox (
    job_id text NOT NULL CHECK (job_id ~ '^[0-9]{{1,20}}$'),
    host text NOT NULL CHECK (host ~ '^[A-Za-z0-9][A-Za-z0-9._-]{{0,254}}$'),
    digest text NOT NULL CHECK (digest ~ '^[0-9a-f]{{64}}$'),
    record bytea NOT NULL CHECK (octet_length(record) <= {MAX_RECORD_BYTES}),
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_by text NOT NULL DEFAULT session_user,
    PRIMARY KEY (job_id, host, digest)
)""",
    "CREATE INDEX IF NOT EXISTS ix_record_inbox_received ON record_inbox (received_at)",
    """
CREATE TABLE IF NOT EXISTS record_quarantine (
    job_id text NOT NULL,
    host text NOT NULL,
    digest text NOT NULL,
    record bytea NOT NULL,
    received_at timestamptz NOT NULL,
    sent_by text NOT NULL,
    reason text NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, host, digest)
)""",
    "CREATE TABLE IF NOT EXISTS inbox_writers (role_name text PRIMARY KEY)",
    # SECURITY DEFINER: the invoking role cannot read inbox_writers itself.
    """
CREATE OR REPLACE FUNCTION slurm_gpu_inbox_writer(role_name text)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT EXISTS (SELECT 1 FROM inbox_writers w WHERE w.role_name = $1)
$$
""",
)


def create_inbox(conn: Connection) -> None:
    """Migration 8 on PostgreSQL (nothing on SQLite): the inbox tables, and no row of any
    table readable by an inbox writer."""
    if conn.dialect.name != "postgresql":
        return
    run = conn.exec_driver_sql
    for ddl in _DDL:
        run(ddl)
    # Evaluated once per query (an InitPlan), not once per row.
    hidden = "(SELECT NOT slurm_gpu_inbox_writer(current_user))"
    for table in PUBLIC_TABLES:
        run(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        run(f"DROP POLICY IF EXISTS {table}_not_inbox ON {table}")
        run(
            f"CREATE POLICY {table}_not_inbox ON {table} AS RESTRICTIVE FOR SELECT USING ({hidden})"
        )
        if table in ("visibility", "visibility_policy", "schema_version"):
            # Tables without a read policy of migration 5: readable by every other role.
            run(f"DROP POLICY IF EXISTS {table}_read ON {table}")
            run(f"CREATE POLICY {table}_read ON {table} FOR SELECT USING (true)")


_HOST_BINDING_DDL = (
    """
CREATE TABLE IF NOT EXISTS inbox_writer_hosts (
    role_name text NOT NULL REFERENCES inbox_writers (role_name) ON DELETE CASCADE,
    host text NOT NULL CHECK (host ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$'),
    PRIMARY KEY (role_name, host)
)""",
    # Roles granted before: bound to the host of their own name (rebind with grant-node --host).
    "INSERT INTO inbox_writer_hosts (role_name, host) SELECT role_name, lower(role_name) "
    "FROM inbox_writers WHERE role_name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$' "
    "ON CONFLICT DO NOTHING",
)


def bind_inbox_hosts(conn: Connection) -> None:
    """Migration 10 on PostgreSQL (nothing on SQLite): ``inbox_writer_hosts``, each existing
    inbox writer bound to the host named like the role."""
    if conn.dialect.name != "postgresql":
        return
    for ddl in _HOST_BINDING_DDL:
        conn.exec_driver_sql(ddl)


def sender_refusal(
    row_host: str, sent_by: str, bindings: Mapping[str, Collection[str]]
) -> str | None:
    """Why a row that ``sent_by`` pushed for host ``row_host`` must not be stored, or None.

    ``bindings``: each inbox writer (node role) and the host names it may push for (lower
    case). A node role pushes only its own hosts' records. A sender that is no inbox writer
    is the store's owner or an administrator's role (a node role's grant allows nothing
    else), whose rows are taken as they are."""
    hosts = bindings.get(sent_by)
    if hosts is None:
        return None
    if _short(row_host) in {_short(h) for h in hosts}:
        return None
    bound = ", ".join(sorted(hosts)) or "no host"
    return f"sent by node role {sent_by!r}, which may push records of {bound} only"


def record_host_refusal(row_host: str, record_host: str) -> str | None:
    """Why a record naming ``record_host`` must not be taken as ``row_host``'s, or None:
    the row's host is what the binding checked, so the sealed record must say the same."""
    if _short(record_host) == _short(row_host):
        return None
    return f"record of host {record_host!r} pushed as host {row_host!r}"


def _short(host: str) -> str:
    """A host's short name, lower case: how the collector matches records to nodes."""
    return host.split(".", 1)[0].lower()


def _record_host_refusal(row: InboxRow) -> str | None:
    """``record_host_refusal`` for the record in ``row``; None when it cannot be decoded
    (the collector quarantines it then, with the decoder's reason)."""
    from slurm_gpu.capture import spool

    assert row.data is not None
    try:
        record = spool.decode_record(row.data, where="postgresql inbox")
    except (SpoolFormatError, ValueError, TypeError, KeyError):
        return None
    return record_host_refusal(row.host, record.hostname)


def record_digest(data: bytes) -> str:
    """The inbox key of a record's bytes: SHA-256, lower-case hex."""
    return hashlib.sha256(data).hexdigest()


def _quote_ident(conn: Connection, name: str) -> str:
    quoted: str = conn.exec_driver_sql("SELECT quote_ident(%(n)s)", {"n": name}).scalar_one()
    return quoted


def grant_node_role(engine: Engine, role: str, hosts: Sequence[str] = ()) -> None:
    """Let ``role`` (an existing login role, made by the database's administrator) push
    records of ``hosts`` (default: the host named like the role): ``INSERT`` on the node
    columns of ``record_inbox``, nothing else. Granting again adds hosts. Run as the
    collector's role (the tables' owner). Raises ``StoreError``."""
    _require_postgresql(engine)
    bound = [h.lower() for h in (hosts or (role,))]
    bad = [h for h in bound if not _HOST_RE.fullmatch(h)]
    if bad:
        raise StoreError(
            f"{bad[0]!r} is not a host name a record can carry",
            hint="give the node's name as its records name it: grant-node ROLE --host NODE",
        )
    try:
        with engine.begin() as conn:
            exists = conn.exec_driver_sql(
                "SELECT 1 FROM pg_roles WHERE rolname = %(r)s", {"r": role}
            ).scalar()
            if not exists:
                raise StoreError(
                    f"no PostgreSQL role {role!r}",
                    hint=f"create it first, as an administrator: CREATE ROLE {role} LOGIN",
                )
            ident = _quote_ident(conn, role)
            conn.exec_driver_sql(
                "INSERT INTO inbox_writers (role_name) VALUES (%(r)s) ON CONFLICT DO NOTHING",
                {"r": role},
            )
            for host in bound:
                conn.exec_driver_sql(
                    "INSERT INTO inbox_writer_hosts (role_name, host) VALUES (%(r)s, %(h)s) "
                    "ON CONFLICT DO NOTHING",
                    {"r": role, "h": host},
                )
            conn.exec_driver_sql(
                f"GRANT INSERT ({', '.join(NODE_COLUMNS)}) ON record_inbox TO {ident}"
            )
    except SQLAlchemyError as exc:
        raise StoreError(f"granting the inbox to {role!r} failed: {_reason(exc)}") from None


def revoke_node_role(engine: Engine, role: str) -> None:
    """Undo ``grant_node_role``. Raises ``StoreError``."""
    _require_postgresql(engine)
    try:
        with engine.begin() as conn:
            ident = _quote_ident(conn, role)
            conn.exec_driver_sql(f"REVOKE ALL ON record_inbox FROM {ident}")
            conn.exec_driver_sql("DELETE FROM inbox_writers WHERE role_name = %(r)s", {"r": role})
    except SQLAlchemyError as exc:
        raise StoreError(f"revoking the inbox of {role!r} failed: {_reason(exc)}") from None


def node_role_excess(engine: Engine) -> list[str]:
    """What each inbox writer may do beyond inserting into ``record_inbox``: lines such as
    ``node1: UPDATE on jobs``. ``SELECT`` on ``PUBLIC_TABLES`` is not listed: the policy of
    migration 8 hides their rows. ``[]`` for SQLite."""
    if engine.dialect.name != "postgresql":
        return []
    privileges = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
    sql = text(
        "SELECT w.role_name, c.relname, p.priv FROM inbox_writers w "
        "CROSS JOIN pg_class c CROSS JOIN unnest(CAST(:privs AS text[])) AS p(priv) "
        "WHERE c.relnamespace = to_regnamespace(current_schema()) "
        "AND c.relkind IN ('r', 'p', 'v', 'm', 'S') "
        "AND has_table_privilege(w.role_name, c.oid, p.priv) ORDER BY 1, 2, 3"
    )
    out = []
    with engine.connect() as conn:
        for role, table, priv in conn.execute(sql, {"privs": list(privileges)}):
            if (table, priv) == ("record_inbox", "INSERT"):
                continue
            if priv == "SELECT" and table in PUBLIC_TABLES:
                continue
            out.append(f"{role}: {priv} on {table}")
        # Column grants beyond the node columns (a table-wide INSERT shows above).
        cols = conn.execute(
            text(
                "SELECT w.role_name, a.attname FROM inbox_writers w "
                "CROSS JOIN pg_attribute a WHERE a.attrelid = to_regclass('record_inbox') "
                "AND a.attnum > 0 AND NOT a.attisdropped "
                "AND has_column_privilege(w.role_name, a.attrelid, a.attnum, 'INSERT') "
                "AND NOT a.attname = ANY (CAST(:ok AS text[]))"
            ),
            {"ok": list(NODE_COLUMNS)},
        )
        out += [f"{role}: INSERT on record_inbox.{col}" for role, col in cols]
    return out


def _reason(exc: SQLAlchemyError) -> str:
    """The driver's message of ``exc`` on one line."""
    cause = getattr(exc, "orig", None) or exc
    return " ".join(str(cause).split())[:300]


def _require_postgresql(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        raise StoreError(
            "the record inbox exists in PostgreSQL stores only",
            hint='set [ship] transport = "directory" for a SQLite store',
        )


@dataclass(frozen=True, slots=True)
class InboxRow:
    """One pushed record: its key, who sent it and when (seconds since the epoch), and its
    bytes (``None`` when larger than the reader's bound)."""

    job_id: str
    host: str
    digest: str
    received_s: float
    sent_by: str
    size: int
    data: bytes | None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.job_id, self.host, self.digest)


class PgInbox:
    """The collector's side of the inbox (the tables' owner; row-level security does not
    restrict it)."""

    def __init__(
        self, engine: Engine, *, max_bytes: int = MAX_RECORD_BYTES, limit: int = 20000
    ) -> None:
        self.engine = engine
        self.max_bytes = max_bytes
        self.limit = limit
        """Most rows read in one pass; the rest wait for the next."""

    def pending(self, only: Collection[str] | None = None) -> list[InboxRow]:
        """The rows waiting, oldest first (only those of the jobs in ``only``, when given).
        A row a node role pushed for a host not bound to it, or whose record names another
        host, is quarantined and logged here, never returned. Raises ``StoreError``."""
        rows = self._read(only)
        bindings = self.bindings()
        out = []
        for row in rows:
            reason = sender_refusal(row.host, row.sent_by, bindings)
            if reason is None and row.sent_by in bindings and row.data is not None:
                reason = _record_host_refusal(row)
            if reason is None:
                out.append(row)
                continue
            log.warning("postgresql inbox: %s/%s quarantined: %s", row.job_id, row.host, reason)
            self.quarantine(row, reason)
        return out

    def bindings(self) -> dict[str, frozenset[str]]:
        """Each inbox writer and the hosts it may push for (``inbox_writer_hosts``)."""
        sql = text(
            "SELECT w.role_name, h.host FROM inbox_writers w "
            "LEFT JOIN inbox_writer_hosts h ON h.role_name = w.role_name"
        )
        try:
            with self.engine.connect() as conn:
                pairs = conn.execute(sql).all()
        except SQLAlchemyError as exc:
            raise StoreError(f"reading the inbox writers failed: {_reason(exc)}") from None
        out: dict[str, set[str]] = {}
        for role, host in pairs:
            hosts = out.setdefault(role, set())
            if host is not None:
                hosts.add(host.lower())
        return {role: frozenset(hosts) for role, hosts in out.items()}

    def _read(self, only: Collection[str] | None) -> list[InboxRow]:
        where = "" if only is None else "WHERE job_id = ANY (CAST(:only AS text[]))"
        sql = text(
            "SELECT job_id, host, digest, extract(epoch FROM received_at), sent_by, "
            "octet_length(record), CASE WHEN octet_length(record) <= :max THEN record END "
            f"FROM record_inbox {where} ORDER BY received_at, job_id, host LIMIT :limit"
        )
        params: dict[str, object] = {"max": self.max_bytes, "limit": self.limit}
        if only is not None:
            params["only"] = sorted(only)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(sql, params).all()
        except SQLAlchemyError as exc:
            raise StoreError(f"reading the record inbox failed: {_reason(exc)}") from None
        return [
            InboxRow(j, h, d, float(t), s, int(n), bytes(b) if b is not None else None)
            for j, h, d, t, s, n, b in rows
        ]

    def take(self, conn: Connection, keys: Sequence[tuple[str, str, str]]) -> None:
        """Delete ``keys`` from the inbox inside the caller's transaction (the one that
        stores their jobs). The rows are locked first (``FOR UPDATE SKIP LOCKED``): a row
        that another collector holds or already took raises ``StoreError``, which rolls the
        whole transaction back, so a record is stored by one transaction only."""
        if not keys:
            return
        arrays = {
            "j": [k[0] for k in keys],
            "h": [k[1] for k in keys],
            "d": [k[2] for k in keys],
        }
        keyed = (
            "(job_id, host, digest) IN (SELECT * FROM unnest(CAST(:j AS text[]), "
            "CAST(:h AS text[]), CAST(:d AS text[])))"
        )
        locked = conn.execute(
            text(f"SELECT 1 FROM record_inbox WHERE {keyed} FOR UPDATE SKIP LOCKED"), arrays
        ).all()
        if len(locked) != len(set(keys)):
            raise StoreError(
                f"{len(set(keys)) - len(locked)} inbox record(s) were taken meanwhile "
                "(another collector); this batch is left to the next pass",
                hint="run one collector per store",
            )
        conn.execute(text(f"DELETE FROM record_inbox WHERE {keyed}"), arrays)

    def quarantine(self, row: InboxRow, reason: str) -> None:
        """Move ``row`` to ``record_quarantine`` with ``reason``, in one transaction (a row
        already there with the same key keeps its first reason). Raises ``StoreError``."""
        key = {"j": row.job_id, "h": row.host, "d": row.digest, "r": reason}
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO record_quarantine "
                        "(job_id, host, digest, record, received_at, sent_by, reason) "
                        "SELECT job_id, host, digest, record, received_at, sent_by, :r "
                        "FROM record_inbox WHERE job_id = :j AND host = :h AND digest = :d "
                        "ON CONFLICT DO NOTHING"
                    ),
                    key,
                )
                conn.execute(
                    text(
                        "DELETE FROM record_inbox WHERE job_id = :j AND host = :h AND digest = :d"
                    ),
                    key,
                )
        except SQLAlchemyError as exc:
            raise StoreError(f"quarantining an inbox record failed: {_reason(exc)}") from None

    def counts(self) -> tuple[int, int]:
        """Rows waiting in the inbox and rows in quarantine."""
        with self.engine.connect() as conn:
            waiting = conn.exec_driver_sql("SELECT count(*) FROM record_inbox").scalar_one()
            held = conn.exec_driver_sql("SELECT count(*) FROM record_quarantine").scalar_one()
        return int(waiting), int(held)


__all__ = [
    "INBOX_TABLES",
    "MAX_RECORD_BYTES",
    "InboxRow",
    "PgInbox",
    "create_inbox",
    "grant_node_role",
    "node_role_excess",
    "record_digest",
    "revoke_node_role",
    "sender_refusal",
]
