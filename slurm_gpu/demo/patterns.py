"""The demo patterns: per-tick GPU activity that reproduces each cause of low utilization.

A pattern says, for each GPU of the job, how much memory the training process holds and, tick
by tick, the share of time a kernel ran (duty), how many SMs and tensor cores were busy while it
did, and what moved over NVLink. ``run_pattern`` turns that into ``VirtualGpuDevice`` calls.
The ``dataloader`` pattern is different: it does real CPU work in worker processes and only
runs a GPU burst when a batch is ready, so its GPU duty cycle comes out of the CPU throughput.
``task-farm`` is one task of a farm (one ``srun`` step on one core and one GPU): it keeps its
core busy the whole time and alternates GPU work with GPU-idle post-processing.
``ranks-share-gpu`` starts several rank processes that all run their kernels on the first GPU
while each other GPU holds one rank's small context and runs nothing.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_gpu.errors import UsageError
from slurm_gpu.telemetry.virtual_device import VirtualGpuDevice

GIB = 1024**3


class Clock(Protocol):
    """Time as the workload sees it; tests pass a fake that advances instantly."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


@dataclass(frozen=True, slots=True)
class DemoParams:
    """Knobs shared by every pattern. ``None`` means the pattern's own default."""

    duration_s: float = 45.0
    tick_s: float = 0.2
    util: float | None = None
    """Duty cycle (0-1) of the busy GPUs."""
    noise: float = 0.03
    """Standard deviation of the per-tick duty jitter."""
    memory_frac: float | None = None
    """Share of GPU memory the process holds."""
    workers: int | None = None
    """dataloader: CPU worker processes (default: the CPUs this job may use)."""
    batch_cpu_s: float = 0.5
    """dataloader: CPU seconds to prepare one batch."""
    gpu_burst_s: float = 0.05
    """dataloader: GPU seconds per batch."""
    active_frac: float = 0.4
    """idle-tail: share of the duration spent working before sitting idle."""
    fail_oom: bool = False
    """near-oom: end with an out-of-memory failure (exit 1)."""
    phase_busy_s: float = 6.0
    """task-farm: seconds of GPU work before each post-processing phase."""
    phase_idle_s: float = 5.0
    """task-farm: seconds of post-processing on the CPU (GPU idle) after each work phase."""
    ranks: int | None = None
    """ranks-share-gpu: rank processes (default: one per GPU of the job)."""
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Activity:
    """What one GPU did during one tick."""

    duty: float
    sm_active: float = 0.8
    tensor_active: float = 0.0
    nvlink_bytes_per_s: float = 0.0
    pcie_bytes_per_s: float = 0.0
    power_of_limit: float | None = None
    """Board power as a share (0-1) of the GPU's power limit; ``None``: the device's model
    (which follows duty and SM activity)."""


#: (progress 0-1, GPU position in the job, number of GPUs, params, rng) -> activity, or None for
#: a GPU the job never touches.
Plan = Callable[[float, int, int, DemoParams, random.Random], Activity | None]


@dataclass(frozen=True, slots=True)
class Pattern:
    name: str
    summary: str
    cause: str
    """The cause (of the seven) this pattern reproduces."""
    min_gpus: int
    memory_frac: tuple[float, float]
    """Range the held memory share is drawn from (``DemoParams.memory_frac`` overrides)."""
    plan: Plan
    uses_gpu: Callable[[int], bool] = lambda i: True


def _jitter(level: float, p: DemoParams, rng: random.Random) -> float:
    return min(1.0, max(0.0, rng.gauss(level, p.noise)))


def _healthy(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    level = p.util if p.util is not None else 0.94
    return Activity(_jitter(level, p, rng), 0.8, 0.55, 2e9 if n > 1 else 0.0, 4e9)


def _idle_gpu(
    progress: float, i: int, n: int, p: DemoParams, rng: random.Random
) -> Activity | None:
    return _healthy(progress, i, 1, p, rng) if i == 0 else None


def _small_batch(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    level = p.util if p.util is not None else 0.25
    # Small kernels leave most SMs empty and barely use the tensor cores.
    return Activity(_jitter(level, p, rng), 0.3, 0.08, 0.0, 1e9)


def _near_oom(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    level = p.util if p.util is not None else 0.9
    return Activity(_jitter(level, p, rng), 0.75, 0.5, 0.0, 3e9)


def _imbalance(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    if i == 0:
        level = p.util if p.util is not None else 0.92
        return Activity(_jitter(level, p, rng), 0.8, 0.5, 5e9, 2e9)
    # The other ranks wait in all-reduce: short kernels, NVLink busy while the SMs idle.
    duty = _jitter(0.2, p, rng)
    return Activity(duty, 0.5, 0.2, 40e9 * (1.0 - duty), 0.5e9)


def _idle_tail(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    if progress < p.active_frac:
        return _healthy(progress, i, n, p, rng)
    return Activity(0.0)


def _busy_empty(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    level = p.util if p.util is not None else 0.97
    # Kernels run nearly all the time but keep few SMs busy and move little memory: the board
    # draws about a quarter of its limit (a real A100 at 99 % duty drew 109 W of 400 W).
    return Activity(_jitter(level, p, rng), 0.1, 0.02, 0.0, 0.2e9, rng.uniform(0.24, 0.3))


def _task_farm(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    level = p.util if p.util is not None else 0.68
    return Activity(_jitter(level, p, rng), 0.7, 0.4, 0.0, 2e9)


def _ranks_share(progress: float, i: int, n: int, p: DemoParams, rng: random.Random) -> Activity:
    if i == 0:
        level = p.util if p.util is not None else 0.99
        return Activity(_jitter(level, p, rng), 0.85, 0.5, 0.0, 2e9)
    return Activity(0.0)  # a context and nothing else


def _first_only(i: int) -> bool:
    return i == 0


PATTERNS: dict[str, Pattern] = {
    p.name: p
    for p in (
        Pattern("healthy", "busy GPUs (90-98 % duty), good memory use", "none", 1, (0.7, 0.85),
                _healthy),
        Pattern("idle-gpu", "2+ GPUs allocated, only the first used; the others never get a "
                "process", "6 allocation", 2, (0.6, 0.75), _idle_gpu, _first_only),
        Pattern("dataloader", "CPU workers prepare batches; the GPU waits, then bursts",
                "2 data loading", 1, (0.3, 0.4), _healthy),
        Pattern("small-batch", "steady 20-30 % duty, little memory", "1 parallelism", 1,
                (0.08, 0.12), _small_batch),
        Pattern("near-oom", "memory at 97-99 % of capacity", "4 memory", 1, (0.975, 0.99),
                _near_oom),
        Pattern("imbalance", "one GPU busy, the others wait on communication (NVLink busy)",
                "5 communication", 2, (0.55, 0.65), _imbalance),
        Pattern("overtime", "healthy, but ends in a small fraction of its --time",
                "6 allocation", 1, (0.7, 0.85), _healthy),
        Pattern("idle-tail", "works, then holds the GPU idle until the end", "6 allocation",
                1, (0.6, 0.7), _idle_tail),
        Pattern("task-farm", "one task of a farm (srun step, 1 core, 1 GPU): GPU work, then "
                "GPU-idle post-processing, again and again, its core busy throughout; exits "
                "--exit-code", "6 allocation (idle phases), 2 data loading", 1, (0.5, 0.6),
                _task_farm),
        Pattern("ranks-share-gpu", "several ranks all run on the first GPU; the other GPUs "
                "hold one rank's small context each and run nothing", "6 allocation (binding)",
                2, (0.6, 0.7), _ranks_share),
        Pattern("busy-empty", "97 % duty at about a quarter of the power limit, few SMs busy, "
                "little memory", "1 parallelism", 1, (0.05, 0.1), _busy_empty),
    )
}  # fmt: skip


class OutOfMemory(Exception):
    """The near-oom pattern's simulated CUDA out-of-memory failure."""


def run_pattern(
    name: str,
    devices: Sequence[VirtualGpuDevice],
    params: DemoParams,
    clock: Clock | None = None,
    log: Callable[[str], None] = lambda line: None,
    spin: Callable[[float], None] | None = None,
) -> None:
    """Drive ``devices`` with pattern ``name`` for ``params.duration_s``.

    ``spin(seconds)`` passes time with this process's core busy (task-farm; default: real CPU
    work when the clock is real, else ``clock.sleep``).
    Raises ``UsageError`` for an unknown pattern or too few GPUs, and ``OutOfMemory`` when
    near-oom is asked to fail. Processes are always detached at the end, as the driver frees a
    dead process's memory.
    """
    pattern = PATTERNS.get(name)
    if pattern is None:
        raise UsageError(f"unknown demo pattern {name!r}", hint=f"one of: {', '.join(PATTERNS)}")
    if len(devices) < pattern.min_gpus:
        raise UsageError(
            f"pattern {name} needs at least {pattern.min_gpus} GPUs, the job has {len(devices)}",
            hint=f"submit with --gres=gpu:{pattern.min_gpus}",
        )
    if spin is None:
        spin = spin_cpu if clock is None else clock.sleep
    clock = clock or RealClock()
    rng = random.Random(params.seed)
    if name == "ranks-share-gpu":
        _run_ranks(pattern, devices, params, clock, rng, log)
        return
    used = [d for i, d in enumerate(devices) if pattern.uses_gpu(i)]
    lo, hi = pattern.memory_frac
    for dev in used:
        frac = params.memory_frac if params.memory_frac is not None else rng.uniform(lo, hi)
        dev.attach(memory_bytes=int(frac * dev.memory_total_bytes))
    try:
        if name == "dataloader":
            _run_dataloader(used, params, clock, log)
        elif name == "task-farm":
            _run_task(pattern, used, params, clock, rng, log, spin)
        else:
            _run_ticks(pattern, devices, params, clock, rng, log)
    finally:
        for dev in used:
            dev.detach()


def _run_ticks(
    pattern: Pattern,
    devices: Sequence[VirtualGpuDevice],
    params: DemoParams,
    clock: Clock,
    rng: random.Random,
    log: Callable[[str], None],
) -> None:
    start = clock.now()
    step = 0
    lo, hi = pattern.memory_frac
    while (elapsed := clock.now() - start) < params.duration_s:
        clock.sleep(min(params.tick_s, params.duration_s - elapsed))
        progress = (clock.now() - start) / params.duration_s
        for i, dev in enumerate(devices):
            act = pattern.plan(progress, i, len(devices), params, rng)
            if act is None:
                continue
            if pattern.name == "near-oom" and params.memory_frac is None:
                # The caching allocator's footprint moves a little from step to step.
                dev.set_memory(int(rng.uniform(lo, hi) * dev.memory_total_bytes))
            dev.tick(
                act.duty,
                sm_active=act.sm_active,
                tensor_active=act.tensor_active,
                nvlink_tx_bytes_per_s=act.nvlink_bytes_per_s / 2,
                nvlink_rx_bytes_per_s=act.nvlink_bytes_per_s / 2,
                pcie_tx_bytes_per_s=act.pcie_bytes_per_s / 4,
                pcie_rx_bytes_per_s=act.pcie_bytes_per_s,
                power_w=_power(dev, act),
            )
        step += 1
        if step % 50 == 0:
            log(f"step {step} elapsed {clock.now() - start:.1f}s")
    if pattern.name == "near-oom" and params.fail_oom:
        for dev in devices:
            dev.set_memory(dev.memory_total_bytes)
        raise OutOfMemory(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            f"{devices[0].memory_total_bytes / GIB:.2f} GiB of which 0 bytes is free."
        )


def _power(dev: VirtualGpuDevice, act: Activity) -> float | None:
    """The board power, watts, an activity asks for (``None``: the device's model)."""
    limit = dev.info.power_limit_w
    if act.power_of_limit is None or not limit:
        return None
    return act.power_of_limit * limit


def _tick(dev: VirtualGpuDevice, act: Activity) -> None:
    dev.tick(
        act.duty,
        sm_active=act.sm_active,
        tensor_active=act.tensor_active,
        pcie_tx_bytes_per_s=act.pcie_bytes_per_s / 4,
        pcie_rx_bytes_per_s=act.pcie_bytes_per_s,
        power_w=_power(dev, act),
    )


def _run_task(
    pattern: Pattern,
    devices: Sequence[VirtualGpuDevice],
    params: DemoParams,
    clock: Clock,
    rng: random.Random,
    log: Callable[[str], None],
    spin: Callable[[float], None],
) -> None:
    """One task of a farm: ``phase_busy_s`` of GPU work, then ``phase_idle_s`` of
    post-processing with the GPU idle, repeated for ``duration_s``; the task's core is busy
    throughout (``spin``), as a process driving a GPU or post-processing on one core is."""
    start = clock.now()
    cycle = params.phase_busy_s + params.phase_idle_s
    phases = 0
    was_working = True
    while (elapsed := clock.now() - start) < params.duration_s:
        spin(min(params.tick_s, params.duration_s - elapsed))
        working = (clock.now() - start) % cycle < params.phase_busy_s
        if was_working and not working:
            phases += 1
            log(f"post-processing phase {phases} at {clock.now() - start:.1f}s")
        was_working = working
        for i, dev in enumerate(devices):
            act = pattern.plan(0.0, i, len(devices), params, rng)
            _tick(dev, act if working and act is not None else Activity(0.0))


#: A rank's own work: it keeps its core busy (launching kernels, polling for their end, MPI
#: progress) for ``argv[1]`` seconds; its kernels are the driver's ticks.
_RANK_CODE = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
acc = 0
while time.monotonic() < end:
    for k in range(500):
        acc = (acc * 31 + k * k) % 1000003
"""


def _rank_process(seconds: float) -> subprocess.Popen[bytes]:
    """A rank: a real process that keeps its core busy for ``seconds``."""
    return subprocess.Popen(
        [sys.executable, "-c", _RANK_CODE, str(seconds)], stdin=subprocess.DEVNULL
    )


def _run_ranks(
    pattern: Pattern,
    devices: Sequence[VirtualGpuDevice],
    params: DemoParams,
    clock: Clock,
    rng: random.Random,
    log: Callable[[str], None],
) -> None:
    """Ranks that all select device 0 (none bound to its own GPU): every rank process holds
    memory on and runs kernels on the first GPU; rank k (k >= 1) also opened GPU k and holds a
    small context there (``ranks`` default: one per GPU). The ranks are real processes; this
    process writes the devices' state for them, as one virtual GPU has one writer."""
    ranks = params.ranks or len(devices)
    lo, hi = pattern.memory_frac
    frac = params.memory_frac if params.memory_frac is not None else rng.uniform(lo, hi)
    context_bytes = int(0.4 * GIB)
    procs = [_rank_process(params.duration_s + 5.0) for _ in range(ranks)]
    try:
        first = devices[0]
        for proc in procs:
            first.attach(pid=proc.pid, memory_bytes=int(frac * first.memory_total_bytes / ranks))
        for k, proc in enumerate(procs[1:], start=1):
            if k < len(devices):
                devices[k].attach(pid=proc.pid, memory_bytes=context_bytes)
        log(f"{ranks} ranks (pids {', '.join(str(p.pid) for p in procs)}) all on GPU 0")
        start = clock.now()
        while (elapsed := clock.now() - start) < params.duration_s:
            clock.sleep(min(params.tick_s, params.duration_s - elapsed))
            progress = (clock.now() - start) / params.duration_s
            for i, dev in enumerate(devices):
                act = pattern.plan(progress, i, len(devices), params, rng)
                _tick(dev, act if act is not None else Activity(0.0))
    finally:
        for dev in devices:
            for proc in procs:
                dev.detach(pid=proc.pid)
        for proc in procs:
            proc.terminate()
            proc.wait()


def spin_cpu(seconds: float) -> None:
    """Keep this process's core busy for ``seconds`` of wall-clock time."""
    end = time.monotonic() + seconds
    acc = 0
    while time.monotonic() < end:
        for k in range(500):
            acc = (acc * 31 + k * k) % 1_000_003


def burn_cpu(cpu_s: float) -> int:
    """Do ``cpu_s`` seconds of real CPU work (decode/augment stand-in); returns a checksum."""
    end = time.process_time() + cpu_s
    acc = 0
    while time.process_time() < end:
        for k in range(2000):
            acc = (acc * 31 + k * k) % 1_000_003
    return acc


def job_cpus() -> int:
    """CPUs this process may run on (the job's allocation under Slurm's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _run_dataloader(
    devices: Sequence[VirtualGpuDevice],
    params: DemoParams,
    clock: Clock,
    log: Callable[[str], None],
) -> None:
    """Workers burn ``batch_cpu_s`` of CPU per batch; the GPUs idle until a batch is ready and
    then run ``gpu_burst_s``. Duty ~ gpu_burst_s * workers / batch_cpu_s when CPU-bound."""
    workers = params.workers or job_cpus()
    start = clock.now()
    batches = 0
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        queue: deque[concurrent.futures.Future[int]] = deque(
            pool.submit(burn_cpu, params.batch_cpu_s) for _ in range(2 * workers)
        )
        while clock.now() - start < params.duration_s:
            try:
                queue[0].result(timeout=params.tick_s)
            except concurrent.futures.TimeoutError:
                for dev in devices:
                    dev.tick(0.0)  # waiting for data
                continue
            queue.popleft()
            queue.append(pool.submit(burn_cpu, params.batch_cpu_s))
            for dev in devices:
                dev.tick(0.0)  # close the waiting period before the burst
            clock.sleep(params.gpu_burst_s)
            for dev in devices:
                dev.tick(1.0, sm_active=0.8, tensor_active=0.5, pcie_rx_bytes_per_s=12e9)
            batches += 1
            if batches % 20 == 0:
                log(f"batch {batches} elapsed {clock.now() - start:.1f}s")
        for fut in queue:
            fut.cancel()
    log(f"{batches} batches with {workers} loader workers")


def describe() -> str:
    """One line per pattern, for ``--help`` and ``demo list``."""
    return "\n".join(
        f"{p.name:<12} {p.summary} (cause {p.cause}; {p.min_gpus}+ GPU)" for p in PATTERNS.values()
    )
