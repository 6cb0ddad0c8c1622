"""The store, against SQLite and the real PostgreSQL server: migrations, round trips, upserts."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_fixtures
from store_fixtures import dump_db, make_job, make_node

from slurm_gpu.errors import StoreError
from slurm_gpu.store import (
    TELEMETRY_COMPLETE,
    TELEMETRY_MISSING,
    TELEMETRY_RECOVERED,
    JobBundle,
    Store,
    idle_head_tail_s,
    migrations,
    schema,
)
from slurm_gpu.store.store import open_engine

# The fixtures, made visible to pytest in this module.
store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, float]
    recommendation: dict[str, str] | None = None
    scope: str | None = None
    subject: str | None = None


def _bundle(job_id: str, **kw: object) -> JobBundle:
    nodes = kw.pop("nodes", None) or (make_node(job_id),)
    return JobBundle(
        job=make_job(job_id, **kw),  # type: ignore[arg-type]
        nodes=tuple(nodes),  # type: ignore[arg-type]
        telemetry=TELEMETRY_COMPLETE,
    )


def test_migrating_an_empty_store_creates_every_table_and_rerunning_is_a_no_op(
    store_url: str,
) -> None:
    engine = open_engine(store_url)
    try:
        with engine.connect() as conn:
            assert migrations.current_version(conn) == 0
    finally:
        engine.dispose()
    with Store.open(store_url) as store:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST_VERSION
            names = set(sa.inspect(conn).get_table_names())
        assert {t.name for t in schema.metadata.sorted_tables} <= names
        assert migrations.migrate(store.engine) == []
        with store.engine.connect() as conn:
            rows = conn.execute(sa.select(schema.schema_version)).all()
        assert [(r.version, r.name) for r in rows] == [
            (m.version, m.name) for m in migrations.MIGRATIONS
        ]


def test_migrated_columns_match_the_declared_schema(store_url: str) -> None:
    with Store.open(store_url) as store:
        insp = sa.inspect(store.engine)
        for table in schema.metadata.sorted_tables:
            got = {c["name"] for c in insp.get_columns(table.name)}
            assert got == {c.name for c in table.columns}, table.name
        indexed = {ix["name"] for ix in insp.get_indexes("jobs")}
        assert {"ix_jobs_end_s", "ix_jobs_user_end", "ix_jobs_account_end"} <= indexed
        assert "ix_jobs_partition_end" in indexed


def test_reader_refuses_an_unmigrated_store_with_a_hint(store_url: str) -> None:
    with pytest.raises(StoreError) as err:
        Store.open(store_url, migrate=False)
    assert err.value.hint is not None and "store migrate" in err.value.hint


def test_a_store_newer_than_this_release_is_refused(store_url: str) -> None:
    with Store.open(store_url) as store, store.engine.begin() as conn:
        conn.execute(
            schema.schema_version.insert().values(version=99, name="future", applied_at_s=0.0)
        )
    with pytest.raises(StoreError, match="newer"):
        Store.open(store_url)


def test_get_job_rebuilds_the_records_exactly(store_url: str) -> None:
    nodes = (make_node("101", "node1", gpus=2), make_node("101", "node2", gpus=1, complete=False))
    job = make_job("101", gpus=3, nodes=("node1", "node2"))
    finding = _Finding(
        "low_duty", "warning", 1, {"duty_mean_pct": 12.5}, {"gres": "gpu:1"}, "gpu", "GPU-x"
    )
    bundle = JobBundle(
        job=job,
        nodes=nodes,
        telemetry=TELEMETRY_RECOVERED,
        findings=(finding,),
        analysis_version="a1",
    )
    with Store.open(store_url) as store:
        store.write_batch([bundle], collected_at_s=1234.5)
        got = store.get_job("101")
        assert got is not None
        assert got.job == job
        assert got.telemetry == TELEMETRY_RECOVERED
        assert got.collected_at_s == 1234.5
        assert got.gpu_hours == pytest.approx(3 * 100 / 3600)
        # Without timelines the node records are exact apart from the timeline.
        assert got.nodes == tuple(dataclasses.replace(n, timeline=()) for n in nodes)
        assert [f.code for f in got.findings] == ["low_duty"]
        f = got.findings[0]
        assert (f.cause, f.evidence, f.recommendation, f.scope, f.subject) == (
            1,
            {"duty_mean_pct": 12.5},
            {"gres": "gpu:1"},
            "gpu",
            "GPU-x",
        )
        assert f.analysis_version == "a1"
        assert len(got.gpus) == 3
        with_tl = store.get_job("101", timelines=True)
        assert with_tl is not None
        assert [len(n.timeline) for n in with_tl.nodes] == [8, 8]
        assert store.get_job("999") is None


def test_summary_columns_for_report_sql(store_url: str) -> None:
    with Store.open(store_url) as store:
        store.write_batch([_bundle("7")], collected_at_s=1.0)
        with store.engine.connect() as conn:
            row = conn.execute(sa.select(schema.job_gpus)).one()
            job = conn.execute(sa.select(schema.jobs)).one()
    # make_gpu: readings 0, 50, 90, 95 every 10 s; one idle reading at the start.
    assert row.util_mean_pct == pytest.approx(58.75)
    assert (row.util_p10_pct, row.util_p50_pct, row.util_p90_pct) == (0.0, 50.0, 90.0)
    assert row.idle_fraction == pytest.approx(0.25)
    assert (row.idle_head_s, row.idle_tail_s) == (10.0, 0.0)
    assert row.xid_events == "79,13"
    assert job.gpu_type == "a100"
    assert (job.alloc_gpus, job.req_gpus, job.alloc_cpus) == (1, 1, 8)
    assert job.user == "alice" and job.telemetry == TELEMETRY_COMPLETE


def test_idle_head_tail_of_a_never_active_gpu_is_the_whole_span() -> None:
    from store_fixtures import make_gpu

    gpu = make_gpu("GPU-idle", util=(0, 0, 0))
    assert idle_head_tail_s(gpu) == (20.0, 0.0)


def test_writing_the_same_batch_twice_is_idempotent(store_url: str) -> None:
    bundles = [_bundle(str(i)) for i in range(1, 6)]
    with Store.open(store_url) as store:
        store.write_batch(bundles, collected_at_s=5.0)
        first = dump_db(store_url)
        store.write_batch(bundles, collected_at_s=5.0)
        assert dump_db(store_url) == first
        assert store.job_ids() == ["1", "2", "3", "4", "5"]


def test_upsert_replaces_a_job_and_its_children(store_url: str) -> None:
    with Store.open(store_url) as store:
        store.write_batch([_bundle("8", nodes=(make_node("8", gpus=4),))], collected_at_s=1.0)
        store.write_batch(
            [
                JobBundle(
                    job=make_job("8", state="FAILED"),
                    nodes=(make_node("8", gpus=1),),
                    telemetry=TELEMETRY_COMPLETE,
                )
            ],
            collected_at_s=2.0,
        )
        got = store.get_job("8")
        assert got is not None and got.job.state == "FAILED"
        assert len(got.gpus) == 1
        with store.engine.connect() as conn:
            assert (
                conn.execute(sa.select(sa.func.count()).select_from(schema.job_gpus)).scalar() == 1
            )


def test_a_failing_batch_writes_nothing(store_url: str) -> None:
    good = _bundle("20")
    bad = JobBundle(job=make_job("21"), nodes=(), telemetry="bogus")
    with Store.open(store_url) as store:
        with pytest.raises(StoreError):
            store.write_batch([good, bad], collected_at_s=1.0)
        assert store.job_ids() == []
        # A database-level failure (NOT NULL) also rolls the whole batch back.
        broken = JobBundle(
            job=dataclasses.replace(make_job("22"), user=None),  # type: ignore[arg-type]
            nodes=(),
            telemetry=TELEMETRY_MISSING,
        )
        with pytest.raises(StoreError):
            store.write_batch([good, broken], collected_at_s=1.0)
        assert store.job_ids() == []


def test_jobs_between_selects_on_end_time(store_url: str) -> None:
    with Store.open(store_url) as store:
        store.write_batch(
            [
                _bundle("30", end_s=1000.0),
                _bundle("31", end_s=2000.0),
                _bundle("32", end_s=3000.0),
                JobBundle(job=make_job("33", end_s=2500.0), nodes=(), telemetry=TELEMETRY_MISSING),
            ],
            collected_at_s=1.0,
        )
        got = store.jobs_between(2000.0, 3000.0)
        assert [j.job.job_id for j in got] == ["31", "33"]
        assert got[1].telemetry == TELEMETRY_MISSING and got[1].nodes == ()
        assert len(got[0].nodes) == 1 and len(got[0].gpus) == 1
        assert store.existing_job_ids(["30", "33", "99"]) == {"30", "33"}


def test_many_jobs_in_one_batch_cross_the_chunk_size(store_url: str) -> None:
    bundles = [_bundle(str(1000 + i)) for i in range(1203)]
    with Store.open(store_url) as store:
        store.write_batch(bundles, collected_at_s=1.0)
        assert len(store.job_ids()) == 1203
        assert len(store.jobs_between(0, 2e9)) == 1203
        info = store.info()
    assert info.rows["jobs"] == 1203 and info.rows["job_gpus"] == 1203
    assert info.telemetry == {TELEMETRY_COMPLETE: 1203}
    assert info.schema_version == migrations.LATEST_VERSION
    assert info.size_bytes is not None and info.size_bytes > 0


def test_info_masks_the_password(store_url: str) -> None:
    with Store.open(store_url) as store:
        info = store.info()
    if "@" in store_url:
        password = sa.engine.make_url(store_url).password
        assert password and password not in info.url


def test_sqlite_store_uses_a_rollback_journal_and_creates_its_directory(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "s.db"
    with Store.open(f"sqlite:///{db}") as store, store.engine.connect() as conn:
        # Not WAL: read-only users could not open it (docs/store.md).
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    assert db.exists()


def test_bad_urls_are_typed_errors_with_hints(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as err:
        Store.open("not a url")
    assert err.value.hint
    with pytest.raises(StoreError):
        Store.open("postgresql+psycopg://nobody:x@127.0.0.1:1/none")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot create"):
        Store.open(f"sqlite:///{blocker}/sub/s.db")


def test_rendered_reports_are_written_replaced_and_dropped_with_their_job(
    store_url: str,
) -> None:
    from slurm_gpu.store.store import CachedReport

    def report(job_id: str, key: str, text: str) -> CachedReport:
        return CachedReport(job_id, job_id, key, text, f"\x1b[1m{text}\x1b[0m", 1.0)

    with Store.open(store_url) as store:
        store.write_batch([_bundle("1"), _bundle("2"), _bundle("3")], collected_at_s=1.0)
        assert sorted(store.jobs_needing_reports("k1")) == ["1", "2", "3"]
        assert len(store.jobs_needing_reports("k1", limit=2)) == 2
        # A report of a job that is not stored (deleted meanwhile) is skipped.
        store.write_reports(
            [report("1", "k1", "one"), report("2", "k0", "two"), report("9", "k1", "x")]
        )
        assert sorted(store.jobs_needing_reports("k1")) == ["2", "3"]
        store.write_reports([report("2", "k1", "two again")])
        assert store.jobs_needing_reports("k1") == ["3"]
        with store.engine.connect() as conn:
            r = schema.job_reports
            rows = conn.execute(sa.select(r.c.job_id, r.c.plain).order_by(r.c.job_id)).all()
        assert [tuple(x) for x in rows] == [("1", "one"), ("2", "two again")]
        # Storing a job again drops its report with its other rows.
        store.write_batch([_bundle("1")], collected_at_s=2.0)
        assert sorted(store.jobs_needing_reports("k1")) == ["1", "3"]


def _undo_migration_4(conn: sa.Connection) -> None:
    """Back to a version-3 store: no ``jobs.timeline_pruned_s`` nor its index."""
    schema.ix_jobs_pruned_end.drop(conn)
    conn.execute(sa.text("ALTER TABLE jobs DROP COLUMN timeline_pruned_s"))


def test_a_version_1_store_migrates_to_the_report_table_and_keeps_its_jobs(
    store_url: str,
) -> None:
    with Store.open(store_url) as store:
        store.write_batch([_bundle("7")], collected_at_s=1.0)
        # Back to what a version-1 store holds: no report table, version 1.
        with migrations.write_transaction(store.engine) as conn:
            schema.job_reports.drop(conn)
            _undo_migration_4(conn)
            conn.execute(
                sa.delete(schema.schema_version).where(schema.schema_version.c.version > 1)
            )
    with pytest.raises(StoreError, match="schema version 1"):
        Store.open(store_url, migrate=False)
    with Store.open(store_url) as store:
        assert store.job_ids() == ["7"]
        assert store.jobs_needing_reports("k") == ["7"]
        with store.engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST_VERSION == 11


def test_a_version_2_store_gets_the_het_index_and_typed_id_lookups_use_indexes(
    store_url: str,
) -> None:
    with Store.open(store_url) as store, migrations.write_transaction(store.engine) as conn:
        schema.ix_jobs_het.drop(conn)
        _undo_migration_4(conn)
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version > 2))
    with Store.open(store_url) as store:
        indexed = {ix["name"] for ix in sa.inspect(store.engine).get_indexes("jobs")}
        assert "ix_jobs_het" in indexed
        if store.engine.dialect.name == "sqlite":
            with store.engine.connect() as conn:
                plan = conn.exec_driver_sql(
                    "EXPLAIN QUERY PLAN SELECT job_id FROM jobs WHERE job_id IN ('1') "
                    "OR array_job_id IN ('1') OR het_job_id IN ('1')"
                ).all()
            details = " ".join(str(row[-1]) for row in plan)
            assert "SCAN jobs" not in details and "ix_jobs_het" in details, details


def test_a_store_the_caller_cannot_reach_is_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen as sgtest1: `police` on a store in root's 0750 directory said "does not exist
    yet" (``os.path.lexists`` answers False on EACCES). Only a missing file is "not created";
    any other failure names its cause."""
    from slurm_gpu.errors import StoreError, StoreNotCreatedError
    from slurm_gpu.store import store as store_module

    db = tmp_path / "s.db"
    with pytest.raises(StoreNotCreatedError, match="does not exist yet"):
        store_module.open_engine(f"sqlite:///{db}", create=False)

    def denied(path: object) -> os.stat_result:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(store_module.os, "lstat", denied)
    with pytest.raises(StoreError, match="Permission denied") as got:
        store_module.open_engine(f"sqlite:///{db}", create=False)
    assert not isinstance(got.value, StoreNotCreatedError)
