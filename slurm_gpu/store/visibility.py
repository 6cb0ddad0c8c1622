"""Who may read which rows of a PostgreSQL store: Slurm's rule, enforced by the database.

Users connect as themselves (peer or GSSAPI authentication: the PostgreSQL role is the Slurm
user name) and read the store with ``gpueff``, ``psql`` or anything else; row-level security
lets each role read only the rows Slurm would show it:

- its own jobs (``jobs.user`` = the role);
- the jobs of the accounts it coordinates (``visibility.accounts``);
- every job when it is an operator or administrator of Slurm, root or SlurmUser
  (``visibility.admin``), or when the site does not set ``PrivateData=jobs``
  (``visibility_policy.private_jobs`` false).

A job's child rows (hosts, GPUs, timelines, findings, rendered reports) are visible exactly
when the job is. Nothing is visible while ``visibility_policy`` is empty: a store whose roles
were never synced is closed, not open. Migration 5 creates the two tables, the function and
the policies and grants ``SELECT`` to every role; no other privilege is granted, so only the
tables' owner (the collector's role, which row-level security does not restrict) writes.

``slurm-gpu store sync-roles`` (run by the collector's timer, as root) fills the two tables
from Slurm itself, never from a file an admin re-types: ``PrivateData`` and ``SlurmUser`` from
``scontrol show config``, admin levels from ``sacctmgr show user``, coordinators from
``sacctmgr show account withcoord``. SQLite stores have no rows per user: their file is
closed to users (``filemode``) and users read their own reports from files.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, text

#: The store's tables whose rows belong to a job, and what they are guarded by.
JOB_TABLES = ("jobs", "job_hosts", "job_gpus", "timelines", "findings", "job_reports")

#: Tables of per-job data that row-level security must cover (``doctor`` checks them all).
SECURED_TABLES = (*JOB_TABLES, "live_actions")

#: Slurm admin levels that see every job whatever ``PrivateData`` says.
ADMIN_LEVELS = frozenset({"operator", "administrator"})

_MAY_SEE = """
CREATE OR REPLACE FUNCTION slurm_gpu_may_see(job_user text, job_account text)
RETURNS boolean LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT job_user = current_user
        OR NOT COALESCE((SELECT private_jobs FROM visibility_policy WHERE id = 1), true)
        OR EXISTS (
            SELECT 1 FROM visibility v
            WHERE v.role_name = current_user
              AND (v.admin OR job_account = ANY (v.accounts))
        )
$$
"""

_GRANT_SCHEMA = """
DO $$ BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %%I TO PUBLIC', current_schema());
EXCEPTION WHEN insufficient_privilege THEN
    NULL;  -- a schema the collector does not own: its owner grants USAGE (docs/store.md)
END $$
"""


def enable_row_security(conn: Connection) -> None:
    """Migration 5 on PostgreSQL (nothing on SQLite): the visibility tables, the function
    ``slurm_gpu_may_see`` and a read policy on every job table; ``SELECT`` for every role."""
    if conn.dialect.name != "postgresql":
        return
    run = conn.exec_driver_sql
    run(
        "CREATE TABLE IF NOT EXISTS visibility (role_name text PRIMARY KEY, "
        "accounts text[] NOT NULL DEFAULT '{}', admin boolean NOT NULL DEFAULT false)"
    )
    run(
        "CREATE TABLE IF NOT EXISTS visibility_policy (id integer PRIMARY KEY CHECK (id = 1), "
        "private_jobs boolean NOT NULL, synced_at_s double precision NOT NULL)"
    )
    run(_MAY_SEE)
    # Idempotent: a store rolled back to an earlier version passes through it again.
    run("ALTER TABLE jobs ENABLE ROW LEVEL SECURITY")
    run("DROP POLICY IF EXISTS jobs_read ON jobs")
    run('CREATE POLICY jobs_read ON jobs FOR SELECT USING (slurm_gpu_may_see("user", account))')
    for table in JOB_TABLES[1:]:
        run(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        run(f"DROP POLICY IF EXISTS {table}_read ON {table}")
        run(
            f"CREATE POLICY {table}_read ON {table} FOR SELECT USING "
            f"(EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = {table}.job_id))"
        )
    readable = (*JOB_TABLES, "visibility", "visibility_policy", "schema_version")
    run(f"GRANT SELECT ON {', '.join(readable)} TO PUBLIC")
    run(_GRANT_SCHEMA)


def secure_live_actions(conn: Connection) -> None:
    """Migration 7 on PostgreSQL (nothing on SQLite): the live policy's actions are read under
    the same rule as jobs, by their own user and account (the job may not be stored yet)."""
    if conn.dialect.name != "postgresql":
        return
    run = conn.exec_driver_sql
    run("ALTER TABLE live_actions ENABLE ROW LEVEL SECURITY")
    run("DROP POLICY IF EXISTS live_actions_read ON live_actions")
    run(
        "CREATE POLICY live_actions_read ON live_actions FOR SELECT "
        'USING (slurm_gpu_may_see("user", account))'
    )
    run("GRANT SELECT ON live_actions TO PUBLIC")


def tables_without_rls(engine: Engine) -> list[str]:
    """The job tables of a PostgreSQL store (found by its search path) without row-level
    security enabled; ``[]`` for other databases."""
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT t.name, c.relrowsecurity FROM unnest(CAST(:names AS text[])) "
                "AS t(name) LEFT JOIN pg_class c ON c.oid = to_regclass(t.name)"
            ),
            {"names": list(SECURED_TABLES)},
        ).all()
    return [name for name, secured in found if not secured]


# ----------------------------------------------------------------- what Slurm says


def config_value(scontrol_config: str, key: str) -> str | None:
    """The value of ``key`` in ``scontrol show config``'s ``Key = value`` lines."""
    for line in scontrol_config.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None


def private_data(scontrol_config: str) -> frozenset[str]:
    """The ``PrivateData`` flags (``jobs``, ``usage``, ...) of ``scontrol show config``;
    empty when it says ``none`` or does not name them."""
    value = config_value(scontrol_config, "PrivateData") or ""
    flags = {f.strip().lower() for f in value.split(",") if f.strip()}
    return frozenset(flags - {"none", "(null)"})


def dbd_private_data(sacctmgr_config: str) -> frozenset[str]:
    """The ``PrivateData`` flags of slurmdbd, from ``sacctmgr show configuration`` (its
    "SlurmDBD configuration:" part). ``sacct`` asks slurmdbd, so for finished jobs these, not
    slurm.conf's, decide what a user is shown; empty when the part is absent."""
    _, found, dbd = sacctmgr_config.partition("SlurmDBD configuration:")
    return private_data(dbd) if found else frozenset()


@dataclass(frozen=True, slots=True)
class Visibility:
    """What Slurm shows whom: ``private_jobs`` (``PrivateData=jobs``), the users who see
    every job, and the accounts each coordinator sees."""

    private_jobs: bool
    admins: frozenset[str]
    coordinated: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _parsable_rows(output: str, fields: int) -> Iterable[list[str]]:
    for line in output.splitlines():
        parts = line.split("|")
        if len(parts) >= fields and parts[0]:
            yield parts


def read_visibility(
    run: Callable[[Sequence[str]], str], scontrol: str, sacctmgr: str
) -> Visibility:
    """Ask Slurm (``run`` returns a command's standard output, raising on failure).

    Jobs are private when slurm.conf (``scontrol show config``) or slurmdbd (``sacctmgr show
    configuration``) sets ``PrivateData=jobs``: sacct follows slurmdbd's, squeue slurmctld's,
    and the store must hide what either hides."""
    config = run([scontrol, "show", "config"])
    dbd_flags = dbd_private_data(run([sacctmgr, "show", "configuration"]))
    admins = {"root"}
    slurm_user = (config_value(config, "SlurmUser") or "").partition("(")[0].strip()
    if slurm_user:
        admins.add(slurm_user)
    users = run([sacctmgr, "-nP", "show", "user", "format=User,AdminLevel"])
    for user, level, *_ in _parsable_rows(users, 2):
        if level.strip().lower() in ADMIN_LEVELS:
            admins.add(user.strip())
    accounts = run([sacctmgr, "-nP", "show", "account", "withcoord", "format=Account,Coordinators"])
    coordinated: dict[str, set[str]] = {}
    for account, coordinators, *_ in _parsable_rows(accounts, 2):
        for name in coordinators.split(","):
            if name.strip():
                coordinated.setdefault(name.strip(), set()).add(account.strip())
    return Visibility(
        private_jobs="jobs" in private_data(config) | dbd_flags,
        admins=frozenset(admins),
        coordinated={k: frozenset(v) for k, v in coordinated.items()},
    )


def write_visibility(
    engine: Engine, vis: Visibility, *, clock: Callable[[], float] = time.time
) -> int:
    """Replace the visibility tables with ``vis`` in one transaction; returns the number of
    roles written. PostgreSQL stores only (``ValueError`` otherwise)."""
    if engine.dialect.name != "postgresql":
        raise ValueError("row visibility exists in PostgreSQL stores only")
    roles = sorted(vis.admins | set(vis.coordinated))
    rows = [
        {
            "role": r,
            "accounts": sorted(vis.coordinated.get(r, ())),
            "admin": r in vis.admins,
        }
        for r in roles
    ]
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM visibility"))
        if rows:
            conn.execute(
                text(
                    "INSERT INTO visibility (role_name, accounts, admin) "
                    "VALUES (:role, :accounts, :admin)"
                ),
                rows,
            )
        conn.execute(
            text(
                "INSERT INTO visibility_policy (id, private_jobs, synced_at_s) "
                "VALUES (1, :p, :t) ON CONFLICT (id) DO UPDATE "
                "SET private_jobs = excluded.private_jobs, synced_at_s = excluded.synced_at_s"
            ),
            {"p": vis.private_jobs, "t": clock()},
        )
    return len(rows)
