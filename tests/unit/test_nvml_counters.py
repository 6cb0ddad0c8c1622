"""The costly NVML reads at their own cadence (issue 29), against the fake libnvidia-ml.so.1.

On an H100 the total-energy field costs about 4 ms and each violation counter 0.85 ms, while
the rest of a GPU-reading costs about 1.5 ms (docs/performance.md, "NVML on a real H100").
These counters are cumulative: the job's totals are differences of two reads, so they are
read at one reading in ``counters_every``, at the first reading of a GPU and when the sampler
seals (``read_counters``), and the totals stay those of a read at every reading. The driver's
utilization samples and the process list are fetched with one C call per reading instead of
two.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvmlfake.driver import Clock, FakeDriver, loaded_drivers

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.capture.spool import JobSpool, read_record
from slurm_gpu.config import Settings, TelemetrySettings
from slurm_gpu.records import GpuSummary
from slurm_gpu.telemetry import counters_every, nvml_samples
from slurm_gpu.telemetry.base import CounterSource
from slurm_gpu.telemetry.nvml import NvmlSource

A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
SLICE_1 = "MIG-11111111-0000-0000-0000-000000000000"
ENERGY, POWER, ECC_SBE, NVLINK_TX, PCIE_TX = 83, 185, 3, 138, 197
T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Iterator[Callable[[str], FakeDriver]]:
    yield from loaded_drivers(monkeypatch, clock)


@pytest.fixture
def h100(driver: Callable[[str], FakeDriver]) -> FakeDriver:
    return driver("r570_h100")


def source(clock: Clock, every: int) -> NvmlSource:
    return NvmlSource(clock=clock, wall_clock=clock, counters_every=every)


# ------------------------------------------------------------------ cadence of the counters


def test_cumulative_counters_are_read_at_one_reading_in_k(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock, 3)
    for _ in range(30):
        clock.advance(10)
        src.sample([A])
    # energy, ECC and PCIe totals: readings 1, 4, 7, ... 28; the rest at every reading
    assert h100.field_reads(ENERGY) == 10
    assert h100.field_reads(ECC_SBE) == h100.field_reads(PCIE_TX) == 10
    assert h100.field_reads(POWER) == h100.field_reads(NVLINK_TX) == 30
    assert h100.calls("nvmlDeviceGetFieldValues") == 30  # still one batch per reading
    assert h100.calls("nvmlDeviceGetViolationStatus") == 2 * 10  # power and thermal


def test_every_reading_reads_every_counter_when_k_is_one(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock, 1)
    for _ in range(5):
        clock.advance(10)
        src.sample([A])
    assert h100.field_reads(ENERGY) == 5 and h100.calls("nvmlDeviceGetViolationStatus") == 10


def test_readings_between_leave_the_counters_unknown_and_read_the_rest(
    h100: FakeDriver, clock: Clock
) -> None:
    h100.set(A, "violation_power_ns", 7 * 10**9)
    src = source(clock, 3)
    clock.advance(10)
    first = src.sample([A])[0]
    assert first.energy_mj == 9_000_000 and first.violation_power_ns == 7 * 10**9
    assert first.ecc_corrected_total == 3 and first.pcie_tx_bytes_per_s is None  # no delta yet
    h100.set(A, "pcie_tx_bytes", 10**9 + 6 * 10**9)
    for _ in range(2):
        clock.advance(10)
        between = src.sample([A])[0]
        assert between.available and between.power_w == pytest.approx(512.345)
        assert between.nvlink_tx_bytes == 100 * 1024 and between.utilization_pct == 87.0
        assert between.energy_mj is None and between.ecc_corrected_total is None
        assert between.violation_power_ns is None and between.violation_thermal_ns is None
        assert between.pcie_tx_bytes_per_s is None
    clock.advance(10)
    fourth = src.sample([A])[0]
    assert fourth.energy_mj == 9_000_000 and fourth.violation_power_ns == 7 * 10**9
    # the PCIe rate over the 30 s since the previous read of the byte counters
    assert fourth.pcie_tx_bytes_per_s == pytest.approx(6 * 10**9 / 30)


def test_a_gpu_first_read_later_has_its_counters_read_at_once(
    h100: FakeDriver, clock: Clock
) -> None:
    src = source(clock, 3)
    clock.advance(10)
    src.sample([A])
    clock.advance(10)
    a, b = src.sample([A, "GPU-bbbbbbbb-0000-0000-0000-000000000000"])
    assert a.energy_mj is None and b.energy_mj == 9_000_000


def test_read_counters_reads_energy_violations_and_ecc_now_and_nothing_else(
    h100: FakeDriver, clock: Clock
) -> None:
    src = source(clock, 30)
    assert isinstance(src, CounterSource)
    clock.advance(10)
    src.sample([A])
    h100.set(A, "energy_mj", 9_500_000)
    h100.set(A, "violation_thermal_ns", 4 * 10**9)
    h100.reset_calls()
    clock.advance(3)
    (s,) = src.read_counters([A])
    assert s.available and s.time_s == clock.t
    assert s.energy_mj == 9_500_000 and s.violation_thermal_ns == 4 * 10**9
    assert s.violation_power_ns == 0 and s.ecc_corrected_total == 3
    assert s.utilization_pct is None and s.power_w is None and s.processes is None
    assert h100.field_reads(ENERGY) == 1
    assert h100.calls() == 1 + 2, h100.call_table()  # one field batch, two violation calls


def test_read_counters_of_a_lost_gpu_or_an_unknown_uuid_is_unavailable(
    h100: FakeDriver, clock: Clock
) -> None:
    src = source(clock, 3)
    src.sample([A])
    h100.lose(A)
    lost, unknown = src.read_counters([A, "GPU-gone"])
    assert not lost.available and not unknown.available


def test_read_counters_of_a_mig_slice_gives_its_gpus_violation_times(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r535_129_h100_mig")
    drv.set("GPU-a1a1a1a1-0000-0000-0000-000000000000", "violation_power_ns", 5 * 10**9)
    src = source(clock, 3)
    src.sample([SLICE_1])
    (s,) = src.read_counters([SLICE_1])
    assert s.available and s.violation_power_ns == 5 * 10**9 and s.energy_mj is None


def test_cadence_from_the_settings() -> None:
    assert counters_every(TelemetrySettings()) == 6  # 60 s at the default 10 s
    assert counters_every(TelemetrySettings(interval_s=1.0, counters_interval_s=30.0)) == 30
    assert counters_every(TelemetrySettings(interval_s=60.0, counters_interval_s=30.0)) == 1
    assert counters_every(TelemetrySettings(counters_interval_s=0.0)) == 1
    assert counters_every(TelemetrySettings(interval_s=7.0, counters_interval_s=30.0)) == 4


def test_open_source_passes_the_cadence_on() -> None:
    from slurm_gpu.telemetry import open_source

    settings = Settings(telemetry=TelemetrySettings(interval_s=5.0, counters_interval_s=60.0))
    src = open_source(settings)
    assert isinstance(src, NvmlSource) and src.counters_every == 12


# ------------------------------------------------------------------ exact totals


def _record(
    src: NvmlSource, drv: FakeDriver, clock: Clock, readings: int, *, seal: bool
) -> GpuSummary:
    """A job on GPU A read every 10 s: the GPU draws 500 W and the power cap holds its clocks
    2.5 s of every 10 s (never when the bitmask is read); ``seal`` reads the counters at the
    end, as the sampler does, at the time of the last reading."""
    info = {g.uuid: g for g in src.list_gpus()}[A]
    agg = NodeAggregator(
        job_id="1", hostname="n1", uid=1000, interval_s=10.0, source="nvml",
        gpus=[info], started_s=clock.t,
    )  # fmt: skip
    drv.set(A, "clocks_event_reasons", 0)
    energy, violation = 9_000_000, 10**12
    for _ in range(readings):
        energy += 5_000_000
        violation += 2_500_000_000
        drv.set(A, "energy_mj", energy)
        drv.set(A, "violation_power_ns", violation)
        clock.advance(10)
        agg.add(clock.t, src.sample([A]), None)
    if seal:
        agg.add_counters(clock.t, src.read_counters([A]))
    return agg.record(ended_s=clock.t, complete=True).gpus[0]


@pytest.mark.parametrize("readings", [1, 2, 13, 14, 30])
def test_totals_with_the_cadence_and_the_seal_equal_those_of_every_reading(
    h100: FakeDriver, clock: Clock, readings: int
) -> None:
    every = _record(source(clock, 1), h100, clock, readings, seal=False)
    h100.load()
    clock.attach(h100)
    sparse = _record(source(clock, 6), h100, clock, readings, seal=True)
    # energy: the counter's difference between the first reading and the last
    assert sparse.energy_j == every.energy_j
    if readings > 1:
        assert sparse.energy_j == (readings - 1) * 5000.0
    # the first reading has no counter delta yet and counts its clear bitmask
    assert sparse.throttle_power_s == pytest.approx((readings - 1) * 2.5)
    assert sparse.throttle_power_s == pytest.approx(every.throttle_power_s)
    assert sparse.throttle_power_known_s == pytest.approx(every.throttle_power_known_s)
    assert sparse.ecc_corrected == every.ecc_corrected


def test_without_the_seal_the_readings_since_the_last_counters_fall_back_to_the_mask(
    h100: FakeDriver, clock: Clock
) -> None:
    g = _record(source(clock, 6), h100, clock, 14, seal=False)
    # counters read at readings 1, 7 and 13: energy up to reading 13; throttling exact up
    # to it (12 x 2.5 s), reading 14 from its clear bitmask; the first reading's too
    assert g.energy_j == 12 * 5000.0
    assert g.throttle_power_s == pytest.approx(12 * 2.5)
    assert g.throttle_power_known_s == pytest.approx(140.0)


# ------------------------------------------------------------------ the sampler's seal


def test_the_sampler_reads_the_counters_when_it_seals(
    h100: FakeDriver, clock: Clock, tmp_path: Path
) -> None:
    opts = SamplerOptions(
        job_id="42", hostname="n1", uid=None, gpu_uuids=(A,), spool_dir=str(tmp_path),
        interval_s=10.0, checkpoint_interval_s=60.0, idle_threshold_pct=1.0,
        timeline_points=64,
    )  # fmt: skip
    energy = [9_000_000]
    waits = [0]

    def wait(timeout_s: float) -> bool:
        clock.advance(timeout_s)
        energy[0] += 1_000_000  # 100 W
        h100.set(A, "energy_mj", energy[0])
        waits[0] += 1
        return waits[0] >= 8  # SIGTERM during the 8th wait: 8 readings, then the seal

    sampler = Sampler(opts, lambda: source(clock, 6), None, clock=clock)
    assert sampler.run(wait)
    record = read_record(JobSpool(str(tmp_path), "42", "n1").record)
    # counters read at readings 1 and 7 and at the seal, 80 s after the first reading
    assert record.gpus[0].energy_j == 8 * 1000.0
    assert h100.field_reads(ENERGY) == 3


# ------------------------------------------------------------------ the driver's samples


def test_utilization_samples_are_read_at_the_counters_cadence_over_the_last_interval(
    h100: FakeDriver, clock: Clock
) -> None:
    # nvmlDeviceGetSamples costs 2.0-2.7 ms per C call on an H200 (docs/performance.md), most of
    # a reading: it is read with the counters, for the interval before that reading only.
    src = source(clock, 6)
    base = int(clock.t * 1_000_000)
    h100.add_sample(A, base - 500_000, 10)
    src.sample([A])  # the first reading reads the counters and primes the cursor
    h100.reset_calls()
    per_reading = []
    for k in range(12):
        h100.add_sample(A, base + k * 1_000_000 + 100_000, 20 + k)
        h100.add_sample(A, base + k * 1_000_000 + 266_667, 40 + k)
        h100.add_sample(A, base + k * 1_000_000 + 433_334, 60 + k)
        h100.add_sample(A, base + k * 1_000_000 + 600_001, 80 + k)
        h100.add_sample(A, base + k * 1_000_000 + 766_668, 0)
        h100.add_sample(A, base + k * 1_000_000 + 933_335, 0)
        clock.advance(1)
        per_reading.append(src.sample([A])[0].utilization_samples_pct)
    assert h100.calls("nvmlDeviceGetSamples") == 2  # readings 7 and 13 of the GPU
    read = [k for k, got in enumerate(per_reading) if got]
    assert read == [5, 11]
    # Only the second before each of those readings: the samples of k = 5 and of k = 11, no
    # 0 % filler for the window's start (it is a reading, not a sampling period).
    assert per_reading[5] == (25.0, 45.0, 65.0, 85.0, 0.0, 0.0)
    assert per_reading[11] == (31.0, 51.0, 71.0, 91.0, 0.0, 0.0)


def test_utilization_samples_at_every_reading_when_k_is_one(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock, 1)
    base = int(clock.t * 1_000_000)
    h100.add_sample(A, base - 500_000, 10)
    src.sample([A])
    got = []
    for k in range(4):
        h100.add_sample(A, base + k * 1_000_000 + 100_000, 20 + k)
        clock.advance(1)
        got.extend(src.sample([A])[0].utilization_samples_pct)
    assert h100.calls("nvmlDeviceGetSamples") == 5
    assert got[-1] == 23.0 and 20.0 in got


def test_a_window_without_a_driver_sample_is_idle(h100: FakeDriver, clock: Clock) -> None:
    # The buffer runs dry while the GPU is idle (NOT_FOUND): the window's samples are 0 %, one
    # per sampling period, as the gap filler counts them between two samples.
    src = source(clock, 3)
    base = int(clock.t * 1_000_000)
    for k in range(6):  # a sampling period of 1/6 s, learnt when the cursor primes
        h100.add_sample(A, base - 1_000_000 + k * 166_667, 50)
    src.sample([A])
    for _ in range(3):
        clock.advance(1)
        got = src.sample([A])[0].utilization_samples_pct
    assert got == (0.0,) * 6


def _primed_on_idle_samples(h100: FakeDriver, clock: Clock, every: int) -> tuple[NvmlSource, int]:
    """A source whose first reading primed the cursor on 0 % samples 200 ms apart (a driver
    that records idle periods, as an H200's does); and the clock's µs at the start."""
    src = source(clock, every)
    base = int(clock.t * 1_000_000)
    for k in range(5):
        h100.add_sample(A, base - 1_000_000 + k * 200_000, 0)
    src.sample([A])
    return src, base


def test_a_driver_that_records_idle_samples_has_its_gaps_left_unfilled(
    h100: FakeDriver, clock: Clock
) -> None:
    # An H200 keeps a sample every 200 ms, idle or busy, 14 s of them: once it has shown a 0 %
    # sample, a gap is what the buffer no longer holds (a reading 20 s later), not idle time.
    src, base = _primed_on_idle_samples(h100, clock, 1)
    for k in range(3):  # then only the buffer's newest samples of the next 20 s remain
        h100.add_sample(A, base + 19_400_000 + k * 200_000, 90)
    clock.advance(20)
    assert src.sample([A])[0].utilization_samples_pct == (90.0, 90.0, 90.0)


def test_a_window_with_no_sample_on_a_driver_that_records_idle_is_unknown(
    h100: FakeDriver, clock: Clock
) -> None:
    src, _base = _primed_on_idle_samples(h100, clock, 3)
    for _ in range(3):
        clock.advance(1)
        got = src.sample([A])[0].utilization_samples_pct
    assert got == ()


@pytest.mark.parametrize("partial", [False, True])
def test_a_full_samples_buffer_grows_and_no_sample_is_lost(
    h100: FakeDriver, clock: Clock, monkeypatch: pytest.MonkeyPatch, partial: bool
) -> None:
    # A driver answers INSUFFICIENT_SIZE, or fills what fits (NVML's documented behaviour).
    monkeypatch.setattr(nvml_samples, "FIRST_CAPACITY", 4)
    h100.set_global("samples_partial", int(partial))
    src = source(clock, 1)  # the samples at every reading
    base = int(clock.t * 1_000_000)
    h100.add_sample(A, base - 66_667, 10)  # one sampling period before the next
    src.sample([A])
    for k in range(11):
        h100.add_sample(A, base + 100_000 + k * 166_667, 50 + k)
    clock.advance(2)
    got = src.sample([A])[0].utilization_samples_pct
    assert got == tuple(float(50 + k) for k in range(11))
    h100.reset_calls()
    h100.add_sample(A, base + 2_000_000, 90)
    clock.advance(1)
    assert src.sample([A])[0].utilization_samples_pct == (90.0,)
    assert h100.calls("nvmlDeviceGetSamples") == 1  # the grown buffer is kept


# ------------------------------------------------------------------ the process list


def test_the_process_list_takes_one_c_call_per_reading(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock, 6)
    src.sample([A])
    h100.reset_calls()
    for _ in range(5):
        clock.advance(10)
        (s,) = src.sample([A])
        assert s.processes is not None and [p.pid for p in s.processes] == [4242]
    # the sizing call (INSUFFICIENT_SIZE with a process running) is gone
    assert h100.calls("nvmlDeviceGetComputeRunningProcesses_v3") == 5


def test_more_processes_than_the_first_call_has_room_for_are_all_read(
    h100: FakeDriver, clock: Clock
) -> None:
    for pid in range(5000, 5030):
        h100.add_process(A, pid, 2**20)
    (s,) = source(clock, 6).sample([A])
    assert s.processes is not None and len(s.processes) == 31
    assert h100.calls("nvmlDeviceGetComputeRunningProcesses_v3") == 2


def test_two_samples_closer_than_any_sampling_period_do_not_set_it(
    h100: FakeDriver, clock: Clock
) -> None:
    # NVML samples every 1/6 s to 1 s. Two samples 2 ms apart taken as the period made a 1 s
    # gap after them 500 idle samples (the H100 records of 2026-11-27 hold ~900 zero
    # sub-samples per reading of the jobs with idle phases).
    src = source(clock, 1)
    base = int(clock.t * 1_000_000)
    for k in range(6):  # the cursor primes on samples 1/6 s apart
        h100.add_sample(A, base - 1_000_000 + k * 166_667, 50)
    src.sample([A])
    h100.add_sample(A, base, 60)
    h100.add_sample(A, base + 2_000, 60)
    clock.advance(1)
    assert src.sample([A])[0].utilization_samples_pct == (60.0, 60.0)
    h100.add_sample(A, base + 1_002_000, 70)  # a 1 s gap: 5 periods of 1/6 s missed
    clock.advance(1)
    assert src.sample([A])[0].utilization_samples_pct == (0.0,) * 5 + (70.0,)


def test_a_cursor_learns_no_period_from_spacings_under_a_tenth_of_a_second() -> None:
    cursor = nvml_samples.SampleCursor()
    cursor.take([(1_000_000, 10.0)], 2_000_000)  # primes
    cursor.take([(1_000_500, 10.0), (1_001_000, 20.0)], 2_000_000)
    assert cursor.period_us is None
    cursor.take([(1_201_000, 30.0)], 2_000_000)
    assert cursor.period_us == 200_000
