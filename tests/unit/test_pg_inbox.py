"""The PostgreSQL record inbox: nodes push sealed records as a role that may only insert, the
collector takes them in the transaction that stores their job, bad ones go to quarantine.

Real PostgreSQL (``share/testpg``), real roles and grants, real spool files; accounting is the
collector's injected seam (``FakeAccounting``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inbox_fixtures import InboxDb, inbox_db
from store_fixtures import FakeAccounting, make_job, make_node

from slurm_gpu import doctor
from slurm_gpu.capture import spool
from slurm_gpu.capture.pgship import PgTarget, connect_params, record_digest, ship_postgresql
from slurm_gpu.cli.admin import cli
from slurm_gpu.collector import Collector, CollectorOptions
from slurm_gpu.config import Settings, parse_settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.inbox import PUBLIC_TABLES, PgInbox, node_role_excess
from slurm_gpu.store.visibility import Visibility, write_visibility

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not glob.glob("/usr/lib/postgresql/*/bin/psql"), reason="needs PostgreSQL's psql"
    ),
]

NOW = 1_700_000_100.0 + 7200


@pytest.fixture
def db(tmp_path: Path) -> Iterator[InboxDb]:
    with inbox_db(tmp_path) as made:
        yield made


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InboxDb]:
    """One store for the tests that only try what the node role may do (each fails)."""
    with inbox_db(tmp_path_factory.mktemp("inbox")) as made:
        yield made


def seal(spool_dir: Path, job_id: str, host: str = "n1") -> spool.JobSpool:
    paths = spool.JobSpool(str(spool_dir), job_id, host)
    paths.create_dir()
    spool.write_record(paths.record, make_node(job_id, host, gpus=2))
    Path(paths.jsonl).write_text("{}\n")
    return paths


def collect(db: InboxDb, tmp_path: Path, accounting: FakeAccounting) -> object:
    state = tmp_path / "state"
    empty_spool = tmp_path / "collector-spool"
    empty_spool.mkdir(exist_ok=True)
    with Store.open(db.url) as store:
        return Collector(
            store=store,
            accounting=accounting,
            spool_dir=str(empty_spool),
            state_dir=str(state),
            options=CollectorOptions(missing_grace_s=600, missing_lookback_s=1),
            clock=lambda: NOW,
            inbox=PgInbox(store.engine),
        ).run_once()


# ----------------------------------------------------------------- the node role


def test_the_node_role_may_insert_into_the_inbox_and_the_collector_role_sees_it(
    db: InboxDb,
) -> None:
    data = b'{"not": "checked by the server"}'
    db.node_sql(
        "INSERT INTO record_inbox (job_id, host, digest, record) "
        f"VALUES ('7', 'n1', '{record_digest(data)}', '\\x{data.hex()}')"
    )
    assert db.scalar("SELECT sent_by FROM record_inbox") == db.role
    engine = sa.create_engine(db.url)
    try:
        assert node_role_excess(engine) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM record_inbox",
        "SELECT count(*) FROM record_inbox",
        "UPDATE record_inbox SET host = 'x'",
        "DELETE FROM record_inbox",
        "TRUNCATE record_inbox",
        "INSERT INTO record_inbox (job_id, host, digest, record, sent_by) "
        "VALUES ('1', 'n1', repeat('a', 64), '\\x00', 'someone')",
        "INSERT INTO record_inbox (job_id, host, digest, record) "
        "VALUES ('1', 'n1', repeat('a', 64), '\\x00') RETURNING *",
        "SELECT * FROM record_quarantine",
        "DELETE FROM record_quarantine",
        "SELECT * FROM inbox_writers",
        "DELETE FROM inbox_writers",
        "INSERT INTO jobs (job_id) VALUES ('1')",
        "UPDATE jobs SET job_name = 'x'",
        "DELETE FROM jobs",
        "DELETE FROM job_hosts",
        "INSERT INTO visibility (role_name, admin) VALUES (current_user, true)",
        "UPDATE visibility_policy SET private_jobs = false",
        "DELETE FROM schema_version",
        "ALTER TABLE record_inbox DISABLE ROW LEVEL SECURITY",
        "DROP TABLE record_inbox",
        "CREATE TABLE planted (x int)",
    ],
)
def test_the_node_role_can_do_nothing_but_insert(shared_db: InboxDb, sql: str) -> None:
    import psycopg

    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        shared_db.node_sql(sql)


@pytest.mark.parametrize("private_jobs", [True, False])
def test_the_node_role_reads_no_row_of_the_store(db: InboxDb, private_jobs: bool) -> None:
    """Migration 5 lets every role read the job tables under row-level security (every job
    where PrivateData is off); the node role sees none, nor the visibility tables."""
    engine = sa.create_engine(db.url)
    with Store.open(db.url) as store:
        store.write_batch(
            [JobBundle(make_job("11"), (make_node("11", "node1"),), TELEMETRY_COMPLETE)],
            collected_at_s=1.0,
        )
    write_visibility(engine, Visibility(private_jobs=private_jobs, admins=frozenset({"root"})))
    engine.dispose()
    for table in ("jobs", "job_hosts", "job_gpus", "visibility", "schema_version"):
        assert db.scalar(f"SELECT count(*) FROM {table}") != 0, "the collector's role reads it"
    for table in PUBLIC_TABLES:
        assert db.node_sql(f"SELECT count(*) FROM {table}") == [(0,)], table


def test_doctor_lists_a_node_role_granted_more_than_insert(db: InboxDb) -> None:
    engine = sa.create_engine(db.url)
    try:
        assert node_role_excess(engine) == []
        with engine.begin() as conn:
            conn.exec_driver_sql(f"GRANT SELECT ON record_inbox TO {db.role}")
            conn.exec_driver_sql(f"GRANT INSERT ON jobs TO {db.role}")
            conn.exec_driver_sql(f"GRANT INSERT (received_at) ON record_inbox TO {db.role}")
        assert node_role_excess(engine) == [
            f"{db.role}: INSERT on jobs",
            f"{db.role}: SELECT on record_inbox",
            f"{db.role}: INSERT on record_inbox.received_at",
        ]
    finally:
        engine.dispose()


def test_doctor_transport_check(db: InboxDb, tmp_path: Path) -> None:
    def settings(**ship: str) -> Settings:
        return parse_settings(
            {"store": {"url": db.url}, "ship": {"transport": "postgresql", **ship}}, path=None
        )

    engine = sa.create_engine(db.url)
    try:
        ok = doctor.check_transport(settings(), lambda: node_role_excess(engine))
        assert ok.status is doctor.Status.OK, ok
        with engine.begin() as conn:
            conn.exec_driver_sql(f"GRANT DELETE ON record_inbox TO {db.role}")
        bad = doctor.check_transport(settings(), lambda: node_role_excess(engine))
        assert (
            bad.status is doctor.Status.FAIL and f"{db.role}: DELETE on record_inbox" in bad.detail
        )
    finally:
        engine.dispose()
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    secret.chmod(0o640)
    node = parse_settings(
        {
            "ship": {
                "transport": "postgresql",
                "postgresql_dsn": db.dsn,
                "password_file": str(secret),
            }
        },
        path=None,
    )
    check = doctor.check_transport(node)
    assert check.status is doctor.Status.FAIL and "0640" in check.detail
    secret.chmod(0o600)
    assert doctor.check_transport(node).status is doctor.Status.OK
    nowhere = parse_settings({"ship": {"transport": "postgresql"}}, path=None)
    assert doctor.check_transport(nowhere).status is doctor.Status.FAIL


# ----------------------------------------------------------------- node to store


def test_records_travel_from_the_node_spool_to_the_store(db: InboxDb, tmp_path: Path) -> None:
    node_spool = tmp_path / "node-spool"
    one = seal(node_spool, "21", "n1")
    seal(node_spool, "22", "n1")
    seal(node_spool, "22", "n2")
    running = seal(node_spool, "23", "n1")
    Path(running.pid).write_text("123\n")
    original = Path(one.record).read_bytes()

    result = ship_postgresql(str(node_spool), db.target())

    assert sorted(result.shipped) == ["21/n1", "22/n1", "22/n2"] and result.failed == ()
    assert not os.path.exists(one.job_dir), "the node's files go after the commit"
    assert os.path.exists(running.record), "a running job's record stays"
    assert (
        db.scalar(f"SELECT count(*) FROM record_inbox WHERE digest = '{record_digest(original)}'")
        == 1
    )

    acc = FakeAccounting(
        {"21": make_job("21", nodes=("n1",)), "22": make_job("22", nodes=("n1", "n2"))}
    )
    report = collect(db, tmp_path, acc)

    assert sorted(report.ingested) == ["21", "22"]  # type: ignore[attr-defined]
    assert db.scalar("SELECT count(*) FROM record_inbox") == 0
    with Store.open(db.url) as store:
        job = store.get_job("22")
        assert job is not None and sorted(n.hostname for n in job.nodes) == ["n1", "n2"]
        stored = store.get_job("21", timelines=True)
        assert stored is not None and stored.nodes[0] == spool.decode_record(original)
    # Kept like an ingested file, for a late node's record of the same job.
    assert (tmp_path / "state" / "done" / "21.n1.record").read_bytes() == original


def test_a_push_repeated_after_a_crash_is_harmless(db: InboxDb, tmp_path: Path) -> None:
    """A node killed between the INSERT's commit and removing its files pushes the same
    record again: the key (job, host, digest) makes that a no-op, before or after the
    collector took the first."""
    node_spool = tmp_path / "node-spool"
    paths = seal(node_spool, "31")
    saved = tmp_path / "copy"
    shutil.copytree(node_spool, saved)
    assert ship_postgresql(str(node_spool), db.target()).shipped == ("31/n1",)
    shutil.copytree(saved, node_spool, dirs_exist_ok=True)
    assert ship_postgresql(str(node_spool), db.target()).shipped == ("31/n1",)
    assert db.scalar("SELECT count(*) FROM record_inbox") == 1
    assert not os.path.exists(paths.record)

    acc = FakeAccounting({"31": make_job("31", nodes=("n1",))})
    assert collect(db, tmp_path, acc).ingested == ("31",)  # type: ignore[attr-defined]
    shutil.copytree(saved, node_spool, dirs_exist_ok=True)
    assert ship_postgresql(str(node_spool), db.target()).shipped == ("31/n1",)
    assert collect(db, tmp_path, acc).ingested == ("31",)  # type: ignore[attr-defined]
    assert db.scalar("SELECT count(*) FROM jobs") == 1
    assert db.scalar("SELECT count(*) FROM job_hosts") == 1


def test_a_job_not_ready_stays_in_the_inbox(db: InboxDb, tmp_path: Path) -> None:
    node_spool = tmp_path / "node-spool"
    seal(node_spool, "41", "n1")
    ship_postgresql(str(node_spool), db.target())
    acc = FakeAccounting({"41": make_job("41", nodes=("n1", "n2"))})
    with Store.open(db.url) as store:
        report = Collector(
            store=store,
            accounting=acc,
            spool_dir=str(tmp_path / "none"),
            state_dir=str(tmp_path / "state"),
            options=CollectorOptions(node_wait_s=1e9),
            clock=lambda: NOW,
            inbox=PgInbox(store.engine),
        ).run_once(missing_pass=False)
    assert report.waiting_nodes == ("41",) and report.ingested == ()
    assert db.scalar("SELECT count(*) FROM record_inbox") == 1


def test_bad_records_are_quarantined_once_and_the_pass_goes_on(db: InboxDb, tmp_path: Path) -> None:
    good = spool.encode_record(make_node("51", "n1"))
    other = spool.encode_record(make_node("99", "n1"))
    rows = [
        ("51", "n1", good),  # the one good record
        ("52", "n1", b"{ truncated"),  # not a record
        ("53", "n1", other),  # a record of job 99 pushed as job 53
    ]
    for job, host, data in rows:
        db.node_sql(
            "INSERT INTO record_inbox (job_id, host, digest, record) "
            f"VALUES ('{job}', '{host}', '{record_digest(data)}', '\\x{data.hex()}')"
        )
    # Bytes that do not match their digest (damaged on the way, or forged).
    db.node_sql(
        "INSERT INTO record_inbox (job_id, host, digest, record) "
        f"VALUES ('54', 'n1', '{record_digest(b'x')}', '\\x{good.hex()}')"
    )
    acc = FakeAccounting({j: make_job(j, nodes=("n1",)) for j in ("51", "52", "53", "54")})

    report = collect(db, tmp_path, acc)

    assert "51" in report.ingested  # type: ignore[attr-defined]
    assert db.scalar("SELECT count(*) FROM record_inbox") == 0
    engine = sa.create_engine(db.url)
    try:
        with engine.connect() as conn:
            reasons = dict(
                conn.exec_driver_sql("SELECT job_id, reason FROM record_quarantine").all()
            )
    finally:
        engine.dispose()
    assert sorted(reasons) == ["52", "53", "54"]
    assert "not JSON" in reasons["52"] and "job 99" in reasons["53"]
    assert "SHA-256" in reasons["54"]
    again = collect(db, tmp_path, acc)
    assert again.quarantined == ()  # type: ignore[attr-defined]


def test_a_node_credential_cannot_push_records_of_another_host(tmp_path: Path) -> None:
    """Issue 27, point 6: the role of node n1 pushes a record as n2, and one as n1 that
    holds n2's record. The server takes both rows (the role may insert); the collector
    quarantines them with the reason and stores neither."""
    with inbox_db(tmp_path, hosts=("n1",)) as db:
        node_spool = tmp_path / "node-spool"
        seal(node_spool, "71", "n2")
        assert ship_postgresql(str(node_spool), db.target()).shipped == ("71/n2",)
        forged = spool.encode_record(make_node("72", "n2"))
        db.node_sql(
            "INSERT INTO record_inbox (job_id, host, digest, record) "
            f"VALUES ('72', 'n1', '{record_digest(forged)}', '\\x{forged.hex()}')"
        )
        acc = FakeAccounting(
            {"71": make_job("71", nodes=("n2",)), "72": make_job("72", nodes=("n1", "n2"))}
        )
        report = collect(db, tmp_path, acc)
        assert report.ingested == ()  # type: ignore[attr-defined]
        assert db.scalar("SELECT count(*) FROM jobs") == 0
        assert db.scalar("SELECT count(*) FROM record_inbox") == 0
        reason71 = db.scalar("SELECT reason FROM record_quarantine WHERE job_id = '71'")
        reason72 = db.scalar("SELECT reason FROM record_quarantine WHERE job_id = '72'")
        assert "may push records of n1 only" in str(reason71)
        assert "record of host 'n2' pushed as host 'n1'" in str(reason72)


def test_a_record_too_large_for_the_inbox_stays_on_the_node(db: InboxDb, tmp_path: Path) -> None:
    import psycopg

    with pytest.raises(psycopg.errors.CheckViolation):
        db.node_sql(
            "INSERT INTO record_inbox (job_id, host, digest, record) "
            "VALUES ('61', 'n1', repeat('a', 64), decode(repeat('00', 67108865), 'hex'))"
        )


# ----------------------------------------------------------------- settings and failures


def test_a_dsn_with_a_password_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="names a password") as err:
        connect_params(PgTarget(dsn="host=db user=node password=secret"))
    assert err.value.hint and "password_file" in err.value.hint
    with pytest.raises(ConfigError, match="postgresql_dsn"):
        ship_postgresql(str(seal(tmp_path / "s", "70").spool_dir), PgTarget(dsn=""))


def test_a_password_file_others_may_read_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by group or others"):
        connect_params(PgTarget(dsn="host=db user=node", password_file=str(secret)))
    secret.chmod(0o600)
    assert (
        connect_params(PgTarget(dsn="host=db user=node", password_file=str(secret)))["password"]
        == "x"
    )


def test_a_server_that_never_answers_fails_the_pass_instead_of_hanging(tmp_path: Path) -> None:
    """A listener that accepts and then says nothing: the connect timeout ends the attempt,
    the records stay for the next pass."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        try:
            while True:
                accepted.append(server.accept()[0])
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    node_spool = tmp_path / "node-spool"
    paths = seal(node_spool, "71")
    try:
        port = server.getsockname()[1]
        target = PgTarget(dsn=f"host=127.0.0.1 port={port} dbname=x user=y", connect_timeout_s=2)
        result = ship_postgresql(str(node_spool), target)
    finally:
        server.close()
        for s in accepted:
            s.close()
    assert result.shipped == ()
    assert result.failed and result.failed[0][0] == "71/n1"
    assert "cannot connect" in result.failed[0][1]
    assert os.path.exists(paths.record)


def test_the_collector_refuses_the_postgresql_transport_with_a_sqlite_store(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        f'[paths]\nstate_dir = "{tmp_path}/state"\nspool_dir = "{tmp_path}/spool"\n'
        '[ship]\ntransport = "postgresql"\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(config), "collect", "--once"])
    assert result.exit_code == 3, result.output
    assert "ship.transport" in result.output and "SQLite" in result.output
    assert "Traceback" not in result.output


def test_ship_cli_pushes_with_the_postgresql_transport(db: InboxDb, tmp_path: Path) -> None:
    node_spool = tmp_path / "node-spool"
    seal(node_spool, "81")
    config = tmp_path / "c.toml"
    config.write_text(
        f'[paths]\nspool_dir = "{node_spool}"\n[ship]\ntransport = "postgresql"\n'
        f'postgresql_dsn = "{db.dsn}"\npassword_file = "{db.password_file}"\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(config), "ship"])
    assert result.exit_code == 0, result.output
    assert "shipped 1 record(s) to the PostgreSQL inbox" in result.output
    assert db.scalar("SELECT count(*) FROM record_inbox WHERE job_id = '81'") == 1
