"""The collector's report step answers a whole batch from one read of the store and renders
the plain text by removing the colour from the coloured one: both must give exactly what
one ``jobs_for_ids`` per job and a second, plain rendering give."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from test_gpueff_owner import _settings, _store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_gpu.jobreport import adapter, jsonout, output, reportwriter, service
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.jobreport.reportwriter import ReportFile, ReportFileWriter
from slurm_gpu.jobreport.storedreports import _BatchReader, as_dict, strip_sgr
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.store import Store
from slurm_gpu.store.sqlite_reader import SqliteReader, sqlite_path

TYPED = ["1001", "2003", "2003_1", "2003_2", "2003_[1-2]", "4000+0", "4000+1", "4000", "5000"]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    _store(
        tmp_path,
        F.job(),
        # An array whose id is also a stored plain job's id, and its two tasks.
        F.job(job_id="2003", job_id_display="2003", job_name="same-id"),
        F.job(job_id="2004", job_id_display="2003_1", array_job_id="2003", array_task_id="1"),
        F.job(job_id="2005", job_id_display="2003_2", array_job_id="2003", array_task_id="2"),
        # A heterogeneous job's two components.
        F.job(job_id="4000", job_id_display="4000+0", het_job_id="4000", het_job_offset=0),
        F.job(job_id="4001", job_id_display="4000+1", het_job_id="4000", het_job_offset=1),
    )
    return tmp_path


def _ids(jobs: list) -> list[str]:  # type: ignore[type-arg]
    return [s.job.job_id for s in jobs]


def test_the_batch_reader_answers_each_typed_id_as_the_reader_does(state: Path) -> None:
    path = sqlite_path(_settings(state).store_url)
    assert path is not None
    with SqliteReader.open(path) as sq:
        batch = _BatchReader(sq, TYPED)
        for typed in TYPED:
            assert _ids(batch.jobs_for_ids([typed], timelines="utilization")) == _ids(
                sq.jobs_for_ids([typed], timelines="utilization")
            ), typed
            got = batch.jobs_for_ids([typed], timelines="utilization")
            want = sq.jobs_for_ids([typed], timelines="utilization")
            assert got == want, typed


def test_the_plain_report_is_the_coloured_one_without_its_colour(state: Path) -> None:
    settings = _settings(state)
    plain_r, colour_r = TerminalRenderer(colour=False), TerminalRenderer(colour=True)
    wording = adapter.findings_wording("")
    for typed in ("1001", "2003_1", "4000+1"):
        job = next(j for j in _jobs(state) if j.job_id_display == typed)
        reader = StoreAndSpoolReader(settings, wording=wording)
        pending = service.start_lookup([typed], service.NoAccounting(), reader, caller_uid=job.uid)
        found = pending.finish(min_elapsed_s=30)
        colour = output.render_groups(colour_r, found.groups)
        assert "\x1b[" in colour
        assert strip_sgr(colour) == output.render_groups(plain_r, found.groups), typed


def _jobs(state: Path) -> list:  # type: ignore[type-arg]
    path = sqlite_path(_settings(state).store_url)
    assert path is not None
    with SqliteReader.open(path) as sq:
        return [s.job for s in sq.jobs_for_ids(["1001", "2003", "4000"])]


def test_a_utilization_only_timeline_has_the_same_times_and_utilization() -> None:
    import dataclasses

    from store_fixtures import make_node

    from slurm_gpu.store import codec

    node = make_node("1", gpus=3)
    blob = codec.encode_timeline(node.timeline, 3)
    full = codec.decode_timeline(blob)
    light = codec.decode_timeline(blob, utilization_only=True)
    assert light == tuple(
        dataclasses.replace(
            p,
            gpu_memory_used_max_bytes=(None,) * 3,
            gpu_power_w=(None,) * 3,
            host_cpu_cores=None,
            host_rss_max_bytes=None,
        )
        for p in full
    )


def _fresh(state: Path, job: Any) -> dict[str, Any]:
    """What gpueff renders for the owner's ``job`` now, as a report file holds it."""
    settings = _settings(state)
    reader = StoreAndSpoolReader(settings, wording=adapter.findings_wording(""))
    typed = job.job_id_display
    found = service.start_lookup(
        [typed], service.NoAccounting(), reader, caller_uid=job.uid
    ).finish(min_elapsed_s=30)
    tel = reader.final(job)
    return {
        "plain": output.render_groups(TerminalRenderer(colour=False), found.groups),
        "colour": output.render_groups(TerminalRenderer(colour=True), found.groups),
        "job": jsonout.job_json(found.groups[0][1][0]),
        # As the file holds it: through JSON (tuples become lists).
        "telemetry": json.loads(json.dumps(dataclasses.asdict(tel))) if tel else None,
    }


@pytest.mark.parametrize("syncfs", ["one syncfs per batch", "fsync per file"])
def test_report_files_and_stored_reports_are_a_fresh_render(
    state: Path, monkeypatch: pytest.MonkeyPatch, syncfs: str
) -> None:
    if syncfs == "fsync per file":  # a C library without syncfs
        monkeypatch.setattr(reportwriter, "_syncfs_function", lambda: None)
    settings = _settings(state)
    root = state / "reports"
    files = ReportFileWriter(str(root), group_of=lambda uid: os.getgid())
    with Store.open(settings.store_url) as store:
        # 2003 names both a job and an array: gpueff asks accounting, so it gets no report.
        assert ReportPrerenderer(settings, store, files=files).refresh() == (6, 5)
    path = sqlite_path(settings.store_url)
    assert path is not None
    con = sqlite3.connect(path)
    stored = {
        typed: (plain, colour)
        for typed, plain, colour in con.execute("SELECT typed_id, plain, colour FROM job_reports")
    }
    con.close()
    assert sorted(stored) == sorted(j.job_id_display for j in _all_jobs(state))
    for job in _all_jobs(state):
        typed = job.job_id_display
        fresh = _fresh(state, job)
        body = json.loads((root / str(job.uid) / f"{typed}.report").read_bytes())
        assert stored[typed] == (fresh["plain"], fresh["colour"]), typed
        assert {k: body[k] for k in fresh} == fresh, typed
    assert not [p for p in (root / str(F.job().uid)).iterdir() if p.name.startswith(".")]


def test_a_failed_sync_writes_no_report_file_and_leaves_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(reportwriter, "_syncfs_function", lambda: failing)
    writer = ReportFileWriter(str(tmp_path / "r"), group_of=lambda uid: os.getgid())
    report = ReportFile(1001, "7", "k", "p\n", "c\n", {"job_id": "7"}, 1)
    assert writer.write([report, dataclasses.replace(report, typed_id="8")]) == 0
    assert list((tmp_path / "r" / "1001").iterdir()) == []


def test_as_dict_is_asdict(state: Path) -> None:
    settings = _settings(state)
    for job in _all_jobs(state):
        reader = StoreAndSpoolReader(settings, wording=adapter.findings_wording(""))
        service.start_lookup(
            [job.job_id_display], service.NoAccounting(), reader, caller_uid=job.uid
        ).finish(min_elapsed_s=30)
        tel = reader.final(job)
        assert tel is not None and tel.gpus
        assert as_dict(tel) == dataclasses.asdict(tel)
    pair = collections.namedtuple("pair", "a b")
    mixed = {"t": (pair(1, [2.5, None]), "s"), "l": [{"k": (True,)}]}
    assert as_dict(mixed) == dataclasses.asdict(_Box(mixed))["v"]


@dataclasses.dataclass(frozen=True)
class _Box:
    v: Any


def _all_jobs(state: Path) -> list:  # type: ignore[type-arg]
    path = sqlite_path(_settings(state).store_url)
    assert path is not None
    with SqliteReader.open(path) as sq:
        return [s.job for s in sq.jobs_for_ids(["1001", "2003_1", "2003_2", "4000+0", "4000+1"])]


def _spark_reference(timeline: Any, gpu: int, points: int) -> tuple[float | None, ...]:
    """The sparkline's down-sampling as first written (one filtered chunk per point)."""
    values = [
        p.gpu_utilization_pct[gpu] if gpu < len(p.gpu_utilization_pct) else None for p in timeline
    ]
    if len(values) <= points:
        return tuple(values)
    out: list[float | None] = []
    for i in range(points):
        chunk = [v for v in values[i * len(values) // points : (i + 1) * len(values) // points]]
        present = [v for v in chunk if v is not None]
        out.append(sum(present) / len(present) if present else None)
    return tuple(out)


def test_the_sparkline_sampling_gives_the_same_values() -> None:
    import random

    from slurm_gpu.records import TimelinePoint

    rng = random.Random(5)

    def timeline(n: int, gpus: int, gaps: float) -> tuple[TimelinePoint, ...]:
        return tuple(
            TimelinePoint(
                t_s=10.0 * i,
                width_s=10.0,
                samples=1,
                gpu_utilization_pct=tuple(
                    None if rng.random() < gaps else round(rng.uniform(0, 100), 2)
                    for _ in range(gpus)
                ),
                gpu_memory_used_max_bytes=(None,) * gpus,
                gpu_power_w=(None,) * gpus,
                host_cpu_cores=None,
                host_rss_max_bytes=None,
            )
            for i in range(n)
        )

    ragged = timeline(50, 2, 0.0) + timeline(50, 1, 0.0)
    cases = [timeline(360, 4, 0.0), timeline(361, 3, 0.2), timeline(10, 2, 0.0), (), ragged]
    cases.append(timeline(100, 1, 1.0))  # no reading at all
    for tl in cases:
        for gpu in range(5):
            assert adapter._spark(tl, gpu, 24) == _spark_reference(tl, gpu, 24)
