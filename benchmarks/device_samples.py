"""How much the driver's utilization-sample buffer holds, and what one read of it costs.

``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` returns the driver's buffered
sub-interval samples newer than a timestamp; nvml.h documents neither the buffer's size nor
its time span. The sampler reads them over the interval before a reading, so the buffer must
span at least ``telemetry.interval_s``. This asks for the whole buffer (timestamp 0) on a
busy GPU and on an idle one, and times the call for the whole buffer and for the last second
(``--calls`` times each). Prints JSON.

Usage on the GPU machine: ``python3 benchmarks/device_samples.py --out "$OUT/samples.json"``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "benchmarks" / "device_workloads.py"
UTILIZATION = 1  # NVML_GPU_UTILIZATION_SAMPLES


def buffer(nv: Any, handle: Any, calls: int) -> dict[str, Any]:
    """The whole buffer once (count, span, spacing) and the call's cost, whole and 1 s."""
    _vt, samples = nv.nvmlDeviceGetSamples(handle, UTILIZATION, 0)
    stamps = sorted(int(s.timeStamp) for s in samples)
    gaps = [b - a for a, b in pairwise(stamps)]
    out: dict[str, Any] = {
        "count": len(stamps),
        "span_s": round((stamps[-1] - stamps[0]) / 1e6, 3) if stamps else None,
        "newest_age_s": round(time.time() - stamps[-1] / 1e6, 3) if stamps else None,
        "spacing_ms_median": round(statistics.median(gaps) / 1000, 1) if gaps else None,
        "spacing_ms_max": round(max(gaps) / 1000, 1) if gaps else None,
    }
    for name, since in (("whole", lambda: 0), ("last_1s", lambda: int((time.time() - 1) * 1e6))):
        ns = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            try:
                nv.nvmlDeviceGetSamples(handle, UTILIZATION, since())
            except nv.NVMLError as exc:  # NOT_FOUND: nothing in that second
                out[f"{name}_error"] = str(exc)
            ns.append(time.perf_counter_ns() - t0)
            time.sleep(0.05)
        # pynvml's wrapper makes two C calls (the count, then the samples): half is one call.
        out[f"{name}_wrapper_ms_median"] = round(statistics.median(ns) / 1e6, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--settle", type=float, default=30.0, help="s of load (or idle) first")
    args = parser.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    load = subprocess.Popen(
        [sys.executable, str(WORKLOADS), "healthy", "--seconds", str(args.settle + 30)],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(args.settle)
    result["busy"] = buffer(nv, handle, args.calls)
    load.kill()
    load.wait()
    time.sleep(args.settle)
    result["idle"] = buffer(nv, handle, args.calls)
    nv.nvmlShutdown()
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
