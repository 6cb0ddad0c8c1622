"""Cost of each NVML field and sampled call on a real GPU, one at a time.

``benchmarks/device_record.py`` times whole C calls: ``nvmlDeviceGetFieldValues`` with the
sampler's batch (``slurm_gpu.telemetry.nvml_fields.FIELDS``) took milliseconds on an H100.
This asks for each field alone, then for the batch, ``--calls`` times each, idle and while a
PyTorch process keeps the GPU busy, and times ``nvmlDeviceGetSamples`` and
``nvmlDeviceGetViolationStatus`` per kind the same way. Prints JSON (median and p95, µs).

Usage on the GPU machine: ``python3 benchmarks/device_fields.py --out "$OUT/fields.json"``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpu.telemetry.nvml_fields import FIELDS  # noqa: E402


def _time(fn: Any, calls: int, pause_s: float) -> dict[str, Any]:
    ns = []
    error = None
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        try:
            fn()
        except Exception as exc:  # an unsupported call is a result too
            error = f"{type(exc).__name__}: {exc}"
        ns.append(time.perf_counter_ns() - t0)
        time.sleep(pause_s)
    ns.sort()
    return {
        "median_us": round(statistics.median(ns) / 1000, 1),
        "p95_us": round(ns[int(0.95 * (len(ns) - 1))] / 1000, 1),
        "error": error,
    }


def probe(nv: Any, handle: Any, calls: int, pause_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in FIELDS:
        out[f"field {f.field_id} {f.nvml_name}"] = _time(
            lambda f=f: nv.nvmlDeviceGetFieldValues(handle, [(f.field_id, f.scope)]),
            calls,
            pause_s,
        )
    out["fields batch (the sampler's)"] = _time(
        lambda: nv.nvmlDeviceGetFieldValues(handle, [(f.field_id, f.scope) for f in FIELDS]),
        calls,
        pause_s,
    )
    for kind, name in ((1, "GPU_UTILIZATION_SAMPLES"), (2, "MEMORY_UTILIZATION_SAMPLES")):
        out[f"GetSamples {name}"] = _time(
            lambda kind=kind: nv.nvmlDeviceGetSamples(handle, kind, 0), calls, pause_s
        )
    for policy, name in ((0, "POWER"), (1, "THERMAL")):
        out[f"GetViolationStatus {name}"] = _time(
            lambda policy=policy: nv.nvmlDeviceGetViolationStatus(handle, policy), calls, pause_s
        )
    out["GetPowerUsage"] = _time(lambda: nv.nvmlDeviceGetPowerUsage(handle), calls, pause_s)
    out["GetPowerManagementDefaultLimit"] = _time(
        lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(handle), 3, pause_s
    )
    out["GetTotalEnergyConsumption"] = _time(
        lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle), calls, pause_s
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--pause", type=float, default=0.02, help="between calls, s")
    args = parser.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    result: dict[str, Any] = {
        "gpu": str(nv.nvmlDeviceGetName(handle)),
        "driver": str(nv.nvmlSystemGetDriverVersion()),
    }
    for key, fn in (
        ("default_power_limit_mw", nv.nvmlDeviceGetPowerManagementDefaultLimit),
        ("enforced_power_limit_mw", nv.nvmlDeviceGetEnforcedPowerLimit),
    ):
        try:
            result[key] = fn(handle)
        except nv.NVMLError as exc:
            result[key] = str(exc)
    result["idle"] = probe(nv, handle, args.calls, args.pause)
    load = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "benchmarks/device_workloads.py"),
            "healthy",
            "--seconds",
            "600",
        ]
    )
    time.sleep(8.0)
    result["busy"] = probe(nv, handle, args.calls, args.pause)
    load.kill()
    load.wait()
    nv.nvmlShutdown()
    text = json.dumps(result, indent=1)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
