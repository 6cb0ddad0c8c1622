"""Real GPUs through NVML (nvidia-ml-py). The only module of slurm-gpu that imports ``pynvml``.

NVML is loaded lazily, on the first ``list_gpus`` or ``sample``, never at import. Every NVML
answer is turned into the project's vocabulary (``docs/telemetry.md``):

* a field the GPU, driver or our privileges do not give (any error code other than those
  below, a call the driver does not export, pynvml's ``NVMLLibraryMismatchError``) is
  ``None`` in the sample; the rest of the reading goes on;
* only ``GPU_IS_LOST``, ``GPU_NOT_FOUND`` and ``RESET_REQUIRED``, or a reading in which not
  one field could be read, make the GPU ``available=False``; the other GPUs go on;
* ``UNINITIALIZED``, ``DRIVER_NOT_LOADED`` or ``LIB_RM_VERSION_MISMATCH`` mid-job (a driver
  reload) make the source shut NVML down, initialise it again and re-enumerate, at most once
  per ``reinit_interval_s``;
* no NVML at all raises ``TelemetryUnavailableError`` with a hint.

No pynvml exception leaves this module. MIG slices are GPUs of their own: their memory,
processes, GPM activity and XIDs, never the parent's aggregate. ``list_gpus`` only
enumerates (the prolog needs no more); event registration and GPM support are set up by the
first ``sample`` of the GPUs actually read.

The cumulative counters whose driver calls cost milliseconds (total energy, the power and
thermal violation times, the PCIe byte and ECC totals) are read at one reading of a GPU in
``counters_every`` and at its first, and ``read_counters`` reads them once more when the
sampler seals: a job's totals are differences of two reads, so they come out as if read at
every reading. The readings between leave those fields ``None``. The driver's utilization
samples (one C call of 2.0-2.7 ms on an H200) are read at the same readings, over the
interval before each (``nvml_samples``); the readings between leave them empty.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuProcess, GpuSample
from slurm_gpu.telemetry import nvml_procs
from slurm_gpu.telemetry.nvml_calls import (
    FUNCTION_NOT_FOUND,
    NO_ID,
    NOT_FOUND,
    NOT_SUPPORTED,
    TIMEOUT,
    CallFailed,
    DriverGone,
    GpuLost,
    call,
    parse_driver_version,
    pynvml_errors,
)
from slurm_gpu.telemetry.nvml_fields import (
    AT_SEAL,
    EVERY_READING,
    FIELDS,
    REQUEST,
    REQUEST_AT_SEAL,
    REQUEST_EVERY_READING,
    decode,
)
from slurm_gpu.telemetry.nvml_samples import SampleBuffer, SampleCursor, fetch

_KIB = 1024
_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_GPM_MIN_GAP_S = 0.1
"""NVML needs two GPM samples at least 100 ms apart to give a rate."""
_EVENTS_PER_READING = 1000
_NO_LIBRARY_HINTS = {
    12: (  # NVML_ERROR_LIBRARY_NOT_FOUND
        "libnvidia-ml.so.1 not found: install the NVIDIA driver (package nvidia-driver or "
        'libnvidia-ml1), or set telemetry.backend = "virtual" on a node without GPUs'
    ),
    9: (  # NVML_ERROR_DRIVER_NOT_LOADED
        "the NVIDIA kernel driver is not loaded: check that `nvidia-smi` works on this node "
        "(modprobe nvidia)"
    ),
    18: (  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
        "the NVML library and the kernel driver differ in version: reboot the node or reload "
        "the nvidia module after a driver upgrade"
    ),
}


@dataclass(frozen=True, slots=True)
class Metric:
    """One row of the metric table (documentation and tests): a call and the fields it fills."""

    fields: tuple[str, ...]
    nvml_call: str
    unit: str


#: Where each ``GpuSample`` field comes from; ``docs/telemetry.md`` shows the same table.
METRICS: tuple[Metric, ...] = (
    Metric(("utilization_pct", "memory_utilization_pct"), "nvmlDeviceGetUtilizationRates", "%"),
    Metric(("memory_used_bytes", "memory_total_bytes"),
           "nvmlDeviceGetMemoryInfo_v2 (v1 before R510)", "bytes"),
    Metric(("power_w",), "field NVML_FI_DEV_POWER_AVERAGE (nvmlDeviceGetPowerUsage before R530)",
           "W (from mW)"),
    Metric(("energy_mj",), "field NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (counters' cadence)",
           "mJ"),
    Metric(("sm_clock_mhz",), "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", "MHz"),
    Metric(("memory_clock_mhz",), "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", "MHz"),
    Metric(("throttle_reasons",),
           "nvmlDeviceGetCurrentClocksEventReasons (…ThrottleReasons before R535)", "bitmask"),
    Metric(("violation_power_ns", "violation_thermal_ns"),
           "nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER / _THERMAL), physical GPU, "
           "counters' cadence", "ns, cumulative"),
    Metric(("temperature_c",), "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)", "°C"),
    Metric(("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
           "fields NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES (delta since the previous read, at the "
           "counters' cadence)", "bytes/s"),
    Metric(("nvlink_tx_bytes", "nvlink_rx_bytes"),
           "fields NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX", "bytes (from KiB), cumulative"),
    Metric(("ecc_corrected_total", "ecc_uncorrected_total"),
           "fields NVML_FI_DEV_ECC_SBE/DBE_VOL_TOTAL (counters' cadence)", "count"),
    Metric(("processes",), "nvmlDeviceGetComputeRunningProcesses_v3/_v2/v1", "pid, bytes"),
    Metric(("utilization_samples_pct",),
           "nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES), one C call", "%"),
    Metric(("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct"),
           "nvmlGpmSampleGet / nvmlGpmMigSampleGet + nvmlGpmMetricsGet", "%"),
    Metric(("xid_events",), "nvmlEventSetWait_v2 (nvmlEventTypeXidCriticalError)", "XID"),
)  # fmt: skip

#: Violation counters (``nvmlDeviceGetViolationStatus``: nvml.h's ``NVML_PERF_POLICY_*``,
#: cumulative ns) -> GpuSample field. Only the two causes the report tells apart: the power
#: policy (power cap) and the thermal policy; HW_SLOWDOWN, which may be either, has none.
VIOLATION_POLICIES: tuple[tuple[str, int], ...] = (
    ("violation_power_ns", 0),  # NVML_PERF_POLICY_POWER
    ("violation_thermal_ns", 1),  # NVML_PERF_POLICY_THERMAL
)

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
    parent: _Device | None = None
    gpu_instance_id: int = NO_ID
    compute_instance_id: int = NO_ID
    cursor: SampleCursor = field(default_factory=SampleCursor)
    samples: SampleBuffer = field(default_factory=SampleBuffer)
    counters_wait: int = 0
    """Readings to go before the cumulative counters are read again (0: at the next)."""
    last_reading_us: int | None = None
    """Wall-clock µs of the previous reading, where the driver's samples were not read."""
    gpm: bool | None = None
    """GPM support, asked on the first reading (``None`` until then)."""
    gpm_samples: list[Any] = field(default_factory=list)
    """Two GPM sample buffers, used in turn (allocated once, freed on close)."""
    gpm_current: int = -1
    """Index in ``gpm_samples`` of the newest filled sample; -1 when none."""
    gpm_time_s: float | None = None
    pcie_last: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Last PCIe byte counter per direction: (value, field timestamp µs)."""
    pending_xids: list[int] = field(default_factory=list)
    registered: bool = False
    violation_policies: tuple[tuple[str, int], ...] = VIOLATION_POLICIES
    """The violation counters still asked for (one the GPU does not keep is dropped)."""

    @property
    def is_mig(self) -> bool:
        return self.parent is not None


class NvmlSource:
    """``TelemetrySource`` over the node's NVIDIA GPUs and MIG slices, by UUID.

    A MIG slice is also found under Slurm's name for it, ``MIG-GPU-<uuid>/<gi>/<ci>``.
    ``clock`` (seconds) paces re-enumeration, re-initialisation and GPM; ``wall_clock``
    (seconds since the epoch) stamps samples and checks the driver's sample timestamps.
    """

    name = "nvml"

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rescan_interval_s: float = 60.0,
        reinit_interval_s: float = 30.0,
        counters_every: int = 1,
    ) -> None:
        self.counters_every = max(1, int(counters_every))
        """The cumulative counters are read at one reading of a GPU in this many."""
        self._nv: ModuleType | None = None
        self._errors: tuple[type[BaseException], ...] = ()
        self._clock = clock
        self._wall = wall_clock
        self._rescan_interval_s = rescan_interval_s
        self._reinit_interval_s = reinit_interval_s
        self._devices: dict[str, _Device] = {}
        self._order: list[str] = []
        self._enumerated = False
        self._last_rescan: float | None = None
        self._last_reinit: float | None = None
        self._event_set: Any = None
        self._no_event_set = False
        """The driver gave no event set: not asked again until NVML is re-initialised."""
        self._driver: tuple[int, ...] = ()
        self._procs_call: tuple[str, Any] | None = None
        self._memory_v2 = True
        self._event_reasons = True
        self._power_call_fallback = False

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
            code = getattr(exc, "value", None)
            raise TelemetryUnavailableError(
                f"NVML cannot be initialised: {exc}",
                hint=_NO_LIBRARY_HINTS.get(code, "check that `nvidia-smi` works on this node")
                if isinstance(code, int)
                else "check that `nvidia-smi` works on this node",
            ) from None
        self._nv = pynvml
        self._errors = pynvml_errors(pynvml)
        version = self._try(pynvml.nvmlSystemGetDriverVersion)
        self._driver = parse_driver_version(_text(version))
        return self._nv

    def close(self) -> None:
        """Free GPM samples and the event set, and shut NVML down (idempotent)."""
        nv = self._nv
        if nv is None:
            return
        self._release(nv)
        self._quiet(nv.nvmlShutdown)
        self._nv = None
        self._devices.clear()
        self._order.clear()
        self._enumerated = False

    def _release(self, nv: Any) -> None:
        for dev in self._devices.values():
            self._free_gpm(dev)
        if self._event_set is not None:
            self._quiet(nv.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._no_event_set = False
        for dev in self._devices.values():
            dev.registered = False

    def _free_gpm(self, dev: _Device) -> None:
        if self._nv is None:
            return
        for sample in dev.gpm_samples:
            self._quiet(self._nv.nvmlGpmSampleFree, sample)
        dev.gpm_samples, dev.gpm_current = [], -1

    def _quiet(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(GpuLost, DriverGone, CallFailed):
            self._do(fn, *args)

    def _reinit(self) -> bool:
        """Shut NVML down and initialise it again (a driver reload); rate limited."""
        now = self._clock()
        if self._last_reinit is not None and now - self._last_reinit < self._reinit_interval_s:
            return False
        self._last_reinit = now
        nv = self._nv
        if nv is not None:
            self._release(nv)
            self._quiet(nv.nvmlShutdown)
        self._nv = None
        try:
            self._lib()
        except TelemetryUnavailableError:
            return False
        old = self._devices
        self._enumerate()
        for gpu_uuid, dev in self._devices.items():  # keep cursors and counters: same job
            if gpu_uuid in old:
                dev.cursor, dev.pcie_last = old[gpu_uuid].cursor, old[gpu_uuid].pcie_last
                dev.samples = old[gpu_uuid].samples
        return True

    # ----------------------------------------------------------------- calls

    def _do(self, fn: Callable[..., Any], *args: Any) -> Any:
        return call(self._nv, self._errors, fn, *args)

    def _try(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The value, or ``None`` for any failure but a lost GPU or a gone driver."""
        try:
            return self._do(fn, *args)
        except CallFailed:
            return None

    # ----------------------------------------------------------------- discovery

    def list_gpus(self) -> Sequence[GpuInfo]:
        """Every GPU, then its MIG slices (when MIG is enabled), in NVML order."""
        self._lib()
        try:
            self._enumerate()
        except DriverGone:
            if self._reinit():
                return self.list_gpus()
            return []
        return [self._devices[u].info for u in self._order]

    def _enumerate(self) -> None:
        nv = self._lib()
        count = self._safe(nv.nvmlDeviceGetCount) or 0
        found: dict[str, _Device] = {}
        order: list[str] = []
        for index in range(count):
            try:
                handle = self._try(nv.nvmlDeviceGetHandleByIndex, index)
                gpu = None if handle is None else self._describe(handle, index, None)
            except GpuLost:
                continue  # a GPU that cannot even be named is not listed; the others are
            if gpu is None:
                continue
            dev = self._adopt(found, gpu, handle, None)
            order.append(gpu.uuid)
            for mig in self._mig_devices(dev, found):
                order.append(mig.info.uuid)
        for gone in set(self._devices) - set(found):
            self._free_gpm(self._devices[gone])
        self._devices, self._order = found, order
        self._enumerated = True
        self._last_rescan = self._clock()

    def _adopt(
        self, found: dict[str, _Device], info: GpuInfo, handle: Any, parent: _Device | None
    ) -> _Device:
        """Keep a known device's state (cursors, GPM buffers) and refresh its handle."""
        dev = self._devices.get(info.uuid)
        if dev is None or dev.info != info:
            if dev is not None:
                self._free_gpm(dev)
            dev = _Device(handle, info, parent)
        dev.handle, dev.parent = handle, parent
        found[info.uuid] = dev
        return dev

    def _safe(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self._try(fn, *args)
        except GpuLost:
            return None

    def _describe(self, handle: Any, index: int | None, parent: GpuInfo | None) -> GpuInfo | None:
        nv = self._lib()
        raw_uuid = self._try(nv.nvmlDeviceGetUUID, handle)
        if not raw_uuid:
            return None
        name = _text(self._try(nv.nvmlDeviceGetName, handle))
        memory = self._memory(handle)
        cc = self._try(nv.nvmlDeviceGetCudaComputeCapability, handle)
        profile = None
        if parent is not None and name and " MIG " in name:
            profile = name.rsplit(" MIG ", 1)[1]  # "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
        whole = parent is None
        power = self._try(nv.nvmlDeviceGetEnforcedPowerLimit, handle) if whole else None
        pci = self._try(nv.nvmlDeviceGetPciInfo, handle) if whole else None
        return GpuInfo(
            uuid=_text(raw_uuid) or "",
            index=index,
            # A MIG slice has no /dev/nvidiaN of its own: never match it by minor number.
            minor_number=self._try(nv.nvmlDeviceGetMinorNumber, handle) if whole else None,
            name=name,
            memory_total_bytes=memory[1] if memory is not None else None,
            power_limit_w=power / 1000.0 if isinstance(power, int | float) else None,
            parent_uuid=parent.uuid if parent else None,
            mig_profile=profile,
            pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
            compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
        )

    def _mig_devices(self, parent: _Device, found: dict[str, _Device]) -> list[_Device]:
        nv = self._lib()
        try:
            mode = self._try(nv.nvmlDeviceGetMigMode, parent.handle)
            if not mode or mode[0] != 1:  # NVML_DEVICE_MIG_ENABLE
                return []
            slots = self._try(nv.nvmlDeviceGetMaxMigDeviceCount, parent.handle) or 0
        except GpuLost:
            return []
        out = []
        for slot in range(slots):
            try:
                # An empty slot answers NOT_FOUND.
                handle = self._try(nv.nvmlDeviceGetMigDeviceHandleByIndex, parent.handle, slot)
                info = None if handle is None else self._describe(handle, None, parent.info)
            except GpuLost:
                continue
            if info is None:
                continue
            gi = _int(self._safe(nv.nvmlDeviceGetGpuInstanceId, handle), NO_ID)
            ci = _int(self._safe(nv.nvmlDeviceGetComputeInstanceId, handle), NO_ID)
            # The ids go into the slice's identity, so that the prolog can resolve Slurm's
            # MIG-GPU-<uuid>/<gi>/<ci> to this slice instead of to its parent.
            info = dataclasses.replace(
                info,
                gpu_instance_id=None if gi == NO_ID else gi,
                compute_instance_id=None if ci == NO_ID else ci,
            )
            dev = self._adopt(found, info, handle, parent)
            dev.gpu_instance_id, dev.compute_instance_id = gi, ci
            out.append(dev)
        return out

    def _lookup(self, gpu_uuid: str) -> _Device | None:
        dev = self._devices.get(gpu_uuid)
        if dev is not None or not gpu_uuid.upper().startswith("MIG-GPU-"):
            return dev
        # Slurm's MIG name: MIG-GPU-<parent uuid>/<gpu instance>/<compute instance>
        parent, _, rest = gpu_uuid[len("MIG-") :].partition("/")
        gi, _, ci = rest.partition("/")
        if not (gi.isdigit() and ci.isdigit()):
            return None
        for dev in self._devices.values():
            if (
                dev.parent is not None
                and dev.parent.info.uuid.lower() == parent.lower()
                and (dev.gpu_instance_id, dev.compute_instance_id) == (int(gi), int(ci))
            ):
                return dev
        return None

    # ----------------------------------------------------------------- sampling

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        """Read each GPU once. Unknown or lost GPUs read as ``available=False``."""
        self._lib()
        if not self._enumerated or (
            any(self._lookup(u) is None for u in uuids) and self._may_rescan()
        ):
            self.list_gpus()
        try:
            out = self._read(uuids)
        except DriverGone:
            out = None
        if out is None or (uuids and not any(s.available for s in out)):
            # Everything failed at once: the driver may have been reloaded under us.
            if self._reinit():
                with contextlib.suppress(DriverGone):
                    return self._read(uuids)
            if out is None:
                now = self._wall()
                return [GpuSample(uuid=u, time_s=now, available=False) for u in uuids]
        return out

    def _may_rescan(self) -> bool:
        now = self._clock()
        return self._last_rescan is None or now - self._last_rescan >= self._rescan_interval_s

    def _read(self, uuids: Sequence[str]) -> list[GpuSample]:
        devices = [self._lookup(u) for u in uuids]
        self._prepare([d for d in devices if d is not None])
        self._drain_xid_events({id(d) for d in devices if d is not None})
        out = []
        for gpu_uuid, dev in zip(uuids, devices, strict=True):
            now = self._wall()
            if dev is None:
                out.append(GpuSample(uuid=gpu_uuid, time_s=now, available=False))
                continue
            try:
                got = self._sample_one(dev, gpu_uuid, now)
                if got is None and dev.is_mig and self._refresh_mig(dev):
                    dev = self._lookup(gpu_uuid) or dev
                    got = self._sample_one(dev, gpu_uuid, now)
            except GpuLost:
                got = None
            out.append(got or GpuSample(uuid=gpu_uuid, time_s=now, available=False))
        return out

    def _refresh_mig(self, dev: _Device) -> bool:
        """A MIG slice that answered nothing may have been recreated: enumerate again."""
        if not self._may_rescan():
            return False
        self._enumerate()
        return dev.info.uuid in self._devices

    def _prepare(self, devices: list[_Device]) -> None:
        """First reading of a GPU: its GPM support and its XID registration."""
        nv = self._lib()
        for dev in devices:
            physical = dev.parent or dev
            if dev.gpm is None:
                support = self._safe(nv.nvmlGpmQueryDeviceSupport, physical.handle)
                dev.gpm = bool(getattr(support, "isSupportedDevice", 0))
            if not physical.registered:
                self._register(physical)

    def _register(self, dev: _Device) -> None:
        nv = self._lib()
        if self._event_set is None and not self._no_event_set:
            self._event_set = self._safe(nv.nvmlEventSetCreate)
            # No event set on this driver (not supported, or the symbol is missing): not asked
            # again at every reading of every GPU; re-initialising NVML asks again.
            self._no_event_set = self._event_set is None
        if self._event_set is None:
            dev.registered = True
            return
        with contextlib.suppress(GpuLost, CallFailed):
            self._do(nv.nvmlDeviceRegisterEvents, dev.handle, _XID_EVENT, self._event_set)
        dev.registered = True  # also when not supported: do not ask at every reading

    def _sample_one(self, dev: _Device, gpu_uuid: str, now: float) -> GpuSample | None:
        """One reading; ``None`` when not one field could be read."""
        nv = self._lib()
        h = dev.handle
        values: dict[str, Any] = {}
        memory = self._memory(h)
        if memory is not None:
            values["memory_used_bytes"], values["memory_total_bytes"] = memory
        counters = dev.counters_wait <= 0
        self._fields(dev, values, counters)
        if not dev.is_mig:  # MIG slices answer NOT_SUPPORTED or INVALID_ARGUMENT to these
            rates = self._try(nv.nvmlDeviceGetUtilizationRates, h)
            if rates is not None:
                values["utilization_pct"] = float(rates.gpu)
                values["memory_utilization_pct"] = float(rates.memory)
            temp = self._try(nv.nvmlDeviceGetTemperature, h, 0)  # NVML_TEMPERATURE_GPU
            if temp is not None:
                values["temperature_c"] = float(temp)
        for key, clock_type in (("sm_clock_mhz", 1), ("memory_clock_mhz", 2)):
            mhz = self._try(nv.nvmlDeviceGetClockInfo, h, clock_type)
            if mhz is not None:
                values[key] = int(mhz)
        reasons = self._throttle(h)
        if reasons is not None:
            values["throttle_reasons"] = reasons
        procs = self._processes(dev)
        if procs is not None:
            values["processes"] = procs
        if not values:
            return None  # not one field: the GPU (or slice handle) is not answering
        if counters:
            values.update(self._violations(dev.parent or dev))
            dev.counters_wait = self.counters_every
        dev.counters_wait -= 1
        if not dev.is_mig and counters:
            values["utilization_samples_pct"] = self._util_samples(dev)
            dev.last_reading_us = None
        elif not dev.is_mig:
            dev.last_reading_us = int(now * 1_000_000)  # ``now`` is the wall clock's
        values.update(self._gpm(dev))
        xids, dev.pending_xids = tuple(dev.pending_xids), []
        return GpuSample(uuid=gpu_uuid, time_s=now, xid_events=xids, **values)

    def _memory(self, handle: Any) -> tuple[int, int] | None:
        """(used, total) bytes; v2 leaves out the driver's reserved memory (R510+)."""
        nv = self._lib()
        if self._memory_v2:
            try:
                info = self._do(nv.nvmlDeviceGetMemoryInfo, handle, _MEMORY_V2)
                return int(info.used), int(info.total)
            except CallFailed as failed:
                if failed.code != FUNCTION_NOT_FOUND:
                    return None
                self._memory_v2 = False
        info = self._try(nv.nvmlDeviceGetMemoryInfo, handle)
        return (int(info.used), int(info.total)) if info is not None else None

    def _fields(self, dev: _Device, values: dict[str, Any], counters: bool) -> None:
        """The field batch: every field when ``counters``, else those of every reading."""
        nv = self._lib()
        fields, request = (FIELDS, REQUEST) if counters else (EVERY_READING, REQUEST_EVERY_READING)
        raw = self._try(nv.nvmlDeviceGetFieldValues, dev.handle, request)
        reading = decode(raw, fields) if raw is not None else None
        got = reading.values if reading is not None else {}
        stamps = reading.timestamp_us if reading is not None else {}
        if "energy_mj" in got:
            values["energy_mj"] = int(got["energy_mj"])
        power = got.get("power_mw")
        if power is None and not dev.is_mig:
            power = self._try(nv.nvmlDeviceGetPowerUsage, dev.handle)  # before R530
        if power is not None:
            values["power_w"] = float(power) / 1000.0
        if "ecc_corrected" in got:
            values["ecc_corrected_total"] = int(got["ecc_corrected"])
        if "ecc_uncorrected" in got:
            values["ecc_uncorrected_total"] = int(got["ecc_uncorrected"])
        for key, name in (
            ("nvlink_tx_kib", "nvlink_tx_bytes"),
            ("nvlink_rx_kib", "nvlink_rx_bytes"),
        ):
            if key in got:
                values[name] = int(got[key]) * _KIB
        if dev.is_mig or not counters:
            return  # PCIe belongs to the physical GPU, shared by every slice
        if "pcie_tx_bytes" in got and "pcie_rx_bytes" in got:
            for key, name in (("pcie_tx_bytes", "pcie_tx_bytes_per_s"),
                              ("pcie_rx_bytes", "pcie_rx_bytes_per_s")):  # fmt: skip
                rate = _rate(dev.pcie_last.get(key), int(got[key]), stamps[key])
                dev.pcie_last[key] = (int(got[key]), stamps[key])
                if rate is not None:
                    values[name] = rate
            return
        # Before the byte counters: a 20 ms snapshot per direction (NVML's own words), at the
        # counters' cadence too.
        for counter, name in ((0, "pcie_tx_bytes_per_s"), (1, "pcie_rx_bytes_per_s")):
            kbs = self._try(nv.nvmlDeviceGetPcieThroughput, dev.handle, counter)
            if kbs is not None:
                values[name] = float(kbs) * _KIB

    def _throttle(self, handle: Any) -> int | None:
        nv = self._lib()
        if self._event_reasons:
            try:
                return int(self._do(nv.nvmlDeviceGetCurrentClocksEventReasons, handle))
            except CallFailed as failed:
                if failed.code != FUNCTION_NOT_FOUND:
                    return None
                self._event_reasons = False  # before R535 the call has its old name only
        reasons = self._try(nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        return int(reasons) if reasons is not None else None

    def _violations(self, physical: _Device) -> dict[str, int]:
        """Cumulative power and thermal violation times (ns) of the physical GPU: clocks
        are the whole GPU's, so a slice is held down exactly when its GPU is. A policy the
        GPU or driver does not keep is not asked again."""
        nv = self._lib()
        out: dict[str, int] = {}
        keep = []
        for name, policy in physical.violation_policies:
            try:
                got = self._do(nv.nvmlDeviceGetViolationStatus, physical.handle, policy)
            except CallFailed as failed:
                if failed.code not in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                    keep.append((name, policy))  # a transient error: ask again next time
                continue
            keep.append((name, policy))
            value = getattr(got, "violationTime", None)
            if isinstance(value, int):
                out[name] = value
        physical.violation_policies = tuple(keep)
        return out

    def read_counters(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        """The cumulative totals of each GPU read now, whatever the cadence: energy, ECC
        totals and the violation times (a MIG slice: its GPU's); every other field ``None``,
        ``available=False`` for a GPU that is lost or unknown. The sampler calls it when it
        seals, so that the job's totals run to its end. Never initialises NVML or
        enumerates: before any reading there is nothing to close."""
        now = self._wall()
        out = []
        nv = self._nv
        for gpu_uuid in uuids:
            dev = self._lookup(gpu_uuid) if nv is not None and self._enumerated else None
            got = None
            if dev is not None:
                with contextlib.suppress(GpuLost, DriverGone):
                    got = self._counters_of(dev, gpu_uuid, now)
            out.append(got or GpuSample(uuid=gpu_uuid, time_s=now, available=False))
        return out

    def _counters_of(self, dev: _Device, gpu_uuid: str, now: float) -> GpuSample:
        nv = self._lib()
        values: dict[str, Any] = {}
        raw = self._try(nv.nvmlDeviceGetFieldValues, dev.handle, REQUEST_AT_SEAL)
        got = decode(raw, AT_SEAL).values if raw is not None else {}
        for key, name in (
            ("energy_mj", "energy_mj"),
            ("ecc_corrected", "ecc_corrected_total"),
            ("ecc_uncorrected", "ecc_uncorrected_total"),
        ):
            if key in got:
                values[name] = int(got[key])
        values.update(self._violations(dev.parent or dev))
        return GpuSample(uuid=gpu_uuid, time_s=now, **values)

    def _processes(self, dev: _Device) -> tuple[GpuProcess, ...] | None:
        """The slice's or GPU's own compute processes; ``None`` when unreadable."""
        nv = self._lib()
        choices = [self._procs_call] if self._procs_call else nvml_procs.candidates(self._driver)
        for name, struct in choices:
            try:
                raw = self._do(nvml_procs.running_processes, nv, dev.handle, name, struct)
            except CallFailed as failed:
                if failed.code == FUNCTION_NOT_FOUND and self._procs_call is None:
                    continue  # an older driver: try the previous version of the call
                return None
            self._procs_call = (name, struct)
            return tuple(GpuProcess(pid=p.pid, used_memory_bytes=p.used_memory_bytes) for p in raw)
        return None

    def _util_samples(self, dev: _Device) -> tuple[float, ...]:
        """The driver's samples since the previous reading. Read at the counters' cadence (the
        one C call costs 2.0-2.7 ms on an H200, most of a reading): where the readings between
        did not read them, only the interval before this reading is taken, the older samples
        left in the driver's buffer; an interval with none is idle where the driver's buffer
        runs dry while the GPU is idle (``SampleCursor.idle_window``)."""
        nv = self._lib()
        now_us = int(self._wall() * 1_000_000)
        if dev.last_reading_us is not None:
            dev.cursor.skip_to(dev.last_reading_us)
        since = dev.cursor.since(now_us)
        try:
            value_type, samples = self._do(fetch, nv, dev.handle, 1, since, dev.samples)
        except CallFailed as failed:  # GPU_UTILIZATION_SAMPLES not supported, or none new
            return dev.cursor.idle_window(now_us) if failed.code == NOT_FOUND else ()
        return dev.cursor.take(
            ((int(s.timeStamp), _sample_value(value_type, s.sampleValue)) for s in samples), now_us
        )

    def _gpm(self, dev: _Device) -> dict[str, float | None]:
        """SM, occupancy and tensor activity between this and the previous GPM sample."""
        nv = self._lib()
        if not dev.gpm:
            return {}
        now = self._clock()
        if dev.gpm_time_s is not None and now - dev.gpm_time_s < _GPM_MIN_GAP_S:
            return {}  # too close to the previous sample: keep it for the next reading
        try:
            while len(dev.gpm_samples) < 2:
                dev.gpm_samples.append(self._do(nv.nvmlGpmSampleAlloc))
            target = dev.gpm_samples[(dev.gpm_current + 1) % 2]
            if dev.parent is not None:
                self._do(nv.nvmlGpmMigSampleGet, dev.parent.handle, dev.gpu_instance_id, target)
            else:
                self._do(nv.nvmlGpmSampleGet, dev.handle, target)
        except CallFailed:
            return {}
        previous = dev.gpm_current
        dev.gpm_current, dev.gpm_time_s = (dev.gpm_current + 1) % 2, now
        if previous < 0:
            return {}  # a rate needs two samples: the next reading will have one
        return self._gpm_metrics(dev.gpm_samples[previous], target)

    def _gpm_metrics(self, first: Any, second: Any) -> dict[str, float | None]:
        nv = self._lib()
        out: dict[str, float | None] = {}
        try:
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = 1  # NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = first, second
            for i, (metric_id, _name) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric_id
            result = self._do(nv.nvmlGpmMetricsGet, request)
        except (CallFailed, AttributeError, TypeError):
            return out
        for i, (_id, name) in enumerate(GPM_METRICS):
            metric = result.metrics[i]
            ok = int(metric.nvmlReturn) == 0 and 0.0 <= float(metric.value) <= 100.0
            out[name] = round(float(metric.value), 3) if ok else None
        return out

    def _drain_xid_events(self, read: set[int]) -> None:
        """Move every XID event the driver queued since the last call to its GPU or slice,
        when that device is one of those being read (``read``: their ``id``). An event is
        never kept for a device nobody reads: in a MIG job the parent GPU and the other
        tenants' slices are registered (events arrive per physical GPU) but never sampled,
        and their lists would grow for the whole job (550 and 500 events after 50
        readings), only to be handed to whoever reads them next."""
        nv = self._lib()
        if self._event_set is None:
            return
        for _ in range(_EVENTS_PER_READING):  # bounded: a storm must not stall the sampler
            try:
                data = self._do(nv.nvmlEventSetWait, self._event_set, 0)
            except CallFailed as failed:
                if failed.code != TIMEOUT:  # TIMEOUT: the queue is empty; else a broken set
                    self._rebuild_event_set()
                return
            except GpuLost:
                continue
            if not int(data.eventType) & _XID_EVENT:
                continue
            gpu_uuid = _text(self._safe(nv.nvmlDeviceGetUUID, data.device))
            physical = self._devices.get(gpu_uuid or "")
            if physical is not None:
                gi = _int(getattr(data, "gpuInstanceId", NO_ID), NO_ID)
                ci = _int(getattr(data, "computeInstanceId", NO_ID), NO_ID)
                for dev in self._xid_targets(physical, gi, ci):
                    if id(dev) in read:
                        dev.pending_xids.append(int(data.eventData))

    def _xid_targets(self, physical: _Device, gi: int, ci: int) -> list[_Device]:
        """The GPU and, for an event with instance ids, only the slice it names; an event
        without them concerns every slice of the GPU."""
        out = [physical]
        for dev in self._devices.values():
            if dev.parent is not physical:
                continue
            if gi == NO_ID or (
                dev.gpu_instance_id == gi and (ci == NO_ID or dev.compute_instance_id == ci)
            ):
                out.append(dev)
        return out

    def _rebuild_event_set(self) -> None:
        """The event set answered an error other than "empty": free it and register anew
        at the next reading, so that a persistent error does not stop draining silently."""
        nv = self._lib()
        self._quiet(nv.nvmlEventSetFree, self._event_set)
        self._event_set = None
        for dev in self._devices.values():
            dev.registered = False


def _rate(previous: tuple[int, int] | None, value: int, stamp_us: int) -> float | None:
    """Mean bytes/s between two counter readings; ``None`` on the first or a reset."""
    if previous is None:
        return None
    last_value, last_stamp = previous
    if stamp_us <= last_stamp or value < last_value:
        return None
    return (value - last_value) / ((stamp_us - last_stamp) / 1_000_000)


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) else default


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _sample_value(value_type: int, value: Any) -> float:
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal"}.get(value_type, "uiVal")
    return float(getattr(value, member))


__all__ = ["FIELDS", "GPM_METRICS", "METRICS", "Metric", "NvmlSource"]
