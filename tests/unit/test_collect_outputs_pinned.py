"""What one collector pass writes for a fixed 4-GPU job, pinned: the report ``gpueff`` prints
(plain and in colour, as stored in ``job_reports``), the owner's report file (its job and GPU
parts) and the stored timeline as the store decodes it. Changes that are only meant to make the
collector faster must leave all of them byte for byte as they are.

A change that is meant to change what users see (wording, a template, the analysis) updates the
pins on purpose: ``SLURM_GPU_UPDATE_PINS=1`` rewrites ``tests/data/pinned/`` from the current
code; the diff of those files is then part of the change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import FakeAccounting, make_gpu, make_job

from slurm_gpu.capture import spool
from slurm_gpu.capture.aggregate import distribution_of as dist
from slurm_gpu.cli.collect_cmd import _analyse_hook
from slurm_gpu.collector import Collector, CollectorOptions
from slurm_gpu.config import parse_settings
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.jobreport.reportwriter import ReportFileWriter
from slurm_gpu.records import HostSummary, NodeRecord, TimelinePoint
from slurm_gpu.store import Store
from slurm_gpu.store.codec import decode_timeline

PINS = Path(__file__).resolve().parents[1] / "data" / "pinned"
JOB = "4242"
START = 1_700_000_000.0
POINTS = 360  # one hour at the default 10 s


def _utils(g: int) -> list[float]:
    """Per-point utilization of GPU ``g``: busy, half busy, never used, busy then idle."""
    out = []
    for i in range(POINTS):
        if g == 0:
            out.append(80.0 + (i * 37) % 20)
        elif g == 1:
            out.append(float((i * 53) % 100) / 2)
        elif g == 2:
            out.append(0.0)
        else:
            out.append(95.0 if i < POINTS // 2 else 0.0)
    return out


def _record() -> NodeRecord:
    utils = [_utils(g) for g in range(4)]
    gpus = tuple(make_gpu(f"GPU-pinned-{g}", util=utils[g], minor=g) for g in range(4))
    timeline = tuple(
        TimelinePoint(
            t_s=START + 10.0 * i,
            width_s=10.0,
            samples=1,
            gpu_utilization_pct=tuple(u[i] for u in utils),
            gpu_memory_used_max_bytes=tuple((20 + g + i % 7) * 2**30 + i for g in range(4)),
            gpu_power_w=tuple(100.0 + utils[g][i] * 2.5 + g for g in range(4)),
            host_cpu_cores=1.0 + (i % 9) / 4,
            host_rss_max_bytes=(4 << 30) + i * 4096,
        )
        for i in range(POINTS)
    )
    return NodeRecord(
        job_id=JOB,
        hostname="node1",
        uid=1001,
        interval_s=10.0,
        source="nvml",
        started_s=START,
        ended_s=START + 10.0 * POINTS,
        gpus=gpus,
        host=HostSummary(
            method="cgroup2",
            samples=POINTS,
            cpu_time_s=3 * 3600.0,
            cpu_cores_busy=dist([10.0 + i % 50 for i in range(POINTS)]),
            allocated_cores=8,
            rss_max_bytes=5 * 2**30,
            rss_mean_bytes=4.5e9,
            io_read_bytes=10**10,
            io_write_bytes=10**9,
        ),
        timeline=timeline,
        complete=True,
    )


@pytest.fixture
def utc() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def _pass(tmp: Path) -> dict[str, str]:
    """One pass over the fixed job, with the analysis and the report step, as files' texts."""
    spool_dir, state_dir = tmp / "spool", tmp / "state"
    record = _record()
    js = spool.JobSpool(str(spool_dir), JOB, "node1")
    js.create_dir()
    spool.write_record(js.record, record)
    job = dataclasses.replace(
        make_job(JOB, gpus=4),
        elapsed_s=3600,
        time_limit_s=7200,
        end_s=START + 3600.0,
        total_cpu_s=3 * 3600.0,
    )
    url = f"sqlite:///{state_dir}/store.db"
    settings = parse_settings(
        {"paths": {"state_dir": str(state_dir)}, "store": {"url": url}}, path=None
    )
    analyse, version = _analyse_hook(settings)
    files = ReportFileWriter(str(tmp / "reports"), group_of=lambda uid: os.getgid())
    with Store.open(url) as store:
        collector = Collector(
            store=store,
            accounting=FakeAccounting({JOB: job}),
            spool_dir=str(spool_dir),
            state_dir=str(state_dir),
            options=CollectorOptions(analysis_version=version),
            analyse=analyse,
            clock=lambda: START + 7200.0,
        )
        collector.reports = ReportPrerenderer(
            settings, store, clock=lambda: START + 7200.0, files=files
        )
        report = collector.run_once(missing_pass=False)
    assert list(report.ingested) == [JOB]
    con = sqlite3.connect(state_dir / "store.db")
    plain, colour = con.execute(
        "SELECT plain, colour FROM job_reports WHERE job_id = ?", (JOB,)
    ).fetchone()
    blob = con.execute("SELECT data FROM timelines WHERE job_id = ?", (JOB,)).fetchone()[0]
    con.close()
    body = json.loads((tmp / "reports" / "1001" / f"{JOB}.report").read_text())
    assert body["plain"] == plain and body["colour"] == colour
    del body["render_key"], body["plain"], body["colour"]  # the key names the code's files
    points = decode_timeline(blob)
    digest = hashlib.sha256(repr([dataclasses.astuple(p) for p in points]).encode()).hexdigest()
    return {
        "collect_4gpu.plain.txt": plain,
        "collect_4gpu.colour.txt": colour,
        "collect_4gpu.file.json": json.dumps(body, indent=1, sort_keys=True) + "\n",
        "collect_4gpu.timeline.sha256": f"{len(points)} points {digest}\n",
    }


def test_a_pass_writes_what_is_pinned(tmp_path: Path, utc: None) -> None:
    got = _pass(tmp_path)
    assert "GPU" in got["collect_4gpu.plain.txt"]
    if os.environ.get("SLURM_GPU_UPDATE_PINS") == "1":
        PINS.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (PINS / name).write_text(text)
    for name, text in got.items():
        assert text == (PINS / name).read_text(), f"{name} differs from tests/data/pinned"
