"""One definition of idle ("wasted") GPU-hours (issue 11, item 9): the engine
(``metrics.wasted_gpu_hours``), ``gpueff --json``, the e-mail and the weekly report give the
same number for the same stored job.

The case the issue reported: the report printed "73.1 idle" GPU-hours where the engine's waste
was 43.9, because the per-job report counted allocated × (1 − mean duty cycle), i.e. under-use,
as idle. Here a 1-hour job on 2 GPUs: GPU 0 idle for its first quarter then busy at 90 %,
GPU 1 never used. Idle: 0.25 + 1.0 = 1.25 GPU-hours; under-use would have said 1.325.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from click.testing import CliRunner

from slurm_gpu.analysis.engine import analyze
from slurm_gpu.cli.gpueff import BACKENDS_KEY, cli
from slurm_gpu.config import parse_settings
from slurm_gpu.jobreport import fmt
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.jobreport.service import report_for
from slurm_gpu.notify.message import MailContext, MessageBuilder
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.weekly.aggregate import Period, build_report

UTILS = ([0.0] * 15 + [90.0] * 45, [0.0] * 60)
IDLE_GPU_HOURS = 0.25 + 1.0


class OwnerAccounting:
    """sacct as the job's owner sees it: the one job."""

    name = "fake"

    def __init__(self, job: JobRecord) -> None:
        self.job = job

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        return {self.job.job_id: self.job} if self.job.job_id in job_ids else {}

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        return [self.job]


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, JobRecord, float]:
    """The job in a real SQLite store, as the collector writes it; the engine's waste."""
    cfg = tmp_path / "config.toml"
    cfg.write_text("[gpueff]\nmin_elapsed_s = 30\n")
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    settings = parse_settings(
        {"paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")}}, path=None
    )
    job = F.job()
    record = F.node_record(utils=UTILS)
    analysis = analyze(job, [record], settings.analysis)
    with Store.open(settings.store_url) as store:
        store.write_batch(
            [
                JobBundle(
                    job,
                    (record,),
                    TELEMETRY_COMPLETE,
                    findings=analysis.findings,
                    analysis_version="1",
                )
            ],
            collected_at_s=1.0,
        )
    wasted = analysis.metrics.gpu_hours_wasted
    assert wasted is not None
    return settings, job, wasted


def test_engine_gpueff_mail_and_weekly_report_agree_on_idle_gpu_hours(
    stored: tuple[Any, JobRecord, float],
) -> None:
    settings, job, engine = stored
    assert engine == pytest.approx(IDLE_GPU_HOURS)

    reader = StoreAndSpoolReader(settings)
    try:
        res = CliRunner().invoke(
            cli,
            ["--json", job.job_id],
            obj={BACKENDS_KEY: (OwnerAccounting(job), reader)},
            catch_exceptions=False,
        )
        assert res.exit_code == 0, res.output
        [shown] = json.loads(res.output)["jobs"]
        assert shown["gpu_hours_idle"] == pytest.approx(engine)

        report = report_for(job, reader, min_elapsed_s=30)
    finally:
        reader.close()
    assert report.gpu_hours_wasted == pytest.approx(engine)
    msg = MessageBuilder(from_address="slurm-gpu@localhost", context=MailContext()).build(
        [report], to="sgtest1@localhost"
    )
    text = msg.get_body(("plain",))
    assert text is not None
    assert f"{fmt.hours(2.0)} allocated, {fmt.hours(engine)} idle" in text.get_content()

    assert job.end_s is not None
    with Store.open(settings.store_url) as store:
        weekly = build_report(store.engine, Period(job.end_s - 60, job.end_s + 60))
    assert weekly.headline.gpu_hours_wasted == pytest.approx(engine)
    [worst] = [j for u in weekly.worst_jobs for j in u.jobs]
    assert worst.gpu_hours_wasted == pytest.approx(engine)
