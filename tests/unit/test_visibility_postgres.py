"""Who sees what in a PostgreSQL store: real roles log in as themselves and row-level security
shows each only the rows Slurm would show it; only the collector's role writes.

Runs against the PostgreSQL server of ``share/testpg`` (``tests/store_fixtures.py``). Roles are
cluster-wide, so each test creates its own (a random prefix) as the ``postgres`` superuser,
through ``psql`` over the server's socket with peer authentication, and drops them after.
"""

from __future__ import annotations

import dataclasses
import glob
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import _pg_exec, _schema_url, make_job, make_node, postgres_url

from slurm_gpu import doctor
from slurm_gpu.config import parse_settings
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.store import CachedReport
from slurm_gpu.store.visibility import (
    JOB_TABLES,
    Visibility,
    read_visibility,
    tables_without_rls,
    write_visibility,
)

pytestmark = pytest.mark.skipif(
    not glob.glob("/usr/lib/postgresql/*/bin/psql"), reason="needs PostgreSQL's psql"
)

_RUN_DIR = "/var/lib/slurm-gpu-testpg/run"
_PORT = "15432"


def _superuser(sql: str) -> None:
    """Run ``sql`` as the ``postgres`` superuser (peer authentication over the socket)."""
    psql = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))[-1]
    subprocess.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            psql,
            "-h",
            _RUN_DIR,
            "-p",
            _PORT,
            "-d",
            "slurmgpu_test",
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A store in its own schema, the collector's URL, and a login URL per user."""

    url: str
    users: dict[str, str]

    def read(self, who: str, sql: str) -> list[Any]:
        engine = sa.create_engine(self.users[who])
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.exec_driver_sql(sql)]
        finally:
            engine.dispose()


def _job(job_id: str, user: str, account: str) -> JobRecord:
    return dataclasses.replace(make_job(job_id), user=user, account=account)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    base = postgres_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    prefix = f"sgv{secrets.token_hex(3)}"
    names = ("alice", "bob", "carol", "dave")
    password = secrets.token_hex(12)
    roles = {n: f"{prefix}_{n}" for n in names}
    _pg_exec(base, f"CREATE SCHEMA {schema}")
    for role in roles.values():
        _superuser(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        url = _schema_url(base, schema)
        host = base.split("@", 1)[1]
        users = {
            n: _schema_url(f"postgresql+psycopg://{r}:{password}@{host}", schema)
            for n, r in roles.items()
        }
        jobs = [
            _job("101", roles["alice"], "physics"),
            _job("102", roles["bob"], "biology"),
            _job("103", roles["carol"], "physics"),
        ]
        with Store.open(url) as store:
            store.write_batch(
                [JobBundle(j, (make_node(j.job_id, "node1"),), TELEMETRY_COMPLETE) for j in jobs],
                collected_at_s=1.0,
            )
            store.write_reports(
                [CachedReport(j.job_id, j.job_id, "k", "p", "c", 1.0) for j in jobs]
            )
        yield Cluster(url, users)
    finally:
        _pg_exec(base, f"DROP SCHEMA {schema} CASCADE")
        for role in roles.values():
            _superuser(f"DROP ROLE IF EXISTS {role}")


def _sync(c: Cluster, *, private: bool, admins: Sequence[str] = (), coords: Any = None) -> None:
    engine = sa.create_engine(c.url)
    try:
        role = {n: u.split("://", 1)[1].split(":", 1)[0] for n, u in c.users.items()}
        write_visibility(
            engine,
            Visibility(
                private_jobs=private,
                admins=frozenset(role[a] for a in admins),
                coordinated={role[k]: frozenset(v) for k, v in (coords or {}).items()},
            ),
        )
    finally:
        engine.dispose()


def _seen(c: Cluster, who: str) -> dict[str, list[str]]:
    return {
        table: sorted(r[0] for r in c.read(who, f"SELECT job_id FROM {table}"))
        for table in ("jobs", "job_hosts", "job_gpus", "findings", "job_reports")
    }


def test_each_postgres_role_reads_only_the_jobs_slurm_would_show_it(cluster: Cluster) -> None:
    _sync(cluster, private=True, admins=["dave"], coords={"carol": ["physics"]})
    alice = _seen(cluster, "alice")
    assert alice["jobs"] == ["101"] and alice["job_reports"] == ["101"]
    assert set(alice["job_hosts"]) == set(alice["job_gpus"]) == {"101"}
    assert _seen(cluster, "bob")["jobs"] == ["102"]
    # A coordinator of physics: the account's jobs, not biology's.
    assert _seen(cluster, "carol")["jobs"] == ["101", "103"]
    # An operator or administrator: every job.
    assert _seen(cluster, "dave")["jobs"] == ["101", "102", "103"]
    assert cluster.read("alice", "SELECT count(*) FROM jobs WHERE job_id = '102'") == [(0,)]


def test_a_store_whose_roles_were_never_synced_shows_users_only_their_own_jobs(
    cluster: Cluster,
) -> None:
    assert _seen(cluster, "alice")["jobs"] == ["101"]
    assert _seen(cluster, "dave")["jobs"] == []


def test_live_policy_actions_are_read_under_the_jobs_rule(cluster: Cluster) -> None:
    # A warning on a running job (not stored yet): the owner and the account's coordinator see
    # it, another user does not.
    from slurm_gpu.store.liveactions import LiveAction, record_actions

    role = {n: u.split("://", 1)[1].split(":", 1)[0] for n, u in cluster.users.items()}
    engine = sa.create_engine(cluster.url)
    try:
        record_actions(
            engine,
            [LiveAction("201", "idle", "warned", role["alice"], "physics", 5.0, 1, 3600.0, "d")],
        )
    finally:
        engine.dispose()
    _sync(cluster, private=True, coords={"carol": ["physics"]})
    sql = "SELECT job_id FROM live_actions"
    assert cluster.read("alice", sql) == [("201",)]
    assert cluster.read("carol", sql) == [("201",)]
    assert cluster.read("bob", sql) == []
    with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
        cluster.read("bob", "DELETE FROM live_actions")


def test_without_private_data_every_role_reads_every_job(cluster: Cluster) -> None:
    _sync(cluster, private=False)
    assert _seen(cluster, "bob")["jobs"] == ["101", "102", "103"]


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE jobs SET job_name = 'x'",
        "DELETE FROM findings",
        "INSERT INTO visibility (role_name, admin) VALUES (current_user, true)",
        "UPDATE visibility_policy SET private_jobs = false",
        "ALTER TABLE jobs DISABLE ROW LEVEL SECURITY",
    ],
)
def test_no_role_but_the_collectors_can_write_or_widen_what_it_sees(
    cluster: Cluster, sql: str
) -> None:
    _sync(cluster, private=True)
    with pytest.raises(sa.exc.ProgrammingError, match=r"permission denied|must be owner"):
        cluster.read("alice", sql)
    assert _seen(cluster, "alice")["jobs"] == ["101"]


def test_doctor_flags_a_postgres_store_without_row_security(cluster: Cluster) -> None:
    engine = sa.create_engine(cluster.url)
    try:
        assert tables_without_rls(engine) == []
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE job_gpus DISABLE ROW LEVEL SECURITY")
        assert tables_without_rls(engine) == ["job_gpus"]
    finally:
        engine.dispose()
    settings = parse_settings({"store": {"url": cluster.url}}, path=None)
    check = doctor.check_visibility(settings, lambda: frozenset({"jobs"}), lambda: ["job_gpus"])
    assert check.status is doctor.Status.FAIL and "job_gpus" in check.detail
    ok = doctor.check_visibility(settings, lambda: frozenset({"jobs"}), lambda: [])
    assert ok.status is doctor.Status.OK
    assert set(JOB_TABLES) >= {"jobs", "job_gpus"}


def test_sync_roles_takes_private_data_admins_and_coordinators_from_slurm() -> None:
    outputs = {
        "show config": "SlurmUser               = slurm(64030)\n"
        "PrivateData             = accounts,jobs\n",
        "show configuration": "PrivateData            = none\nSlurmDBD configuration:\n"
        "PrivateData            = none\n",
        "show user": "alice|None\ndave|Administrator\nerin|Operator\n",
        "show account": "physics|carol,alice\nbiology|\n",
    }
    asked: list[list[str]] = []

    def run(argv: Sequence[str]) -> str:
        asked.append(list(argv))
        key = next(k for k in outputs if k in " ".join(argv))
        return outputs[key]

    vis = read_visibility(run, "/usr/bin/scontrol", "/usr/bin/sacctmgr")
    assert vis.private_jobs
    assert vis.admins == {"root", "slurm", "dave", "erin"}
    assert vis.coordinated == {"carol": {"physics"}, "alice": {"physics"}}
    assert asked[0] == ["/usr/bin/scontrol", "show", "config"]
    outputs["show config"] = "PrivateData             = none\n"
    assert not read_visibility(run, "scontrol", "sacctmgr").private_jobs


def test_private_data_set_in_slurmdbd_alone_hides_jobs() -> None:
    # Seen on the test cluster: slurm.conf without PrivateData, slurmdbd.conf with
    # PrivateData=jobs; sacct then hides other users' jobs, so the store must too.
    outputs = {
        "show config": "SlurmUser               = slurm(64030)\nPrivateData             = none\n",
        "show configuration": "PrivateData            = none\n\nSlurmDBD configuration:\n"
        "DbdPort                = 6819\nPrivateData            = jobs\n",
        "show user": "",
        "show account": "",
    }

    def run(argv: Sequence[str]) -> str:
        line = " ".join(argv)
        key = (
            "show configuration"
            if "configuration" in line
            else next(k for k in outputs if k in line)
        )
        return outputs[key]

    assert read_visibility(run, "scontrol", "sacctmgr").private_jobs


def test_sqlite_stores_have_no_row_security_to_check(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/s.db")
    try:
        assert tables_without_rls(engine) == []
        with pytest.raises(ValueError):
            write_visibility(engine, Visibility(True, frozenset()))
    finally:
        engine.dispose()
