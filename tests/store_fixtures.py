"""Fixtures and record builders for the store and collector tests.

``store_url`` runs a test once against a SQLite file and once against the real PostgreSQL
server of ``share/testpg`` (started here when it is not running; if it cannot start, the test
fails: a store suite that silently skips PostgreSQL proves nothing about it).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa

from slurm_gpu.capture.aggregate import distribution_of as dist
from slurm_gpu.records import (
    GpuInfo,
    GpuSummary,
    HostSummary,
    JobRecord,
    NodeRecord,
    TimelinePoint,
    Tres,
)

REPO = Path(__file__).resolve().parents[1]
TESTPG_START = REPO / "share" / "testpg" / "start"


def postgres_url() -> str:
    """URL of the test PostgreSQL database, starting the server if needed (fails if it can't)."""
    env = os.environ.get("SLURM_GPU_TEST_PG_URL")
    if env:
        return env
    proc = subprocess.run(
        [str(TESTPG_START)], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"cannot start the test PostgreSQL server ({TESTPG_START}): {proc.stderr.strip()}"
        )
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def _pg_url() -> str:
    return postgres_url()


def _schema_url(url: str, schema: str) -> str:
    """``url`` with every connection's search_path set to ``schema``."""
    return f"{url}?options=-csearch_path%3D{schema}"


def _pg_exec(url: str, sql: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store URL: a fresh SQLite file, or a fresh schema of the PostgreSQL test
    database (one per test, so concurrent runs do not see each other's tables)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/sub/dir/store.db"
        return
    url = request.getfixturevalue("_pg_url")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    _pg_exec(url, f"CREATE SCHEMA {schema}")
    try:
        yield _schema_url(url, schema)
    finally:
        _pg_exec(url, f"DROP SCHEMA {schema} CASCADE")


# --------------------------------------------------------------------------- builders


def make_gpu(uuid: str, *, util: Sequence[float] = (0, 50, 90, 95), minor: int = 0) -> GpuSummary:
    active = [i for i, u in enumerate(util) if u > 1]
    t0 = 1_700_000_000.0
    return GpuSummary(
        info=GpuInfo(
            uuid=uuid,
            index=minor,
            minor_number=minor,
            name="Virtual A100 80GB",
            memory_total_bytes=80 * 2**30,
            power_limit_w=400.0,
            compute_capability=(8, 0),
        ),
        samples=len(util),
        samples_available=len(util),
        first_time_s=t0,
        last_time_s=t0 + 10 * (len(util) - 1),
        utilization=dist(util),
        sub_samples=dist([]),
        idle_samples=len(util) - len(active),
        active_first_time_s=t0 + 10 * active[0] if active else None,
        active_last_time_s=t0 + 10 * active[-1] if active else None,
        memory_used_max_bytes=30 * 2**30 + 12345,
        memory_used_mean_bytes=2.5e10,
        power_mean_w=210.5,
        power_max_w=390.25,
        energy_j=123456.75,
        sm_clock_mean_mhz=1410.0,
        temperature_max_c=71.0,
        throttle_power_s=20.0,
        throttle_thermal_s=0.0,
        pcie_tx_mean_bytes_per_s=1.5e9,
        pcie_rx_mean_bytes_per_s=None,
        nvlink_bytes=None,
        nvlink_bytes_while_idle=None,
        ecc_corrected=0,
        ecc_uncorrected=None,
        xid_events=(79, 13),
        process_seen=bool(active),
        max_processes=1 if active else 0,
        pids=(4242, 4243) if active else (),
        sm_active_mean_pct=None,
        tensor_active_mean_pct=12.5,
    )


def make_timeline(
    n_points: int, gpus: int, t0: float = 1_700_000_000.0
) -> tuple[TimelinePoint, ...]:
    return tuple(
        TimelinePoint(
            t_s=t0 + 10 * i,
            width_s=10.0,
            samples=1,
            gpu_utilization_pct=tuple(float((i * 7 + g * 13) % 101) for g in range(gpus)),
            gpu_memory_used_max_bytes=tuple((i % 50 + 1) * 2**30 for _ in range(gpus)),
            gpu_power_w=tuple(100.0 + (i % 30) * 10 for _ in range(gpus)),
            host_cpu_cores=(i % 8) + 0.25,
            host_rss_max_bytes=(i % 20 + 1) * 2**28,
        )
        for i in range(n_points)
    )


def make_node(
    job_id: str,
    host: str = "node1",
    *,
    gpus: int = 1,
    complete: bool = True,
    timeline_points: int = 8,
    ended_s: float = 1_700_000_100.0,
) -> NodeRecord:
    summaries = tuple(make_gpu(f"GPU-{job_id}-{host}-{i}", minor=i) for i in range(gpus))
    return NodeRecord(
        job_id=job_id,
        hostname=host,
        uid=1001,
        interval_s=10.0,
        source="virtual",
        started_s=ended_s - 100,
        ended_s=ended_s,
        gpus=summaries,
        host=HostSummary(
            method="cgroup1",
            samples=10,
            cpu_time_s=812.5,
            cpu_cores_busy=dist([10, 20, 95]),
            allocated_cores=8,
            rss_max_bytes=3 * 2**30,
            rss_mean_bytes=2.2e9,
            io_read_bytes=None,
            io_write_bytes=10**9,
        ),
        timeline=make_timeline(timeline_points, gpus),
        complete=complete,
        notes=() if complete else ("sampler_killed",),
    )


def make_job(
    job_id: str,
    *,
    gpus: int = 1,
    nodes: Sequence[str] = ("node1",),
    state: str = "COMPLETED",
    end_s: float | None = 1_700_000_100.0,
    user: str = "alice",
    account: str = "physics",
    partition: str = "gpu",
    settled: bool = True,
) -> JobRecord:
    alloc = Tres(
        cpus=8 * len(nodes),
        mem_bytes=64 * 2**30,
        nodes=len(nodes),
        gpus=gpus or None,
        gpu_types=(("a100", gpus),) if gpus else (),
        billing=8,
        raw=f"billing=8,cpu={8 * len(nodes)},gres/gpu={gpus},mem=64G,node={len(nodes)}"
        if settled
        else "",
    )
    req = Tres(cpus=8, mem_bytes=64 * 2**30, nodes=len(nodes), gpus=gpus or None, raw="cpu=8")
    return JobRecord(
        job_id=job_id,
        job_id_display=job_id,
        array_job_id=None,
        array_task_id=None,
        het_job_id=None,
        het_job_offset=None,
        user=user,
        uid=1001,
        account=account,
        partition=partition,
        qos="normal",
        job_name="train\nwith newline, 'quotes' and ünïcode",
        work_dir="/home/alice",
        nodelist=tuple(nodes),
        state=state,
        cancelled_by_uid=None,
        exit_code=0,
        exit_signal=None,
        derived_exit_code=0,
        alloc_tres=alloc,
        req_tres=req if settled else Tres(),
        alloc_cpus=8 * len(nodes),
        req_mem_bytes=64 * 2**30,
        max_rss_bytes=3 * 2**30,
        total_cpu_s=812.5,
        elapsed_s=100,
        time_limit_s=3600,
        submit_s=1_699_999_900.0,
        start_s=1_700_000_000.0,
        end_s=end_s,
        restarts=0,
        comment=None,
        admin_comment=None,
        mail_user="alice@example.org",
        mail_type="END",
    )


class FakeAccounting:
    """An ``AccountingSource`` over a dict, counting queries (one per batch is the contract)."""

    name = "fake"

    def __init__(self, jobs: dict[str, JobRecord] | None = None) -> None:
        self.jobs = dict(jobs or {})
        self.get_calls: list[list[str]] = []
        self.between_calls: list[tuple[float, float]] = []
        self.fail = False

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        from slurm_gpu.errors import AccountingError

        if self.fail:
            raise AccountingError("sacct: slurmdbd unreachable")
        self.get_calls.append(list(job_ids))
        return {j: self.jobs[j] for j in job_ids if j in self.jobs}

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        from slurm_gpu.errors import AccountingError

        if self.fail:
            raise AccountingError("sacct: slurmdbd unreachable")
        self.between_calls.append((start_s, end_s))
        return [
            j
            for j in self.jobs.values()
            if j.end_s is not None
            and j.start_s is not None
            and j.start_s <= end_s
            and j.end_s >= start_s
        ]


def rolled_back_store(url: str, version: int, columns: Sequence[tuple[str, str]]) -> None:
    """A store at ``url`` holding job ``7``, then taken back to schema ``version``: the
    (table, column) pairs that later migrations add dropped, their versions forgotten."""
    import sqlalchemy as sa

    from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store

    with Store.open(url) as store:
        store.write_batch(
            [JobBundle(job=make_job("7"), nodes=(make_node("7"),), telemetry=TELEMETRY_COMPLETE)],
            collected_at_s=1.0,
        )
    raw = sa.create_engine(url)
    with raw.begin() as conn:
        for table, column in columns:
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.exec_driver_sql(f"DELETE FROM schema_version WHERE version > {version}")
    raw.dispose()


def dump_db(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every store table, sorted: for comparing two stores exactly."""
    from slurm_gpu.store import schema

    engine = sa.create_engine(url)
    out: dict[str, list[tuple[object, ...]]] = {}
    try:
        with engine.connect() as conn:
            for table in schema.metadata.sorted_tables:
                if table.name == "schema_version":
                    continue
                rows = conn.execute(sa.select(table)).all()
                out[table.name] = sorted((tuple(r) for r in rows), key=json_key)
    finally:
        engine.dispose()
    return out


def json_key(row: tuple[object, ...]) -> str:
    return json.dumps([repr(v) for v in row])
