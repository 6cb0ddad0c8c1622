"""``sqlite_reader`` against ``Store``: the same stored jobs read back as equal records."""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import make_job, make_node

from slurm_gpu.errors import StoreError, StoreNotCreatedError
from slurm_gpu.store import (
    TELEMETRY_COMPLETE,
    TELEMETRY_MISSING,
    TELEMETRY_NONE,
    TELEMETRY_RECOVERED,
    JobBundle,
    Store,
    migrations,
)
from slurm_gpu.store.sqlite_reader import SCHEMA_VERSION, SqliteReader, sqlite_path


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, object]
    recommendation: dict[str, object] | None = None
    scope: str | None = None
    subject: str | None = None


def _bundles() -> list[JobBundle]:
    """Every shape gpueff meets: multi-node multi-GPU with findings, a node without a host
    summary, an incomplete node and a missing one, no telemetry, no GPU, array tasks, a het
    job."""
    multi_nodes = (make_node("100", "node1", gpus=4), make_node("100", "node2", gpus=2))
    findings = (
        _Finding(
            "GPU_UNUSED",
            "critical",
            6,
            {"idle_fraction": 1.0, "gpus": ["GPU-100-node1-3"]},
            {"gres": "gpu:3", "lines": ["#SBATCH --gres=gpu:3"]},
            "gpu",
            "GPU-100-node1-3",
        ),
        _Finding("LOW_UTILIZATION", "warning", 1, {"util_mean_pct": 12.5}),
        _Finding("NO_TELEMETRY_HINT", "info", None, {}, None, "node", "node2"),
    )
    bare = dataclasses.replace(make_node("101", "node1", gpus=1), host=None, timeline=())
    partial = make_node("102", "node1", gpus=2, complete=False)
    out = [
        JobBundle(
            make_job("100", gpus=6, nodes=("node1", "node2")),
            multi_nodes,
            TELEMETRY_COMPLETE,
            findings=findings,
            analysis_version="3",
        ),
        JobBundle(make_job("101", gpus=1), (bare,), TELEMETRY_COMPLETE, analysis_version="3"),
        JobBundle(
            make_job("102", gpus=4, nodes=("node1", "node2")),
            (partial,),
            TELEMETRY_RECOVERED,
            missing_hosts=("node2",),
        ),
        JobBundle(make_job("103", gpus=2), (), TELEMETRY_MISSING),
        JobBundle(make_job("104", gpus=0, user="bob"), (), TELEMETRY_NONE),
    ]
    for task, raw in enumerate(("201", "202", "203")):
        job = dataclasses.replace(
            make_job(raw, end_s=1_700_000_200.0 + task),
            job_id_display=f"200_{task}",
            array_job_id="200",
            array_task_id=str(task),
        )
        out.append(JobBundle(job, (make_node(raw),), TELEMETRY_COMPLETE))
    for offset, raw in enumerate(("300", "301")):
        job = dataclasses.replace(
            make_job(raw), job_id_display=f"300+{offset}", het_job_id="300", het_job_offset=offset
        )
        out.append(JobBundle(job, (make_node(raw),), TELEMETRY_COMPLETE))
    return out


ALL_IDS = ["100", "101", "102", "103", "104", "201", "202", "203", "300", "301"]


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "state" / "store.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.write_batch(_bundles(), collected_at_s=1_700_000_500.0)
    return path


@pytest.mark.parametrize("timelines", [True, False])
def test_every_stored_job_reads_back_equal_to_store_get_job(db: Path, timelines: bool) -> None:
    with Store.open(f"sqlite:///{db}", migrate=False) as store, SqliteReader.open(str(db)) as rd:
        for job_id in ALL_IDS:
            expected = store.get_job(job_id, timelines=timelines)
            assert expected is not None
            assert rd.get_job(job_id, timelines=timelines) == expected, job_id
        assert rd.get_job("999") is None and store.get_job("999") is None


def test_shapes_are_really_exercised(db: Path) -> None:
    with SqliteReader.open(str(db)) as rd:
        multi = rd.get_job("100", timelines=True)
        assert multi is not None
        assert [len(n.gpus) for n in multi.nodes] == [4, 2]
        assert all(n.timeline for n in multi.nodes)
        assert [f.code for f in multi.findings] == [
            "GPU_UNUSED",
            "LOW_UTILIZATION",
            "NO_TELEMETRY_HINT",
        ]
        assert multi.findings[0].recommendation == {
            "gres": "gpu:3",
            "lines": ["#SBATCH --gres=gpu:3"],
        }
        bare = rd.get_job("101", timelines=True)
        assert bare is not None and bare.nodes[0].host is None and bare.nodes[0].timeline == ()
        recovered = rd.get_job("102")
        assert recovered is not None and recovered.missing_hosts == ("node2",)
        assert recovered.nodes[0].notes == ("sampler_killed",)
        assert recovered.nodes[0].complete is False
        missing = rd.get_job("103")
        assert missing is not None and missing.nodes == () and missing.telemetry == "missing"
        cpu_only = rd.get_job("104")
        assert cpu_only is not None and cpu_only.gpu_hours is None


def test_typed_ids_find_jobs_array_tasks_and_het_components(db: Path) -> None:
    with SqliteReader.open(str(db)) as rd:

        def ids(*typed: str) -> list[str]:
            return sorted(s.job.job_id for s in rd.jobs_for_ids(typed))

        assert ids("100") == ["100"]
        assert ids("200") == ["201", "202", "203"]
        assert ids("200_1") == ["202"]
        assert ids("200_[0-1]") == ["201", "202", "203"]  # a range: matched after accounting
        assert ids("300+1") == ["301"]
        assert ids("300") == ["300", "301"]
        assert ids("100", "103", "999") == ["100", "103"]
        with Store.open(f"sqlite:///{db}", migrate=False) as store:
            assert rd.jobs_for_ids(["200"], timelines=True) == [
                store.get_job(i, timelines=True) for i in ("201", "202", "203")
            ]


def test_user_jobs_are_the_newest_of_that_user_in_the_window(db: Path) -> None:
    with SqliteReader.open(str(db)) as rd:
        alice = rd.user_jobs("alice", 1_700_000_000.0, 1_800_000_000.0, limit=100)
        assert sorted(s.job.job_id for s in alice) == sorted(set(ALL_IDS) - {"104"})
        assert [s.job.job_id for s in rd.user_jobs("bob", 0.0, 2e9, limit=5)] == ["104"]
        # Ended before the window: not listed.
        assert rd.user_jobs("alice", 1_700_000_150.0, 2e9, limit=100) == [
            s for s in alice if s.job.array_job_id == "200"
        ]
        assert len(rd.user_jobs("alice", 0.0, 2e9, limit=2)) == 2


def test_schema_version_follows_the_migrations() -> None:
    assert SCHEMA_VERSION == migrations.LATEST_VERSION


def test_a_store_behind_this_release_is_refused(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM schema_version")
    with pytest.raises(StoreError, match="schema version 0") as info:
        SqliteReader.open(str(db))
    assert "slurm-gpu store migrate" in (info.value.hint or "")


def test_a_missing_or_foreign_file_is_a_store_error(tmp_path: Path) -> None:
    # A file that does not exist yet is its own case: the mail program waits for it.
    with pytest.raises(StoreNotCreatedError, match="does not exist yet"):
        SqliteReader.open(str(tmp_path / "nope.db"))
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a database"):
        SqliteReader.open(str(junk))


def test_sqlite_path_only_for_plain_sqlite_files() -> None:
    assert sqlite_path("sqlite:////var/lib/slurm-gpu/slurm-gpu.db") == (
        "/var/lib/slurm-gpu/slurm-gpu.db"
    )
    assert sqlite_path("sqlite+pysqlite:///rel.db") == "rel.db"
    assert sqlite_path("sqlite://") is None
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("sqlite:///file:x.db?mode=ro&uri=true") is None
    assert sqlite_path("postgresql+psycopg://u@h/db") is None


def test_reader_never_writes(db: Path) -> None:
    before = db.read_bytes()
    with SqliteReader.open(str(db)) as rd:
        for job_id in ALL_IDS:
            rd.get_job(job_id, timelines=True)
    assert db.read_bytes() == before
    assert sorted(p.name for p in db.parent.iterdir()) == ["store.db"]


def test_a_wal_store_of_an_earlier_release_is_switched_when_the_collector_opens_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.write_batch(_bundles()[:1], collected_at_s=1.0)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
    conn.close()
    with Store.open(f"sqlite:///{path}") as store, store.engine.connect() as sa_conn:
        assert sa_conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
    with SqliteReader.open(str(path)) as rd:
        assert rd.get_job("100") is not None
