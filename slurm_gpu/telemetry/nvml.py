"""Real GPUs through NVML (nvidia-ml-py). The only module of slurm-gpu that imports ``pynvml``.

NVML is loaded lazily, on the first ``list_gpus`` or ``sample``, never at import. Every NVML
failure is turned into the project's vocabulary:

* a field the GPU, driver or our privileges do not offer (``NOT_SUPPORTED``, ``NO_PERMISSION``,
  ``FUNCTION_NOT_FOUND``, any other unexpected code) is ``None`` in the sample;
* a GPU that stopped answering (``GPU_IS_LOST``, ``UNKNOWN``, ``GPU_NOT_FOUND``,
  ``INVALID_ARGUMENT`` from a stale handle, ``RESET_REQUIRED``) reads as ``available=False``;
  the other GPUs go on;
* no NVML at all (``LIBRARY_NOT_FOUND``, ``DRIVER_NOT_LOADED``, driver/library mismatch, or
  the Python package missing) raises ``TelemetryUnavailableError`` with a hint.

No ``pynvml.NVMLError`` leaves this module (they cannot even be hashed).

The simple metrics are a table, ``METRICS``: one row per NVML call, naming the ``GpuSample``
fields it fills; ``docs/telemetry.md`` lists the same rows. Stateful readings (the driver's
sub-interval samples, XID events, GPM metrics) keep per-GPU state between two calls of
``sample``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuProcess, GpuSample

_UINT_MAX = 0xFFFFFFFF
_KIB = 1024

# Error-code names, resolved against pynvml once it is loaded.
_LOST_CODES = (
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_UNKNOWN",
    "NVML_ERROR_GPU_NOT_FOUND",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_RESET_REQUIRED",
)
_NO_LIBRARY_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "libnvidia-ml.so.1 not found: install the NVIDIA driver (package nvidia-driver or "
        'libnvidia-ml1), or set telemetry.backend = "virtual" on a node without GPUs'
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "the NVIDIA kernel driver is not loaded: check that `nvidia-smi` works on this node "
        "(modprobe nvidia)"
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "the NVML library and the kernel driver differ in version: reboot the node or reload "
        "the nvidia module after a driver upgrade"
    ),
}


class _GpuLost(Exception):
    """Internal: the GPU stopped answering during this reading."""


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class Metric:
    """One row of the metric table: an NVML call and the ``GpuSample`` fields it fills."""

    fields: tuple[str, ...]
    nvml_call: str
    unit: str
    read: Callable[[Any, Any], tuple[Any, ...]]
    """``(pynvml, handle) -> one value per field``, already in the field's unit."""


def _utilization(nv: Any, h: Any) -> tuple[Any, ...]:
    rates = nv.nvmlDeviceGetUtilizationRates(h)
    return float(rates.gpu), float(rates.memory)


def _memory(nv: Any, h: Any) -> tuple[Any, ...]:
    info = nv.nvmlDeviceGetMemoryInfo(h)
    return int(info.used), int(info.total)


def _throttle(nv: Any, h: Any) -> tuple[Any, ...]:
    # Renamed "clocks event reasons" in recent drivers; the old name remains for old ones.
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is None:
        fn = nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return (int(fn(h)),)


def _pcie(nv: Any, h: Any) -> tuple[Any, ...]:
    tx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)
    rx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)
    return float(tx) * _KIB, float(rx) * _KIB  # KB/s -> bytes/s


def _nvlink(nv: Any, h: Any) -> tuple[Any, ...]:
    # Cumulative data counters in KiB; scope UINT_MAX asks for the sum over all links.
    values = nv.nvmlDeviceGetFieldValues(
        h,
        [
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _UINT_MAX),
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _UINT_MAX),
        ],
    )
    out: list[int | None] = []
    for v in values:
        out.append(int(v.value.ullVal) * _KIB if v.nvmlReturn == nv.NVML_SUCCESS else None)
    return tuple(out)


def _ecc(nv: Any, h: Any) -> tuple[Any, ...]:
    corrected = nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC
    )
    uncorrected = nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
    )
    return int(corrected), int(uncorrected)


def _processes(nv: Any, h: Any) -> tuple[Any, ...]:
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    return (
        tuple(
            GpuProcess(pid=int(p.pid), used_memory_bytes=_int_or_none(p.usedGpuMemory))
            for p in procs
        ),
    )


def _int_or_none(value: Any) -> int | None:
    # pynvml gives None when the driver reports NVML_VALUE_NOT_AVAILABLE (e.g. under MIG).
    return int(value) if isinstance(value, int) else None


#: The metric table. A row whose call fails with "not supported" leaves its fields ``None``.
METRICS: tuple[Metric, ...] = (
    Metric(("utilization_pct", "memory_utilization_pct"), "nvmlDeviceGetUtilizationRates",
           "%", _utilization),
    Metric(("memory_used_bytes", "memory_total_bytes"), "nvmlDeviceGetMemoryInfo", "bytes",
           _memory),
    Metric(("power_w",), "nvmlDeviceGetPowerUsage", "W (from mW)",
           lambda nv, h: (nv.nvmlDeviceGetPowerUsage(h) / 1000.0,)),
    Metric(("energy_mj",), "nvmlDeviceGetTotalEnergyConsumption", "mJ",
           lambda nv, h: (int(nv.nvmlDeviceGetTotalEnergyConsumption(h)),)),
    Metric(("sm_clock_mhz",), "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", "MHz",
           lambda nv, h: (int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),)),
    Metric(("memory_clock_mhz",), "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", "MHz",
           lambda nv, h: (int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),)),
    Metric(("throttle_reasons",), "nvmlDeviceGetCurrentClocksEventReasons", "bitmask",
           _throttle),
    Metric(("temperature_c",), "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)", "°C",
           lambda nv, h: (float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),)),
    Metric(("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"), "nvmlDeviceGetPcieThroughput",
           "bytes/s (from KB/s)", _pcie),
    Metric(("nvlink_tx_bytes", "nvlink_rx_bytes"),
           "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX)",
           "bytes (from KiB), cumulative", _nvlink),
    Metric(("ecc_corrected_total", "ecc_uncorrected_total"),
           "nvmlDeviceGetTotalEccErrors(NVML_VOLATILE_ECC)", "count", _ecc),
    Metric(("processes",), "nvmlDeviceGetComputeRunningProcesses", "pid, bytes", _processes),
)  # fmt: skip

#: GPM metric ids (nvml.h) -> GpuSample field.
GPM_METRICS: tuple[tuple[int, str], ...] = (
    (2, "sm_active_pct"),  # NVML_GPM_METRIC_SM_UTIL: share of SMs busy
    (3, "sm_occupancy_pct"),  # NVML_GPM_METRIC_SM_OCCUPANCY: resident warps vs maximum
    (5, "tensor_active_pct"),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
)


@dataclass(slots=True)
class _Device:
    handle: Any
    info: GpuInfo
    is_mig: bool
    last_sample_ts: int | None = None
    """Timestamp (µs) of the newest driver utilization sample already returned."""
    gpm: bool = False
    gpm_previous: Any = None
    pending_xids: list[int] = field(default_factory=list)


class NvmlSource:
    """``TelemetrySource`` over the node's NVIDIA GPUs and MIG instances, by UUID."""

    name = "nvml"

    def __init__(self) -> None:
        self._nv: ModuleType | None = None
        self._devices: dict[str, _Device] = {}
        self._order: list[str] = []
        self._event_set: Any = None

    # ----------------------------------------------------------------- life cycle

    def _lib(self) -> ModuleType:
        """Load pynvml and initialise NVML once; map "no NVML" to TelemetryUnavailableError."""
        if self._nv is not None:
            return self._nv
        try:
            import pynvml
        except ImportError:
            raise TelemetryUnavailableError(
                "the Python package nvidia-ml-py is not installed",
                hint="pip install nvidia-ml-py (it provides the module pynvml)",
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = _code(exc)
            hint = None
            for name, text in _NO_LIBRARY_HINTS.items():
                if code == getattr(pynvml, name, None):
                    hint = text
            raise TelemetryUnavailableError(
                f"NVML cannot be initialised: {exc}",
                hint=hint or "check that `nvidia-smi` works on this node",
            ) from None
        self._nv = pynvml
        return self._nv

    def close(self) -> None:
        """Free GPM samples and the event set, and shut NVML down (idempotent)."""
        nv, self._nv = self._nv, None
        if nv is None:
            return
        for dev in self._devices.values():
            if dev.gpm_previous is not None:
                self._quiet(nv, nv.nvmlGpmSampleFree, dev.gpm_previous)
                dev.gpm_previous = None
        if self._event_set is not None:
            self._quiet(nv, nv.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._quiet(nv, nv.nvmlShutdown)
        self._devices.clear()
        self._order.clear()

    @staticmethod
    def _quiet(nv: Any, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(nv.NVMLError):
            fn(*args)

    # ----------------------------------------------------------------- calls

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML: the value, ``None`` when not offered, ``_GpuLost`` when the GPU is gone."""
        nv = self._lib()
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            code = _code(exc)
            if any(code == getattr(nv, name, None) for name in _LOST_CODES):
                raise _GpuLost from None
            return None  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND and the rest

    def _read_metric(self, metric: Metric, handle: Any) -> tuple[Any, ...] | None:
        nv = self._lib()
        try:
            return metric.read(nv, handle)
        except nv.NVMLError as exc:
            code = _code(exc)
            if any(code == getattr(nv, name, None) for name in _LOST_CODES):
                raise _GpuLost from None
            return None
        except (AttributeError, TypeError, ValueError):
            return None  # an older pynvml without this call, or an odd value

    # ----------------------------------------------------------------- discovery

    def list_gpus(self) -> Sequence[GpuInfo]:
        """Every GPU, then its MIG instances (when MIG is enabled), in NVML order."""
        nv = self._lib()
        try:
            count = self._call(nv.nvmlDeviceGetCount)
        except _GpuLost:
            count = 0
        found: dict[str, _Device] = {}
        order: list[str] = []
        for index in range(count or 0):
            try:
                handle = self._call(nv.nvmlDeviceGetHandleByIndex, index)
                if handle is None:
                    continue
                gpu = self._describe(handle, index, parent=None)
            except _GpuLost:
                continue  # a GPU that cannot even be named is not listed; the others are
            if gpu is None:
                continue
            found[gpu.uuid] = self._devices.get(gpu.uuid) or _Device(handle, gpu, False)
            found[gpu.uuid].handle = handle
            order.append(gpu.uuid)
            for mig in self._mig_devices(handle, gpu):
                found[mig.info.uuid] = self._devices.get(mig.info.uuid) or mig
                found[mig.info.uuid].handle = mig.handle
                order.append(mig.info.uuid)
        self._devices, self._order = found, order
        self._register_xid_events()
        for dev in found.values():
            if not dev.is_mig and dev.gpm_previous is None:
                support = self._safe(nv.nvmlGpmQueryDeviceSupport, dev.handle)
                dev.gpm = bool(getattr(support, "isSupportedDevice", 0))
        return [found[u].info for u in order]

    def _safe(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self._call(fn, *args)
        except _GpuLost:
            return None

    def _describe(self, handle: Any, index: int | None, parent: GpuInfo | None) -> GpuInfo | None:
        nv = self._lib()
        raw_uuid = self._call(nv.nvmlDeviceGetUUID, handle)
        if raw_uuid is None:
            return None
        name = _text(self._call(nv.nvmlDeviceGetName, handle))
        memory = self._call(nv.nvmlDeviceGetMemoryInfo, handle)
        cc = self._call(nv.nvmlDeviceGetCudaComputeCapability, handle)
        profile = None
        if parent is not None and name and " MIG " in name:
            profile = name.rsplit(" MIG ", 1)[1]  # "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
        power = self._call(nv.nvmlDeviceGetEnforcedPowerLimit, handle) if parent is None else None
        pci = self._call(nv.nvmlDeviceGetPciInfo, handle) if parent is None else None
        return GpuInfo(
            uuid=_text(raw_uuid) or "",
            index=index,
            # A MIG instance has no /dev/nvidiaN of its own: never match it by minor number.
            minor_number=self._call(nv.nvmlDeviceGetMinorNumber, handle)
            if parent is None
            else None,
            name=name,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_limit_w=power / 1000.0 if isinstance(power, int | float) else None,
            parent_uuid=parent.uuid if parent else None,
            mig_profile=profile,
            pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
            compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
        )

    def _mig_devices(self, handle: Any, parent: GpuInfo) -> list[_Device]:
        nv = self._lib()
        try:
            mode = self._call(nv.nvmlDeviceGetMigMode, handle)
            if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
                return []
            slots = self._call(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        except _GpuLost:
            return []
        out = []
        for slot in range(slots):
            try:
                # An empty slot answers NOT_FOUND, which _call turns into None.
                mig_handle = self._call(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
                info = None if mig_handle is None else self._describe(mig_handle, None, parent)
            except _GpuLost:
                continue
            if info is not None:
                out.append(_Device(mig_handle, info, True))
        return out

    def _register_xid_events(self) -> None:
        nv = self._lib()
        if self._event_set is None:
            self._event_set = self._safe(nv.nvmlEventSetCreate)
            if self._event_set is None:
                return
            for dev in self._devices.values():
                if not dev.is_mig:
                    self._safe(
                        nv.nvmlDeviceRegisterEvents,
                        dev.handle,
                        nv.nvmlEventTypeXidCriticalError,
                        self._event_set,
                    )

    # ----------------------------------------------------------------- sampling

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        """Read each GPU once. Unknown or lost GPUs read as ``available=False``."""
        nv = self._lib()
        if not self._devices or any(u not in self._devices for u in uuids):
            self.list_gpus()
        self._drain_xid_events()
        out = []
        for gpu_uuid in uuids:
            now = time.time()
            dev = self._devices.get(gpu_uuid)
            if dev is None:
                out.append(GpuSample(uuid=gpu_uuid, time_s=now, available=False))
                continue
            try:
                out.append(self._sample_one(nv, dev, now))
            except _GpuLost:
                out.append(GpuSample(uuid=gpu_uuid, time_s=now, available=False))
        return out

    def _sample_one(self, nv: Any, dev: _Device, now: float) -> GpuSample:
        values: dict[str, Any] = {}
        for metric in METRICS:
            got = self._read_metric(metric, dev.handle)
            if got is not None:
                values.update(zip(metric.fields, got, strict=True))
        values["utilization_samples_pct"] = self._new_util_samples(nv, dev)
        values.update(self._gpm(nv, dev))
        xids, dev.pending_xids = tuple(dev.pending_xids), []
        return GpuSample(uuid=dev.info.uuid, time_s=now, xid_events=xids, **values)

    def _new_util_samples(self, nv: Any, dev: _Device) -> tuple[float, ...]:
        got = self._call(
            nv.nvmlDeviceGetSamples,
            dev.handle,
            nv.NVML_GPU_UTILIZATION_SAMPLES,
            dev.last_sample_ts or 0,
        )
        if not got:
            return ()  # not supported, or NVML_ERROR_NOT_FOUND: no new samples
        value_type, samples = got
        first_call = dev.last_sample_ts is None
        last = dev.last_sample_ts or 0
        fresh = []
        for s in samples:
            if s.timeStamp > last:
                fresh.append(float(_sample_value(nv, value_type, s.sampleValue)))
        dev.last_sample_ts = max([last, *(int(s.timeStamp) for s in samples)])
        # The first call returns the driver's whole buffer, which predates this job's sampler.
        return () if first_call else tuple(fresh)

    def _gpm(self, nv: Any, dev: _Device) -> dict[str, float | None]:
        if not dev.gpm:
            return {}
        try:
            current = self._call(nv.nvmlGpmSampleAlloc)
            if current is None:
                return {}
            if self._call(nv.nvmlGpmSampleGet, dev.handle, current) is None:
                self._quiet(nv, nv.nvmlGpmSampleFree, current)
                return {}
        except (_GpuLost, AttributeError):
            return {}
        previous, dev.gpm_previous = dev.gpm_previous, current
        if previous is None:
            return {}  # a metric needs two samples: the next reading will have one
        out: dict[str, float | None] = {}
        try:
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = previous
            request.sample2 = current
            for i, (metric_id, _name) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric_id
            result = self._call(nv.nvmlGpmMetricsGet, request)
            if result is not None:
                for i, (_id, name) in enumerate(GPM_METRICS):
                    metric = result.metrics[i]
                    ok = metric.nvmlReturn == nv.NVML_SUCCESS
                    out[name] = round(float(metric.value), 3) if ok else None
        except (_GpuLost, AttributeError, TypeError):
            pass
        finally:
            self._quiet(nv, nv.nvmlGpmSampleFree, previous)
        return out

    def _drain_xid_events(self) -> None:
        """Move every XID event the driver queued since the last call to its GPU."""
        nv = self._lib()
        if self._event_set is None:
            return
        for _ in range(1000):  # bounded: a storm of events must not stall the sampler
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError:
                return  # NVML_ERROR_TIMEOUT: the queue is empty
            try:
                gpu_uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError:
                continue
            dev = self._devices.get(gpu_uuid or "")
            if dev is not None and data.eventType & nv.nvmlEventTypeXidCriticalError:
                dev.pending_xids.append(int(data.eventData))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _sample_value(nv: Any, value_type: int, value: Any) -> float:
    attr = {
        nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    }.get(value_type, "uiVal")
    return float(getattr(value, attr))
