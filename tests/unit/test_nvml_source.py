"""NvmlSource's general behaviour against the fake libnvidia-ml.so.1 (tests/nvmlfake/).

The real pynvml runs against the library: its wrappers, structs and exception classes.
Driver-specific behaviour (old and new branches, MIG, reloads) is in
``test_nvml_driver_behaviour.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path

import pynvml
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvmlfake.driver import Clock, FakeDriver, loaded_drivers

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.records import GpuSample
from slurm_gpu.telemetry.base import TelemetrySource
from slurm_gpu.telemetry.nvml import METRICS, NvmlSource

GIB = 2**30
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Iterator[Callable[[str], FakeDriver]]:
    yield from loaded_drivers(monkeypatch, clock)


@pytest.fixture
def h100(driver: Callable[[str], FakeDriver]) -> FakeDriver:
    return driver("r570_h100")


def source(clock: Clock) -> NvmlSource:
    return NvmlSource(clock=clock, wall_clock=clock)


def test_protocol_and_lazy_init(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock)
    assert isinstance(src, TelemetrySource)
    assert h100.calls("nvmlInitWithFlags") == 0  # constructing the source loads nothing
    src.list_gpus()
    src.list_gpus()
    assert h100.calls("nvmlInitWithFlags") == 1
    src.close()
    src.close()
    assert h100.calls("nvmlShutdown") == 1


def test_importing_slurm_gpu_does_not_import_pynvml() -> None:
    code = (
        "import sys, slurm_gpu, slurm_gpu.telemetry, slurm_gpu.records, slurm_gpu.telemetry.nvml;"
        "print('pynvml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_healthy_gpu_every_metric_in_its_unit(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock)
    infos = src.list_gpus()
    assert [(i.uuid, i.minor_number) for i in infos] == [(A, 0), (B, 1)]
    assert infos[0].power_limit_w == 700.0 and infos[0].compute_capability == (9, 0)
    assert infos[0].pci_bus_id == "00000000:18:00.0" and infos[0].memory_total_bytes == 80 * GIB
    src.sample([A])
    h100.set(A, "pcie_tx_bytes", 10**9 + 2 * 10**9)
    clock.advance(2)
    s = src.sample([A])[0]
    assert s.available and s.utilization_pct == 87.0 and s.memory_utilization_pct == 12.0
    assert s.memory_used_bytes == 30 * GIB and s.memory_total_bytes == 80 * GIB
    assert s.power_w == pytest.approx(512.345)
    assert s.energy_mj == 9_000_000
    assert (s.sm_clock_mhz, s.memory_clock_mhz) == (1980, 2619)
    assert s.throttle_reasons == 0x4 and s.temperature_c == 64.0
    assert s.pcie_tx_bytes_per_s == 1e9 and s.pcie_rx_bytes_per_s == 0.0
    assert s.nvlink_tx_bytes == 100 * 1024 and s.nvlink_rx_bytes == 7 * 1024
    assert (s.ecc_corrected_total, s.ecc_uncorrected_total) == (3, 0)
    assert s.processes is not None and [(p.pid, p.used_memory_bytes) for p in s.processes] == [
        (4242, GIB)
    ]


@pytest.mark.parametrize("code", ["NOT_SUPPORTED", "NO_PERMISSION", "UNKNOWN"])
def test_unsupported_field_is_none_and_the_rest_is_read(
    h100: FakeDriver, clock: Clock, code: str
) -> None:
    h100.fail(A, "FI_185", code)  # the power field, and the call older drivers use
    h100.fail(A, "nvmlDeviceGetPowerUsage", code)
    h100.fail(A, "FI_138", code)  # a PCIe card without NVLink
    s = source(clock).sample([A])[0]
    assert s.available and s.power_w is None and s.nvlink_tx_bytes is None
    assert s.utilization_pct == 87.0 and s.energy_mj == 9_000_000 and s.nvlink_rx_bytes == 7168


def test_power_from_the_call_when_the_driver_lacks_the_power_field(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r470_a100")
    (s,) = source(clock).sample(["GPU-47047047-0000-0000-0000-000000000000"])
    assert s.power_w == pytest.approx(512.345)


def test_energy_counter_missing_on_pre_volta_gpu(h100: FakeDriver, clock: Clock) -> None:
    h100.fail(A, "FI_83", "NOT_SUPPORTED")
    s = source(clock).sample([A])[0]
    assert s.energy_mj is None and s.power_w is not None


def test_empty_process_list_is_empty_not_none(h100: FakeDriver, clock: Clock) -> None:
    assert source(clock).sample([B])[0].processes == ()


def test_process_memory_not_available_on_a_gpu_in_mig_mode(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_129_h100_mig")
    (s,) = source(clock).sample(["GPU-a1a1a1a1-0000-0000-0000-000000000000"])
    assert s.processes is not None and [p.used_memory_bytes for p in s.processes] == [None, None]


@pytest.mark.parametrize("code", ["GPU_IS_LOST", "GPU_NOT_FOUND", "RESET_REQUIRED"])
def test_gpu_answering_lost_codes_is_unavailable(h100: FakeDriver, clock: Clock, code: str) -> None:
    src = source(clock)
    src.list_gpus()
    h100.fail(B, "nvmlDeviceGetMemoryInfo_v2", code)
    ok, bad = src.sample([A, B])
    assert ok.available and not bad.available


def test_gpu_answering_nothing_at_all_is_unavailable(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock)
    src.list_gpus()
    h100.fail(B, "*", "UNKNOWN")
    ok, bad = src.sample([A, B])
    assert ok.available and not bad.available


def test_unknown_uuid_is_unavailable(h100: FakeDriver, clock: Clock) -> None:
    (s,) = source(clock).sample(["GPU-gone"])
    assert not s.available


@pytest.mark.parametrize(
    ("code", "hint_word"),
    [
        ("LIBRARY_NOT_FOUND", "install the NVIDIA driver"),
        ("DRIVER_NOT_LOADED", "nvidia-smi"),
        ("LIB_RM_VERSION_MISMATCH", "reboot"),
    ],
)
def test_library_missing_or_driver_not_loaded_raises_with_hint(
    h100: FakeDriver, clock: Clock, code: str, hint_word: str
) -> None:
    h100.set_global("init_code", code)
    with pytest.raises(TelemetryUnavailableError) as caught:
        source(clock).list_gpus()
    assert caught.value.hint and hint_word in caught.value.hint
    assert not isinstance(caught.value.__cause__, pynvml.NVMLError)


def test_real_library_absent_on_this_machine_raises_typed_error() -> None:
    # No fake: on a machine without the NVIDIA driver the real nvmlInit fails.
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        with pytest.raises(TelemetryUnavailableError):
            NvmlSource().list_gpus()
    else:  # pragma: no cover - a machine with a GPU
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")


def test_python_package_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(TelemetryUnavailableError, match="nvidia-ml-py"):
        NvmlSource().list_gpus()


def test_mig_slices_enumerated_with_parent_uuid_and_profile(
    driver: Callable[[str], FakeDriver], clock: Clock
) -> None:
    driver("r535_129_h100_mig")  # 7 slots, 2 used: the empty ones answer NOT_FOUND
    infos = source(clock).list_gpus()
    parent = "GPU-a1a1a1a1-0000-0000-0000-000000000000"
    assert [i.uuid for i in infos] == [
        parent, "MIG-11111111-0000-0000-0000-000000000000",
        "MIG-22222222-0000-0000-0000-000000000000",
    ]  # fmt: skip
    mig = infos[1]
    assert mig.parent_uuid == parent and mig.mig_profile == "3g.40gb"
    assert mig.minor_number is None and mig.memory_total_bytes == 40 * GIB


def test_subinterval_samples_only_new_ones(h100: FakeDriver, clock: Clock) -> None:
    base = int(clock.t * 1_000_000) - 1_000_000
    for k, u in enumerate((10, 20)):
        h100.add_sample(A, base + k * 200_000, u)
    src = source(clock)
    assert src.sample([A])[0].utilization_samples_pct == ()  # the first call primes
    h100.add_sample(A, base + 400_000, 30)
    h100.add_sample(A, base + 600_000, 40)
    assert src.sample([A])[0].utilization_samples_pct == (30.0, 40.0)
    assert src.sample([A])[0].utilization_samples_pct == ()


def test_xid_events_go_to_their_gpu_once(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock)
    src.sample([A, B])
    h100.xid(B, 79)
    h100.xid(B, 48)
    a, b = src.sample([A, B])
    assert a.xid_events == () and b.xid_events == (79, 48)
    assert src.sample([B])[0].xid_events == ()


def test_gpm_metrics_from_two_samples(h100: FakeDriver, clock: Clock) -> None:
    src = source(clock)
    first = src.sample([A])[0]
    assert first.sm_active_pct is None  # one GPM sample is not a rate yet
    clock.advance(10)
    second = src.sample([A])[0]
    assert second.sm_active_pct == 61.5 and second.tensor_active_pct == 22.0
    assert second.sm_occupancy_pct == 40.0


def test_gpm_unsupported_leaves_sm_activity_none(h100: FakeDriver, clock: Clock) -> None:
    h100.fail(A, "nvmlGpmQueryDeviceSupport", "NOT_SUPPORTED")
    src = source(clock)
    for _ in range(2):
        clock.advance(10)
        s = src.sample([A])[0]
        assert s.available and s.sm_active_pct is None and s.tensor_active_pct is None


def test_metric_table_fields_exist_on_gpusample() -> None:
    names = {f.name for f in fields(GpuSample)}
    for metric in METRICS:
        assert set(metric.fields) <= names, metric.nvml_call
