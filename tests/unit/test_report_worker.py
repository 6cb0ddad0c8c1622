"""The report worker (``renderpool`` + ``renderworker``): a second process renders the
collector's reports exactly as the collector's own step does, ``flush`` waits for all of them,
and a worker that cannot start or that dies loses none of them (they are rendered in the
collector's process, with a log line)."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from test_gpueff_owner import _settings, _store

from slurm_gpu.config import Settings
from slurm_gpu.jobreport import prerender
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.jobreport.renderpool import RenderPool, environment, worker_command
from slurm_gpu.records import JobRecord
from slurm_gpu.store import Store
from slurm_gpu.store.sqlite_reader import SqliteReader, sqlite_path

IDS = [str(3000 + i) for i in range(7)]
#: A worker that reads a little of its input and dies.
DYING = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(1); sys.exit(3)"]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    _store(tmp_path, *(F.job(job_id=i, job_id_display=i) for i in IDS))
    return tmp_path


def _jobs(state: Path) -> list[JobRecord]:
    path = sqlite_path(_settings(state).store_url)
    assert path is not None
    with SqliteReader.open(path) as sq:
        return [s.job for s in sq.jobs_for_ids(IDS)]


def _in_process(state: Path) -> dict[str, tuple[str, str, str, str]]:
    """The reports the collector's own step renders, by job id."""
    settings = _settings(state)
    with Store.open(settings.store_url) as store:
        reports, _ = ReportPrerenderer(settings, store, pool=None, files=_NoFiles()).render(
            _jobs(state)
        )
    return {r.job_id: _text(r) for r in reports}


def _text(r: Any) -> tuple[str, str, str, str]:
    return (r.typed_id, r.render_key, r.plain, r.colour)


def _stored(state: Path) -> dict[str, tuple[str, str, str, str]]:
    path = sqlite_path(_settings(state).store_url)
    assert path is not None
    con = sqlite3.connect(path)
    rows = con.execute("SELECT job_id, typed_id, render_key, plain, colour FROM job_reports")
    out = {r[0]: tuple(r[1:]) for r in rows}
    con.close()
    return out  # type: ignore[return-value]


class _NoFiles:
    def write(self, reports: Any) -> int:
        return 0


def test_the_worker_renders_what_the_collector_renders(state: Path) -> None:
    want = _in_process(state)
    assert sorted(want) == IDS
    pool = RenderPool(_settings(state), unit_jobs=100)
    assert pool.submit(_jobs(state))
    with pool._cond:  # the worker has its unit (so that ``finish`` leaves it to the worker)
        pool._cond.wait_for(lambda: not pool._waiting, timeout=120)
    here: list[list[JobRecord]] = []
    pool.finish(here.append)
    assert here == []
    assert {r.job_id: _text(r) for r in pool.take_done()} == want
    assert not pool.running  # stopped by ``finish``


def test_flush_stores_every_report_handed_over(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _in_process(state)
    monkeypatch.setattr(prerender, "MIN_WORKER_JOBS", 1)
    settings = _settings(state)
    with Store.open(settings.store_url) as store:
        p = ReportPrerenderer(settings, store, pool=RenderPool(settings, unit_jobs=2))
        jobs = _jobs(state)
        assert p.publish(jobs[:3]) == 3  # handed over: the worker starts
        assert p.publish(jobs[3:]) == 4  # a running worker takes any batch
        p.flush()
    assert _stored(state) == want


def _pass_with_a_failing_worker(
    state: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    pool_of: Callable[[Settings], RenderPool],
    batches: Callable[[list[JobRecord]], list[list[JobRecord]]],
) -> tuple[RenderPool, list[int]]:
    """One collector pass handing ``batches`` to a worker that fails (``pool_of``), its errors
    logged into ``caplog``; the reports stored must be those rendered in-process. Returns the
    pool and what each ``publish`` returned."""
    want = _in_process(state)
    monkeypatch.setattr(prerender, "MIN_WORKER_JOBS", 1)
    settings = _settings(state)
    with Store.open(settings.store_url) as store:
        pool = pool_of(settings)
        p = ReportPrerenderer(settings, store, pool=pool)
        with caplog.at_level(logging.ERROR, logger="slurm_gpu.prerender"):
            published = [p.publish(batch) for batch in batches(_jobs(state))]
            p.flush()  # returns: the pass ends
    assert _stored(state) == want
    return pool, published


def test_a_worker_that_dies_loses_no_report(
    state: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pool, _ = _pass_with_a_failing_worker(
        state,
        monkeypatch,
        caplog,
        lambda settings: RenderPool(settings, command=DYING, unit_jobs=2),
        lambda jobs: [jobs[:3], jobs[3:]],
    )
    assert "report worker failed: " in caplog.text
    assert not pool.running


def test_a_worker_that_cannot_start_is_logged_and_the_collector_renders(
    state: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, published = _pass_with_a_failing_worker(
        state,
        monkeypatch,
        caplog,
        lambda settings: RenderPool(settings, command=[str(state / "no-such-python")]),
        lambda jobs: [jobs],
    )
    assert published == [len(IDS)]
    assert "report worker not started" in caplog.text


def test_small_batches_and_postgresql_stores_render_in_the_collector(state: Path) -> None:
    settings = _settings(state)
    pool = _NoPool()
    with Store.open(settings.store_url) as store:
        p = ReportPrerenderer(settings, store, pool=pool)  # type: ignore[arg-type]
        assert p.publish(_jobs(state)) == len(IDS)  # fewer than MIN_WORKER_JOBS
        p.flush()
    assert pool.submitted == []
    pg = dataclasses.replace(
        settings, store=dataclasses.replace(settings.store, url="postgresql://h/db")
    )
    assert ReportPrerenderer(pg, store=None)._pool is None
    off = dataclasses.replace(
        settings, collector=dataclasses.replace(settings.collector, report_worker=False)
    )
    assert ReportPrerenderer(off, store=None)._pool is None
    assert ReportPrerenderer(settings, store=None)._pool is not None


class _NoPool:
    running = False

    def __init__(self) -> None:
        self.submitted: list[Any] = []

    def submit(self, jobs: Any) -> bool:
        self.submitted.append(jobs)
        return True

    def take_done(self) -> list[Any]:
        return []

    def finish(self, render_here: Any) -> None:
        pass


def test_the_worker_is_isolated_and_handed_its_environment() -> None:
    cmd = worker_command()
    assert cmd[:3] == [sys.executable, "-I", "-c"]
    assert Path(cmd[4], "slurm_gpu", "jobreport", "renderworker.py").is_file()
    env = environment({"TZ": "Europe/Berlin", "PYTHONPATH": "/tmp", "SLURM_GPU_CONFIG": "/x"})
    assert env == {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "TZ": "Europe/Berlin",
    }
    assert "TZ" not in environment({})


def test_the_worker_renders_without_sqlalchemy(state: Path, tmp_path: Path) -> None:
    """The worker starts once per pass: SQLAlchemy (about 0.1 s of CPU to import, more than
    rendering 50 reports) is the collector's, never the worker's."""
    from slurm_gpu.jobreport.renderworker import BOOT

    seen = tmp_path / "modules.txt"
    spy = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(seen)!r}, 'w').write("
        "' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'psycopg', 'numpy')))))\n"
    )
    cmd = worker_command()
    cmd[3] = spy + BOOT
    pool = RenderPool(_settings(state), command=cmd, unit_jobs=100)
    assert pool.submit(_jobs(state))
    with pool._cond:
        pool._cond.wait_for(lambda: not pool._waiting, timeout=120)
    pool.finish(lambda jobs: None)
    assert len(pool.take_done()) == len(IDS)  # rendered in the worker
    assert seen.read_text() == ""
