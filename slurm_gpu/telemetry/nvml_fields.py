"""The counters read in one ``nvmlDeviceGetFieldValues`` call per GPU and reading.

Each id is nvml.h's ``NVML_FI_*`` number (ABI-stable; older pynvml releases lack some of the
names). A field the driver does not know answers NOT_SUPPORTED in its own slot and leaves
its ``GpuSample`` field ``None``; the others in the batch are unaffected.

Two batches: ``FIELDS``, every field, at the readings that also read the cumulative counters
(``NvmlSource``'s ``counters_every``), and ``EVERY_READING``, the fields read at every
reading. The cumulative totals (energy, ECC, PCIe bytes) are left out of the latter: the
total-energy field alone costs about 4 ms on an H100 and the PCIe byte counters about 0.5 ms
each, against 0.07 ms for the power average (docs/performance.md), and their job totals are
differences of two reads. NVLink stays in every reading: its bytes are split by whether the
reading was idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm_gpu.telemetry.nvml_calls import SUCCESS

ALL_LINKS = 0xFFFFFFFF
"""Scope that asks an NVLink field for the sum over all links."""


@dataclass(frozen=True, slots=True)
class Field:
    """One field id of the batch and how its value is read."""

    key: str
    field_id: int
    nvml_name: str
    unit: str
    scope: int = 0


FIELDS: tuple[Field, ...] = (
    Field("energy_mj", 83, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ, cumulative"),
    Field("power_mw", 185, "NVML_FI_DEV_POWER_AVERAGE", "mW, 1 s mean (R530+)"),
    Field("ecc_corrected", 3, "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "count since driver load"),
    Field("ecc_uncorrected", 4, "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "count since driver load"),
    Field("nvlink_tx_kib", 138, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "KiB, cumulative",
          ALL_LINKS),
    Field("nvlink_rx_kib", 139, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "KiB, cumulative",
          ALL_LINKS),
    Field("pcie_tx_bytes", 197, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "bytes, cumulative"),
    Field("pcie_rx_bytes", 198, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", "bytes, cumulative"),
)  # fmt: skip

#: Keys read at every reading (the others at the counters' cadence).
EVERY_READING_KEYS = frozenset({"power_mw", "nvlink_tx_kib", "nvlink_rx_kib"})
EVERY_READING: tuple[Field, ...] = tuple(f for f in FIELDS if f.key in EVERY_READING_KEYS)
#: The totals read when the sampler seals (``NvmlSource.read_counters``).
SEAL_KEYS = frozenset({"energy_mj", "ecc_corrected", "ecc_uncorrected"})
AT_SEAL: tuple[Field, ...] = tuple(f for f in FIELDS if f.key in SEAL_KEYS)


def request_of(fields: tuple[Field, ...]) -> list[tuple[int, int]]:
    """pynvml's ``nvmlDeviceGetFieldValues`` argument for ``fields``."""
    return [(f.field_id, f.scope) for f in fields]


REQUEST = request_of(FIELDS)
REQUEST_EVERY_READING = request_of(EVERY_READING)
REQUEST_AT_SEAL = request_of(AT_SEAL)

#: nvml.h value types -> the member of the value union that holds it.
_UNION = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


@dataclass(frozen=True, slots=True)
class FieldReading:
    """Values by ``Field.key`` (absent when the driver did not answer that field)."""

    values: dict[str, float]
    timestamp_us: dict[str, int]


def decode(raw: Any, fields: tuple[Field, ...] = FIELDS) -> FieldReading:
    """Read pynvml's ``c_nvmlFieldValue_t`` array, asked in ``fields`` order."""
    values: dict[str, float] = {}
    stamps: dict[str, int] = {}
    for spec, entry in zip(fields, raw, strict=False):
        if int(entry.nvmlReturn) != SUCCESS:
            continue
        member = _UNION.get(int(entry.valueType), "ullVal")
        values[spec.key] = getattr(entry.value, member)
        stamps[spec.key] = int(entry.timestamp)
    return FieldReading(values, stamps)
