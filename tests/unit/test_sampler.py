"""The sampler loop (slurm_gpu.capture.sampler): schedule, checkpoints, sealing, and not dying."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.sampler import ORPHAN_GRACE_S, Sampler, SamplerOptions
from slurm_gpu.capture.spool import JobSpool, SpoolWriter, read_record, read_spool, read_state
from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuSample, HostSample

UUIDS = ("GPU-a", "GPU-b")


class FakeSource:
    """A TelemetrySource at the seam: utilization = reading number; can break on demand."""

    name = "fake"

    def __init__(self, clock: FakeClock, broken: Sequence[int] = ()) -> None:
        self.clock = clock
        self.calls = 0
        self.broken = set(broken)
        self.closed = False

    def list_gpus(self) -> Sequence[GpuInfo]:
        return [GpuInfo(uuid=u, minor_number=i, name="fake") for i, u in enumerate(UUIDS)]

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        self.calls += 1
        if self.calls in self.broken:
            raise RuntimeError("driver hiccup")
        return [
            GpuSample(uuid=u, time_s=self.clock(), utilization_pct=float(self.calls % 100))
            for u in uuids
        ]

    def close(self) -> None:
        self.closed = True


class FakeHost:
    method = "proc"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def sample(self, now_s: float | None = None) -> HostSample:
        t = self.clock() if now_s is None else now_s
        return HostSample(t, t - 1000.0, 10, 0, 0, 1, "proc")

    def allocated_cores(self) -> int | None:
        return 2

    def job_gone(self) -> bool:
        return False


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_opts(tmp_path: Path, **kw: object) -> SamplerOptions:
    base: dict[str, object] = {
        "job_id": "42",
        "hostname": "n1",
        "uid": 1000,
        "gpu_uuids": UUIDS,
        "spool_dir": str(tmp_path / "spool"),
        "interval_s": 10.0,
        "checkpoint_interval_s": 60.0,
        "idle_threshold_pct": 1.0,
        "timeline_points": 64,
    }
    base.update(kw)
    return SamplerOptions(**base)  # type: ignore[arg-type]


def stop_after(clock: FakeClock, n: int, reading_cost_s: float = 0.0):  # type: ignore[no-untyped-def]
    """A wait() that advances the fake clock and asks to stop after n waits."""
    waits: list[float] = []

    def wait(timeout_s: float) -> bool:
        waits.append(timeout_s)
        clock.now += timeout_s + reading_cost_s
        return len(waits) >= n

    return wait, waits


def test_run_writes_spool_checkpoints_and_seals(tmp_path: Path) -> None:
    clock = FakeClock()
    source = FakeSource(clock)
    sampler = Sampler(make_opts(tmp_path), lambda: source, FakeHost(clock), clock=clock)
    wait, waits = stop_after(clock, 20)
    assert sampler.run(wait)
    paths = JobSpool(str(tmp_path / "spool"), "42", "n1")
    contents = read_spool(paths.jsonl)
    assert len(contents.readings) == 20
    assert contents.header.source == "fake"
    assert [g.uuid for g in contents.header.gpus] == list(UUIDS)
    record = read_record(paths.record)
    assert record.complete and record.notes == ()
    assert [g.samples for g in record.gpus] == [20, 20]
    assert record.host is not None and record.host.allocated_cores == 2
    assert record.host.cpu_time_s == 190.0
    # Checkpoints every 60 s: the state covers a prefix of the spool.
    state, offset, _notes = read_state(paths.state)
    assert 0 < offset <= os.path.getsize(paths.jsonl)
    assert NodeAggregator.from_state(state).readings in range(6, 20)
    assert os.path.exists(paths.live)
    assert source.closed
    assert all(w == pytest.approx(10.0) for w in waits)


def test_schedule_is_drift_free_and_skips_missed_ticks(tmp_path: Path) -> None:
    clock = FakeClock()
    sampler = Sampler(make_opts(tmp_path), lambda: FakeSource(clock), FakeHost(clock), clock=clock)
    # Every wait overshoots by 3 s (a slow reading): the next wait shrinks to stay on the grid.
    wait, waits = stop_after(clock, 4, reading_cost_s=3.0)
    sampler.run(wait)
    assert waits == pytest.approx([10.0, 7.0, 7.0, 7.0])
    clock = FakeClock()
    sampler = Sampler(
        make_opts(tmp_path / "b"), lambda: FakeSource(clock), FakeHost(clock), clock=clock
    )
    # A 25 s stall skips two ticks instead of bunching readings up.
    wait, waits = stop_after(clock, 3, reading_cost_s=25.0)
    sampler.run(wait)
    # 1035 -> next tick 1040 (not 1020 and 1030); 1065 -> 1070.
    assert waits == pytest.approx([10.0, 5.0, 5.0])


def test_broken_readings_are_logged_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    source = FakeSource(clock, broken=[2, 3])
    sampler = Sampler(make_opts(tmp_path), lambda: source, FakeHost(clock), clock=clock)
    wait, _ = stop_after(clock, 6)
    assert sampler.run(wait)
    record = read_record(JobSpool(str(tmp_path / "spool"), "42", "n1").record)
    assert [(g.samples, g.samples_available) for g in record.gpus] == [(6, 4), (6, 4)]
    assert "gpu_lost:GPU-a" in record.notes
    assert "driver hiccup" in caplog.text


def test_telemetry_unavailable_still_seals(tmp_path: Path) -> None:
    clock = FakeClock()

    def factory() -> FakeSource:
        raise TelemetryUnavailableError("virtual GPU directory /x does not exist")

    sampler = Sampler(make_opts(tmp_path), factory, FakeHost(clock), clock=clock)
    wait, _ = stop_after(clock, 3)
    assert sampler.run(wait)
    record = read_record(JobSpool(str(tmp_path / "spool"), "42", "n1").record)
    assert "telemetry_unavailable" in record.notes
    assert [g.info.uuid for g in record.gpus] == list(UUIDS)
    assert all(g.samples_available == 0 for g in record.gpus)
    assert record.host is not None and record.host.samples == 3


def test_disk_full_stops_the_spool_but_not_the_aggregates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real_append = SpoolWriter.append

    def append(self: SpoolWriter, *args: object) -> None:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(SpoolWriter, "append", append)
    clock = FakeClock()
    sampler = Sampler(make_opts(tmp_path), lambda: FakeSource(clock), FakeHost(clock), clock=clock)
    wait, _ = stop_after(clock, 10)
    assert sampler.run(wait)
    paths = JobSpool(str(tmp_path / "spool"), "42", "n1")
    record = read_record(paths.record)
    assert record.gpus[0].samples == 10
    assert "spool_write_failed:ENOSPC" in record.notes
    assert calls["n"] == 3  # no retry storm: writing stopped at the first failure
    assert len(read_spool(paths.jsonl).readings) == 2


def test_unwritable_spool_keeps_sampling_and_reports_seal_failure(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    clock = FakeClock()
    sampler = Sampler(
        make_opts(tmp_path, spool_dir=str(blocker / "spool")),
        lambda: FakeSource(clock),
        FakeHost(clock),
        clock=clock,
    )
    wait, _ = stop_after(clock, 4)
    assert not sampler.run(wait)
    assert sampler.agg.readings == 4
    assert any(n.startswith("spool_write_failed:") for n in sampler.notes)


# --------------------------------------------------------------------------- real process


def test_real_sampler_process_seals_on_sigterm(tmp_path: Path) -> None:
    from slurm_gpu.telemetry.virtual_device import create_gpus

    vdir = tmp_path / "vgpu"
    infos = create_gpus(vdir, 2)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nlog_file = "{tmp_path}/log/hooks.log"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\ninterval_s = 0.1\n'
        "checkpoint_interval_s = 1\n"
    )
    cmd = [sys.executable, "-m", "slurm_gpu.hooks.sampler", "--config", str(cfg), "--job-id", "77"]
    cmd += ["--gpus", ",".join(i.uuid for i in infos), "--hostname", "n1", "--cores", "2"]
    proc = subprocess.Popen(cmd)
    paths = JobSpool(f"{tmp_path}/spool", "77", "n1")
    deadline = time.monotonic() + 30
    while not os.path.exists(paths.state) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    record = read_record(paths.record)
    assert record.complete
    assert record.source == "virtual"
    assert [g.info.uuid for g in record.gpus] == [i.uuid for i in infos]
    assert record.gpus[0].samples >= 10
    assert record.gpus[0].info.minor_number == 0
    log = (tmp_path / "log" / "hooks.log").read_text()
    assert "job=77 sampler started" in log and "record sealed" in log


class EndingJobHost(FakeHost):
    """A job whose cgroup Slurm removes after ``ends_after`` readings."""

    def __init__(self, clock: FakeClock, ends_after: int) -> None:
        super().__init__(clock)
        self.readings = 0
        self.ends_after = ends_after

    def sample(self, now_s: float | None = None) -> HostSample:
        self.readings += 1
        return super().sample(now_s)

    def job_gone(self) -> bool:
        return self.readings > self.ends_after


def test_a_sampler_whose_epilog_never_comes_seals_once_the_job_cgroup_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Slurm 24.11 lab, PrologFlags=RunInJob (a clean-clone CI run): the job ended, its epilog
    left no trace, and its sampler ran on until the next job's prolog reaped it 106 s later.
    Once the job's cgroup has been gone for ORPHAN_GRACE_S, the sampler seals by itself."""
    clock = FakeClock()
    source = FakeSource(clock)
    host = EndingJobHost(clock, ends_after=5)
    sampler = Sampler(make_opts(tmp_path, interval_s=1.0), lambda: source, host, clock=clock)
    wait, waits = stop_after(clock, 10_000)  # no epilog ever asks it to stop
    with caplog.at_level(logging.WARNING):
        assert sampler.run(wait)
    assert 5 + ORPHAN_GRACE_S <= len(waits) + 1 <= 5 + ORPHAN_GRACE_S + 2
    record = read_record(JobSpool(str(tmp_path / "spool"), "42", "n1").record)
    assert "sealed_without_epilog" in record.notes
    assert "no epilog stopped this sampler" in caplog.text


def test_a_running_job_is_never_sealed_by_the_orphan_check(tmp_path: Path) -> None:
    clock = FakeClock()
    sampler = Sampler(
        make_opts(tmp_path, interval_s=1.0), lambda: FakeSource(clock), FakeHost(clock), clock=clock
    )
    wait, waits = stop_after(clock, 200)
    assert sampler.run(wait)
    assert len(waits) == 200
    assert read_record(JobSpool(str(tmp_path / "spool"), "42", "n1").record).notes == ()
