"""gpueff's reader over a real SQLite store, real analysis findings, and a real live file."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest

from slurm_gpu.analysis.engine import analyze
from slurm_gpu.capture import livefile, spool
from slurm_gpu.config import parse_settings
from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.jobreport.service import report_for
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store


@dataclass(frozen=True)
class WithRecommendation:
    """A finding carrying its recommendation, as the collector stores it."""

    code: Any
    severity: Any
    cause: int | None
    evidence: Any
    subject: str | None = None
    recommendation: dict[str, Any] | None = field(default=None)


def _settings(tmp_path: Path) -> Any:
    return parse_settings(
        {"paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")}},
        path=None,
    )


def _store_job(tmp_path: Path, job: JobRecord) -> None:
    settings = _settings(tmp_path)
    record = F.node_record()
    analysis = analyze(job, [record], settings.analysis)
    recs = {r.finding: r.to_dict() for r in analysis.recommendations}
    findings = tuple(
        WithRecommendation(f.code, f.severity, f.cause, f.evidence, f.subject, recs.get(f.code))
        for f in analysis.findings
    )
    assert findings, "the factory's half-idle job must produce findings"
    with Store.open(settings.store_url) as store:
        store.write_batch(
            [
                JobBundle(
                    job, (record,), TELEMETRY_COMPLETE, findings=findings, analysis_version="1"
                )
            ],
            collected_at_s=1.0,
        )


def test_stored_job_reads_back_with_worded_findings(tmp_path: Path) -> None:
    job = F.job()
    _store_job(tmp_path, job)
    reader = StoreAndSpoolReader(_settings(tmp_path))
    report = report_for(job, reader, min_elapsed_s=30)
    reader.close()
    assert report.telemetry.value == "final"
    assert [g.duty_mean_pct for g in report.gpus] == pytest.approx([80.0, 0.0])
    assert len(report.gpus[0].spark_pct) == 24
    codes = {f.code for f in report.findings}
    assert "GPU_UNUSED" in codes
    unused = next(f for f in report.findings if f.code == "GPU_UNUSED")
    assert unused.title == "An allocated GPU was never used"
    assert "GPU-node1-0001" in unused.text
    assert any(
        line.startswith("#SBATCH") for r in report.recommendations for line in r.sbatch_lines
    )
    text = TerminalRenderer(colour=False).report(report)
    assert "An allocated GPU was never used (cause 6)" in text


def test_unknown_code_falls_back_to_its_name() -> None:
    word = adapter.findings_wording()
    f = WithRecommendation("FUTURE_THING", "info", None, {})
    assert word(f) == ("Future thing", "")


def _write_summary(settings: Any, job: JobRecord, host: str, updated_s: float) -> None:
    """A live summary of one busy GPU of ``job`` on ``host``, last written at ``updated_s``."""
    paths = spool.JobSpool(settings.paths.spool_dir, job.job_id, host)
    paths.create_dir()
    summary = {
        "job_id": job.job_id,
        "hostname": host,
        "started_s": updated_s - 60.0,
        "updated_s": updated_s,
        "interval_s": 1.0,
        "gpus": [
            {
                "uuid": "GPU-a",
                "utilization_pct": 90.0,
                "memory_used_bytes": 5 * F.GIB,
                "memory_total_bytes": 40 * F.GIB,
                "utilization_mean_pct": 55.0,
                "idle_samples": 6,
                "samples": 60,
                "memory_used_max_bytes": 6 * F.GIB,
                "process_seen": True,
            }
        ],
        "host": None,
    }
    livefile.write_live(paths, summary, None)


def test_live_file_is_read_for_running_jobs(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    job = F.job(state="RUNNING", end_s=None, exit_code=None)
    updated_s = time.time() - 5
    _write_summary(settings, job, "node1", updated_s)
    report = report_for(job, StoreAndSpoolReader(settings), min_elapsed_s=30)
    assert report.telemetry.value == "live" and report.live_updated_s == updated_s
    (g,) = report.gpus
    assert g.duty_mean_pct == 55.0 and g.idle_fraction == pytest.approx(0.1)
    assert g.memory_peak_bytes == 6 * F.GIB and g.power_mean_w is None
    assert report.notes == ()


def test_a_stale_live_file_shows_its_gpus_as_unknown_with_the_reason(tmp_path: Path) -> None:
    # As from Prometheus: a node whose sampler stopped writing (hung, killed, the node gone)
    # has its last numbers shown as unknown, never as the job's current ones.
    settings = _settings(tmp_path)
    job = F.job(state="RUNNING", end_s=None, exit_code=None)
    _write_summary(settings, job, "node1", time.time() - 600)
    report = report_for(job, StoreAndSpoolReader(settings), min_elapsed_s=30)
    (g,) = report.gpus
    assert g.duty_mean_pct is None and g.idle_fraction is None and g.memory_peak_bytes is None
    assert g.energy_j is None and g.memory_total_bytes == 40 * F.GIB
    notes = " ".join(report.notes)
    assert "node1: its live summary is 00:10:00 old" in notes, notes
    assert "shown as unknown" in notes
    text = TerminalRenderer(colour=False).report(report)
    assert "n/a busy" in text and "0 % busy" not in text and "00:10:00 old" in text


def test_a_live_file_dated_ahead_of_this_hosts_clock_is_unknown(tmp_path: Path) -> None:
    # The node's clock runs an hour ahead: its summary looks fresh for an hour after its
    # sampler stopped, so its age cannot be told and its numbers are not shown as current.
    settings = _settings(tmp_path)
    job = F.job(state="RUNNING", end_s=None, exit_code=None)
    _write_summary(settings, job, "node1", time.time() + 3600)
    report = report_for(job, StoreAndSpoolReader(settings), min_elapsed_s=30)
    (g,) = report.gpus
    assert g.duty_mean_pct is None and g.idle_fraction is None and g.energy_j is None
    notes = " ".join(report.notes)
    assert "node1: its live summary is dated 01:00:00 ahead of this host's clock" in notes, notes
    assert "shown as unknown" in notes
    text = TerminalRenderer(colour=False).report(report)
    assert "n/a busy" in text and "55 %" not in text
    assert " 0 s old" not in text, text  # no age is told that cannot be


def test_a_live_file_a_few_seconds_ahead_is_shown(tmp_path: Path) -> None:
    # Clocks a second or two apart, or a summary written while this host read it: current.
    settings = _settings(tmp_path)
    job = F.job(state="RUNNING", end_s=None, exit_code=None)
    _write_summary(settings, job, "node1", time.time() + 2)
    report = report_for(job, StoreAndSpoolReader(settings), min_elapsed_s=30)
    assert report.gpus[0].duty_mean_pct == 55.0 and report.notes == ()


def test_a_node_without_a_live_file_is_named(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    job = replace(F.job(state="RUNNING", end_s=None, exit_code=None), nodelist=("node1", "node2"))
    _write_summary(settings, job, "node1", time.time() - 5)
    report = report_for(job, StoreAndSpoolReader(settings), min_elapsed_s=30)
    assert [g.node for g in report.gpus] == ["node1"]
    assert report.gpus[0].duty_mean_pct == 55.0
    notes = " ".join(report.notes)
    assert "no live summary readable on this host from node2" in notes, notes


def test_running_job_on_a_host_without_live_file(tmp_path: Path) -> None:
    job = F.job(state="RUNNING", end_s=None, exit_code=None)
    report = report_for(job, StoreAndSpoolReader(_settings(tmp_path)), min_elapsed_s=30)
    assert report.telemetry.value == "no_telemetry" and report.gpus == ()


def test_sqlite_store_is_read_mode_ro_by_a_user_who_cannot_write_beside_it(
    tmp_path: Path,
) -> None:
    import shutil
    import tempfile

    from slurm_gpu.jobreport.readers import open_store_reader
    from slurm_gpu.store.sqlite_reader import SqliteReader

    job = F.job()
    if os.geteuid() != 0:  # the rest needs another uid
        _store_job(tmp_path, job)
        assert isinstance(open_store_reader(_settings(tmp_path).store_url), SqliteReader)
        return
    # pytest's own directories are private to root; this one is world-traversable.
    shared = Path(tempfile.mkdtemp(prefix="gpueff-ro-"))
    try:
        shared.chmod(0o755)
        _store_job(shared, job)
        (shared / "slurm-gpu.db").chmod(0o644)
        os.seteuid(65534)
        try:
            assert not os.access(shared, os.W_OK, effective_ids=True)
            reader = open_store_reader(_settings(shared).store_url)
            stored = reader.get_job(job.job_id, timelines=True)
            reader.close()
        finally:
            os.seteuid(0)
        assert isinstance(reader, SqliteReader)
        assert stored is not None and stored.job == job
        assert [p.name for p in shared.iterdir() if p.name.startswith("slurm-gpu.db")] == [
            "slurm-gpu.db"
        ]
    finally:
        shutil.rmtree(shared)
