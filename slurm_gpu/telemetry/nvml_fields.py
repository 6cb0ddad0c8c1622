"""The counters read in one ``nvmlDeviceGetFieldValues`` call per GPU and reading.

Each id is nvml.h's ``NVML_FI_*`` number (ABI-stable; older pynvml releases lack some of the
names). A field the driver does not know answers NOT_SUPPORTED in its own slot and leaves
its ``GpuSample`` field ``None``; the others in the batch are unaffected.
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

REQUEST: list[tuple[int, int]] = [(f.field_id, f.scope) for f in FIELDS]

#: nvml.h value types -> the member of the value union that holds it.
_UNION = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


@dataclass(frozen=True, slots=True)
class FieldReading:
    """Values by ``Field.key`` (absent when the driver did not answer that field)."""

    values: dict[str, float]
    timestamp_us: dict[str, int]


def decode(raw: Any) -> FieldReading:
    """Read pynvml's ``c_nvmlFieldValue_t`` array in ``FIELDS`` order."""
    values: dict[str, float] = {}
    stamps: dict[str, int] = {}
    for spec, entry in zip(FIELDS, raw, strict=False):
        if int(entry.nvmlReturn) != SUCCESS:
            continue
        member = _UNION.get(int(entry.valueType), "ullVal")
        values[spec.key] = getattr(entry.value, member)
        stamps[spec.key] = int(entry.timestamp)
    return FieldReading(values, stamps)
