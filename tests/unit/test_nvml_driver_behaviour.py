"""NvmlSource against a fake libnvidia-ml.so.1 playing real drivers (tests/nvmlfake/).

The real pynvml runs: its wrappers, ctypes structs, version decorators and exception
classes. Each test is named after the driver behaviour it reproduces (issue 16, items 1-9).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvmlfake.driver import Clock, FakeDriver, load_profile, loaded_drivers

from slurm_gpu.analysis.metrics import GpuMetrics, gpu_metrics
from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.hooks.gpus import resolve_job_gpus
from slurm_gpu.telemetry.base import (
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_POWER_MASK,
    THROTTLE_THERMAL_MASK,
)
from slurm_gpu.telemetry.nvml import NvmlSource
from slurm_gpu.telemetry.nvml_calls import FUNCTION_NOT_FOUND, CallFailed

GIB = 2**30
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
H100_MIG_PARENT = "GPU-a1a1a1a1-0000-0000-0000-000000000000"
SLICE_1 = "MIG-11111111-0000-0000-0000-000000000000"
SLICE_2 = "MIG-22222222-0000-0000-0000-000000000000"
T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Iterator[Callable[[str], FakeDriver]]:
    yield from loaded_drivers(monkeypatch, clock)


def source(clock: Clock) -> NvmlSource:
    return NvmlSource(clock=clock, wall_clock=clock)


# ------------------------------------------------------------- 1. per-field errors


def test_mig_slice_answering_invalid_argument_to_temperature_pcie_samples_is_read(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_129_h100_mig")
    src = source(clock)
    src.list_gpus()
    (s,) = src.sample([SLICE_1])
    assert s.available and s.memory_used_bytes == 5 * GIB
    assert s.temperature_c is None and s.pcie_tx_bytes_per_s is None


def test_transient_unknown_error_on_one_field_keeps_the_gpu(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    src.sample([A])
    drv.fail(A, "nvmlDeviceGetTemperature", "UNKNOWN")
    drv.fail(B, "nvmlDeviceGetUtilizationRates", "INVALID_ARGUMENT")
    a, b = src.sample([A, B])
    assert a.available and a.temperature_c is None and a.utilization_pct == 87.0
    assert b.available and b.utilization_pct is None and b.temperature_c == 64.0


def test_gpu_fallen_off_the_bus_is_unavailable_and_others_go_on(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    src.sample([A, B])
    drv.lose(B)
    a, b = src.sample([A, B])
    assert a.available and a.utilization_pct == 87.0
    assert not b.available and b.utilization_pct is None


def test_gpu_lost_before_the_job_is_not_listed(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r570_gpu_lost")
    src = source(clock)
    assert [g.uuid for g in src.list_gpus()] == [A]
    ok, lost = src.sample([A, "GPU-dead0000-0000-0000-0000-000000000000"])
    assert ok.available and not lost.available


# ------------------------------------------------------------- 2. process list


def test_r470_driver_without_v3_process_call_still_lists_processes(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r470_a100")
    (s,) = source(clock).sample(["GPU-47047047-0000-0000-0000-000000000000"])
    assert s.available and s.processes is not None
    assert [(p.pid, p.used_memory_bytes) for p in s.processes] == [
        (1001, GIB), (1002, 2 * GIB), (1003, 3 * GIB)
    ]  # fmt: skip


def test_library_mismatch_error_of_an_unversioned_wrapper_costs_one_field_not_the_gpu(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    # From nvidia-ml-py 12.550 pynvml's unversioned process wrapper raises
    # NVMLLibraryMismatchError (not an NVMLError) on a driver without the _v3 call; the
    # source's call guard maps it like FUNCTION_NOT_FOUND instead of letting it escape.
    driver("r470_a100")
    src = source(clock)
    (gpu,) = src.list_gpus()
    dev = src._lookup(gpu.uuid)
    assert dev is not None
    mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)  # 12.550 and later
    with pytest.raises(Exception) as raw:
        pynvml.nvmlDeviceGetComputeRunningProcesses(dev.handle)
    if mismatch is not None:
        assert isinstance(raw.value, mismatch) and not isinstance(raw.value, pynvml.NVMLError)
    with pytest.raises(CallFailed) as failed:
        src._do(pynvml.nvmlDeviceGetComputeRunningProcesses, dev.handle)
    assert failed.value.code == FUNCTION_NOT_FOUND
    assert src.sample([gpu.uuid])[0].available


def test_driver_535_54_with_32_byte_process_entries_gives_true_pids(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_54_h100")
    (s,) = source(clock).sample(["GPU-53554000-0000-0000-0000-000000000000"])
    assert s.processes is not None
    assert [(p.pid, p.used_memory_bytes) for p in s.processes] == [
        (2001, GIB), (2002, 2 * GIB), (2003, 3 * GIB)
    ]  # fmt: skip


def test_process_list_not_permitted_is_none_not_empty(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    drv.fail(A, "nvmlDeviceGetComputeRunningProcesses_v3", "NO_PERMISSION")
    (s,) = source(clock).sample([A])
    assert s.available and s.processes is None


# ------------------------------------------------------------- 3. MIG


def test_mig_slice_reports_its_own_memory_and_processes_not_the_parents(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_129_h100_mig")
    src = source(clock)
    one, two = src.sample([SLICE_1, SLICE_2])
    assert one.memory_used_bytes == 5 * GIB and one.memory_total_bytes == 40 * GIB
    assert one.processes is not None and [p.pid for p in one.processes] == [3001]
    assert two.processes is not None and [p.pid for p in two.processes] == [3002]


def test_slurm_mig_name_samples_the_slice_not_the_parent(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_129_h100_mig")
    slurm_name = f"MIG-{H100_MIG_PARENT}/2/0"
    (s,) = source(clock).sample([slurm_name])
    assert s.available and s.uuid == slurm_name
    assert s.processes is not None and [p.pid for p in s.processes] == [3002]
    assert s.memory_used_bytes == 7 * GIB


@pytest.mark.parametrize(
    ("cvd_one", "cvd_two"),
    [
        (f"MIG-{H100_MIG_PARENT}/1/0", f"MIG-{H100_MIG_PARENT}/2/0"),  # before R470
        (SLICE_1, SLICE_2),  # MIG-<uuid>, R470 and later
    ],
)
def test_prolog_resolves_slurm_mig_ids_to_the_slice_so_two_jobs_see_only_their_own(
    driver: Callable[[str], FakeDriver], clock: Clock, cvd_one: str, cvd_two: str
) -> None:
    driver("r535_129_h100_mig")
    listed = source(clock).list_gpus()  # what the prolog sees
    one = resolve_job_gpus(None, cvd_one, listed)
    two = resolve_job_gpus(None, cvd_two, listed)
    assert (one.uuids, two.uuids) == ((SLICE_1,), (SLICE_2,))
    assert set(one.owner_keys).isdisjoint(two.owner_keys)
    infos = {g.uuid: g for g in listed}
    assert infos[SLICE_1].parent_uuid == H100_MIG_PARENT
    for job, pid, used in ((one, 3001, 5 * GIB), (two, 3002, 7 * GIB)):
        (s,) = source(clock).sample(job.uuids)  # each job's own sampler
        assert s.available and s.uuid == job.uuids[0]
        assert s.processes is not None and [p.pid for p in s.processes] == [pid]
        assert s.memory_used_bytes == used and s.memory_total_bytes == 40 * GIB


def test_mig_slice_activity_from_gpm_mig_samples_on_hopper(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r535_129_h100_mig")
    src = source(clock)
    src.sample([SLICE_1, SLICE_2])
    clock.advance(10)
    one, two = src.sample([SLICE_1, SLICE_2])
    assert one.utilization_pct is None  # NOT_SUPPORTED on MIG
    assert (one.sm_active_pct, one.tensor_active_pct) == (35.0, 10.0)
    assert (two.sm_active_pct, two.tensor_active_pct) == (80.0, 50.0)
    assert drv.calls("nvmlGpmMigSampleGet") == 4


def test_xid_with_instance_ids_reaches_only_its_mig_slice(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r535_129_h100_mig")
    src = source(clock)
    src.sample([SLICE_1, SLICE_2])
    drv.xid(H100_MIG_PARENT, 43, gi=2, ci=0)
    drv.xid(H100_MIG_PARENT, 79)  # no instance: the whole GPU, so every slice
    one, two = src.sample([SLICE_1, SLICE_2])
    assert one.xid_events == (79,) and two.xid_events == (43, 79)


def test_recreated_mig_instance_handle_is_checked_again(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r535_129_h100_mig")
    src = source(clock)
    assert src.sample([SLICE_1])[0].available
    drv.recreate(SLICE_1, SLICE_1)  # same slot and UUID, the old handle is stale
    clock.advance(61)
    (s,) = src.sample([SLICE_1])
    assert s.available and s.memory_used_bytes == 5 * GIB


# ------------------------------------------------------------- 4. throttle reasons


def test_r470_driver_without_clocks_event_reasons_still_reads_throttle_reasons(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r470_a100")
    (s,) = source(clock).sample(["GPU-47047047-0000-0000-0000-000000000000"])
    assert s.throttle_reasons == 0x48


def test_hw_slowdown_is_not_counted_as_thermal() -> None:
    # NVML: HW_SLOWDOWN can be a thermal or a power brake; it proves neither.
    assert not THROTTLE_THERMAL_MASK & THROTTLE_HW_SLOWDOWN
    assert not THROTTLE_POWER_MASK & THROTTLE_HW_SLOWDOWN


def _job(
    src: NvmlSource, clock: Clock, uuid: str, readings: int, between: Callable[[int], None]
) -> GpuMetrics:
    """Sample ``uuid`` every 10 s through the sampler's aggregates; the analysis' metrics."""
    start = clock.t
    info = {g.uuid: g for g in src.list_gpus()}[uuid]
    agg = NodeAggregator(
        job_id="1", hostname="n1", uid=1000, interval_s=10.0, source="nvml",
        gpus=[info], started_s=start,
    )  # fmt: skip
    for i in range(readings):
        between(i)
        clock.advance(10)
        agg.add(clock.t, src.sample([uuid]), None)
    record = agg.record(ended_s=clock.t, complete=True)
    return gpu_metrics(record.gpus[0], record, AnalysisSettings())


def _no_reasons(drv: FakeDriver, uuid: str) -> None:
    for fn in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetViolationStatus",
    ):
        drv.fail(uuid, fn, "NOT_SUPPORTED")


def test_driver_without_throttle_reasons_reports_unknown_not_zero(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    _no_reasons(drv, A)
    m = _job(source(clock), clock, A, 12, lambda i: None)
    assert m.samples_available == 12
    assert m.throttle_power_pct is None and m.throttle_thermal_pct is None
    assert m.throttle_known_pct == 0.0


def test_throttle_reasons_known_part_of_the_job_are_a_share_of_the_known_time(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    # Per-field errors for the second half of the job (UNKNOWN: nvidia-smi's ERR!), while
    # the first half reports the power cap at every reading.
    drv = driver("r570_h100")
    drv.fail(A, "nvmlDeviceGetViolationStatus", "NOT_SUPPORTED")

    def between(i: int) -> None:
        if i == 6:
            drv.fail(A, "nvmlDeviceGetCurrentClocksEventReasons", "UNKNOWN")

    m = _job(source(clock), clock, A, 12, between)
    assert m.throttle_power_pct == pytest.approx(100.0)  # of the known half, not 50 %
    assert m.throttle_known_pct == pytest.approx(50.0)


def test_violation_counters_give_exact_throttled_seconds_not_one_mask_per_interval(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    # The power cap held the clocks down 2.5 s of every 10 s, never at the instant the
    # bitmask was read: the sampled mask says 0 %, the driver's counter 25 %.
    drv = driver("r570_h100")
    drv.set(A, "clocks_event_reasons", 0)
    drv.set(A, "violation_power_ns", 7 * 10**12)
    counter = [7 * 10**12]

    def between(i: int) -> None:
        counter[0] += 2_500_000_000
        drv.set(A, "violation_power_ns", counter[0])

    m = _job(source(clock), clock, A, 12, between)
    # The first reading has no counter delta yet and falls back to its (clear) bitmask.
    assert m.throttle_power_pct == pytest.approx(100.0 * 11 * 2.5 / 120)
    assert m.throttle_thermal_pct == 0.0 and m.throttle_known_pct == pytest.approx(100.0)


def test_violation_counter_reset_by_a_driver_reload_falls_back_to_the_mask(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")  # bitmask: SW power cap at every reading
    counter = [10**12]

    def between(i: int) -> None:
        # The counter restarts from 0 at reading 6 (driver reload): that interval is
        # counted from the mask (10 s), every other one from the counter (1 s each).
        counter[0] = 0 if i == 6 else counter[0] + 10**9
        drv.set(A, "violation_power_ns", counter[0])

    m = _job(source(clock), clock, A, 12, between)
    # reading 0: no delta yet, mask (10 s); 1-5 and 7-11: counter (1 s); 6: reset, mask
    assert m.throttle_power_pct == pytest.approx(100.0 * (10 + 10 + 10 * 1.0) / 120)


def test_thermal_violation_counter_counts_as_thermal_and_hw_slowdown_as_neither(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    drv.set(A, "clocks_event_reasons", THROTTLE_HW_SLOWDOWN)
    counter = [0]

    def between(i: int) -> None:
        counter[0] += 4 * 10**9
        drv.set(A, "violation_thermal_ns", counter[0])

    m = _job(source(clock), clock, A, 12, between)
    assert m.throttle_power_pct == 0.0
    assert m.throttle_thermal_pct == pytest.approx(100.0 * 11 * 4 / 120)


def test_mig_slice_takes_the_violation_counters_of_its_gpu(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r535_129_h100_mig")
    drv.set(H100_MIG_PARENT, "violation_power_ns", 5 * 10**9)
    (s,) = source(clock).sample([SLICE_1])
    assert s.violation_power_ns == 5 * 10**9  # clocks are the whole GPU's


def test_gpu_without_violation_counters_is_not_asked_again(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    drv.fail(A, "nvmlDeviceGetViolationStatus", "NOT_SUPPORTED")
    src = source(clock)
    for _ in range(3):
        clock.advance(10)
        (s,) = src.sample([A])
        assert s.violation_power_ns is None and s.throttle_reasons == 0x4
    assert drv.calls("nvmlDeviceGetViolationStatus") == 2  # one per policy, once


# ------------------------------------------------------------- 5. XID events


def test_xid_events_registered_only_for_gpus_the_sampler_reads(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    src.list_gpus()
    src.sample([A])
    assert drv.registered() == 1
    drv.xid(B, 48)
    drv.xid(A, 79)
    assert src.sample([A])[0].xid_events == (79,)


def test_broken_event_set_is_rebuilt_and_draining_resumes(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    src.sample([A])
    drv.break_event_sets()  # every wait on the old set now answers UNKNOWN
    src.sample([A])
    src.sample([A])
    drv.xid(A, 31)
    assert src.sample([A])[0].xid_events == (31,)


# ------------------------------------------------------------- 6. PCIe


def test_pcie_rate_is_the_mean_over_the_interval_from_byte_counters(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    first = src.sample([A])[0]
    assert first.pcie_tx_bytes_per_s is None  # one counter reading is not a rate
    drv.set(A, "pcie_tx_bytes", 10**9 + 5 * 10**9)
    drv.set(A, "pcie_rx_bytes", 3 * 10**9 + 10**9)
    clock.advance(10)
    s = src.sample([A])[0]
    assert (s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) == (5e8, 1e8)
    assert drv.calls("nvmlDeviceGetPcieThroughput") == 0  # no 20 ms snapshots


def test_driver_without_pcie_counters_falls_back_to_the_snapshot(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_a100_no_gpm")
    (s,) = source(clock).sample(["GPU-a100a100-0000-0000-0000-000000000000"])
    assert (s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) == (1000 * 1024, 3000 * 1024)


# ------------------------------------------------------------- 7. memory


def test_memory_used_leaves_out_driver_reserved_memory(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    drv.set(B, "mem_used", 0)
    a, b = source(clock).sample([A, B])
    assert a.memory_used_bytes == 30 * GIB and b.memory_used_bytes == 0


def test_r470_driver_without_memory_v2_reads_v1(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r470_a100")
    (s,) = source(clock).sample(["GPU-47047047-0000-0000-0000-000000000000"])
    assert s.memory_used_bytes == 30 * GIB + 512 * 2**20 and s.memory_total_bytes == 40 * GIB


# ------------------------------------------------------------- 8. driver samples


def _us(t: float) -> int:
    return int(t * 1_000_000)


def test_idle_gaps_in_driver_samples_count_as_zero(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    drv.add_sample(A, _us(T0 - 1), 50)
    src.sample([A])  # primes the cursor
    for k in range(1, 4):  # busy for 0.5 s at 6 samples/s ...
        drv.add_sample(A, _us(T0 - 1) + k * 166_667, 90)
    drv.add_sample(A, _us(T0 - 1) + 10 * 166_667, 90)  # ... then 6 periods without a sample
    clock.advance(1)
    (s,) = src.sample([A])
    assert s.utilization_samples_pct == (90.0, 90.0, 90.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 90.0)


def test_out_of_range_driver_samples_are_dropped(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    drv.add_sample(A, _us(T0 - 1), 50)
    src.sample([A])
    drv.add_sample(A, _us(T0 - 1) + 166_667, 290_000)
    drv.add_sample(A, _us(T0 - 1) + 2 * 166_667, 40)
    clock.advance(1)
    assert src.sample([A])[0].utilization_samples_pct == (40.0,)


def test_backward_clock_step_restarts_the_sample_cursor(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    drv.add_sample(A, _us(T0), 50)
    src.sample([A])
    clock.t -= 3600  # NTP steps the clock back an hour: new samples are older than the cursor
    drv.add_sample(A, _us(clock.t), 60)
    src.sample([A])  # sees the step and primes again
    drv.add_sample(A, _us(clock.t) + 166_667, 70)
    clock.t += 1
    assert src.sample([A])[0].utilization_samples_pct == (70.0,)


# ------------------------------------------------------------- 9. cost and life cycle


def test_fewer_nvml_calls_per_gpu_reading(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    for _ in range(3):
        clock.advance(10)
        src.sample([A])
    drv.reset_calls()
    clock.advance(10)
    src.sample([A])
    # one GPU with one process, GPM and XID registration set up: was 21 or more; 13, and
    # the two violation counters (power, thermal) that make throttled time exact
    assert drv.calls() <= 15, drv.call_table()


def test_one_missing_uuid_does_not_re_enumerate_every_reading(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    for _ in range(5):
        clock.advance(10)
        ok, gone = src.sample([A, "GPU-gone"])
        assert ok.available and not gone.available
    assert drv.calls("nvmlDeviceGetCount_v2") == 1
    clock.advance(60)
    src.sample([A, "GPU-gone"])
    assert drv.calls("nvmlDeviceGetCount_v2") == 2


def test_gpm_samples_are_not_leaked_when_a_gpm_call_fails(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    for _ in range(2):
        clock.advance(10)
        src.sample([A])
    drv.fail(A, "nvmlGpmSampleGet", "UNKNOWN")
    for _ in range(3):
        clock.advance(10)
        assert src.sample([A])[0].available
    assert drv.gpm_live() <= 2  # the two buffers in use, never one per reading
    src.close()
    assert drv.gpm_live() == 0


def test_gpm_samples_closer_than_100_ms_are_not_taken(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    src = source(clock)
    src.sample([A])
    clock.advance(0.05)
    assert src.sample([A])[0].sm_active_pct is None
    clock.advance(0.1)
    assert src.sample([A])[0].sm_active_pct == 61.5
    assert drv.calls("nvmlGpmSampleGet") == 2


def test_prolog_listing_gpus_registers_no_events_and_queries_no_gpm(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_h100")
    assert len(source(clock).list_gpus()) == 2
    assert drv.calls("nvmlDeviceRegisterEvents") == 0
    assert drv.calls("nvmlGpmQueryDeviceSupport") == 0
    assert drv.calls("nvmlEventSetCreate") == 0


def test_driver_reload_mid_job_reinitialises_nvml(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    drv = driver("r570_driver_reload")
    src = source(clock)
    assert src.sample([A])[0].utilization_pct == 87.0
    drv.reload()
    clock.advance(10)
    (s,) = src.sample([A])
    assert s.available and s.utilization_pct == 87.0
    drv.xid(A, 13)  # events are registered again on the new handles
    clock.advance(10)
    assert src.sample([A])[0].xid_events == (13,)


def test_a100_without_gpm_reads_everything_else(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_a100_no_gpm")
    src = source(clock)
    for _ in range(2):
        clock.advance(10)
        (s,) = src.sample(["GPU-a100a100-0000-0000-0000-000000000000"])
    assert s.available and s.sm_active_pct is None and s.utilization_pct == 87.0
    assert s.energy_mj == 9_000_000 and s.power_w == pytest.approx(512.345)


def test_driver_without_event_sets_is_not_asked_for_one_at_every_reading(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """A driver whose library has no ``nvmlEventSetCreate`` (events unsupported): the sampler
    asked for an event set at every reading of every GPU; it asks once."""
    profile = load_profile("r570_h100")
    profile["absent"] = ["nvmlEventSetCreate"]
    drv = FakeDriver(profile)
    drv.install(pynvml)
    monkeypatch.setattr(pynvml, "nvmlLib", drv.lib)
    clock.attach(drv)
    asked = []
    real = pynvml.nvmlEventSetCreate

    def counted() -> object:
        asked.append(1)
        return real()

    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", counted)
    src = source(clock)
    try:
        for _ in range(5):
            reading = src.sample([A, B])
            assert [s.available for s in reading] == [True, True]
            assert all(s.xid_events == () for s in reading)
            clock.advance(1.0)
    finally:
        pynvml._nvmlGetFunctionPointer_cache.clear()
    assert len(asked) == 1
