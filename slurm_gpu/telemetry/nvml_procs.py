"""Compute processes of a GPU or MIG slice, with the struct the driver really fills.

pynvml's process wrappers are not used: from nvidia-ml-py 12.550 the unversioned one raises
``NVMLLibraryMismatchError`` on drivers before R510 (R470 is an LTS branch), and every release
sizes the ``_v3`` entries for one driver family only, while drivers 535.43–535.86 fill
32-byte entries (``usedGpuCcProtectedMemory``) and all others 24. Reading 32-byte entries
with a 24-byte stride (or the reverse) turns every pid after the first into garbage. So, as
nvitop does, the call is chosen by what the driver exports (``_v3``, then ``_v2``, then the
unversioned v1) and the entry size by the driver version, and the size protocol is run here
through pynvml's function lookup: the first call already passes room for ``FIRST_ENTRIES``
processes, so a GPU with no more than that takes one C call per reading, not two.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from slurm_gpu.telemetry.nvml_calls import INSUFFICIENT_SIZE, NO_ID, SUCCESS

_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
_MAX_TRIES = 3
FIRST_ENTRIES = 16
"""Processes the first call has room for (more: the driver says how many, and a second call
reads them)."""


class _V1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _V2(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _V3ConfidentialCompute(ctypes.Structure):
    _fields_ = [*_V2._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


@dataclass(frozen=True, slots=True)
class RawProcess:
    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int
    compute_instance_id: int


def v3_struct(driver: tuple[int, ...]) -> type[ctypes.Structure]:
    """The entry the ``_v3`` call fills on this driver (32 bytes on 535.43–535.86)."""
    if driver[:2] >= (535, 43) and driver[:2] < (535, 98):
        return _V3ConfidentialCompute
    return _V2


def candidates(driver: tuple[int, ...]) -> tuple[tuple[str, type[ctypes.Structure]], ...]:
    return (
        ("nvmlDeviceGetComputeRunningProcesses_v3", v3_struct(driver)),
        ("nvmlDeviceGetComputeRunningProcesses_v2", _V2),
        ("nvmlDeviceGetComputeRunningProcesses", _V1),
    )


def running_processes(
    nv: Any, handle: Any, name: str, struct: type[ctypes.Structure]
) -> tuple[RawProcess, ...]:
    """One process list through the C entry point ``name``; raises pynvml's NVMLError."""
    fn = nv._nvmlGetFunctionPointer(name)  # raises NVMLError(FUNCTION_NOT_FOUND) if absent
    size = FIRST_ENTRIES
    for _ in range(_MAX_TRIES):
        entries = (struct * size)()
        count = ctypes.c_uint(size)
        ret = fn(handle, ctypes.byref(count), entries)
        if ret == SUCCESS:
            return tuple(_convert(entries[i]) for i in range(min(count.value, size)))
        if ret != INSUFFICIENT_SIZE:
            raise nv.NVMLError(ret)
        size = count.value * 2 + 5  # room for processes started between the two calls
    raise nv.NVMLError(ret)


def _convert(entry: Any) -> RawProcess:
    mem = int(entry.usedGpuMemory)
    return RawProcess(
        pid=int(entry.pid),
        # NVML_VALUE_NOT_AVAILABLE: e.g. per-process memory on a GPU in MIG mode
        used_memory_bytes=None if mem == _NOT_AVAILABLE else mem,
        gpu_instance_id=int(getattr(entry, "gpuInstanceId", NO_ID)),
        compute_instance_id=int(getattr(entry, "computeInstanceId", NO_ID)),
    )
