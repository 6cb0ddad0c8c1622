"""The demo patterns: per-tick GPU activity that reproduces each cause of low utilization.

A pattern says, for each GPU of the job, how much memory the training process holds and, tick
by tick, the share of time a kernel ran (duty), how many SMs and tensor cores were busy while it
did, and what moved over NVLink. ``run_pattern`` turns that into ``VirtualGpuDevice`` calls.
The ``dataloader`` pattern is different: it does real CPU work in worker processes and only
runs a GPU burst when a batch is ready, so its GPU duty cycle comes out of the CPU throughput.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
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
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Activity:
    """What one GPU did during one tick."""

    duty: float
    sm_active: float = 0.8
    tensor_active: float = 0.0
    nvlink_bytes_per_s: float = 0.0
    pcie_bytes_per_s: float = 0.0


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
) -> None:
    """Drive ``devices`` with pattern ``name`` for ``params.duration_s``.

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
    clock = clock or RealClock()
    rng = random.Random(params.seed)
    used = [d for i, d in enumerate(devices) if pattern.uses_gpu(i)]
    lo, hi = pattern.memory_frac
    for dev in used:
        frac = params.memory_frac if params.memory_frac is not None else rng.uniform(lo, hi)
        dev.attach(memory_bytes=int(frac * dev.memory_total_bytes))
    try:
        if name == "dataloader":
            _run_dataloader(used, params, clock, log)
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
