"""Epilog cost: wall time to stop the sampler and have a sealed record, for a 5-minute and a
7-day job on 8 GPUs at a 10 s interval.

For each job length the aggregates are built by feeding ``NodeAggregator`` the readings
(30 or 60,480), checkpointed, and a real sampler process is started from that checkpoint (it
restores the aggregates, then samples 8 virtual GPUs like any sampler). Then:

* normal path: the epilog's ``stop_sampler`` (SIGTERM, wait) until the sampler has sealed the
  record from memory; and the whole ``python -m slurm_gpu.hooks epilog`` process (interpreter
  start-up and configuration included);
* recovery path: the sampler is SIGKILLed, and ``recover_record`` seals from the checkpoint
  plus a spool tail of one checkpoint interval (6 lines at 60 s / 10 s).

Target: <= 0.3 s for both job lengths. Prints a Markdown section for docs/performance.md.
``--smoke`` runs one round with a 600-reading "long" job (a check that it runs, not a
measure). Every wait is bounded (``WAIT_S``): a sampler that does not start or does not stop
fails the benchmark instead of hanging it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.spool import (
    JobSpool,
    SpoolHeader,
    SpoolWriter,
    read_record,
    write_pidfile,
    write_state,
)
from slurm_gpu.config import load_settings
from slurm_gpu.hooks.epilog import recover_record, stop_sampler
from slurm_gpu.hooks.sampler import CMDLINE_MARKER
from slurm_gpu.records import GpuProcess, GpuSample, HostSample
from slurm_gpu.telemetry.virtual_device import create_gpus

GPUS = 8
INTERVAL_S = 10.0
HOST = "bench"
#: Longest wait for a sampler to start, to stop, or for an epilog process, in seconds.
WAIT_S = 60.0

# The first line names the sampler module: the epilog only signals a process whose command
# line holds ``CMDLINE_MARKER`` (and ``--job-id ID``), as a real sampler's does.
SERVE = (
    f"# {CMDLINE_MARKER} stand-in\n"
    + """
import os
import sys
from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.sampler import Sampler, SamplerOptions, _signal_waiter
from slurm_gpu.capture.spool import read_state
from slurm_gpu.telemetry.virtual import VirtualGpuSource
wait = _signal_waiter()
spool, vdir, _flag, job, uuids = sys.argv[1:6]
opts = SamplerOptions(job, "bench", None, tuple(uuids.split(",")), spool, 0.5, 3600, 1.0, 512)
s = Sampler(opts, lambda: VirtualGpuSource(vdir), None)
state, offset, notes = read_state(s.paths.state)
s.agg = NodeAggregator.from_state(state)
s.open_spool()
print("ready", flush=True)
status = 0 if s.run(wait) else 1
os._exit(status)  # as the real sampler: no interpreter teardown once sealed
"""
)


def feed(agg: NodeAggregator, uuids: list[str], start: float, n: int) -> None:
    for i in range(n):
        t = start + INTERVAL_S * i
        agg.add(
            t,
            [
                GpuSample(
                    uuid=u,
                    time_s=t,
                    utilization_pct=float((i * 7 + k) % 100),
                    utilization_samples_pct=(50.0, 60.0, 70.0),
                    memory_used_bytes=(i % 1000) * 2**24,
                    power_w=100.0 + (i % 300),
                    energy_mj=i * 1_000_000,
                    sm_clock_mhz=1980,
                    throttle_reasons=4 if i % 5 == 0 else 0,
                    temperature_c=60.0,
                    nvlink_tx_bytes=i * 1000,
                    nvlink_rx_bytes=i * 1000,
                    ecc_corrected_total=0,
                    processes=(GpuProcess(pid=1000 + k, used_memory_bytes=2**30),),
                    sm_active_pct=40.0,
                    tensor_active_pct=10.0,
                )
                for k, u in enumerate(uuids)
            ],
            HostSample(t, float(i * 8), 2**33, i, i, 9, "proc"),
        )


def prepare(tmp: Path, job: str, readings: int, uuids: list[str]) -> tuple[JobSpool, float]:
    paths = JobSpool(str(tmp / "spool"), job, HOST)
    paths.create_dir()
    start = time.time() - readings * INTERVAL_S
    agg = NodeAggregator(
        job_id=job,
        hostname=HOST,
        uid=None,
        interval_s=INTERVAL_S,
        source="virtual",
        gpus=[g.info for g in NodeAggregator.from_state(_infos_state(tmp, uuids)).gpus],
        started_s=start,
    )
    t0 = time.process_time()
    feed(agg, uuids, start, readings)
    build_s = time.process_time() - t0
    header = SpoolHeader(job, HOST, None, INTERVAL_S, "virtual", agg.gpu_infos, start)
    writer = SpoolWriter(paths.jsonl, header)
    offset = writer.sync()
    write_state(paths.state, agg.state(), offset, [])
    # The spool tail written after the checkpoint: one checkpoint interval of readings.
    tail = NodeAggregator.from_state(agg.state())
    for i in range(6):
        t = start + INTERVAL_S * (readings + i)
        gpus = [GpuSample(uuid=u, time_s=t, utilization_pct=50.0) for u in uuids]
        writer.append(t, gpus, None)
        tail.add(t, gpus, None)
    writer.close()
    return paths, build_s


def _infos_state(tmp: Path, uuids: list[str]) -> dict[str, object]:
    from slurm_gpu.telemetry.virtual import VirtualGpuSource

    infos = [i for i in VirtualGpuSource(tmp / "vgpu").list_gpus() if i.uuid in uuids]
    agg = NodeAggregator(
        job_id="1", hostname=HOST, uid=None, interval_s=1, source="v", gpus=infos, started_s=0
    )
    return agg.state()


def start_sampler(tmp: Path, paths: JobSpool, uuids: list[str]) -> subprocess.Popen[str]:
    # "--job-id ID" in the command line, as the epilog's pid check wants from a real sampler.
    args = [str(tmp / "spool"), str(tmp / "vgpu"), "--job-id", paths.job_id, ",".join(uuids)]
    proc = subprocess.Popen([sys.executable, "-c", SERVE, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = bool(sel.select(WAIT_S)) and proc.stdout.readline().strip() == "ready"
    if not ready:
        _kill(proc)
        raise RuntimeError(f"the stand-in sampler did not start within {WAIT_S:g} s")
    write_pidfile(paths.pid, proc.pid)
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    """Make sure a stand-in sampler is gone (a failed round must not leave it running)."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=WAIT_S)


def one_round(
    tmp: Path, cfg: Path, uuids: list[str], label: str, readings: int, k: int
) -> dict[str, float]:
    settings = load_settings(str(cfg))
    # Normal path, timed inside the epilog's own function.
    job = str(100_000 * k + 1000 + readings)
    paths, _build_s = prepare(tmp, job, readings, uuids)
    proc = start_sampler(tmp, paths, uuids)
    try:
        t0 = time.perf_counter()
        outcome = stop_sampler(paths, 3.0)
        stop_s = time.perf_counter() - t0
        proc.wait(timeout=WAIT_S)
    finally:
        _kill(proc)
    record = read_record(paths.record)
    assert outcome == "stopped" and record.complete, outcome
    assert record.gpus[0].samples > readings
    record_kb = os.path.getsize(paths.record) / 1024
    # The whole epilog process, on the same kind of sampler.
    job2 = str(100_000 * k + 2000 + readings)
    paths2, _ = prepare(tmp, job2, readings, uuids)
    proc2 = start_sampler(tmp, paths2, uuids)
    env = {
        "SLURM_GPU_CONFIG": str(cfg),
        "SLURM_JOB_ID": job2,
        "SLURMD_NODENAME": HOST,
        "PATH": "/usr/bin:/bin",
        # Passed through so that a checkout given by PYTHONPATH measures its own epilog.
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    }
    try:
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "slurm_gpu.hooks", "epilog"], env=env, check=True, timeout=WAIT_S
        )
        whole_s = time.perf_counter() - t0
        proc2.wait(timeout=WAIT_S)
    finally:
        _kill(proc2)
    assert read_record(paths2.record).complete
    assert read_record(paths2.record).gpus[0].samples > readings
    # Recovery path: sampler dead, seal from checkpoint + tail.
    job3 = str(100_000 * k + 3000 + readings)
    paths3, _ = prepare(tmp, job3, readings, uuids)
    t0 = time.perf_counter()
    recover_record(paths3, settings, "sampler_killed")
    recover_s = time.perf_counter() - t0
    rec3 = read_record(paths3.record)
    assert not rec3.complete and rec3.gpus[0].samples == readings + 6
    return {
        "stop": stop_s,
        "whole": whole_s,
        "recover": recover_s,
        "record_kb": record_kb,
        "state_kb": os.path.getsize(paths3.state) / 1024,
        "load": os.getloadavg()[0],
    }


def _ms(values: list[float]) -> str:
    v = sorted(values)
    return f"{statistics.median(v) * 1e3:.0f} ({v[0] * 1e3:.0f}–{v[-1] * 1e3:.0f}) ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds per job length")
    ap.add_argument("--smoke", action="store_true", help="one round, a 600-reading long job")
    args = ap.parse_args()
    lengths = (("5-minute", 30), ("7-day", 60_480))
    if args.smoke:
        args.repeat = 1
        lengths = (("5-minute", 30), ("100-minute (smoke)", 600))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uuids = [i.uuid for i in create_gpus(tmp / "vgpu", GPUS)]
        cfg = tmp / "bench.toml"
        cfg.write_text(
            f'[paths]\nspool_dir = "{tmp}/spool"\nlog_file = "{tmp}/bench.log"\n'
            f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{tmp}/vgpu"\n'
        )
        for label, readings in lengths:
            runs = [one_round(tmp, cfg, uuids, label, readings, k) for k in range(args.repeat)]
            rows.append((label, readings, runs))
    print("## Epilog: stop and seal (`benchmarks/bench_epilog.py`)\n")
    print(
        f"{GPUS} virtual GPUs, 10 s interval, {args.repeat} rounds per job length: median "
        "(min–max). Aggregates built by feeding every reading; "
        '"stop + seal" is SIGTERM until the sampler has sealed from memory and exited; '
        '"epilog process" is the whole `python -m slurm_gpu.hooks epilog` (interpreter '
        'start-up and configuration included); "recovery" seals from the checkpoint plus 6 '
        "spool lines.\n"
    )
    print(
        "| job | readings | stop + seal | epilog process | recovery from checkpoint | "
        "record | checkpoint | load avg (1 min) | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, n, runs in rows:
        loads = [r["load"] for r in runs]
        print(
            f"| {label} | {n:,} | {_ms([r['stop'] for r in runs])} | "
            f"{_ms([r['whole'] for r in runs])} | {_ms([r['recover'] for r in runs])} | "
            f"{runs[0]['record_kb']:.0f} KiB | {runs[0]['state_kb']:.0f} KiB | "
            f"{min(loads):.1f}–{max(loads):.1f} | ≤ 300 ms |"
        )
    print()
    from results import target_line

    for label, _, runs in rows:
        whole = statistics.median(r["whole"] for r in runs)
        print(
            target_line(
                f"epilog, {label} job of {GPUS} GPUs: the whole epilog process (median)",
                f"{whole * 1e3:.0f} ms",
                "≤ 300 ms",
                whole <= 0.3,
            )
        )


if __name__ == "__main__":
    main()
