"""``gpueff``'s cached reports on a PostgreSQL store: the collector renders them there too, and
the owner's ``gpueff JOBID`` reads them through libpq (``slurm_gpu.store.libpq``), without
importing psycopg, SQLAlchemy or jinja2. Runs against the local test server (``share/testpg``).
"""

from __future__ import annotations

import dataclasses
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from click.testing import CliRunner
from test_gpueff_owner import SGTEST1, SGTEST2, NeverAsked, _Finding

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import _pg_exec, _schema_url, postgres_url

from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
from slurm_gpu.config import parse_settings
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.jobreport.reportcache import read_cached_pg, render_key
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.urls import libpq_conninfo

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store(tmp_path: Path) -> Iterator[Any]:
    base = postgres_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    _pg_exec(base, f"CREATE SCHEMA {schema}")
    url = _schema_url(base, schema)
    settings = parse_settings(
        {
            "paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")},
            "store": {"url": url},
            "gpueff": {"min_elapsed_s": 30},
        },
        path=None,
    )
    jobs = [
        F.job(),
        F.job(job_id="1002", job_id_display="1002", job_name="eval"),
        F.job(
            job_id="2005",
            job_id_display="2003_2",
            array_job_id="2003",
            array_task_id="2",
            job_name="sweep",
        ),
        F.job(job_id="3001", job_id_display="3001", user="sgtest2", uid=SGTEST2),
    ]
    bundles = [
        JobBundle(
            job,
            (dataclasses.replace(F.node_record(), job_id=job.job_id),),
            TELEMETRY_COMPLETE,
            findings=(_Finding("GPU_UNUSED", "critical", 6, {}, "GPU-node1-0001"),),
            analysis_version="1",
        )
        for job in jobs
    ]
    try:
        with Store.open(url) as store:
            store.write_batch(bundles, collected_at_s=1.0)
            # The collector's publisher, on a PostgreSQL store: no report files are needed
            # there (row-level security shows users their own rows).
            publisher = ReportPrerenderer(settings, store)
            assert publisher.enabled
            # Array tasks (2003_2) are looked up by their typed id through the SQLite reader
            # only: on PostgreSQL gpueff renders theirs itself (docs/gpueff.md, "Speed").
            assert publisher.publish(jobs) == 3
        yield settings
    finally:
        _pg_exec(base, f"DROP SCHEMA {schema} CASCADE")
    assert not (tmp_path / "reports").exists()


def _conninfo(settings: Any) -> str:
    # The test server's role has a password (TCP); a user's URL has none (peer) and goes
    # through ``libpq_conninfo``: here the conninfo is built the same way, password kept.
    return "postgresql://" + settings.store_url.split("://", 1)[1]


def _full(settings: Any, uid: int, *ids: str) -> str:
    reader = StoreAndSpoolReader(settings)
    result = CliRunner().invoke(
        cli,
        ["--no-color", *ids],
        obj={BACKENDS_KEY: (NeverAsked(), reader), CALLER_UID_KEY: uid},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("ids", [["1001"], ["1001", "1002"]])
def test_the_pg_cached_text_is_what_the_full_command_prints(pg_store: Any, ids: list[str]) -> None:
    key = render_key(pg_store.gpueff)
    texts = read_cached_pg(_conninfo(pg_store), ids, SGTEST1, key, colour=False)
    assert texts is not None and "\n".join(texts) == _full(pg_store, SGTEST1, *ids)


@pytest.mark.parametrize(
    ("uid", "ids"),
    [
        (SGTEST2, ["1001"]),  # someone else's job
        (SGTEST1, ["3001"]),
        (SGTEST1, ["1001", "999"]),  # one id not cached: all take the full path
        (SGTEST1, ["2003"]),  # the whole array: accounting knows every task
        (SGTEST1, ["2003_2"]),  # not rendered on PostgreSQL (see the fixture)
        (SGTEST1, []),
    ],
)
def test_the_pg_cache_answers_only_the_callers_own_jobs(
    pg_store: Any, uid: int, ids: list[str]
) -> None:
    key = render_key(pg_store.gpueff)
    assert read_cached_pg(_conninfo(pg_store), ids, uid, key, colour=False) is None


def test_another_render_key_or_an_unreachable_server_is_not_answered(pg_store: Any) -> None:
    conninfo = _conninfo(pg_store)
    assert read_cached_pg(conninfo, ["1001"], SGTEST1, "other-key", colour=False) is None
    dead = "postgresql://nobody@127.0.0.1:1/none"
    assert (
        read_cached_pg(dead, ["1001"], SGTEST1, render_key(pg_store.gpueff), colour=False) is None
    )


def test_root_gets_any_cached_report_from_pg(pg_store: Any) -> None:
    texts = read_cached_pg(
        _conninfo(pg_store), ["3001"], 0, render_key(pg_store.gpueff), colour=False
    )
    assert texts is not None and 'Job 3001 "train-resnet"' in texts[0]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql+psycopg:///slurmgpu?host=/var/run/postgresql",
            "postgresql:///slurmgpu?host=/var/run/postgresql",
        ),
        ("postgresql://db.example/slurmgpu", "postgresql://db.example/slurmgpu"),
        ("postgresql+psycopg://collector:secret@db/slurmgpu", None),  # the collector's URL
        ("sqlite:////var/lib/slurm-gpu/slurm-gpu.db", None),
    ],
)
def test_only_password_free_postgres_urls_take_the_libpq_path(
    url: str, expected: str | None
) -> None:
    assert libpq_conninfo(url) == expected
