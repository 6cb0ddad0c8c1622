"""Latency from a job's end to its stored job, records shipped through PostgreSQL on the
three-node version lab (issue 12; docs/performance.md, "Job end to stored job on the lab").

What runs, as a site would run it: on each compute host a loop ``slurm-gpu --config
ship-pg.toml ship; sleep SHIP_S`` (a node timer) inside the host's namespaces, and on the
controller ``slurm-gpu --config collect-pg.toml collect --once; sleep COLLECT_S`` (a short
collector timer); records go node -> PostgreSQL inbox -> store, nothing shared (share/testlab/pg).
JOBS short GPU jobs are submitted (every fourth on two nodes); for each, the latency is the
store's ``jobs.collected_at_s`` minus sacct's ``End`` (whole seconds), in seconds.

    share/testlab/start 24.11 && share/testlab/pg start 24.11
    PYTHONPATH=. .venv/bin/python benchmarks/bench_lab_latency.py [--version 24.11]
        [--jobs 24] [--ship-s 3] [--collect-s 2]

Needs root and the lab running; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lab"))

from labtools import PATH, PROJECT_BIN, Lab  # noqa: E402

from slurm_gpu.store import Store  # noqa: E402

SHIP_CONFIG = "/etc/slurm-gpu/ship-pg.toml"
COLLECT_CONFIG = "/etc/slurm-gpu/collect-pg.toml"


def _loop(lab: Lab, command: str, every_s: float, node: str | None) -> subprocess.Popen[bytes]:
    """``command; sleep every_s`` for ever, in the root (on ``node``: in its namespaces), in a
    process group of its own."""
    chroot = shutil.which("chroot")
    assert chroot
    argv = [chroot, str(lab.root), "/usr/bin/env", "-i", f"PATH={PATH}", "LANG=C.UTF-8"]
    argv += ["/bin/sh", "-c", f"while :; do {command} >/dev/null 2>&1; sleep {every_s}; done"]
    if node is not None:
        nsenter = shutil.which("nsenter")
        assert nsenter
        argv = [nsenter, "-t", str(lab.slurmd_pid(node)), "-n", "-u", "-m", *argv]
    return subprocess.Popen(argv, cwd="/", start_new_session=True)


def _end_epoch(lab: Lab, job_id: str) -> int:
    proc = lab.run(
        ["env", "SLURM_TIME_FORMAT=%s", "sacct", "-n", "-X", "-P", "-j", job_id, "-o", "End"]
    )
    return int(proc.stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="24.11")
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--ship-s", type=float, default=3.0)
    ap.add_argument("--collect-s", type=float, default=2.0)
    ap.add_argument("--duration-s", type=int, default=6, help="each job's run time")
    args = ap.parse_args()

    lab = Lab(args.version)
    url = tomllib.loads((lab.root / COLLECT_CONFIG.lstrip("/")).read_text())["store"]["url"]
    bin_ = f"{PROJECT_BIN}/slurm-gpu"
    loops = [
        _loop(lab, f"{bin_} --config {SHIP_CONFIG} ship", args.ship_s, node) for node in lab.nodes
    ]
    collect = f"{bin_} --config {COLLECT_CONFIG} collect --once"
    loops.append(_loop(lab, collect, args.collect_s, None))
    try:
        jobs = []
        for i in range(args.jobs):
            nodes = 2 if i % 4 == 3 else 1
            jobs.append(
                lab.submit(
                    "#!/bin/bash\n"
                    f"#SBATCH --job-name=lat -N{nodes} --ntasks-per-node=1 --cpus-per-task=1\n"
                    "#SBATCH --gres=gpu:2 --mem=200M --time=00:05:00\n"
                    f"srun {PROJECT_BIN}/python -m slurm_gpu.demo healthy "
                    f"--duration {args.duration_s}\n"
                )
            )
        collected: dict[str, float] = {}
        deadline = time.monotonic() + 600
        with Store.open(url, migrate=False) as store:
            while len(collected) < len(jobs) and time.monotonic() < deadline:
                for job_id in jobs:
                    if job_id not in collected:
                        got = store.get_job(job_id)
                        if got is not None and not got.missing_hosts:
                            collected[job_id] = got.collected_at_s
                time.sleep(1)
    finally:
        for proc in loops:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    missing = sorted(set(jobs) - set(collected))
    latencies = sorted(collected[j] - _end_epoch(lab, j) for j in collected)
    p95 = latencies[max(0, round(0.95 * len(latencies)) - 1)] if latencies else None
    print(
        json.dumps(
            {
                "version": args.version,
                "jobs": len(jobs),
                "stored": len(collected),
                "not_stored": missing,
                "ship_every_s": args.ship_s,
                "collect_every_s": args.collect_s,
                "latency_median_s": round(statistics.median(latencies), 2) if latencies else None,
                "latency_p95_s": None if p95 is None else round(p95, 2),
                "latency_max_s": round(latencies[-1], 2) if latencies else None,
                "latency_min_s": round(latencies[0], 2) if latencies else None,
            }
        )
    )


if __name__ == "__main__":
    main()
