"""The collector's AdminComment step: after the commit, one sacctmgr write per stored GPU job,
failures counted, and a stop for the whole run when sacctmgr lower-cases (Slurm 22.05)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from reportseff import job as reportseff_job

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import FakeAccounting, make_job, make_node

from slurm_gpu.accounting.admincomment import AdminCommentWriter, build_summary, decode
from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.capture import spool
from slurm_gpu.cli.collect_cmd import admin_comment_publisher
from slurm_gpu.collector import Collector, CollectReport
from slurm_gpu.collector.admincomment import AdminCommentPublisher
from slurm_gpu.config import parse_settings
from slurm_gpu.store import Store

END = 1_700_000_100.0


class Slurm:
    """sacctmgr and sacct behind the writer's runner seam.

    ``mode``: ``keeps`` (stores what it is given), ``lowers`` (Slurm 22.05: stores it
    lower-cased), ``denies`` (sacctmgr exits 1, as for a user without admin rights).
    ``on_write`` runs at each sacctmgr call, to look at the store at that moment.
    """

    def __init__(self, mode: str, on_write: object = None) -> None:
        self.mode = mode
        self.on_write = on_write
        self.stored: dict[str, str] = {}
        self.sacctmgr: list[list[str]] = []
        self.sacct: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        if argv[0].endswith("sacct"):
            self.sacct.append(list(argv))
            target = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1]
            return CommandResult(0, (self.stored.get(target, "") + "\n").encode(), "")
        self.sacctmgr.append(list(argv))
        if callable(self.on_write):
            self.on_write(argv)
        if self.mode == "denies":
            return CommandResult(1, b"", " Access/permission denied\n")
        target = argv[5].split("=", 1)[1]
        comment = argv[-1].split("=", 1)[1]
        self.stored[target] = comment.lower() if self.mode == "lowers" else comment
        return CommandResult(0, f" Modified job(s)...\n  {target}\n".encode(), "")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def publisher(slurm: Slurm) -> AdminCommentPublisher:
    clock = FakeClock()
    writer = AdminCommentWriter(runner=slurm, clock=clock, sleep=clock.sleep, retry_for_s=3.0)
    return AdminCommentPublisher(writer)


class Site:
    def __init__(self, tmp_path: Path) -> None:
        self.spool_dir = tmp_path / "spool"
        self.state_dir = tmp_path / "state"
        self.url = f"sqlite:///{tmp_path}/state/store.db"
        self.accounting = FakeAccounting()

    def add(self, job_id: str, gpus: int = 1) -> None:
        self.accounting.jobs[job_id] = make_job(job_id, gpus=gpus)
        record = make_node(job_id, "node1", gpus=gpus)
        js = spool.JobSpool(str(self.spool_dir), job_id, "node1")
        js.create_dir()
        spool.write_record(js.record, record)

    def run(self, pub: AdminCommentPublisher | None, **kw: object) -> CollectReport:
        with Store.open(self.url) as store:
            return Collector(
                store=store,
                accounting=self.accounting,
                spool_dir=str(self.spool_dir),
                state_dir=str(self.state_dir),
                clock=lambda: END + 30,
                admin_comment=pub,
            ).run_once(missing_pass=False, **kw)  # type: ignore[arg-type]

    def stored_ids(self) -> set[str]:
        with Store.open(self.url, migrate=False) as store:
            return {j for j in ("1", "2", "3", "4") if store.get_job(j) is not None}


def test_summaries_are_written_after_the_commit(tmp_path: Path) -> None:
    site = Site(tmp_path)
    for job_id in ("1", "2"):
        site.add(job_id, gpus=2)
    seen_in_store: list[bool] = []

    def look(argv: Sequence[str]) -> None:
        job_id = argv[5].split("=", 1)[1]
        seen_in_store.append(job_id in site.stored_ids())

    slurm = Slurm("keeps", on_write=look)
    report = site.run(publisher(slurm))
    assert sorted(report.ingested) == ["1", "2"]
    assert sorted(report.admin_comment_written) == ["1", "2"]
    assert report.admin_comment_failed == ()
    assert seen_in_store == [True, True]  # each write saw its job committed already
    assert len(slurm.sacctmgr) == 2  # one sacctmgr call per job
    with Store.open(site.url, migrate=False) as store:
        stored = store.get_job("1")
        assert stored is not None
        assert decode(slurm.stored["1"]) == build_summary(stored.job, stored.nodes)


def test_a_failed_write_is_counted_and_logged_and_the_job_stays_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = Site(tmp_path)
    site.add("1")
    slurm = Slurm("denies")
    with caplog.at_level(logging.WARNING, logger="slurm_gpu.collector"):
        report = site.run(publisher(slurm))
    assert report.ingested == ("1",)
    assert report.admin_comment_failed == ("1",) and report.admin_comment_written == ()
    assert site.stored_ids() == {"1"}
    assert spool.list_sealed(str(site.spool_dir)) == []  # the records left the spool anyway
    assert any("job 1: AdminComment not written" in r.getMessage() for r in caplog.records)
    # Bounded: the writer's retry window (3 s, one try a second), not more.
    assert len(slurm.sacctmgr) == 4


def test_lower_casing_is_logged_once_and_stops_writing_for_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = Site(tmp_path)
    for job_id in ("1", "2", "3"):
        site.add(job_id)
    slurm = Slurm("lowers")
    pub = publisher(slurm)
    with caplog.at_level(logging.WARNING, logger="slurm_gpu.collector"):
        first = site.run(pub)
        site.add("4")
        second = site.run(pub)  # a later pass of the same run
    assert len(slurm.sacctmgr) == 1
    assert first.admin_comment_failed == ("1", "2", "3") and second.admin_comment_failed == ("4",)
    assert site.stored_ids() == {"1", "2", "3", "4"}
    lowered = [r for r in caplog.records if "lower-cases AdminComment" in r.getMessage()]
    assert len(lowered) == 1
    assert "upgrade Slurm or leave collector.admin_comment off" in lowered[0].getMessage()
    assert pub.stopped == "lower-cased"


def test_the_lower_cased_leftover_is_ignored_by_reportseff(tmp_path: Path) -> None:
    """The one comment written before the stop stays lower-cased; reportseff skips it (it does
    not start with ``JS``) instead of failing on it."""
    site = Site(tmp_path)
    site.add("1")
    slurm = Slurm("lowers")
    site.run(publisher(slurm))
    assert slurm.stored["1"].startswith("js1:")
    assert reportseff_job._parse_admin_comment_to_dict(slurm.stored["1"]) is None


def test_repeated_failures_stop_writing_for_the_run(tmp_path: Path) -> None:
    site = Site(tmp_path)
    for job_id in ("1", "2", "3", "4"):
        site.add(job_id)
    slurm = Slurm("denies")
    report = site.run(publisher(slurm))
    assert report.admin_comment_failed == ("1", "2", "3", "4")
    assert {s[5] for s in slurm.sacctmgr} == {"jobid=1", "jobid=2", "jobid=3"}


def test_jobs_without_gpu_telemetry_get_no_summary(tmp_path: Path) -> None:
    site = Site(tmp_path)
    site.add("1", gpus=0)  # a CPU-only job that still left a record
    slurm = Slurm("keeps")
    report = site.run(publisher(slurm))
    assert report.ingested == ("1",)
    assert slurm.sacctmgr == []
    assert report.admin_comment_written == () and report.admin_comment_failed == ()


def test_a_broken_publisher_does_not_end_the_pass(tmp_path: Path) -> None:
    class Broken:
        def publish(self, bundles: object) -> tuple[list[str], list[str]]:
            raise RuntimeError("bug")

    site = Site(tmp_path)
    site.add("1")
    report = site.run(Broken())  # type: ignore[arg-type]
    assert report.ingested == ("1",) and site.stored_ids() == {"1"}


def test_off_by_default_and_built_from_settings_when_on() -> None:
    assert parse_settings({}, path=None).collector.admin_comment is False
    assert admin_comment_publisher(parse_settings({}, path=None)) is None
    slurm = Slurm("keeps")
    on = parse_settings(
        {
            "collector": {"admin_comment": True},
            "accounting": {"sacct_path": "/opt/slurm/bin/sacct"},
        },
        path=None,
    )
    pub = admin_comment_publisher(on, runner=slurm)
    assert isinstance(pub, AdminCommentPublisher)
    assert pub.writer.sacctmgr_path == "/opt/slurm/bin/sacctmgr"  # type: ignore[attr-defined]
    named = parse_settings(
        {"collector": {"admin_comment": True, "sacctmgr_path": "/usr/local/sbin/sacctmgr"}},
        path=None,
    )
    assert admin_comment_publisher(named).writer.sacctmgr_path == "/usr/local/sbin/sacctmgr"
    plain = parse_settings({"collector": {"admin_comment": True}}, path=None)
    assert admin_comment_publisher(plain).writer.sacctmgr_path == "sacctmgr"


def test_collect_without_the_setting_runs_no_sacctmgr(tmp_path: Path) -> None:
    """The composition root's choice, end to end through the collector."""
    site = Site(tmp_path)
    site.add("1")
    report = site.run(admin_comment_publisher(parse_settings({}, path=None)))
    assert report.ingested == ("1",)
    assert report.admin_comment_written == () and report.admin_comment_failed == ()
