"""The collector: spool + (fake) accounting -> store; waiting, quarantine, missing telemetry."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_fixtures
from store_fixtures import FakeAccounting, dump_db, make_job, make_node

from slurm_gpu.capture import spool
from slurm_gpu.collector import Collector, CollectorLock, CollectorOptions
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.store import (
    TELEMETRY_COMPLETE,
    TELEMETRY_MISSING,
    TELEMETRY_NONE,
    TELEMETRY_RECOVERED,
    Store,
)

store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url

END = 1_700_000_100.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Env:
    spool_dir: Path
    state_dir: Path
    url: str
    accounting: FakeAccounting
    clock: Clock

    def seal(self, record: NodeRecord) -> Path:
        js = spool.JobSpool(str(self.spool_dir), record.job_id, record.hostname)
        js.create_dir()
        spool.write_record(js.record, record)
        Path(js.jsonl).write_text("{}\n")
        return Path(js.record)

    def add_job(self, job: JobRecord, *hosts: str, gpus: int = 1) -> None:
        self.accounting.jobs[job.job_id] = job
        for host in hosts:
            self.seal(make_node(job.job_id, host, gpus=gpus))

    def collector(self, store: Store, **opts: object) -> Collector:
        return Collector(
            store=store,
            accounting=self.accounting,
            spool_dir=str(self.spool_dir),
            state_dir=str(self.state_dir),
            options=CollectorOptions(**opts),  # type: ignore[arg-type]
            clock=self.clock,
        )

    def run(self, **opts: object) -> object:
        with Store.open(self.url) as store:
            return self.collector(store, **opts).run_once()

    def records(self) -> list[str]:
        return sorted(f"{r.job_id}/{r.hostname}" for r in spool.list_sealed(str(self.spool_dir)))


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(
        spool_dir=tmp_path / "spool",
        state_dir=tmp_path / "state",
        url=f"sqlite:///{tmp_path}/state/store.db",
        accounting=FakeAccounting(),
        clock=Clock(END + 30),
    )


def test_ingests_records_in_batches_and_moves_them_after_the_commit(env: Env) -> None:
    for i in range(5):
        env.add_job(make_job(str(100 + i)), "node1")
    report = env.run(batch_size=2)
    assert sorted(report.ingested) == ["100", "101", "102", "103", "104"]  # type: ignore[attr-defined]
    # One accounting query per batch of two.
    assert [len(c) for c in env.accounting.get_calls] == [2, 2, 1]
    assert env.records() == []
    assert not any((env.spool_dir / str(100 + i)).exists() for i in range(5))
    # Flat done/: <job>.<host>.record (and the host's other files), no directory per job.
    assert (env.state_dir / "done" / "100.node1.record").exists()
    assert (env.state_dir / "done" / "100.node1.jsonl").exists()
    assert not any(p.is_dir() for p in (env.state_dir / "done").iterdir())
    with Store.open(env.url) as store:
        got = store.get_job("103")
        assert got is not None
        assert got.telemetry == TELEMETRY_COMPLETE
        assert got.job == env.accounting.jobs["103"]
        assert got.nodes[0].gpus == make_node("103", "node1").gpus


def test_running_twice_or_reingesting_the_same_records_gives_the_same_store(
    env: Env, store_url: str
) -> None:
    env.url = store_url
    for i in range(3):
        env.add_job(make_job(str(200 + i), nodes=("n1", "n2")), "n1", "n2", gpus=2)
    env.run()
    first = dump_db(store_url)
    assert len(first["jobs"]) == 3 and len(first["job_gpus"]) == 12
    env.run()
    assert dump_db(store_url) == first
    # A crash after the commit but before the move leaves the records in the spool: put them
    # back and ingest again.
    for job in ("200", "201", "202"):
        os.makedirs(env.spool_dir / job, exist_ok=True)
        for host in ("n1", "n2"):
            shutil.copy(
                env.state_dir / "done" / f"{job}.{host}.record",
                env.spool_dir / job / f"{host}.record",
            )
    assert len(env.records()) == 6
    env.run()
    assert dump_db(store_url) == first
    assert env.records() == []


def test_corrupt_records_are_quarantined_and_the_rest_ingested(env: Env) -> None:
    env.add_job(make_job("300"), "node1")
    env.add_job(make_job("301"), "node1")
    env.add_job(make_job("302"), "node1")
    (env.spool_dir / "301" / "node1.record").write_text('{"schema": "slurm-gpu/node-rec')
    current = f'"version":{spool.RECORD_VERSION}'.encode()
    good = spool.encode_record(make_node("302", "node1")).replace(current, b'"version":9')
    assert b'"version":9' in good
    (env.spool_dir / "302" / "node1.record").write_bytes(good)
    report = env.run()
    assert report.ingested == ("300",)  # type: ignore[attr-defined]
    quarantined = sorted(os.path.basename(p) for p in report.quarantined)  # type: ignore[attr-defined]
    assert quarantined == ["301.node1.record", "302.node1.record"]
    reason = (env.state_dir / "quarantine" / "302.node1.record.reason").read_text()
    assert "version 9" in reason
    assert env.records() == []
    with Store.open(env.url) as store:
        assert store.job_ids() == ["300"]


def test_a_record_in_another_jobs_directory_is_quarantined(env: Env) -> None:
    env.accounting.jobs["401"] = make_job("401")
    record = make_node("400", "node1")
    path = env.seal(record)
    os.makedirs(env.spool_dir / "401")
    shutil.move(path, env.spool_dir / "401" / "node1.record")
    report = env.run()
    assert report.ingested == ()  # type: ignore[attr-defined]
    assert len(report.quarantined) == 1  # type: ignore[attr-defined]


def test_unsettled_accounting_is_polled_again_not_stored_half(env: Env) -> None:
    env.add_job(make_job("500", state="COMPLETING", end_s=None), "node1")
    env.add_job(make_job("501", settled=False), "node1")
    report = env.run()
    assert sorted(report.unsettled) == ["500", "501"]  # type: ignore[attr-defined]
    assert env.records() == ["500/node1", "501/node1"]
    # Accounting settles.
    env.accounting.jobs["500"] = make_job("500")
    report = env.run()
    assert report.ingested == ("500",)  # type: ignore[attr-defined]
    # 501 never settles: after the timeout it is stored as accounting has it.
    env.clock.now = END + 3601
    report = env.run()
    assert report.ingested == ("501",)  # type: ignore[attr-defined]
    with Store.open(env.url) as store:
        got = store.get_job("501")
        assert got is not None and got.job.req_tres.raw == ""


def test_multi_node_job_waits_for_every_node_then_ingests_what_exists(env: Env) -> None:
    job = make_job("600", gpus=2, nodes=("n1", "n2", "n3"))
    env.add_job(job, "n1")
    report = env.run(node_wait_s=600)
    assert report.waiting_nodes == ("600",)  # type: ignore[attr-defined]
    env.seal(make_node("600", "n2"))
    report = env.run(node_wait_s=600)
    assert report.waiting_nodes == ("600",)  # type: ignore[attr-defined]
    env.clock.now = END + 601
    report = env.run(node_wait_s=600)
    assert report.ingested == ("600",) and report.partial == ("600",)  # type: ignore[attr-defined]
    with Store.open(env.url) as store:
        got = store.get_job("600")
        assert got is not None
        assert got.telemetry == TELEMETRY_RECOVERED
        assert got.missing_hosts == ("n3",)
        assert [n.hostname for n in got.nodes] == ["n1", "n2"]


def test_all_nodes_present_fully_qualified_names_match_the_nodelist(env: Env) -> None:
    env.add_job(make_job("650", nodes=("gpu01", "gpu02")), "gpu01.cluster.example", "gpu02")
    report = env.run()
    assert report.ingested == ("650",) and report.partial == ()  # type: ignore[attr-defined]


def test_a_job_accounting_never_knew_is_quarantined_after_the_timeout(env: Env) -> None:
    env.seal(make_node("700", "node1"))
    report = env.run()
    assert report.no_accounting == ("700",)  # type: ignore[attr-defined]
    assert env.records() == ["700/node1"]
    env.clock.now = END + 3601
    report = env.run()
    assert len(report.quarantined) == 1  # type: ignore[attr-defined]
    assert env.records() == []


def test_accounting_failure_leaves_the_records_in_the_spool(env: Env) -> None:
    env.add_job(make_job("800"), "node1")
    env.accounting.fail = True
    report = env.run()
    assert report.ingested == () and len(report.errors) == 2  # type: ignore[attr-defined]
    assert env.records() == ["800/node1"]
    env.accounting.fail = False
    assert env.run().ingested == ("800",)  # type: ignore[attr-defined]


def test_recovered_record_and_job_without_gpus(env: Env) -> None:
    env.accounting.jobs["900"] = make_job("900")
    env.seal(make_node("900", "node1", complete=False))
    env.accounting.jobs["901"] = make_job("901", gpus=0)
    env.seal(make_node("901", "node1", gpus=0))
    env.run()
    with Store.open(env.url) as store:
        assert store.get_job("900").telemetry == TELEMETRY_RECOVERED  # type: ignore[union-attr]
        assert store.get_job("901").telemetry == TELEMETRY_NONE  # type: ignore[union-attr]


def test_gpu_jobs_without_any_record_are_stored_as_missing(env: Env) -> None:
    env.clock.now = END + 3600
    env.accounting.jobs["1000"] = make_job("1000", gpus=2)  # hooks not installed
    env.accounting.jobs["1001"] = make_job("1001", gpus=0)  # CPU job
    env.accounting.jobs["1002"] = make_job("1002", end_s=END + 3300)  # ended within the grace
    env.accounting.jobs["1003"] = make_job("1003", state="RUNNING", end_s=None)
    env.add_job(make_job("1004"), "node1")  # has telemetry
    report = env.run(missing_grace_s=600)
    assert report.missing_telemetry == ("1000",)  # type: ignore[attr-defined]
    assert report.ingested == ("1004",)  # type: ignore[attr-defined]
    with Store.open(env.url) as store:
        got = store.get_job("1000")
        assert got is not None and got.telemetry == TELEMETRY_MISSING and got.nodes == ()
        assert got.missing_hosts == ("node1",)
        assert store.job_ids() == ["1000", "1004"]
    # Later passes look from where the last one stopped and do not store it again.
    env.clock.now += 600
    report = env.run(missing_grace_s=600)
    assert report.missing_telemetry == ("1002",)  # type: ignore[attr-defined]
    start, _ = env.accounting.between_calls[-1]
    assert start == pytest.approx(END + 3600 - 600 - 600)


def test_a_late_record_replaces_a_missing_entry(env: Env) -> None:
    env.clock.now = END + 3600
    env.accounting.jobs["1100"] = make_job("1100")
    assert env.run().missing_telemetry == ("1100",)  # type: ignore[attr-defined]
    env.seal(make_node("1100", "node1"))
    assert env.run().ingested == ("1100",)  # type: ignore[attr-defined]
    with Store.open(env.url) as store:
        assert store.get_job("1100").telemetry == TELEMETRY_COMPLETE  # type: ignore[union-attr]


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, float]


def test_analyse_hook_findings_are_stored_and_a_failing_hook_does_not_block(env: Env) -> None:
    env.add_job(make_job("1200"), "node1")
    env.add_job(make_job("1201", user="bob"), "node1")
    seen: list[tuple[str, int]] = []

    def analyse(job: JobRecord, nodes: object) -> list[_Finding]:
        seen.append((job.job_id, len(nodes)))  # type: ignore[arg-type]
        if job.user == "bob":
            raise ZeroDivisionError("rule bug")
        return [_Finding("gpu_idle", "critical", 6, {"idle_pct": 97.0})]

    with Store.open(env.url) as store:
        c = env.collector(store, analysis_version="rules-3")
        c.analyse = analyse
        report = c.run_once()
        assert sorted(report.ingested) == ["1200", "1201"]
        assert report.analysis_failed == ("1201",)
        ok = store.get_job("1200")
        bad = store.get_job("1201")
    assert seen == [("1200", 1), ("1201", 1)]
    assert ok is not None and [(f.code, f.cause) for f in ok.findings] == [("gpu_idle", 6)]
    assert ok.analysis_version == "rules-3"
    assert bad is not None and bad.findings == () and bad.analysis_version is None


def test_job_option_restricts_the_pass_to_one_job(env: Env) -> None:
    env.add_job(make_job("1300"), "node1")
    env.add_job(make_job("1301"), "node1")
    with Store.open(env.url) as store:
        report = env.collector(store).run_once("1301")
    assert report.ingested == ("1301",)
    assert env.records() == ["1300/node1"]
    assert env.accounting.between_calls == []  # no missing pass for a single job


def test_done_files_are_pruned_after_the_retention(env: Env) -> None:
    """A file in done/ is pruned by the time it was moved there (a rename keeps the time the
    node wrote it, so the collector sets it), and a job directory of an earlier collector
    (done/<job>/) by its own time."""
    env.add_job(make_job("1400"), "node1")
    record = env.seal(make_node("1400", "node1"))
    os.utime(record, (END - 30 * 86400, END - 30 * 86400))  # sealed long ago
    env.run()
    done = env.state_dir / "done"
    moved = done / "1400.node1.record"
    assert moved.exists() and moved.stat().st_mtime > END - 86400
    old = done / "1300"
    old.mkdir()
    (old / "node1.record").write_bytes(moved.read_bytes())
    env.run(done_retention_s=86400 * 365)
    assert moved.exists() and old.exists()
    for path in (moved, done / "1400.node1.jsonl", old):
        os.utime(path, (END - 10 * 86400, END - 10 * 86400))
    env.run(done_retention_s=86400)
    assert sorted(p.name for p in done.iterdir()) == []


def test_the_lock_admits_one_collector(tmp_path: Path) -> None:
    a, b = CollectorLock(str(tmp_path / "st")), CollectorLock(str(tmp_path / "st"))
    assert a.acquire()
    assert not b.acquire()
    a.release()
    assert b.acquire()
    b.release()


def test_each_stored_batch_gets_its_gpueff_reports_rendered(env: Env) -> None:
    """With the report step (``[gpueff] cache_reports``), every job the pass stores, from the
    spool or as missing telemetry, gets its report rendered after the commit."""
    from slurm_gpu.config import parse_settings
    from slurm_gpu.jobreport.prerender import ReportPrerenderer
    from slurm_gpu.jobreport.reportcache import read_cached, render_key

    settings = parse_settings(
        {"paths": {"state_dir": str(env.state_dir)}, "store": {"url": env.url}}, path=None
    )
    env.clock.now = END + 3600
    for i in range(3):
        env.add_job(make_job(str(100 + i)), "node1")
    env.accounting.jobs["200"] = make_job("200", gpus=2)  # no record: stored as missing
    with Store.open(env.url) as store:
        collector = env.collector(store, batch_size=2, missing_grace_s=600)
        collector.reports = ReportPrerenderer(settings, store)
        report = collector.run_once()
    assert report.ingested == ("100", "101", "102")  # type: ignore[attr-defined]
    assert report.missing_telemetry == ("200",)  # type: ignore[attr-defined]
    key = render_key(settings.gpueff)
    db = env.url.removeprefix("sqlite:///")
    uid = make_job("100").uid
    assert uid is not None
    for jid in ("100", "101", "102", "200"):
        texts = read_cached(db, [jid], uid, key, colour=False)
        assert texts is not None and f"Job {jid} " in texts[0], jid
    texts = read_cached(db, ["200"], uid, key, colour=False)
    assert texts is not None and "No GPU telemetry was recorded" in texts[0]


def test_a_pass_returns_after_its_report_files_are_written(env: Env) -> None:
    """The owners' report files are written by a thread while the pass goes on; the pass
    waits for them, the last batch's included, even when the writing is slow."""
    import time
    from collections.abc import Sequence

    from slurm_gpu.config import parse_settings
    from slurm_gpu.jobreport.prerender import ReportPrerenderer
    from slurm_gpu.jobreport.reportwriter import ReportFile, ReportFileWriter

    class SlowWriter(ReportFileWriter):
        def write(self, reports: Sequence[ReportFile]) -> int:
            time.sleep(0.3)  # slower than the rest of the pass
            return super().write(reports)

    settings = parse_settings(
        {"paths": {"state_dir": str(env.state_dir)}, "store": {"url": env.url}}, path=None
    )
    env.clock.now = END + 3600
    for i in range(3):
        env.add_job(make_job(str(100 + i)), "node1")
    root = env.state_dir.parent / "reports"
    files = SlowWriter(str(root), group_of=lambda uid: os.getgid())
    with Store.open(env.url) as store:
        collector = env.collector(store, batch_size=2)
        collector.reports = ReportPrerenderer(settings, store, files=files)
        assert collector.run_once(missing_pass=False).ingested == ("100", "101", "102")
    uid = make_job("100").uid
    assert sorted(p.name for p in (root / str(uid)).iterdir()) == [
        "100.report",
        "101.report",
        "102.report",
    ]


def test_reports_are_handed_over_after_the_commit_before_the_files_move(env: Env) -> None:
    """Each batch's reports go to the report step right after its commit, while its records
    are still in the spool (the report worker renders them while the files move); the
    AdminComment step comes after the move."""
    from collections.abc import Sequence

    events: list[tuple[str, tuple[str, ...], list[str]]] = []

    class Reports:
        def publish(self, jobs: Sequence[JobRecord]) -> int:
            with Store.open(env.url) as store:  # committed: readable from a second connection
                assert all(store.get_job(j.job_id) is not None for j in jobs)
            events.append(("reports", tuple(j.job_id for j in jobs), env.records()))
            return len(jobs)

        def flush(self) -> None:
            events.append(("flush", (), env.records()))

    class Comments:
        def publish(self, bundles: Sequence[object]) -> tuple[list[str], list[str]]:
            ids = tuple(b.job.job_id for b in bundles)  # type: ignore[attr-defined]
            events.append(("admin_comment", ids, env.records()))
            return list(ids), []

    for i in range(3):
        env.add_job(make_job(str(100 + i)), "node1")
    with Store.open(env.url) as store:
        collector = env.collector(store, batch_size=2)
        collector.reports = Reports()
        collector.admin_comment = Comments()
        assert collector.run_once(missing_pass=False).ingested == ("100", "101", "102")
    assert events == [
        ("reports", ("100", "101"), ["100/node1", "101/node1", "102/node1"]),
        ("admin_comment", ("100", "101"), ["102/node1"]),
        ("reports", ("102",), ["102/node1"]),
        ("admin_comment", ("102",), []),
        ("flush", (), []),
    ]


@pytest.mark.parametrize("with_reports", [True, False])
def test_with_reports_a_batch_is_committed_in_parts_each_handed_over_after_its_commit(
    env: Env, monkeypatch: pytest.MonkeyPatch, with_reports: bool
) -> None:
    """With the report step, an accounting batch is stored in parts of at most
    ``REPORT_PART_JOBS`` jobs (one transaction each, sizes as equal as can be), each part's
    reports handed over after its commit; AdminComment once per batch. Without it, one
    transaction per batch as before."""
    from collections.abc import Sequence

    from slurm_gpu.collector import collector as collector_mod

    monkeypatch.setattr(collector_mod, "REPORT_PART_JOBS", 2)
    events: list[tuple[str, tuple[str, ...]]] = []

    class Reports:
        def publish(self, jobs: Sequence[JobRecord]) -> int:
            events.append(("reports", tuple(j.job_id for j in jobs)))
            return len(jobs)

        def flush(self) -> None:
            pass

    class Comments:
        def publish(self, bundles: Sequence[object]) -> tuple[list[str], list[str]]:
            ids = tuple(b.job.job_id for b in bundles)  # type: ignore[attr-defined]
            events.append(("admin_comment", ids))
            return list(ids), []

    for i in range(7):
        env.add_job(make_job(str(100 + i)), "node1")
    with Store.open(env.url) as store:
        write_batch = store.write_batch

        def counted(bundles: Sequence[object], **kw: object) -> None:
            events.append(("commit", tuple(b.job.job_id for b in bundles)))  # type: ignore[attr-defined]
            write_batch(bundles, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "write_batch", counted)
        collector = env.collector(store, batch_size=5)
        collector.reports = Reports() if with_reports else None
        collector.admin_comment = Comments()
        report = collector.run_once(missing_pass=False)
    assert report.ingested == tuple(str(100 + i) for i in range(7))
    assert env.records() == []
    if not with_reports:
        assert events == [
            ("commit", ("100", "101", "102", "103", "104")),
            ("admin_comment", ("100", "101", "102", "103", "104")),
            ("commit", ("105", "106")),
            ("admin_comment", ("105", "106")),
        ]
        return
    assert events == [
        ("commit", ("100", "101")),
        ("reports", ("100", "101")),
        ("commit", ("102", "103")),
        ("reports", ("102", "103")),
        ("commit", ("104",)),
        ("reports", ("104",)),
        ("admin_comment", ("100", "101", "102", "103", "104")),
        ("commit", ("105", "106")),
        ("reports", ("105", "106")),
        ("admin_comment", ("105", "106")),
    ]


def test_a_store_error_in_a_later_part_still_publishes_the_parts_stored_before(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that cannot be stored ends the pass with the store's error, as a batch did; the
    parts committed before it have left the spool, so their AdminComment is still written."""
    from collections.abc import Sequence

    from slurm_gpu.collector import collector as collector_mod
    from slurm_gpu.errors import StoreError

    monkeypatch.setattr(collector_mod, "REPORT_PART_JOBS", 2)
    commented: list[str] = []

    class Reports:
        def publish(self, jobs: Sequence[JobRecord]) -> int:
            return len(jobs)

        def flush(self) -> None:
            pass

    class Comments:
        def publish(self, bundles: Sequence[object]) -> tuple[list[str], list[str]]:
            commented.extend(b.job.job_id for b in bundles)  # type: ignore[attr-defined]
            return [], []

    for i in range(4):
        env.add_job(make_job(str(100 + i)), "node1")
    with Store.open(env.url) as store:
        write_batch = store.write_batch

        def failing(bundles: Sequence[object], **kw: object) -> None:
            if any(b.job.job_id == "102" for b in bundles):  # type: ignore[attr-defined]
                raise StoreError("disk full")
            write_batch(bundles, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "write_batch", failing)
        collector = env.collector(store, batch_size=10)
        collector.reports = Reports()
        collector.admin_comment = Comments()
        with pytest.raises(StoreError):
            collector.run_once(missing_pass=False)
    assert commented == ["100", "101"]
    assert env.records() == ["102/node1", "103/node1"]


def test_parts_are_the_fewest_of_at_most_the_size_and_as_equal_as_can_be() -> None:
    from slurm_gpu.collector.collector import _parts

    def sizes(n: int, most: int) -> list[int]:
        items = list(range(n))
        parts = _parts(items, most)  # type: ignore[arg-type]
        assert [x for p in parts for x in p] == items
        return [len(p) for p in parts]

    assert sizes(500, 128) == [125, 125, 125, 125]
    assert sizes(129, 128) == [65, 64]
    assert sizes(128, 128) == [128]
    assert sizes(5, 2) == [2, 2, 1]
    assert sizes(1, 128) == [1]
    assert sizes(0, 128) == [0]


def test_each_batch_is_read_just_before_it_is_stored_in_the_same_batches(env: Env) -> None:
    """Without an inbox the spool is read batch by batch, each just before its accounting
    query: the batches are those of reading everything first (ids in numeric order, a job
    whose only record is unreadable quarantined and left out of its batch)."""
    from slurm_gpu.collector.collector import _SpoolModule

    events: list[str] = []

    class Reader(_SpoolModule):
        def read_record(self, path: str) -> NodeRecord:
            events.append("read " + Path(path).parent.name)
            return super().read_record(path)

    class Accounting(FakeAccounting):
        def get_jobs(self, job_ids):  # type: ignore[no-untyped-def]
            events.append("query " + ",".join(job_ids))
            return super().get_jobs(job_ids)

    acc = Accounting()
    env.accounting = acc
    for jid in ("9", "10", "11", "12", "100"):
        env.add_job(make_job(jid), "node1")
    (env.spool_dir / "11" / "node1.record").write_text("not json")
    with Store.open(env.url) as store:
        collector = env.collector(store, batch_size=2)
        collector.reader = Reader((str(env.spool_dir), str(env.state_dir)))
        report = collector.run_once(missing_pass=False)
    assert report.ingested == ("9", "10", "12", "100")  # type: ignore[attr-defined]
    assert len(report.quarantined) == 1  # type: ignore[attr-defined]
    assert events == [
        "read 9",
        "read 10",
        "query 9,10",
        "read 11",
        "read 12",
        "read 100",
        "query 12,100",
    ]


def test_a_pass_killed_while_moving_a_multi_node_jobs_records_stores_it_whole_again(
    env: Env,
) -> None:
    """The records of a stored job leave the spool one host at a time; a pass killed between
    two moves leaves some in the spool. The next pass stores the job again from those and
    from the ones already moved to done/, never from the leftovers alone."""
    env.add_job(make_job("700", gpus=2, nodes=("n1", "n2")), "n1", "n2")
    assert env.run().ingested == ("700",)  # type: ignore[attr-defined]
    before = dump_db(env.url)
    # As if the kill came after n1's record moved and before n2's did.
    done = env.state_dir / "done"
    (env.spool_dir / "700").mkdir()
    shutil.move(str(done / "700.n2.record"), str(env.spool_dir / "700" / "n2.record"))
    assert env.run().ingested == ("700",)  # type: ignore[attr-defined]
    assert dump_db(env.url) == before
    assert env.records() == []


def test_records_kept_by_an_earlier_collector_in_a_job_directory_are_still_joined(
    env: Env,
) -> None:
    """Collectors before 2026-11-27 kept done/<job>/<host>.record; after an upgrade a late
    node's record still joins the nodes kept there, and a pass killed half-way through moving
    a job stores it whole from both layouts."""
    env.add_job(make_job("720", gpus=2, nodes=("n1", "n2", "n3")), "n1", "n2", "n3")
    assert env.run().ingested == ("720",)  # type: ignore[attr-defined]
    before = dump_db(env.url)
    done = env.state_dir / "done"
    # As an earlier collector left them: n1 in done/720/, n2 in flat done/, n3 back in the
    # spool (its move never happened).
    (done / "720").mkdir()
    shutil.move(str(done / "720.n1.record"), str(done / "720" / "n1.record"))
    (env.spool_dir / "720").mkdir()
    shutil.move(str(done / "720.n3.record"), str(env.spool_dir / "720" / "n3.record"))
    assert env.run().ingested == ("720",)  # type: ignore[attr-defined]
    assert dump_db(env.url) == before
    assert (done / "720" / "n1.record").exists() and (done / "720.n3.record").exists()


def test_flat_done_names_are_indexed_by_job_id() -> None:
    from slurm_gpu.collector.collector import _index_record, done_name

    index: dict[str, list[str]] = {}
    for name in (
        done_name("42", "gpu01.cluster.example", ".record"),
        done_name("42", "gpu02", ".record"),
        done_name("42", "gpu02", ".jsonl"),
        "420.gpu01.record",
        ".42.gpu03.record.tmp",
        "42.record",
        "x42.gpu01.record",
        "42",
    ):
        _index_record(index, name)
    assert index == {
        "42": ["42.gpu01.cluster.example.record", "42.gpu02.record"],
        "420": ["420.gpu01.record"],
    }


def test_a_late_node_record_joins_the_nodes_already_stored(env: Env) -> None:
    env.add_job(make_job("710", gpus=2, nodes=("n1", "n2")), "n1")
    env.clock.now = END + 601
    assert env.run(node_wait_s=600).partial == ("710",)  # type: ignore[attr-defined]
    env.seal(make_node("710", "n2", gpus=2))
    assert env.run(node_wait_s=600).ingested == ("710",)  # type: ignore[attr-defined]
    with Store.open(env.url) as store:
        got = store.get_job("710")
        assert got is not None and got.telemetry == TELEMETRY_COMPLETE
        assert [n.hostname for n in got.nodes] == ["n1", "n2"] and got.missing_hosts == ()


def test_records_of_an_earlier_run_of_a_requeued_job_are_not_joined(env: Env) -> None:
    first = make_job("720", gpus=2, nodes=("n1",))
    env.add_job(first, "n1")
    assert env.run().ingested == ("720",)  # type: ignore[attr-defined]
    # Requeued: the second run starts after the first one's record ended, on n2.
    start = END + 1000
    env.accounting.jobs["720"] = dataclasses.replace(
        first, nodelist=("n2",), start_s=start, end_s=start + 100
    )
    env.seal(make_node("720", "n2", gpus=2, ended_s=start + 100))
    env.clock.now = start + 130
    assert env.run().ingested == ("720",)  # type: ignore[attr-defined]
    with Store.open(env.url) as store:
        got = store.get_job("720")
        assert got is not None and [n.hostname for n in got.nodes] == ["n2"]


def test_prune_removes_a_symlink_in_done_never_its_target(env: Env, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "old").mkdir(parents=True)
    os.utime(outside / "old", (END - 30 * 86400, END - 30 * 86400))
    (env.state_dir / "done").mkdir(parents=True, mode=0o700)
    (env.state_dir / "done" / "123").symlink_to(outside / "old")
    env.run(done_retention_s=60.0)
    assert (outside / "old").is_dir()
    assert not (env.state_dir / "done" / "123").is_symlink()


def test_oversized_record_is_quarantined_and_a_fifo_is_never_opened(env: Env) -> None:
    big = env.seal(make_node("510", "node1"))
    with open(big, "r+b") as fh:
        fh.truncate((64 << 20) + 1)  # sparse: costs no disk
    env.accounting.jobs["510"] = make_job("510")
    (env.spool_dir / "511").mkdir()
    os.mkfifo(env.spool_dir / "511" / "node1.record")  # reading it would block forever
    report = env.run()
    assert [Path(q).name for q in report.quarantined] == ["510.node1.record"]  # type: ignore[attr-defined]
    reason = (env.state_dir / "quarantine" / "510.node1.record.reason").read_text()
    assert "longer than" in reason
    assert (env.spool_dir / "511" / "node1.record").exists()
