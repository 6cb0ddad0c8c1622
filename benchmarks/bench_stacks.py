"""Stack sampling cost: one py-spy dump and one burst against real Python processes, as the
sampler runs them (``StackSampler.read_one``: the job's cgroup listed, /proc checked, py-spy
through setpriv as the job's uid when run as root, the output parsed and the pid checked
again), and the classifier alone.

Targets (``docs/stacks.md``): a burst of the default size (5 samples of one process) well
under one second of wall time, and the reader within ``max_core_pct`` (1 %) of one core at
the default interval (300 s); the budget enforces the latter whatever a burst costs.

Three target programs: a shallow loop (a stack of 3 frames), a deep one (60 frames) and a
process with 16 threads. CPU is the reader's (the children's rusage: py-spy and setpriv),
wall is the burst's. Prints a Markdown section for docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slurm_gpu.capture import stackread
from slurm_gpu.capture.stackclass import Frame, classify, load_table
from slurm_gpu.capture.stacksampler import StackOptions, StackSampler

PROGRAMS = {
    "shallow (3 frames)": """
def forward():
    return sum(i * i for i in range(1000))
print("ready", flush=True)
while True:
    forward()
""",
    "deep (60 frames)": """
import sys
def down(n):
    if n == 0:
        while True:
            sum(i * i for i in range(1000))
    down(n - 1)
print("ready", flush=True)
down(56)
""",
    "16 threads": """
import threading, time
def idle():
    while True:
        time.sleep(0.1)
for _ in range(15):
    threading.Thread(target=idle, daemon=True).start()
print("ready", flush=True)
while True:
    sum(i * i for i in range(1000))
""",
}

AS_ROOT = os.geteuid() == 0
JOB_UID = 65534 if AS_ROOT else os.getuid()
#: Longest wait for a target program to start or exit, or for py-spy to answer, in seconds.
WAIT_S = 60.0


def start(workdir: Path, name: str, text: str) -> subprocess.Popen[str]:
    script = workdir / f"bench_{abs(hash(name))}.py"
    script.write_text(text)
    script.chmod(0o644)
    argv = [sys.executable, str(script)]
    if AS_ROOT:
        argv = ["setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_UID}", "--clear-groups", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd="/tmp")
    assert proc.stdout is not None
    # Bounded: a target that does not start fails the benchmark instead of hanging it.
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = bool(sel.select(WAIT_S)) and proc.stdout.readline().strip() == "ready"
    if not ready:
        proc.kill()
        proc.wait(timeout=WAIT_S)
        raise RuntimeError(f"target {name} did not start within {WAIT_S:g} s")
    return proc


def fixed(path: str) -> Callable[[], str | None]:
    """The job's cgroup directory, as the host sampler would give it."""
    return lambda: path


def pause(seconds: float) -> bool:
    """The wait between two samples of a burst (no stop request)."""
    time.sleep(seconds)
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bursts", type=int, default=10, help="bursts per program")
    ap.add_argument("--samples", type=int, default=5, help="samples per burst (the default)")
    args = ap.parse_args()
    py_spy = stackread.default_reader_path()
    if not os.access(py_spy, os.X_OK):
        sys.exit(f"py-spy not found at {py_spy}: pip install slurm-gpu[stacks]")
    table = load_table()
    workdir = Path(tempfile.mkdtemp(prefix="bench-stacks-", dir="/tmp"))
    workdir.chmod(0o755)
    rows = []
    try:
        for name, text in PROGRAMS.items():
            proc = start(workdir, name, text)
            cg = workdir / f"cg-{proc.pid}"
            cg.mkdir()
            (cg / "cgroup.procs").write_text(f"{proc.pid}\n")
            opts = StackOptions(
                uid=JOB_UID,
                samples_per_burst=args.samples,
                sample_spacing_s=0.2,
                first_burst_s=0.0,
                py_spy=py_spy,
                setpriv=shutil.which("setpriv") or "/usr/bin/setpriv",
            )
            walls, cpus = [], []
            sampler = StackSampler(opts, table, fixed(str(cg)), started_s=time.time())
            for _ in range(args.bursts):
                cpu0 = sampler.cpu_s
                t0 = time.monotonic()
                sampler.burst(time.time(), None, pause, time.time)
                walls.append(time.monotonic() - t0)
                cpus.append(sampler.cpu_s - cpu0)
            proc.kill()
            proc.wait(timeout=WAIT_S)
            st = sampler.summary()
            per_dump_ms = 1e3 * statistics.median(cpus) / args.samples
            spacing = 0.2 * (args.samples - 1)
            rows.append(
                (
                    name,
                    st.samples,
                    per_dump_ms,
                    1e3 * statistics.median(cpus),
                    1e3 * (statistics.median(walls) - spacing),
                    1e3 * statistics.median(walls),
                    100 * statistics.median(cpus) / opts.interval_s,
                    ",".join(n for n in st.notes) or "-",
                )
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    frames = [Frame(f"/usr/lib/python3.11/mod{i}.py", f"f{i}") for i in range(60)]
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        classify(frames, True, table)
    classify_us = 1e6 * (time.perf_counter() - t0) / n

    with open("/proc/loadavg") as fh:
        load = fh.read().strip()
    version = subprocess.run(
        [py_spy, "--version"], capture_output=True, text=True, timeout=WAIT_S
    ).stdout.strip()
    print("## Stack sampling: cost per burst (`benchmarks/bench_stacks.py`)")
    print()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `nproc` {os.cpu_count()}, "
        f"`uname -r` {platform.release()}, /proc/loadavg `{load}`; py-spy "
        f"{version}"
        f"; {'root: through setpriv as uid ' + str(JOB_UID) if AS_ROOT else 'as the caller'}; "
        f"{args.bursts} bursts of {args.samples} samples, 0.2 s apart, per program "
        "(medians)."
    )
    print()
    print(
        "| program | samples | reader CPU per dump | reader CPU per burst | burst wall less "
        "spacing | burst wall | share of one core at 300 s | notes |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r[0]} | {r[1]} | {r[2]:.1f} ms | {r[3]:.1f} ms | {r[4]:.0f} ms | {r[5]:.0f} ms "
            f"| {r[6]:.4f} % | {r[7]} |"
        )
    print()
    print(
        f"Classifying one 60-frame stack that no rule matches (the worst case): "
        f"{classify_us:.0f} µs."
    )
    print()


if __name__ == "__main__":
    main()
