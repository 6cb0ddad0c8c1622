"""The pull pass: ended jobs of partitions whose source is not the hooks, read from that
source and stored like pushed ones (a real SQLite store and state directory; the
accounting and the source are fakes at their seams)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import FakeAccounting, make_job, make_node

from slurm_gpu.collector import Collector, CollectorOptions
from slurm_gpu.collector.pull import (
    PULL_STATE,
    PullCollector,
    PullOptions,
    SourceMap,
    merged,
)
from slurm_gpu.errors import ConfigError, TelemetryUnavailableError
from slurm_gpu.records import JobRecord
from slurm_gpu.sourcecaps import CAPABILITIES, SourceCapabilities
from slurm_gpu.sources.base import SourceResult
from slurm_gpu.sources.registry import NAMES
from slurm_gpu.store import (
    TELEMETRY_COMPLETE,
    TELEMETRY_MISSING,
    TELEMETRY_RECOVERED,
    Store,
)

END = 1_700_000_100.0


class FakeSource:
    """A ``TelemetrySource`` that returns records for the hosts it is told have data."""

    def __init__(self, name: str = "dcgm-exporter") -> None:
        self.name = name
        self.hosts_with_data: set[str] | None = None  # None: every node of the job
        self.fail: Exception | None = None
        self.calls: list[str] = []
        self.extra: list[tuple[str, str]] = []  # (job id, host) of records that do not fit

    @property
    def capabilities(self) -> SourceCapabilities:
        return CAPABILITIES[self.name]

    def records_for(self, job: JobRecord) -> SourceResult:
        self.calls.append(job.job_id)
        if self.fail is not None:
            raise self.fail
        hosts = [
            h for h in job.nodelist if self.hosts_with_data is None or h in self.hosts_with_data
        ]
        nodes = [
            dataclasses.replace(make_node(job.job_id, h, gpus=1), source=self.name) for h in hosts
        ]
        nodes += [dataclasses.replace(make_node(j, h), source=self.name) for j, h in self.extra]
        missing = tuple(h for h in job.nodelist if h not in hosts)
        return SourceResult(tuple(nodes), missing, ())


@dataclasses.dataclass
class Env:
    tmp: Path
    accounting: FakeAccounting
    source: FakeSource
    now: float = END + 60
    source_map: SourceMap = dataclasses.field(
        default_factory=lambda: SourceMap("hooks", {"a100": "dcgm"})
    )

    @property
    def url(self) -> str:
        return f"sqlite:///{self.tmp}/state/store.db"

    def run(self, **opts: object) -> object:
        made: list[str] = []

        def make(name: str) -> FakeSource:
            made.append(name)
            return self.source

        with Store.open(self.url) as store:
            return PullCollector(
                store=store,
                accounting=self.accounting,
                state_dir=str(self.tmp / "state"),
                source_map=self.source_map,
                make_source=make,
                options=PullOptions(**opts),  # type: ignore[arg-type]
                analyse=lambda job, nodes: (),
                clock=lambda: self.now,
            ).run_once()

    def stored(self, job_id: str) -> object:
        with Store.open(self.url) as store:
            return store.get_job(job_id)

    def mark(self) -> float:
        return float(json.loads((self.tmp / "state" / PULL_STATE).read_text())["checked_until_s"])


@pytest.fixture
def env(tmp_path: Path) -> Env:
    (tmp_path / "state").mkdir(mode=0o700)
    return Env(tmp_path, FakeAccounting(), FakeSource())


def _add(env: Env, job_id: str, partition: str = "a100", **kw: object) -> JobRecord:
    job = make_job(job_id, partition=partition, **kw)  # type: ignore[arg-type]
    env.accounting.jobs[job_id] = job
    return job


def test_an_ended_job_of_a_pulled_partition_is_stored_from_its_source(env: Env) -> None:
    _add(env, "10", nodes=("n1", "n2"))
    report = env.run()
    assert report.ingested == ("10",) and report.errors == ()  # type: ignore[attr-defined]
    got = env.stored("10")
    assert got is not None
    assert got.telemetry == TELEMETRY_COMPLETE  # type: ignore[attr-defined]
    assert sorted(n.hostname for n in got.nodes) == ["n1", "n2"]  # type: ignore[attr-defined]
    assert {n.source for n in got.nodes} == {"dcgm-exporter"}  # type: ignore[attr-defined]
    assert env.mark() == env.now
    # The next pass looks again (relook) but does not ask the source for a stored job.
    env.now += 300
    assert env.run().ingested == ()  # type: ignore[attr-defined]
    assert env.source.calls == ["10"]


def test_jobs_of_hooks_and_none_partitions_are_not_pulled(env: Env) -> None:
    env.source_map = SourceMap("hooks", {"a100": "dcgm", "cpu": "none"})
    _add(env, "11", partition="gpu")
    _add(env, "12", partition="cpu")
    _add(env, "13", partition="a100")
    assert env.run().ingested == ("13",)  # type: ignore[attr-defined]
    assert env.source.calls == ["13"]


def test_a_source_that_cannot_be_read_leaves_the_job_for_the_next_pass(env: Env) -> None:
    job = _add(env, "20")
    env.source.fail = TelemetryUnavailableError("prometheus: connection refused")
    report = env.run()
    assert report.ingested == () and "connection refused" in report.source_errors[0]  # type: ignore[attr-defined]
    assert env.stored("20") is None
    assert job.end_s is not None and env.mark() <= job.end_s
    env.source.fail = None
    env.now += 3600 * 5  # longer than relook_s after the first pass: the hold keeps it
    assert env.run().ingested == ("20",)  # type: ignore[attr-defined]


def test_a_source_bug_fails_one_job_not_the_pass(env: Env) -> None:
    _add(env, "21")
    env.source.fail = ValueError("bad series")
    report = env.run()
    assert report.ingested == () and "bad series" in report.source_errors[0]  # type: ignore[attr-defined]


def test_nodes_without_data_are_stored_missing_and_the_job_partial(env: Env) -> None:
    _add(env, "30", nodes=("n1", "n2"), gpus=2)
    env.source.hosts_with_data = {"n1"}
    report = env.run()
    assert report.partial == ("30",)  # type: ignore[attr-defined]
    got = env.stored("30")
    assert got.telemetry == TELEMETRY_RECOVERED  # type: ignore[attr-defined]
    assert tuple(got.missing_hosts) == ("n2",)  # type: ignore[attr-defined]


def test_a_job_the_source_has_nothing_for_is_stored_missing(env: Env) -> None:
    _add(env, "31")
    env.source.hosts_with_data = set()
    report = env.run()
    assert report.missing_telemetry == ("31",)  # type: ignore[attr-defined]
    assert env.stored("31").telemetry == TELEMETRY_MISSING  # type: ignore[attr-defined]


def test_records_of_another_job_or_node_are_never_stored_under_this_job(env: Env) -> None:
    _add(env, "32", nodes=("n1",))
    env.source.extra = [("99", "n1"), ("32", "intruder")]
    env.run()
    got = env.stored("32")
    assert [n.hostname for n in got.nodes] == ["n1"]  # type: ignore[attr-defined]


def test_unsettled_accounting_waits_and_holds_the_watermark(env: Env) -> None:
    job = _add(env, "40", settled=False)
    report = env.run()
    assert report.unsettled == ("40",) and env.stored("40") is None  # type: ignore[attr-defined]
    assert job.end_s is not None and env.mark() <= job.end_s
    env.accounting.jobs["40"] = make_job("40", partition="a100")
    env.now += 60
    assert env.run().ingested == ("40",)  # type: ignore[attr-defined]


def test_accounting_down_keeps_the_watermark(env: Env) -> None:
    _add(env, "50")
    env.accounting.fail = True
    report = env.run()
    assert report.errors and not (env.tmp / "state" / PULL_STATE).exists()  # type: ignore[attr-defined]


def test_the_push_collectors_missing_pass_leaves_pulled_partitions_alone(env: Env) -> None:
    _add(env, "60", partition="a100")
    _add(env, "61", partition="gpu")
    (env.tmp / "spool").mkdir()
    with Store.open(env.url) as store:
        report = Collector(
            store=store,
            accounting=env.accounting,
            spool_dir=str(env.tmp / "spool"),
            state_dir=str(env.tmp / "state"),
            options=CollectorOptions(missing_grace_s=0.0),
            clock=lambda: END + 700,
            uses_hooks=env.source_map.uses_hooks,
        ).run_once()
    assert report.missing_telemetry == ("61",)


def test_source_map_per_partition_and_default() -> None:
    m = SourceMap("slurm-tres", {"a100": "dcgm", "cpu": "none"})
    assert m.source_for("a100") == "dcgm" and m.source_for("v100") == "slurm-tres"
    assert m.source_for("a100,v100") == "dcgm" and m.source_for(None) == "slurm-tres"
    assert m.pulled == frozenset({"dcgm", "slurm-tres"})
    assert SourceMap().pulled == frozenset()


def test_an_unknown_source_name_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"source\.partitions\.a100.*'dgcm'"):
        SourceMap("hooks", {"a100": "dgcm"}).check(NAMES)
    with pytest.raises(ConfigError, match=r"source\.default"):
        SourceMap("prom").check(NAMES)


def test_nothing_pulled_means_no_query_at_all(env: Env) -> None:
    env.source_map = SourceMap()
    _add(env, "70")
    assert env.run().ingested == ()  # type: ignore[attr-defined]
    assert env.accounting.between_calls == []


def test_merged_reports_concatenate_both_passes() -> None:
    from slurm_gpu.collector import CollectReport

    both = merged(CollectReport(ingested=("1",)), CollectReport(ingested=("2",), partial=("2",)))
    assert both.ingested == ("1", "2") and both.partial == ("2",)
