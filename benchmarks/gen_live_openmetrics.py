"""Write the exporter's series for N running jobs as OpenMetrics, for
``promtool tsdb create-blocks-from openmetrics`` (the policy-pass benchmark's Prometheus).

Each job has ``--gpus`` GPUs on its own node; ``--idle-every`` jobs in one hold GPUs never
used since they started (the rest run at 85 %). Counters get two samples (14.5 and 0.5
minutes before ``--now``), the utilisation three (14.5, 7.5 and 0.5 minutes before), the
last-sample time two (1.5 and 0.5 minutes before: its value advances), other gauges one (0.5
minutes before), so that an instant query at ``--now`` sees every series, ``increase(...[15m])``
has two points and the live policy's window queries over 15 minutes see the whole window.
Series carry ``instance="<host>:9817"`` and ``job="slurm-gpu"``, as Prometheus attaches them
when it scrapes the node's exporter; GPU series their ``gpu_index`` 0..N-1, the GPU indices
the benchmark's Slurm allocates each job on its node.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

GPU_COUNTERS = ("slurm_gpu_gpu_busy_seconds_total", "slurm_gpu_gpu_sampled_seconds_total")
#: Gauges with more than one sample per series (grouped per series, in time order).
SEVERAL_SAMPLES = (
    "slurm_gpu_gpu_utilization_ratio",
    "slurm_gpu_job_last_sample_timestamp_seconds",
)


def write(out: TextIO, jobs: int, gpus: int, idle_every: int, now: float) -> None:
    t_old, t_mid, t_new = now - 870.0, now - 450.0, now - 30.0
    started = now - 4 * 3600.0
    sampled_new, sampled_old = t_new - started, t_old - started
    rows: dict[str, list[str]] = {}
    for j in range(jobs):
        job_id = str(100000 + j)
        idle = idle_every > 0 and j % idle_every == 0
        base = (
            f'job_id="{job_id}",user="user{j % 997}",account="acct{j % 37}",'
            f'partition="gpu",host="node{j:05d}",instance="node{j:05d}:9817",job="slurm-gpu"'
        )
        rows.setdefault("slurm_gpu_job_start_timestamp_seconds", []).append(
            f"{{{base}}} {started} {t_new}"
        )
        rows.setdefault("slurm_gpu_job_last_sample_timestamp_seconds", []).extend(
            (f"{{{base}}} {t_new - 60} {t_new - 60}", f"{{{base}}} {t_new} {t_new}")
        )
        for g in range(gpus):
            lb = f'{base},gpu_uuid="GPU-{j:06d}-{g:02d}",gpu_index="{g}"'
            duty = 0.0 if idle else 0.85
            for name, old, new in (
                (GPU_COUNTERS[0], sampled_old * duty, sampled_new * duty),
                (GPU_COUNTERS[1], sampled_old, sampled_new),
            ):
                rows.setdefault(name, []).append(f"{{{lb}}} {old} {t_old}")
                rows[name].append(f"{{{lb}}} {new} {t_new}")
            gauges = {
                "slurm_gpu_gpu_available": 1,
                "slurm_gpu_gpu_utilization_ratio": duty,
                "slurm_gpu_gpu_memory_used_bytes": 0 if idle else 30 << 30,
                "slurm_gpu_gpu_memory_total_bytes": 80 << 30,
                "slurm_gpu_gpu_power_watts": 60.0 if idle else 350.0,
            }
            if idle:
                gauges["slurm_gpu_gpu_idle_since_timestamp_seconds"] = started
            else:
                gauges["slurm_gpu_gpu_first_active_timestamp_seconds"] = started + 10
            for name, value in gauges.items():
                rows.setdefault(name, []).append(f"{{{lb}}} {value} {t_new}")
            rows["slurm_gpu_gpu_utilization_ratio"][-1:-1] = [
                f"{{{lb}}} {duty} {t_old}",
                f"{{{lb}}} {duty} {t_mid}",
            ]
    for name, lines in rows.items():
        family = name[: -len("_total")] if name.endswith("_total") else name
        kind = "counter" if name.endswith("_total") else "gauge"
        out.write(f"# TYPE {family} {kind}\n")
        # OpenMetrics wants a family's samples grouped, each series' in time order.
        if kind == "counter" or name in SEVERAL_SAMPLES:
            lines = sorted(lines, key=lambda line: line.rsplit(" ", 2)[0])
        for line in lines:
            out.write(f"{name}{line}\n")
    out.write("# EOF\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--idle-every", type=int, default=100)
    p.add_argument("--now", type=float, default=time.time())
    a = p.parse_args()
    write(sys.stdout, a.jobs, a.gpus, a.idle_every, a.now)


if __name__ == "__main__":
    main()
