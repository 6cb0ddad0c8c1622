"""NVML calls per GPU-sample, and what they would cost on a real node (modelled).

Runs ``NvmlSource`` against the fake ``libnvidia-ml.so.1`` of ``tests/nvmlfake`` (the real
pynvml calls into it), per driver profile, and counts the C entry points each GPU-sample
calls in steady state (after the first readings set up events and GPM). No GPU is needed.
Between two readings the driver records utilization samples, as a busy GPU's does (a MIG
slice has none), so ``nvmlDeviceGetSamples`` has something to return.

The cost on a node with a GPU is estimated from the counts, a MODEL: each call count is
multiplied by ``LATENCY_US``, the per-call latencies measured on an H100 (docs/performance.md),
and each ``nvmlDeviceGetFieldValues`` batch is costed by the fields it asked (the fake counts
them): a batch with the total-energy field as the measured batch of all eight fields
(``BATCH_WITH_ENERGY_US``), any other as the sum of its fields' one-at-a-time latencies
(``FIELD_LATENCY_US``, an upper bound: each of those includes the call's own overhead). The
Python-side CPU per GPU-sample against the fake (whose calls take nanoseconds) is measured
and printed alongside: it is the part that does not depend on the driver.

``--counters-every K`` is the source's cadence of the cumulative counters (6: the default
``counters_interval_s`` of 60 s at the default 10 s interval); ``--source-file PATH``
benchmarks another ``nvml.py`` (e.g. an older release's, which reads every counter at every
reading) in place of the installed one, for a before/after comparison. Prints a Markdown
section.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import pynvml  # noqa: E402
from nvmlfake.driver import Clock, FakeDriver  # noqa: E402

#: Latency of one C call, µs: the medians measured on an NVIDIA H100 80GB HBM3, driver
#: 580.159.04, while it ran bf16 matrix products (benchmarks/device_record.py and
#: device_fields.py, 2026-11-27; docs/performance.md "NVML on a real H100"), except where a
#: comment says otherwise. The driver's time counts as the caller's CPU time.
LATENCY_US: dict[str, float] = {
    "nvmlDeviceGetPcieThroughput": 20_000.0,  # not called on R580; NVML: "a 20 ms interval"
    "nvmlDeviceGetFieldValues": 4_300.0,  # not used: batches are costed by their fields
    "nvmlDeviceGetSamples": 1_100.0,  # per C call; pynvml's wrapper makes two per reading
    "nvmlDeviceGetViolationStatus": 900.0,
    "nvmlGpmSampleGet": 190.0,
    "nvmlGpmMigSampleGet": 190.0,  # not measured (no MIG there): as the whole GPU's
    "nvmlDeviceGetMemoryInfo_v2": 63.0,
    "nvmlDeviceGetMemoryInfo": 63.0,  # not measured: as _v2
    "nvmlDeviceGetComputeRunningProcesses_v3": 48.0,
    "nvmlDeviceGetComputeRunningProcesses_v2": 48.0,  # not measured: as _v3
    "nvmlDeviceGetComputeRunningProcesses": 48.0,  # not measured: as _v3
    "nvmlDeviceGetPowerUsage": 41.0,
    "nvmlDeviceGetTotalEnergyConsumption": 4_260.0,
    "nvmlDeviceGetTotalEccErrors": 80.0,  # not measured: as the ECC fields alone
    "nvmlEventSetWait_v2": 22.0,
    "nvmlDeviceGetUtilizationRates": 7.5,
    "nvmlGpmMetricsGet": 5.6,
    "nvmlDeviceGetTemperature": 4.4,
    "nvmlDeviceGetCurrentClocksEventReasons": 4.5,
    "nvmlDeviceGetClockInfo": 2.5,
}
DEFAULT_LATENCY_US = 20.0
"""Every other call (not met in the steady state of the profiles)."""

#: ``nvmlDeviceGetFieldValues`` asking the total-energy field (83): the measured median of
#: the sampler's batch of all eight fields on the busy H100 (energy alone: 4,337 µs).
BATCH_WITH_ENERGY_US = 4_433.0
#: One field asked alone, µs: the busy H100's medians (device_fields.py, 2026-11-27).
FIELD_LATENCY_US: dict[int, float] = {
    83: 4_337.0,  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    185: 74.3,  # NVML_FI_DEV_POWER_AVERAGE
    3: 84.4,  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL
    4: 72.5,  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    138: 128.4,  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    139: 148.1,  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    197: 457.8,  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    198: 435.1,  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
}
ENERGY_FIELD = 83


def _pynvml_version() -> str:
    """The installed nvidia-ml-py's version (the module, not where this machine keeps it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return "unknown"


def batch_us(ids: tuple[int, ...]) -> float:
    """Modelled latency of one field batch."""
    if ENERGY_FIELD in ids:
        return BATCH_WITH_ENERGY_US
    return sum(FIELD_LATENCY_US.get(i, DEFAULT_LATENCY_US) for i in ids)


PROFILES = (
    ("r570_h100", ["GPU-aaaaaaaa-0000-0000-0000-000000000000"], "R570, H100, one process"),
    ("r535_129_h100_mig", ["MIG-11111111-0000-0000-0000-000000000000"], "535.129, H100 MIG slice"),
    ("r470_a100", ["GPU-47047047-0000-0000-0000-000000000000"], "R470, A100, three processes"),
)


def _source_class(path: str | None) -> Any:
    if path is None:
        from slurm_gpu.telemetry.nvml import NvmlSource

        return NvmlSource
    spec = importlib.util.spec_from_file_location("nvml_under_test", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.NvmlSource


def _source(cls: Any, clock: Clock, counters_every: int) -> Any:
    for kwargs in (
        {"clock": clock, "wall_clock": clock, "counters_every": counters_every},
        {"clock": clock, "wall_clock": clock},  # a source that reads every counter each time
        {},  # an older source without injectable clocks
    ):
        try:
            return cls(**kwargs)
        except TypeError:
            continue
    raise TypeError("cannot construct the source")


def _modelled_us(drv: FakeDriver) -> float:
    calls = drv.call_table()
    fields = sum(n * batch_us(ids) for ids, n in drv.field_batches().items())
    other = sum(
        n * LATENCY_US.get(name, DEFAULT_LATENCY_US)
        for name, n in calls.items()
        if name != "nvmlDeviceGetFieldValues"
    )
    return fields + other


SAMPLES_PER_READING = 6
"""Utilization samples the driver records between two readings (about 6 a second on recent
GPUs; fewer here, which changes nothing in the calls)."""


def _advance(drv: FakeDriver, clock: Clock, uuids: list[str], seconds: float) -> None:
    start_us = int(clock.t * 1_000_000)
    clock.advance(seconds)
    step = int(seconds * 1_000_000) // SAMPLES_PER_READING
    for uuid in uuids:
        if not uuid.startswith("MIG-"):
            for k in range(1, SAMPLES_PER_READING + 1):
                drv.add_sample(uuid, start_us + k * step, 60)


def measure(
    profile: str, uuids: list[str], readings: int, source_file: str | None, counters_every: int
) -> dict[str, Any]:
    drv = FakeDriver(profile)
    drv.install(pynvml)
    clock = Clock()
    clock.attach(drv)
    src = _source(_source_class(source_file), clock, counters_every)
    for _ in range(3):
        _advance(drv, clock, uuids, 10)
        src.sample(uuids)
    drv.reset_calls()
    cpu = 0.0
    # Each reading's modelled cost, to tell the readings that read the counters apart.
    per_reading: list[float] = []
    before = 0.0
    for _ in range(readings):
        _advance(drv, clock, uuids, 10)
        start = time.process_time()
        src.sample(uuids)
        cpu += time.process_time() - start
        total = _modelled_us(drv)
        per_reading.append((total - before) / len(uuids))
        before = total
    table = {k: v / (readings * len(uuids)) for k, v in drv.call_table().items()}
    batches = {ids: n / (readings * len(uuids)) for ids, n in drv.field_batches().items()}
    src.close()
    return {
        "calls": sum(table.values()),
        "table": table,
        "batches": batches,
        "modelled_us": _modelled_us(drv) / (readings * len(uuids)),
        "cheapest_us": min(per_reading),
        "dearest_us": max(per_reading),
        "cpu_us": cpu / (readings * len(uuids)) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=500)
    parser.add_argument("--source-file", help="benchmark this nvml.py instead of the installed")
    parser.add_argument(
        "--counters-every", type=int, default=6,
        help="read the cumulative counters at one reading in this many (a source that can)",
    )  # fmt: skip
    args = parser.parse_args()
    print(f"### NVML calls per GPU-sample ({args.source_file or 'this tree'}, "
          f"counters every {args.counters_every} readings)\n")  # fmt: skip
    print(f"{platform.node()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, nvidia-ml-py {_pynvml_version()}; "
          f"{args.readings} readings after 3 warm-up readings; no real GPU: the NVML time is "
          "a MODEL (call counts times latencies measured on an H100).\n")  # fmt: skip
    print("| profile | calls per GPU-sample | modelled NVML time per GPU-sample: mean "
          "(cheapest–dearest reading) | Python CPU per GPU-sample (fake) |")  # fmt: skip
    print("|---|---|---|---|")
    details = []
    for profile, uuids, label in PROFILES:
        try:
            r = measure(profile, uuids, args.readings, args.source_file, args.counters_every)
        except Exception as exc:  # an older source may let a pynvml error escape
            print(f"| {label} | raises {type(exc).__name__} | | |")
            continue
        print(f"| {label} | {r['calls']:.1f} | {r['modelled_us'] / 1000:.2f} ms "
              f"({r['cheapest_us'] / 1000:.2f}–{r['dearest_us'] / 1000:.2f}) | "
              f"{r['cpu_us']:.0f} µs |")  # fmt: skip
        details.append((label, r["table"], r["batches"]))
    for label, table, batches in details:
        calls = ", ".join(f"{name} {n:g}" for name, n in sorted(table.items()))
        asked = "; ".join(
            f"[{','.join(str(i) for i in ids)}] {n:g}" for ids, n in sorted(batches.items())
        )
        print(f"\n- {label}: {calls}; field batches by ids: {asked}")


if __name__ == "__main__":
    main()
