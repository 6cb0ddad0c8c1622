"""Sampler cost: CPU time per GPU-sample and resident memory, with 8 virtual GPUs.

Two measurements:

1. In-process: ``Sampler.read_once`` (virtual GPU read + host /proc scan + aggregate + spool
   line) repeated many times; CPU time (``time.process_time``) per GPU-sample, with and without
   the host scan, and the checkpoint cost.
2. A real ``python -m slurm_gpu.sampler`` process at a short interval: its VmHWM (peak resident
   memory) and its CPU time per GPU-sample, start-up included.

Targets: <= 100 us CPU per GPU-sample; <= 40 MB resident.
Prints a Markdown section for docs/performance.md.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_gpu.hostsample import AutoHostSampler
from slurm_gpu.sampler import Sampler, SamplerOptions
from slurm_gpu.spool import JobSpool, read_record
from slurm_gpu.telemetry.virtual import VirtualGpuSource, create_gpus

GPUS = 8
READINGS = 3000
CLK_TCK = os.sysconf("SC_CLK_TCK")


def in_process(tmp: Path, with_host: bool) -> tuple[float, float]:
    """(CPU us per GPU-sample for read_once, ms per checkpoint)."""
    vdir = tmp / "vgpu"
    infos = create_gpus(vdir, GPUS)
    opts = SamplerOptions(
        job_id="999999999",
        hostname="bench",
        uid=None,
        gpu_uuids=tuple(i.uuid for i in infos),
        spool_dir=str(tmp / f"spool-{with_host}"),
        interval_s=10.0,
        checkpoint_interval_s=60.0,
        idle_threshold_pct=1.0,
        timeline_points=512,
    )
    host = AutoHostSampler(opts.job_id, None) if with_host else None
    sampler = Sampler(opts, lambda: VirtualGpuSource(vdir), host)
    sampler.open_spool()
    for _ in range(20):  # warm caches (membership of /proc entries, imports)
        sampler.read_once()
    t0 = time.process_time()
    for _ in range(READINGS):
        sampler.read_once()
    per_sample_us = (time.process_time() - t0) / (READINGS * GPUS) * 1e6
    t0 = time.process_time()
    for _ in range(20):
        sampler.checkpoint()
    checkpoint_ms = (time.process_time() - t0) / 20 * 1e3
    sampler.seal()
    return per_sample_us, checkpoint_ms


def real_process(tmp: Path, seconds: float = 30.0, interval: float = 0.05) -> dict[str, float]:
    vdir = tmp / "vgpu"
    infos = create_gpus(vdir, GPUS)
    cfg = tmp / "bench.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp}/spool-real"\nlog_file = "{tmp}/bench.log"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\ninterval_s = {interval}\n'
        "checkpoint_interval_s = 60\n"
    )
    cmd = [sys.executable, "-m", "slurm_gpu.sampler", "--config", str(cfg), "--job-id", "424242"]
    cmd += ["--gpus", ",".join(i.uuid for i in infos), "--hostname", "bench"]
    proc = subprocess.Popen(cmd)
    time.sleep(seconds)
    status = Path(f"/proc/{proc.pid}/status").read_text()
    hwm_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    rss_kb = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
    stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(stat[11]) + int(stat[12])) / CLK_TCK
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    record = read_record(JobSpool(f"{tmp}/spool-real", "424242", "bench").record)
    readings = record.gpus[0].samples
    return {
        "hwm_mb": hwm_kb / 1024,
        "rss_mb": rss_kb / 1024,
        "cpu_s": cpu_s,
        "readings": readings,
        "per_sample_us": cpu_s / (readings * GPUS) * 1e6,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        gpu_only, _ = in_process(tmp, with_host=False)
        with_host, checkpoint_ms = in_process(tmp, with_host=True)
        real = real_process(tmp)
    nproc = len(os.listdir("/proc"))
    print("## Sampler: CPU per GPU-sample and resident memory (`benchmarks/bench_sampler.py`)\n")
    print(f"{GPUS} virtual GPUs; {READINGS} readings in process; {platform.python_version()}.\n")
    print("| measurement | result | target |")
    print("|---|---|---|")
    print(
        "| CPU per GPU-sample, GPUs only (read + aggregate + spool line) | "
        f"{gpu_only:.0f} µs | ≤ 100 µs |"
    )
    print(
        f"| CPU per GPU-sample, with the host /proc scan ({nproc} /proc entries) | "
        f"{with_host:.0f} µs | ≤ 100 µs |"
    )
    print(
        "| checkpoint (fsync + aggregates, every 60 s by default) | "
        f"{checkpoint_ms:.1f} ms CPU | — |"
    )
    print(
        f"| real sampler process, {real['readings']:.0f} readings at 0.05 s: CPU per GPU-sample "
        f"incl. start-up | {real['per_sample_us']:.0f} µs | ≤ 100 µs |"
    )
    print(
        "| real sampler process: peak resident memory (VmHWM) | "
        f"{real['hwm_mb']:.1f} MB | ≤ 40 MB |"
    )
    print()


if __name__ == "__main__":
    main()
