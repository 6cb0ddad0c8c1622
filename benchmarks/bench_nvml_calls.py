"""NVML calls per GPU-sample, and what they would cost on a real node (modelled).

Runs ``NvmlSource`` against the fake ``libnvidia-ml.so.1`` of ``tests/nvmlfake`` (the real
pynvml calls into it), per driver profile, and counts the C entry points each GPU-sample
calls in steady state (after the first readings set up events and GPM). No GPU is needed.

The cost on a node with a GPU is estimated from the counts: each call count is multiplied by
``LATENCY_US``, the per-call latencies measured on an H100 (docs/performance.md). The Python-side
CPU per GPU-sample against the fake (whose calls take nanoseconds) is measured and printed
alongside: it is the part that does not depend on the driver.

``--source-file PATH`` benchmarks another ``nvml.py`` (e.g. an older release's) in place of
the installed one, for a before/after comparison. Prints a Markdown section.
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
    "nvmlDeviceGetFieldValues": 4_300.0,  # the sampler's batch; the energy counter is ~4 ms
    "nvmlDeviceGetSamples": 1_100.0,  # per C call; pynvml makes two per reading
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


def measure(
    profile: str, uuids: list[str], readings: int, source_file: str | None
) -> dict[str, Any]:
    drv = FakeDriver(profile)
    drv.install(pynvml)
    clock = Clock()
    clock.attach(drv)
    cls = _source_class(source_file)
    try:
        src = cls(clock=clock, wall_clock=clock)
    except TypeError:
        src = cls()  # an older source without injectable clocks
    for _ in range(3):
        clock.advance(10)
        src.sample(uuids)
    drv.reset_calls()
    cpu = 0.0
    for _ in range(readings):
        clock.advance(10)
        start = time.process_time()
        src.sample(uuids)
        cpu += time.process_time() - start
    table = {k: v / (readings * len(uuids)) for k, v in drv.call_table().items()}
    src.close()
    modelled = sum(n * LATENCY_US.get(name, DEFAULT_LATENCY_US) for name, n in table.items())
    return {
        "calls": sum(table.values()),
        "table": table,
        "modelled_us": modelled,
        "cpu_us": cpu / (readings * len(uuids)) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=500)
    parser.add_argument("--source-file", help="benchmark this nvml.py instead of the installed")
    args = parser.parse_args()
    print(f"### NVML calls per GPU-sample ({args.source_file or 'this tree'})\n")
    print(f"{platform.node()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, pynvml {pynvml.__file__}; "
          f"{args.readings} readings after 3 warm-up readings; no real GPU (latencies "
          "measured on an H100).\n")  # fmt: skip
    print("| profile | calls per GPU-sample | modelled NVML time per GPU-sample | "
          "Python CPU per GPU-sample (fake) |")  # fmt: skip
    print("|---|---|---|---|")
    details = []
    for profile, uuids, label in PROFILES:
        try:
            r = measure(profile, uuids, args.readings, args.source_file)
        except Exception as exc:  # an older source may let a pynvml error escape
            print(f"| {label} | raises {type(exc).__name__} | | |")
            continue
        print(f"| {label} | {r['calls']:.1f} | {r['modelled_us'] / 1000:.2f} ms | "
              f"{r['cpu_us']:.0f} µs |")  # fmt: skip
        details.append((label, r["table"]))
    for label, table in details:
        calls = ", ".join(f"{name} {n:g}" for name, n in sorted(table.items()))
        print(f"\n- {label}: {calls}")


if __name__ == "__main__":
    main()
