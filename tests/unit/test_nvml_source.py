"""NvmlSource against the real pynvml module with its C-calling functions replaced.

Each scenario is named after the real failure it reproduces. The fake below plays the driver:
handles are plain objects, errors are pynvml's own NVMLError subclasses.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.telemetry.base import TelemetrySource
from slurm_gpu.telemetry.nvml import METRICS, NvmlSource


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    uuid: str
    minor: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 87
    mem_used: int = 30 * 2**30
    mem_total: int = 80 * 2**30
    power_mw: int = 512_345
    energy_mj: int = 9_000_000
    samples: list[tuple[int, int]] = field(default_factory=list)  # (timestamp µs, util %)
    fail: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    lost: bool = False
    mig: list[FakeGpu | None] = field(default_factory=list)
    gpm: bool = False
    processes: list[tuple[int, int | None]] = field(default_factory=lambda: [(4242, 2**30)])


class FakeNvml:
    """Installs fake NVML entry points on the real pynvml module."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.init_error: int | None = None
        self.inited = 0
        self.shutdowns = 0
        self.events: list[tuple[FakeGpu, int]] = []
        self.gpm_sm: float = 61.5
        self.sample_args: list[int] = []
        m = monkeypatch
        for name in dir(self):
            if name.startswith("nvml"):
                m.setattr(pynvml, name, getattr(self, name))

    # -- helpers
    def _gpu(self, handle: FakeGpu, fn: str) -> FakeGpu:
        if handle.lost:
            raise err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in handle.fail:
            raise err(handle.fail[fn])
        return handle

    # -- library
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise err(self.init_error)
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    # -- identity
    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetMinorNumber(self, h: FakeGpu) -> int:
        return self._gpu(h, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit")
        return 700_000

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        self._gpu(h, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        self._gpu(h, "nvmlDeviceGetCudaComputeCapability")
        return (9, 0)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        g = self._gpu(h, "nvmlDeviceGetMigMode")
        return [1 if g.mig else 0, 1 if g.mig else 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return len(self._gpu(h, "nvmlDeviceGetMaxMigDeviceCount").mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, i: int) -> FakeGpu:
        child = self._gpu(h, "nvmlDeviceGetMigDeviceHandleByIndex").mig[i]
        if child is None:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return child

    # -- metrics
    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util, memory=12)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._gpu(h, "nvmlDeviceGetClockInfo")
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons")
        return 0x4

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._gpu(h, "nvmlDeviceGetTemperature")
        return 64

    def nvmlDeviceGetPcieThroughput(self, h: FakeGpu, counter: int) -> int:
        self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return 1000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 3000

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, ids: list[tuple[int, int]]) -> Any:
        self._gpu(h, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, (fid, _scope) in enumerate(ids):
            values[i].fieldId = fid
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[i].value.ullVal = (
                100 if fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 7
            )
        return values

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, kind: int, counter: int) -> int:
        self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        return 3 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.processes]

    def nvmlDeviceGetSamples(self, h: FakeGpu, kind: int, since: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetSamples")
        self.sample_args.append(since)
        newer = [(t, u) for t, u in g.samples if t > since]
        if not newer:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for t, u in newer:
            s = pynvml.c_nvmlSample_t()
            s.timeStamp = t
            s.sampleValue.uiVal = u
            out.append(s)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    # -- events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types: int, es: str) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait(self, es: str, timeout_ms: int) -> Any:
        if not self.events:
            raise err(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.events.pop(0)
        return SimpleNamespace(
            device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def nvmlEventSetFree(self, es: str) -> None:
        pass

    # -- GPM
    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        g = self._gpu(h, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(isSupportedDevice=1 if g.gpm else 0)

    def nvmlGpmSampleAlloc(self) -> Any:
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, h: FakeGpu, sample: Any) -> Any:
        self._gpu(h, "nvmlGpmSampleGet")
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        pass

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL:
                metric.value, metric.nvmlReturn = self.gpm_sm, pynvml.NVML_SUCCESS
            elif metric.metricId == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                metric.value, metric.nvmlReturn = 22.0, pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request


@pytest.fixture
def gpus() -> list[FakeGpu]:
    return [FakeGpu("GPU-aaaa", minor=0), FakeGpu("GPU-bbbb", minor=1)]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> FakeNvml:
    return FakeNvml(monkeypatch, gpus)


def test_protocol_and_lazy_init(nvml: FakeNvml) -> None:
    source = NvmlSource()
    assert isinstance(source, TelemetrySource)
    assert nvml.inited == 0  # constructing the source loads nothing
    source.list_gpus()
    source.list_gpus()
    assert nvml.inited == 1
    source.close()
    source.close()
    assert nvml.shutdowns == 1


def test_importing_slurm_gpu_does_not_import_pynvml() -> None:
    import subprocess

    code = (
        "import sys, slurm_gpu, slurm_gpu.telemetry, slurm_gpu.records, slurm_gpu.telemetry.nvml;"
        "print('pynvml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_healthy_gpu_every_metric_in_its_unit(nvml: FakeNvml) -> None:
    source = NvmlSource()
    infos = source.list_gpus()
    assert [(i.uuid, i.minor_number) for i in infos] == [("GPU-aaaa", 0), ("GPU-bbbb", 1)]
    assert infos[0].power_limit_w == 700.0 and infos[0].compute_capability == (9, 0)
    assert infos[0].pci_bus_id == "00000000:18:00.0"
    s = source.sample(["GPU-aaaa"])[0]
    assert s.available and s.utilization_pct == 87.0 and s.memory_utilization_pct == 12.0
    assert s.memory_used_bytes == 30 * 2**30 and s.memory_total_bytes == 80 * 2**30
    assert s.power_w == pytest.approx(512.345)
    assert s.energy_mj == 9_000_000
    assert (s.sm_clock_mhz, s.memory_clock_mhz) == (1980, 2619)
    assert s.throttle_reasons == 0x4 and s.temperature_c == 64.0
    assert s.pcie_tx_bytes_per_s == 1000 * 1024 and s.pcie_rx_bytes_per_s == 3000 * 1024
    assert s.nvlink_tx_bytes == 100 * 1024 and s.nvlink_rx_bytes == 7 * 1024
    assert (s.ecc_corrected_total, s.ecc_uncorrected_total) == (3, 0)
    assert s.processes is not None and [(p.pid, p.used_memory_bytes) for p in s.processes] == [
        (4242, 2**30)
    ]


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    ],
)
def test_unsupported_field_is_none_and_the_rest_is_read(
    nvml: FakeNvml, gpus: list[FakeGpu], code: int
) -> None:
    gpus[0].fail["nvmlDeviceGetPowerUsage"] = code
    gpus[0].fail["nvmlDeviceGetFieldValues"] = code  # e.g. a PCIe card without NVLink
    s = NvmlSource().sample(["GPU-aaaa"])[0]
    assert s.available and s.power_w is None and s.nvlink_tx_bytes is None
    assert s.utilization_pct == 87.0 and s.energy_mj == 9_000_000


def test_energy_counter_missing_on_pre_volta_gpu(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    gpus[0].fail["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    s = NvmlSource().sample(["GPU-aaaa"])[0]
    assert s.energy_mj is None and s.power_w is not None


def test_no_permission_for_processes_gives_none_not_empty(
    nvml: FakeNvml, gpus: list[FakeGpu]
) -> None:
    gpus[0].fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    s = NvmlSource().sample(["GPU-aaaa"])[0]
    assert s.processes is None  # "could not be read", which must not look like "no process"


def test_process_memory_not_available_under_mig(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    gpus[0].processes = [(7, None)]
    s = NvmlSource().sample(["GPU-aaaa"])[0]
    assert s.processes is not None and s.processes[0].used_memory_bytes is None


def test_gpu_lost_mid_job_is_unavailable_and_others_go_on(
    nvml: FakeNvml, gpus: list[FakeGpu]
) -> None:
    source = NvmlSource()
    first = source.sample(["GPU-aaaa", "GPU-bbbb"])
    assert all(s.available for s in first)
    gpus[0].lost = True  # XID 79: fallen off the bus
    lost, other = source.sample(["GPU-aaaa", "GPU-bbbb"])
    assert not lost.available and lost.uuid == "GPU-aaaa" and lost.utilization_pct is None
    assert other.available and other.utilization_pct == 87.0


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_INVALID_ARGUMENT])
def test_gpu_answering_unknown_error_or_stale_handle_is_unavailable(
    nvml: FakeNvml, gpus: list[FakeGpu], code: int
) -> None:
    source = NvmlSource()
    source.list_gpus()
    gpus[1].fail["nvmlDeviceGetUtilizationRates"] = code
    ok, bad = source.sample(["GPU-aaaa", "GPU-bbbb"])
    assert ok.available and not bad.available


def test_unknown_uuid_is_unavailable(nvml: FakeNvml) -> None:
    (s,) = NvmlSource().sample(["GPU-gone"])
    assert not s.available


@pytest.mark.parametrize(
    ("code", "hint_word"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "install the NVIDIA driver"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "nvidia-smi"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot"),
    ],
)
def test_library_missing_or_driver_not_loaded_raises_with_hint(
    nvml: FakeNvml, code: int, hint_word: str
) -> None:
    nvml.init_error = code
    with pytest.raises(TelemetryUnavailableError) as caught:
        NvmlSource().list_gpus()
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


def test_mig_devices_enumerated_with_parent_uuid_and_profile(
    nvml: FakeNvml, gpus: list[FakeGpu]
) -> None:
    gpus[0].name = "NVIDIA A100-SXM4-40GB"
    gpus[0].mig = [
        FakeGpu("MIG-1111", name="NVIDIA A100-SXM4-40GB MIG 3g.20gb", mem_total=20 * 2**30),
        None,  # an empty slot answers NOT_FOUND
        FakeGpu("MIG-2222", name="NVIDIA A100-SXM4-40GB MIG 1g.5gb", mem_total=5 * 2**30),
    ]
    infos = NvmlSource().list_gpus()
    by_uuid = {i.uuid: i for i in infos}
    assert [i.uuid for i in infos] == ["GPU-aaaa", "MIG-1111", "MIG-2222", "GPU-bbbb"]
    assert by_uuid["MIG-1111"].parent_uuid == "GPU-aaaa"
    assert by_uuid["MIG-1111"].mig_profile == "3g.20gb"
    assert by_uuid["MIG-2222"].memory_total_bytes == 5 * 2**30
    assert by_uuid["MIG-2222"].minor_number is None
    assert by_uuid["GPU-aaaa"].parent_uuid is None and by_uuid["GPU-aaaa"].mig_profile is None


def test_mig_instance_sampled_by_its_own_uuid(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    mig = FakeGpu("MIG-1111", name="X MIG 1g.10gb", mem_used=123)
    mig.fail["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpus[0].mig = [mig]
    (s,) = NvmlSource().sample(["MIG-1111"])
    assert s.available and s.memory_used_bytes == 123 and s.utilization_pct is None


def test_subinterval_samples_only_new_ones(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    gpus[0].samples = [(100, 10), (200, 20)]  # the driver's buffer from before the job
    source = NvmlSource()
    assert source.sample(["GPU-aaaa"])[0].utilization_samples_pct == ()
    gpus[0].samples += [(300, 30), (400, 40)]
    assert source.sample(["GPU-aaaa"])[0].utilization_samples_pct == (30.0, 40.0)
    assert source.sample(["GPU-aaaa"])[0].utilization_samples_pct == ()  # NOT_FOUND: none new
    gpus[0].samples += [(500, 50)]
    assert source.sample(["GPU-aaaa"])[0].utilization_samples_pct == (50.0,)
    assert nvml.sample_args == [0, 200, 400, 400]


def test_xid_events_go_to_their_gpu_once(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    source = NvmlSource()
    source.list_gpus()
    nvml.events = [(gpus[1], 79), (gpus[1], 48)]
    a, b = source.sample(["GPU-aaaa", "GPU-bbbb"])
    assert a.xid_events == () and b.xid_events == (79, 48)
    assert source.sample(["GPU-bbbb"])[0].xid_events == ()


def test_gpm_metrics_from_two_samples(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    gpus[0].gpm = True
    source = NvmlSource()
    first = source.sample(["GPU-aaaa"])[0]
    assert first.sm_active_pct is None  # one GPM sample is not a rate yet
    second = source.sample(["GPU-aaaa"])[0]
    assert second.sm_active_pct == 61.5 and second.tensor_active_pct == 22.0
    assert second.sm_occupancy_pct is None  # that metric answered NOT_SUPPORTED


def test_gpm_unsupported_on_ampere_leaves_sm_activity_none(
    nvml: FakeNvml, gpus: list[FakeGpu]
) -> None:
    gpus[0].fail["nvmlGpmQueryDeviceSupport"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource()
    for _ in range(2):
        s = source.sample(["GPU-aaaa"])[0]
        assert s.available and s.sm_active_pct is None and s.tensor_active_pct is None


def test_metric_table_fields_exist_on_gpusample() -> None:
    from dataclasses import fields

    from slurm_gpu.records import GpuSample

    names = {f.name for f in fields(GpuSample)}
    for metric in METRICS:
        assert set(metric.fields) <= names, metric.nvml_call
