"""What ``gpueff`` says about a job that runs or waits: no exit code before the job ended, the
GPUs a pending job asked for, and a running job's GPUs by their model name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gpueff_factory as F
from test_sampler import FakeClock, FakeHost, FakeSource, make_opts, stop_after

from slurm_gpu.capture.livefile import read_live
from slurm_gpu.capture.sampler import Sampler
from slurm_gpu.capture.spool import JobSpool
from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.records import Tres


def _render(job: object) -> str:
    report = adapter.accounting_report(job, min_elapsed_s=30)  # type: ignore[arg-type]
    return TerminalRenderer(colour=False).report(report)


def test_a_running_job_has_no_exit_code_yet() -> None:
    out = _render(F.job(state="RUNNING", exit_code=0, end_s=None))
    assert out.splitlines()[0].endswith("RUNNING"), out
    assert "(exit" not in out


def test_a_pending_job_shows_the_gpus_it_asked_for() -> None:
    job = F.job(
        state="PENDING",
        exit_code=0,
        start_s=None,
        end_s=None,
        elapsed_s=0,
        nodelist=(),
        alloc_tres=Tres(),
        req_tres=Tres(cpus=8, gpus=1, gpu_types=(("a100", 1),), raw="x"),
    )
    out = _render(job)
    assert out.splitlines()[0].endswith("PENDING"), out
    assert "gpus 1 x a100" in out and "gpus 0" not in out


def test_an_ended_job_keeps_its_exit_code() -> None:
    out = _render(F.job(state="FAILED", exit_code=3))
    assert "FAILED (exit 3)" in out


def _live_run(tmp_path: Path, source_of: Any, readings: int) -> tuple[dict[str, Any], Any]:
    """A sampler fed by ``source_of(clock)`` for ``readings`` readings: its live summary, and
    the GPU lines ``gpueff`` reads from it."""
    clock = FakeClock()
    source = source_of(clock)
    sampler = Sampler(make_opts(tmp_path), lambda: source, FakeHost(clock), clock=clock)
    wait, _ = stop_after(clock, readings)
    assert sampler.run(wait)
    summary = read_live(JobSpool(str(tmp_path / "spool"), "42", "n1").live)
    tel = adapter.telemetry_from_live(
        [summary],
        ("n1",),
        now_s=summary["updated_s"],
        stale_after_s=180.0,
        clock_s=summary["updated_s"],
    )
    return summary, tel


def test_a_running_jobs_live_summary_names_its_gpus(tmp_path: Path) -> None:
    summary, tel = _live_run(tmp_path, FakeSource, 3)
    assert [(g["name"], g["minor_number"]) for g in summary["gpus"]] == [("fake", 0), ("fake", 1)]
    running = adapter.accounting_report(F.job(state="RUNNING"), min_elapsed_s=30)
    report = adapter.with_telemetry(running, tel.gpus, live=True)
    assert report.gpu_model == "fake"
    assert [g.slot for g in report.gpus] == [0, 1]


def test_a_job_ended_by_a_signal_says_which_not_exit_0() -> None:
    """sacct's ``ExitCode`` 0:9 is a batch script killed by signal 9: "exit 0" alone would
    read as a clean exit (seen on the test cluster: ``FAILED (exit 0)`` for ``0:53``)."""
    out = _render(F.job(state="FAILED", exit_code=0, exit_signal=9))
    assert out.splitlines()[0].endswith("FAILED (signal 9, SIGKILL)"), out
    out = _render(F.job(state="FAILED", exit_code=0, exit_signal=53))
    assert out.splitlines()[0].endswith("FAILED (signal 53)"), out
    out = _render(F.job(state="FAILED", exit_code=2, exit_signal=15))
    assert out.splitlines()[0].endswith("FAILED (exit 2, signal 15, SIGTERM)"), out


def test_a_signal_is_in_the_json_report_too() -> None:
    from slurm_gpu.jobreport.jsonout import job_json

    report = adapter.accounting_report(F.job(state="FAILED", exit_code=0, exit_signal=9))
    doc = job_json(report)
    assert (doc["exit_code"], doc["exit_signal"]) == (0, 9)
    running = adapter.accounting_report(F.job(state="RUNNING", exit_signal=9, end_s=None))
    assert job_json(running)["exit_signal"] is None


def test_a_running_jobs_gpu_line_has_its_mean_power_and_limit(tmp_path: Path) -> None:
    """Seen on the test cluster: a running job's line said ``power n/a`` (the reader looked for
    a ``power_mean_w`` the live summary never had) while Prometheus' view and the final
    report showed ``power 55 W / 400 W``."""
    import dataclasses

    from slurm_gpu.records import GpuInfo

    class Powered(FakeSource):
        def list_gpus(self) -> list[GpuInfo]:
            return [dataclasses.replace(g, power_limit_w=400.0) for g in super().list_gpus()]

        def sample(self, uuids):  # type: ignore[no-untyped-def]
            watts = 100.0 + 50.0 * (self.calls % 2)  # 150, 100, 150, ... W
            return [dataclasses.replace(s, power_w=watts) for s in super().sample(uuids)]

    _, tel = _live_run(tmp_path, Powered, 4)
    assert tel is not None
    for line in tel.gpus:
        assert line.power_mean_w is not None and 100.0 <= line.power_mean_w <= 150.0, line
        assert line.power_limit_w == 400.0
    running = adapter.accounting_report(F.job(state="RUNNING"), min_elapsed_s=30)
    out = TerminalRenderer(colour=False).report(
        adapter.with_telemetry(running, tel.gpus, live=True)
    )
    assert "power n/a" not in out and "W / 400 W" in out, out


def test_a_job_cancelled_before_it_started_shows_what_it_asked_for() -> None:
    """Seen on the test cluster: a job cancelled while it waited read ``gpus 0`` and "No GPU
    was allocated to this job." although it asked for 4: it never started."""
    job = F.job(
        state="CANCELLED",
        exit_code=0,
        nodelist=(),
        elapsed_s=0,
        alloc_cpus=1,
        alloc_tres=Tres(),
        req_tres=Tres(cpus=1, gpus=4, raw="x"),
        total_cpu_s=0.0,
    )
    out = _render(job)
    assert "gpus 4" in out and "No GPU was allocated" not in out, out
    assert "The job never started: it ended CANCELLED before it was given its GPUs." in out
    # A job that ran without GPUs is still said to have had none.
    cpu_only = F.job(alloc_tres=Tres(cpus=8, raw="x"), req_tres=Tres(cpus=8, raw="x"))
    assert "No GPU was allocated to this job." in _render(cpu_only)
