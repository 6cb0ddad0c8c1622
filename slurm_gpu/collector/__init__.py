"""The collector: sealed node records + accounting -> analysis -> store, crash-safe."""

from __future__ import annotations

from slurm_gpu.collector.collector import (
    Accounting,
    Analyse,
    Collector,
    CollectorOptions,
    CollectReport,
    RecordReader,
    telemetry_status,
)
from slurm_gpu.collector.lock import CollectorLock

__all__ = [
    "Accounting",
    "Analyse",
    "CollectReport",
    "Collector",
    "CollectorLock",
    "CollectorOptions",
    "RecordReader",
    "telemetry_status",
]
