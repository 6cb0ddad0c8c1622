"""The telemetry seam: what every GPU source provides.

Concrete sources: ``slurm_gpu.telemetry.nvml.NvmlSource`` (real GPUs, the only module that
imports pynvml) and ``slurm_gpu.telemetry.virtual.VirtualGpuSource`` (file-backed virtual GPUs
for machines without one). Only the hooks and the CLI choose which (``open_source``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from slurm_gpu.records import GpuInfo, GpuSample

# NVML clock event (throttle) reason bits, copied as numbers so that callers above the NVML
# adapter need not import pynvml. Values from nvml.h (nvmlClocksEventReason*).
THROTTLE_GPU_IDLE = 0x1
THROTTLE_APP_CLOCKS = 0x2
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_DISPLAY_CLOCKS = 0x100

THROTTLE_POWER_MASK = THROTTLE_SW_POWER_CAP | THROTTLE_HW_POWER_BRAKE
# HW_SLOWDOWN is set for a thermal slowdown and for an external power brake alike (nvml.h),
# so it proves neither cause and is in neither mask.
THROTTLE_THERMAL_MASK = THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL


@runtime_checkable
class TelemetrySource(Protocol):
    """Reads GPUs. Implementations never raise for one bad field or one lost GPU.

    ``list_gpus`` raises ``TelemetryUnavailableError`` only when nothing at all can be read
    (library missing, driver not loaded). ``sample`` returns one ``GpuSample`` per requested
    UUID, in the same order, with ``available=False`` for a GPU that cannot be read.
    """

    name: str
    """``nvml`` or ``virtual``; recorded in the spool header."""

    def list_gpus(self) -> Sequence[GpuInfo]:
        """Every GPU and MIG instance on this node."""
        ...

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        """Read each GPU once, now."""
        ...

    def close(self) -> None:
        """Release the library (idempotent)."""
        ...


def slurm_gpu_index(gpu: GpuInfo, gpus: Sequence[GpuInfo]) -> int | None:
    """The number Slurm names ``gpu`` by on this node, as the prolog reads ``SLURM_JOB_GPUS``
    (``hooks.gpus``): its device minor number (the ``N`` of gres.conf ``File=/dev/nvidiaN``);
    the source's index where the source knows no minor number of any whole GPU among
    ``gpus`` (the node's GPUs, as ``list_gpus`` gives them); ``None`` for a MIG slice (it has
    no device of its own) or where neither is known."""
    if gpu.parent_uuid is not None:
        return None
    if gpu.minor_number is not None:
        return gpu.minor_number
    if all(g.minor_number is None for g in gpus if g.parent_uuid is None):
        return gpu.index
    return None


@runtime_checkable
class CounterSource(Protocol):
    """A source that reads some cumulative counters (energy, ECC totals, violation times) at
    fewer readings than the rest, and reads them on request so that totals are exact at the
    end: the sampler calls ``read_counters`` when it seals. A source that reads everything at
    every reading does not implement it."""

    def read_counters(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        """Each GPU's cumulative counters read now (the other fields ``None``), in order;
        ``available=False`` for a GPU that cannot be read. Never raises."""
        ...
