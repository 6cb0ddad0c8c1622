"""Retention (``slurm-gpu store prune``) on a real SQLite file and the test PostgreSQL server:
old timelines and reports go, summaries and findings stay, a batch per transaction, and
``gpueff`` says when a job's timeline is gone."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import gpueff_factory as F
import sqlalchemy as sa
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_fixtures
from store_fixtures import make_job, make_node

from slurm_gpu.cli.admin import cli as admin_main
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.jobreport.service import report_for
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store, migrations, schema
from slurm_gpu.store.prune import DAY_S, RetentionPolicy, prune
from slurm_gpu.store.store import CachedReport

store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url

END = 1_700_000_100.0  # make_job's end time


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, float]


def _fill(store: Store, n: int, *, first: int = 1, end_step_s: float = DAY_S) -> list[str]:
    """``n`` jobs with a timeline, a finding and a rendered report, one ending per
    ``end_step_s`` from ``END`` on; returns their ids, oldest first."""
    ids = [str(first + i) for i in range(n)]
    bundles = [
        JobBundle(
            job=dataclasses.replace(make_job(jid), end_s=END + i * end_step_s),
            nodes=(make_node(jid),),
            telemetry=TELEMETRY_COMPLETE,
            findings=(_Finding("low_duty", "warning", 1, {"duty_mean_pct": 10.0}),),
            analysis_version="a1",
        )
        for i, jid in enumerate(ids)
    ]
    store.write_batch(bundles, collected_at_s=1.0)
    store.write_reports([CachedReport(jid, jid, "k", "plain", "colour", 1.0) for jid in ids])
    return ids


def _count(store: Store, table: sa.Table, ids: list[str] | None = None) -> int:
    with store.engine.connect() as conn:
        q = sa.select(sa.func.count()).select_from(table)
        if ids is not None:
            q = q.where(table.c.job_id.in_(ids))
        return int(conn.execute(q).scalar() or 0)


def test_prune_removes_old_timelines_and_reports_and_keeps_summaries_and_findings(
    store_url: str,
) -> None:
    with Store.open(store_url) as store:
        ids = _fill(store, 10)  # ending on days 0..9
        # Now is day 9 + 180: the jobs that ended on days 0..4 are over 184 days old.
        now = END + 9 * DAY_S + 180 * DAY_S
        result = prune(
            store.engine,
            RetentionPolicy(timeline_days=184.5, summary_days=0, batch_jobs=3),
            clock=lambda: now,
        )
        old, recent = ids[:5], ids[5:]
        assert (result.timelines_pruned, result.jobs_deleted) == (5, 0)
        assert (result.timeline_rows, result.report_rows, result.batches) == (5, 5, 2)
        assert _count(store, schema.timelines, old) == 0
        assert _count(store, schema.job_reports, old) == 0
        assert _count(store, schema.timelines, recent) == 5
        assert _count(store, schema.job_reports, recent) == 5
        # Summaries, per-GPU rows and findings of every job stay.
        assert store.job_ids() == sorted(ids)
        assert _count(store, schema.job_gpus) == 10
        assert _count(store, schema.findings) == 10
        pruned = store.get_job(old[0], timelines=True)
        assert pruned is not None and pruned.nodes[0].timeline == ()
        assert pruned.timeline_pruned_s == now
        assert [f.code for f in pruned.findings] == ["low_duty"]
        kept = store.get_job(recent[0], timelines=True)
        assert kept is not None and kept.nodes[0].timeline and kept.timeline_pruned_s is None
        # Idempotent: a second run finds nothing left to do.
        again = prune(
            store.engine,
            RetentionPolicy(timeline_days=184.5, summary_days=0, batch_jobs=3),
            clock=lambda: now + 60,
        )
        assert (again.timelines_pruned, again.jobs_deleted, again.batches) == (0, 0, 0)
        assert store.get_job(old[0]).timeline_pruned_s == now  # type: ignore[union-attr]


def test_prune_deletes_whole_jobs_past_the_summary_retention(store_url: str) -> None:
    with Store.open(store_url) as store:
        ids = _fill(store, 6)
        now = END + 5 * DAY_S + 100 * DAY_S  # days 0..1 are over 103.5 days old
        result = prune(
            store.engine,
            RetentionPolicy(timeline_days=103.5, summary_days=103.5, batch_jobs=500),
            clock=lambda: now,
        )
        assert (result.jobs_deleted, result.timelines_pruned) == (2, 0)
        assert store.job_ids() == sorted(ids[2:])
        for table in schema.JOB_CHILD_TABLES:
            assert _count(store, table, ids[:2]) == 0, table.name


def test_prune_with_both_horizons_at_zero_keeps_everything(store_url: str) -> None:
    with Store.open(store_url) as store:
        _fill(store, 3)
        result = prune(store.engine, RetentionPolicy(0, 0), clock=lambda: END + 1e9)
        assert (result.timelines_pruned, result.jobs_deleted, result.batches) == (0, 0, 0)
        assert _count(store, schema.timelines) == 3


def test_prune_dry_run_counts_and_deletes_nothing(store_url: str) -> None:
    with Store.open(store_url) as store:
        _fill(store, 4)
        now = END + 3 * DAY_S + 10 * DAY_S
        result = prune(store.engine, RetentionPolicy(11.5, 12.5), dry_run=True, clock=lambda: now)
        # Day 0 is past both horizons (deleted, not counted twice); day 1 loses its timeline.
        assert (result.jobs_deleted, result.timelines_pruned, result.batches) == (1, 1, 0)
        assert _count(store, schema.jobs) == 4 and _count(store, schema.timelines) == 4


def test_prune_commits_each_batch_so_others_see_it_before_the_next(store_url: str) -> None:
    """Each batch is its own transaction: while the second batch runs, another connection
    already sees the first batch pruned (a single long transaction would show nothing)."""
    with Store.open(store_url) as store:
        _fill(store, 5)
        seen: list[int] = []
        reader = sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool)

        def clock() -> float:
            # Called once for the cutoffs, then once inside each batch's transaction.
            with reader.connect() as conn:
                seen.append(
                    int(
                        conn.execute(
                            sa.select(sa.func.count())
                            .select_from(schema.jobs)
                            .where(schema.jobs.c.timeline_pruned_s.is_not(None))
                        ).scalar()
                        or 0
                    )
                )
            return END + 1000 * DAY_S

        try:
            result = prune(store.engine, RetentionPolicy(1, 0, batch_jobs=2), clock=clock)
        finally:
            reader.dispose()
        assert result.batches == 3
        assert seen == [0, 0, 2, 4]


def test_migration_4_adds_the_pruned_column_to_a_version_3_store_and_keeps_its_jobs(
    store_url: str,
) -> None:
    with Store.open(store_url) as store:
        _fill(store, 2)
        with migrations.write_transaction(store.engine) as conn:
            schema.ix_jobs_pruned_end.drop(conn)
            conn.execute(sa.text("ALTER TABLE jobs DROP COLUMN timeline_pruned_s"))
            conn.execute(
                sa.delete(schema.schema_version).where(schema.schema_version.c.version > 3)
            )
    with Store.open(store_url) as store:
        insp = sa.inspect(store.engine)
        assert "timeline_pruned_s" in {c["name"] for c in insp.get_columns("jobs")}
        assert "ix_jobs_pruned_end" in {ix["name"] for ix in insp.get_indexes("jobs")}
        job = store.get_job("1", timelines=True)
        assert job is not None and job.timeline_pruned_s is None and job.nodes[0].timeline


def _settings_file(tmp_path: Path, url: str, extra: str = "") -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n[store]\nurl = "{url}"\n{extra}')
    return cfg


def test_store_prune_command_prints_a_summary_and_dry_run_changes_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with Store.open(url) as store:
        _fill(store, 3)  # ended in 2023: far past the default 180 days
    cfg = _settings_file(tmp_path, url)
    runner = CliRunner()
    dry = runner.invoke(admin_main, ["--config", str(cfg), "store", "prune", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would remove the timelines of 3 job(s) and delete 0 job(s)" in dry.output
    with Store.open(url) as store:
        assert _count(store, schema.timelines) == 3
    done = runner.invoke(admin_main, ["--config", str(cfg), "store", "prune", "--json"])
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output)
    assert (summary["timelines_pruned"], summary["jobs_deleted"]) == (3, 0)
    with Store.open(url) as store:
        assert _count(store, schema.timelines) == 0 and _count(store, schema.jobs) == 3


def test_gpueff_on_a_pruned_job_shows_summary_and_findings_and_says_the_timeline_is_gone(
    tmp_path: Path,
) -> None:
    from test_gpueff_store import _settings, _store_job

    job = F.job()
    _store_job(tmp_path, job)
    settings = _settings(tmp_path)

    def render() -> str:
        reader = StoreAndSpoolReader(settings)
        try:
            return TerminalRenderer(colour=False).report(report_for(job, reader, min_elapsed_s=30))
        finally:
            reader.close()

    before = render()
    assert "Timeline deleted" not in before
    with Store.open(settings.store_url) as store:
        pruned_at = (job.end_s or 0) + 200 * DAY_S
        result = prune(store.engine, RetentionPolicy(180, 0), clock=lambda: pruned_at)
        assert result.timelines_pruned == 1
    after = render()
    day = time.strftime("%Y-%m-%d", time.gmtime(pruned_at))
    assert (
        f"Timeline deleted on {day} by the site's retention: no sparkline; "
        "the numbers above and the findings are kept." in after
    )
    # The summary and the findings are still there; only the sparklines went.
    assert "An allocated GPU was never used (cause 6)" in after
    assert "busy" in after
    spark_chars = set("▁▂▃▄▅▆▇█")
    assert spark_chars & set(before) and not spark_chars & set(after)
