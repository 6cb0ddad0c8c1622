"""Sampler cost: CPU time per GPU-sample and resident memory, with 8 virtual GPUs.

Two measurements:

1. In-process: ``Sampler.read_once`` (virtual GPU read + host /proc scan + aggregate + spool
   line) repeated many times; CPU time (``time.process_time``) per GPU-sample, GPUs only, with
   the host read of a fake 4-process job (the /proc method, as under ``proctrack/linuxproc``),
   and while no job process exists yet (probing every reading); the checkpoint cost.
   And ``Sampler.run`` at the default cadence: a 10 s interval on a simulated clock, so that
   the live summary is rewritten at every reading, a checkpoint is taken at every 6th and the
   look for the job's slurmstepd made at every 6th, as on a node, with 50 ms of real sleep
   between readings (their CPU not counted): what the 0.05 s real process below does not
   show, since it rewrites the live summary every 200 readings.
2. A real ``python -I -m slurm_gpu.hooks.sampler`` process: the one-off CPU of a whole short life
   (start-up, one reading, seal, exit) measured apart from its steady-state CPU per
   GPU-sample (the CPU between two points in time, divided by the readings between them), and
   its VmHWM (peak resident memory).

Targets: <= 100 us CPU per GPU-sample; <= 40 MB resident.
Prints a Markdown section for docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_gpu.capture.hostsample import CGROUP_GRACE_READINGS, AutoHostSampler
from slurm_gpu.capture.livefile import LiveWriter, read_live, write_live
from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.capture.spool import JobSpool, read_record
from slurm_gpu.hooks.sampler import JobLifeBound
from slurm_gpu.telemetry.virtual import VirtualGpuSource
from slurm_gpu.telemetry.virtual_device import create_gpus

GPUS = 8
READINGS = 3000
PAUSED_READINGS = 400
#: Longest wait for a sampler process to write its first reading or to exit, in seconds.
WAIT_S = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def fake_job(job_id: str, processes: int = 4) -> subprocess.Popen[bytes]:
    """A process tree that the /proc method takes for the job's, as on a node with
    ``proctrack/linuxproc``: a shell and its children under a stand-in for the job's
    slurmstepd (a shell started through a link named ``slurmstepd``, so that its command name
    is, with slurmstepd's command line ``slurmstepd: [<id>.0]``, run by this benchmark's own
    account, which the /proc method trusts as it trusts root). Without it no process is the
    job's and the sampler keeps probing cgroups and /proc at every reading."""
    link_dir = tempfile.mkdtemp(prefix="bench-stepd-")
    stepd = os.path.join(link_dir, "slurmstepd")
    os.symlink("/bin/sh", stepd)
    inner = " ".join(["sleep 600 &"] * (processes - 1)) + " wait"
    argv = [f"slurmstepd: [{job_id}.0]", "-c", f"/bin/sh -c '{inner}' & wait"]
    try:
        return subprocess.Popen(argv, executable=stepd, start_new_session=True)
    finally:  # the command name is set at exec, which Popen has waited for
        os.unlink(stepd)
        os.rmdir(link_dir)


def in_process(
    tmp: Path, with_host: bool, job: bool = True, pause_s: float = 0.0
) -> tuple[float, float, float]:
    """(CPU us per GPU-sample for read_once, ms per checkpoint, share of readings that listed
    /proc). With the host: ``job`` runs a fake job of 4 processes (the /proc method is chosen
    at the first reading); without it the sampler keeps probing cgroups and /proc at every
    reading, as before a job's first process appears. ``pause_s``: sleep between readings,
    as the real sampler does (its caches go cold); the sleep's own CPU is not counted."""
    vdir = tmp / "vgpu"
    tmp.mkdir(parents=True, exist_ok=True)
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
    tree = fake_job(opts.job_id) if with_host and job else None
    try:
        time.sleep(0.2)  # let the shell fork its children
        sampler = Sampler(opts, lambda: VirtualGpuSource(vdir), host)
        sampler.open_spool()
        # Warm caches (membership of /proc entries, imports); where Slurm keeps a cgroup tree
        # on the machine, the /proc method is kept after CGROUP_GRACE_READINGS readings.
        for _ in range(CGROUP_GRACE_READINGS + 5):
            sampler.read_once()
        if tree is not None:
            assert host is not None and host.method == "proc" and host._chosen is not None
        readings = PAUSED_READINGS if pause_s else READINGS
        proc = host._proc if host is not None else None
        scans0 = proc.full_scans if proc is not None else 0
        cpu = 0.0
        for _ in range(readings):
            t0 = time.process_time()
            sampler.read_once()
            cpu += time.process_time() - t0
            if pause_s:
                time.sleep(pause_s)
        per_sample_us = cpu / (readings * GPUS) * 1e6
        scans = (proc.full_scans - scans0) / readings if proc is not None else 0.0
        t0 = time.process_time()
        for _ in range(20):
            sampler.checkpoint()
        checkpoint_ms = (time.process_time() - t0) / 20 * 1e3
        sampler.seal()
    finally:
        if tree is not None:
            os.killpg(tree.pid, signal.SIGKILL)
            tree.wait()
    return per_sample_us, checkpoint_ms, scans


class _SimClock:
    """Seconds since the epoch that the benchmark moves (the default cadence, faster)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def default_cadence(tmp: Path, readings: int, pause_s: float = 0.05) -> tuple[float, float]:
    """(CPU us per GPU-sample of ``Sampler.run`` between its waits, share of readings that
    listed /proc) at the default settings' cadence: a 10 s interval on a simulated clock, 60 s
    checkpoints, the job's life bound (``JobLifeBound``) as the sampler process has it."""
    vdir = tmp / "vgpu"
    tmp.mkdir(parents=True, exist_ok=True)
    infos = create_gpus(vdir, GPUS)
    job = "999999998"
    opts = SamplerOptions(
        job_id=job,
        hostname="bench",
        uid=None,
        gpu_uuids=tuple(i.uuid for i in infos),
        spool_dir=str(tmp / "spool-cadence"),
        interval_s=10.0,
        checkpoint_interval_s=60.0,
        idle_threshold_pct=1.0,
        timeline_points=512,
    )
    clock = _SimClock()
    auto = AutoHostSampler(job, None)
    tree = fake_job(job)
    warm = CGROUP_GRACE_READINGS + 10
    done = {"waits": 0, "cpu": 0.0, "scans": 0}
    mark = [0.0]

    def wait(timeout_s: float) -> bool:
        now = time.process_time()
        if done["waits"] >= warm:
            done["cpu"] += now - mark[0]
        elif done["waits"] == warm - 1 and auto._proc is not None:
            done["scans"] = auto._proc.full_scans
        done["waits"] += 1
        time.sleep(pause_s)
        clock.now += timeout_s
        mark[0] = time.process_time()
        return done["waits"] >= warm + readings

    try:
        time.sleep(0.2)
        host = JobLifeBound(auto, job, None, clock=clock)
        sampler = Sampler(opts, lambda: VirtualGpuSource(vdir), host, clock=clock)
        sampler.run(wait)
        assert auto._chosen is not None and auto.method == "proc"
        scans = auto._proc.full_scans - done["scans"] if auto._proc is not None else 0
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()
    return done["cpu"] / (readings * GPUS) * 1e6, scans / readings


def live_writes(tmp: Path, writes: int, rounds: int = 5) -> tuple[list[float], list[float]]:
    """CPU us per rewrite of an 8-GPU live summary, in place (``LiveWriter``, what the sampler
    does) and by a temporary file and a rename (``write_live``, what it did before), in
    alternating rounds of ``writes`` each: (in place, by rename), each sorted."""
    sampler = Sampler(
        SamplerOptions(
            job_id="999999997",
            hostname="bench",
            uid=None,
            gpu_uuids=tuple(i.uuid for i in create_gpus(tmp / "vgpu-live", GPUS)),
            spool_dir=str(tmp / "spool-live-bench"),
            interval_s=10.0,
            checkpoint_interval_s=60.0,
            idle_threshold_pct=1.0,
            timeline_points=512,
        ),
        lambda: VirtualGpuSource(tmp / "vgpu-live"),
        None,
    )
    sampler.open_spool()
    sampler.read_once()
    sampler.write_live()  # the summary the sampler writes, as it builds it
    summary = read_live(sampler.paths.live)
    writer = LiveWriter(sampler.paths, None)
    in_place: list[float] = []
    renamed: list[float] = []
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(writes):
            writer.write(summary)
        in_place.append((time.process_time() - t) / writes * 1e6)
        t = time.process_time()
        for _ in range(writes):
            write_live(sampler.paths, summary, None)
        renamed.append((time.process_time() - t) / writes * 1e6)
    writer.close()
    return sorted(in_place), sorted(renamed)


def _config(tmp: Path, vdir: Path, interval: float) -> Path:
    cfg = tmp / f"bench-{interval}.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp}/spool-real"\nlog_file = "{tmp}/bench.log"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\ninterval_s = {interval}\n'
        "checkpoint_interval_s = 60\n"
    )
    return cfg


def _cmd(cfg: Path, job: str, uuids: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "slurm_gpu.hooks.sampler", "--config", str(cfg), "--job-id", job]
    return [*cmd, "--gpus", ",".join(uuids), "--hostname", "bench"]


def _cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / CLK_TCK


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n") - 1  # minus the header
    except OSError:
        return 0


def startup_cpu(tmp: Path, uuids: list[str], vdir: Path, job: str) -> float:
    """CPU seconds of a whole sampler life with one reading: interpreter start-up, imports,
    configuration, opening the GPUs, the first reading, sealing and exit."""
    cfg = _config(tmp, vdir, 3600.0)
    jsonl = tmp / "spool-real" / job / "bench.jsonl"
    proc = subprocess.Popen(_cmd(cfg, job, uuids))
    deadline = time.monotonic() + WAIT_S
    while _lines(jsonl) < 1:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
            raise RuntimeError(f"the sampler wrote no reading within {WAIT_S:g} s")
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    # wait4 (for the child's CPU time), polled so that the wait is bounded.
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline + WAIT_S:
            proc.kill()
            proc.wait(timeout=WAIT_S)
            raise RuntimeError(f"the sampler did not exit within {WAIT_S:g} s of SIGTERM")
        time.sleep(0.005)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.returncode
    return usage.ru_utime + usage.ru_stime


def real_process(
    tmp: Path, seconds: float = 20.0, interval: float = 0.05, startups: int = 5
) -> dict[str, float]:
    vdir = tmp / "vgpu"
    uuids = [i.uuid for i in create_gpus(vdir, GPUS)]
    job = "424242"
    tree = fake_job(job)
    try:
        starts = sorted(startup_cpu(tmp, uuids, vdir, str(500000 + k)) for k in range(startups))
        cfg = _config(tmp, vdir, interval)
        jsonl = tmp / "spool-real" / job / "bench.jsonl"
        proc = subprocess.Popen(_cmd(cfg, job, uuids))
        time.sleep(min(3.0, seconds))  # past start-up
        cpu1, n1 = _cpu_s(proc.pid), _lines(jsonl)
        time.sleep(seconds)
        cpu2, n2 = _cpu_s(proc.pid), _lines(jsonl)
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        hwm_kb = int(next(line for line in status if line.startswith("VmHWM")).split()[1])
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT_S)
        record = read_record(JobSpool(f"{tmp}/spool-real", job, "bench").record)
        assert record.host is not None and record.host.method == "proc"
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()
    return {
        "hwm_mb": hwm_kb / 1024,
        "steady_us": (cpu2 - cpu1) / ((n2 - n1) * GPUS) * 1e6,
        "steady_readings": n2 - n1,
        "startup_s": statistics.median(starts),
        "startup_min_s": starts[0],
        "startup_max_s": starts[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="in-process runs of each kind")
    ap.add_argument(
        "--smoke", action="store_true", help="a few readings of each kind (runs, not a measure)"
    )
    args = ap.parse_args()
    global READINGS, PAUSED_READINGS  # the sizes of this run, read by in_process
    seconds, startups = 20.0, 5
    if args.smoke:
        args.repeat, READINGS, PAUSED_READINGS, seconds, startups = 1, 50, 10, 1.0, 1
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        gpu_only = sorted(in_process(tmp / f"g{k}", False)[0] for k in range(args.repeat))
        runs = [in_process(tmp / f"h{k}", True) for k in range(args.repeat)]
        with_host = sorted(r[0] for r in runs)
        checkpoint_ms = statistics.median(r[1] for r in runs)
        probing = sorted(in_process(tmp / f"p{k}", True, job=False)[0] for k in range(args.repeat))
        paused_runs = [in_process(tmp / f"s{k}", True, pause_s=0.05) for k in range(args.repeat)]
        paused = sorted(r[0] for r in paused_runs)
        paused_scans = statistics.median(r[2] for r in paused_runs)
        cadence_runs = [default_cadence(tmp / f"c{k}", PAUSED_READINGS) for k in range(args.repeat)]
        cadence = sorted(r[0] for r in cadence_runs)
        cadence_scans = statistics.median(r[1] for r in cadence_runs)
        real = real_process(tmp, seconds=seconds, startups=startups)
        live_in_place, live_renamed = live_writes(tmp, 50 if args.smoke else 2000)
    load_end = os.getloadavg()[0]
    nproc = len(os.listdir("/proc"))

    def us(v: list[float]) -> str:
        return f"{statistics.median(v):.0f} ({v[0]:.0f}–{v[-1]:.0f}) µs"

    job_samples = 30 * GPUS  # a 5-minute job at 10 s on 8 GPUs
    per_job_s = real["startup_s"] + job_samples * real["steady_us"] / 1e6
    print("## Sampler: CPU per GPU-sample and resident memory (`benchmarks/bench_sampler.py`)\n")
    print(
        f"{GPUS} virtual GPUs; {READINGS} readings per in-process run, {args.repeat} runs: "
        f"median (min–max); Python {platform.python_version()}; {nproc} /proc entries; "
        f"load average {load:.1f} at the start, {load_end:.1f} at the end.\n"
    )
    print("| measurement | result | target |")
    print("|---|---|---|")
    print(
        f"| steady state, GPUs only (read + aggregate + spool line) | {us(gpu_only)} | ≤ 100 µs |"
    )
    print(
        "| steady state, GPUs + host (/proc method, a 4-process job) | "
        f"{us(with_host)} | ≤ 100 µs |"
    )
    print(
        "| while no job process exists yet (cgroups and /proc probed every reading) | "
        f"{us(probing)} | — |"
    )
    print(
        f"| in process, GPUs + host, {PAUSED_READINGS} readings with 50 ms sleeps between them "
        f"(sleep not counted; /proc listed at {paused_scans:.0%} of readings) | "
        f"{us(paused)} | ≤ 100 µs |"
    )
    print(
        f"| in process at the default cadence ({PAUSED_READINGS} readings, 10 s interval on a "
        "simulated clock: live summary at every reading, checkpoint and slurmstepd look at "
        f"every 6th; 50 ms sleeps, not counted; /proc listed at {cadence_scans:.0%} of "
        f"readings) | {us(cadence)} | ≤ 100 µs |"
    )
    print(
        f"| real sampler process, steady state ({real['steady_readings']} readings at 0.05 s, "
        f"4-process job) | {real['steady_us']:.0f} µs | ≤ 100 µs |"
    )
    print(
        "| real sampler process, one-off start-up to exit (interpreter, imports, config, "
        f"first reading, seal), {startups} runs | {real['startup_s'] * 1e3:.0f} "
        f"({real['startup_min_s'] * 1e3:.0f}–{real['startup_max_s'] * 1e3:.0f}) ms CPU | — |"
    )
    print(
        f"| a 5-minute 8-GPU job at 10 s ({job_samples} GPU-samples): start-up + steady state "
        f"| {per_job_s * 1e3:.0f} ms CPU in all, {per_job_s / job_samples * 1e6:.0f} µs per "
        "GPU-sample | — |"
    )
    print(
        f"| live summary rewrite ({GPUS} GPUs, at every reading), in place (one pwrite, what "
        f"the sampler does), CPU per write | {us(live_in_place)} | — |"
    )
    print(
        "| the same summary by a temporary file and a rename (what the sampler did before), "
        f"alternating with the row above | {us(live_renamed)} | — |"
    )
    print(
        "| checkpoint (fsync + aggregates, every 60 s by default) | "
        f"{checkpoint_ms:.1f} ms CPU | — |"
    )
    print(
        "| real sampler process: peak resident memory (VmHWM) | "
        f"{real['hwm_mb']:.1f} MB | ≤ 40 MB |"
    )
    print()
    from results import target_line

    print(
        target_line(
            "sampler, real process, CPU per GPU-sample (virtual GPUs, readings 0.05 s apart)",
            f"{real['steady_us']:.0f} µs",
            "≤ 100 µs",
            real["steady_us"] <= 100,
        )
    )
    print(
        target_line(
            "sampler at the default 10 s cadence, CPU per GPU-sample (in process, simulated clock)",
            us(cadence),
            "≤ 100 µs",
            statistics.median(cadence) <= 100,
        )
    )
    print(
        target_line(
            "sampler, real process, peak resident memory",
            f"{real['hwm_mb']:.1f} MB",
            "≤ 40 MB",
            real["hwm_mb"] <= 40,
        )
    )


if __name__ == "__main__":
    main()
