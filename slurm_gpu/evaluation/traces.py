"""Synthetic, labelled job traces: one generator per pattern of low GPU utilization.

Each trace is a ``JobRecord`` plus the ``NodeRecord`` of every node, built the way production
builds them: a stream of ``GpuSample`` and ``HostSample`` readings folded through the sampler's
own streaming aggregates (``slurm_gpu.capture.aggregate.NodeAggregator``). Parameters vary per trace
(job length, reading interval, GPU and node count, GPU model, noise, which optional metrics the
GPU reports), all drawn from one seeded ``random.Random`` so a seed names a corpus exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.records import (
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    JobRecord,
    JobStep,
    NodeRecord,
    Tres,
)
from slurm_gpu.telemetry.base import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
)

GIB = 1024**3

#: (name, memory GiB, compute capability, power limit W, has NVLink)
GPU_MODELS: tuple[tuple[str, int, tuple[int, int], float, bool], ...] = (
    ("NVIDIA A100-SXM4-40GB", 40, (8, 0), 400.0, True),
    ("NVIDIA A100-SXM4-80GB", 80, (8, 0), 400.0, True),
    ("NVIDIA H100 80GB HBM3", 80, (9, 0), 700.0, True),
    ("Tesla V100-SXM2-32GB", 32, (7, 0), 300.0, True),
    ("NVIDIA L40S", 48, (8, 9), 350.0, False),
)

#: Pattern -> the causes it stands for (scored for recall) ...
LABELS: dict[str, frozenset[int | str]] = {
    "healthy": frozenset(),
    "idle-gpu": frozenset({6}),
    "dataloader": frozenset({2}),
    # The loader in the training process: one core busy, the GPU idle between batches.
    "dataloader-main": frozenset({2}),
    "small-batch": frozenset({1}),
    "no-amp": frozenset({3}),
    "near-oom": frozenset({4}),
    "imbalance": frozenset({5}),
    "comm-wait": frozenset({5}),
    "overtime": frozenset({6}),
    "idle-tail": frozenset({6}),
    # Issue 26: the idle head, drawn across its line like the tail.
    "idle-head": frozenset({6}),
    "throttle": frozenset({"site"}),
    # Real-world shapes (issue: a diagnosis that holds on real jobs).
    "task-farm": frozenset({2, 6}),
    "task-farm-failed": frozenset({2, 6, "outcome"}),
    "ranks-one-gpu": frozenset({6}),
    "busy-empty": frozenset({1}),
    "whole-node": frozenset(),
    "node-fail": frozenset({"site"}),
    # Busy at low power like busy-empty, but streaming memory (bandwidth-bound kernels): a
    # larger batch would not help, so nothing is expected.
    "memory-bound": frozenset(),
    # Issue 26: steps ended by Slurm, sources that lack a deciding signal, host-bound jobs at
    # moderate duty, ranks sharing a GPU told from accounting.
    "timeout-steps": frozenset({"outcome"}),
    "node-fail-failed": frozenset({"site"}),
    "task-farm-no-step-cpu": frozenset(),
    "host-bound": frozenset({2}),
    "ranks-no-process-list": frozenset({6}),
}

#: ... and the causes that are also true of how the pattern is generated, so reporting them is
#: not a false alarm: a small-batch job also fits a smaller GPU (cause 6, ``GPU_OVERSIZED``).
TOLERATED: dict[str, frozenset[int | str]] = {
    "small-batch": frozenset({6}),
    # Ranks on one GPU make the others wait: imbalance (cause 5) is true too.
    "ranks-one-gpu": frozenset({5}),
    # A node that failed mid-job leaves its GPUs idle to the end and its job over time.
    "node-fail": frozenset({6}),
    "node-fail-failed": frozenset({6}),
    # The farm's recurring idle phases are true (cause 6), whatever its steps' CPU time.
    "task-farm-no-step-cpu": frozenset({6}),
    "ranks-no-process-list": frozenset({5}),
}

#: Pattern -> the finding codes of which one must appear (a stricter check than the cause).
EXPECTED_CODE: dict[str, tuple[str, ...]] = {
    "healthy": (),
    "idle-gpu": ("GPU_UNUSED",),
    "dataloader": ("DATALOADER_BOUND",),
    "dataloader-main": ("DATALOADER_BOUND",),
    "small-batch": ("LOW_PARALLELISM",),
    "no-amp": ("TENSOR_CORES_IDLE",),
    "near-oom": ("GPU_MEMORY_NEAR_FULL",),
    "imbalance": ("GPU_IMBALANCE",),
    "comm-wait": ("COMMUNICATION_WAIT",),
    "overtime": ("TIME_OVERREQUESTED",),
    "idle-tail": ("IDLE_TAIL",),
    "idle-head": ("IDLE_HEAD",),
    "throttle": ("GPU_THROTTLED_POWER", "GPU_THROTTLED_THERMAL"),
    "task-farm": ("STEPS_CPU_BOUND",),
    "task-farm-failed": ("STEPS_FAILED",),
    "ranks-one-gpu": ("RANKS_SHARE_GPU",),
    "busy-empty": ("LOW_PARALLELISM",),
    "whole-node": (),
    "node-fail": ("NODE_FAILED",),
    "memory-bound": (),
    "timeout-steps": ("TIME_LIMIT_REACHED",),
    "node-fail-failed": ("NODE_FAILED",),
    "task-farm-no-step-cpu": ("SOURCE_CANNOT_TELL",),
    "host-bound": ("DATALOADER_BOUND",),
    "ranks-no-process-list": ("RANKS_SHARE_GPU",),
}

PATTERNS: tuple[str, ...] = tuple(LABELS)


@dataclass(frozen=True, slots=True)
class Trace:
    """One labelled job."""

    name: str
    pattern: str
    seed: int
    job: JobRecord
    nodes: tuple[NodeRecord, ...]
    labels: frozenset[int | str]
    tolerated: frozenset[int | str] = field(default_factory=frozenset)
    params: tuple[tuple[str, float], ...] = ()
    """The drawn parameters, for the table and for reproducing a failure."""
    margin: str = "clear"
    """How far the pattern's deciding parameter lies from its ground-truth line
    (``TRUTH_LINES``): ``clear``, ``near`` or ``ambiguous`` (``margin_of``)."""
    expected: tuple[str, ...] | None = None
    """The finding codes of which one must appear, where it differs from the pattern's
    (``()``: a trace drawn on the healthy side of its pattern's line expects none)."""
    whole_node: bool = False
    """The site gave the job whole nodes (the generator's truth, whatever accounting shows):
    a CPU, memory or GPU-count reduction cannot be acted on."""


@dataclass(slots=True)
class _Gpu:
    """What one GPU does over the job, as a function of the reading time."""

    duty: Callable[[float], float]
    memory_frac: float
    process: Callable[[float], bool] = lambda t: True
    processes: int = 1
    """Compute processes on the GPU while ``process`` is true (ranks sharing it)."""
    power_frac: float | None = None
    """Power drawn as a share of the limit whatever the duty cycle (a busy GPU running tiny
    kernels); ``None``: it follows the duty cycle."""
    sm_frac: float = 0.8
    mem_bw_frac: float | None = 0.45
    """Share of a kernel's time the memory controller is busy (NVML's memory utilization is
    the duty cycle times this); ``None``: the source does not report it."""
    tensor_pct: float = 40.0
    throttle_share: float = 0.0
    throttle_bits: int = THROTTLE_SW_POWER_CAP
    power_cap_frac: float | None = None
    """Power never above this share of the limit (a power brake holding the GPU below its
    board limit); ``None``: no such ceiling."""
    nvlink_busy_bps: float = 2e9
    nvlink_idle_bps: float = 0.0


@dataclass(slots=True)
class _Plan:
    """Everything a pattern decides before the readings are generated."""

    rng: random.Random
    elapsed_s: int
    interval_s: float
    nodes: int
    gpus_per_node: int
    cpus_per_gpu: int
    model: tuple[str, int, tuple[int, int], float, bool]
    noise_pct: float
    gpm: bool
    """Whether the GPU reports SM and tensor activity."""
    level_pct: float = 80.0
    """The job's healthy duty cycle: synchronous data-parallel GPUs work in step."""
    cpu_frac: Callable[[float], float] = lambda t: 0.5
    rss_frac: float = 0.5
    """Peak resident memory over requested memory."""
    time_limit_factor: float = 1.5
    state: str = "COMPLETED"
    gpus: list[list[_Gpu]] = field(default_factory=list)
    whole_node_cpus: int | None = None
    """Cores the site allocates per node whatever the request (a whole-node site); the job
    requested ``cpus_per_gpu`` per GPU."""
    whole_node_mem: bool = True
    """On a whole-node site, whether it also gives the node's memory (512 GiB; an exclusive
    partition) or the memory requested (``--exclusive`` on a shared partition)."""
    steps: list[JobStep] = field(default_factory=list)
    source: str = "synthetic"
    """The telemetry source the node records name (``dcgm-exporter``: no process list, no
    host series)."""
    truth: tuple[str, float] | None = None
    """(the pattern's deciding parameter, its drawn value) for patterns drawn across their
    ground-truth line (``TRUTH_LINES``)."""


#: The ground truth of the patterns drawn across a line: (parameter, line, True when the pattern
#: holds at or above it). These are the patterns' definitions, fixed here and not read from the
#: settings: a job within 5 % of its GPU memory (under 0.05 of it free) is one step from
#: out-of-memory; GPUs whose mean duty cycles differ by 30 points or more work unequally; a limit
#: 2.5 times the elapsed time or more is over-requested (40 % used); a busy GPU under 35 % of its
#: power limit is nearly empty; an idle tail or head of 600 s or more (in 12-28 % of the job) is
#: one; a job whose GPUs were busy half the time or more is healthy, below that its utilization is
#: low (the generated mean duty cycle, before reading noise); a host that can prepare less work
#: than the GPUs could run (capacity below 1: the GPUs run at that share of their fed rate and
#: every core is busy) holds them back, one with capacity to spare does not (its cores then busy at
#: 1/capacity). The generators draw on both sides of each line, so the rules (whose thresholds sit
#: on the same lines, and whose graded findings are notes within ``near_threshold_band_pct`` of
#: them) can disagree with the labels near it.
TRUTH_LINES: dict[str, tuple[str, float, bool]] = {
    "near-oom": ("memory_free_frac", 0.05, False),
    "imbalance": ("spread_pct", 30.0, True),
    "overtime": ("limit_factor", 2.5, True),
    "busy-empty": ("power_frac", 0.35, False),
    "idle-tail": ("tail_s", 600.0, True),
    "idle-head": ("head_s", 600.0, True),
    "healthy": ("duty_pct", 50.0, True),
    "host-bound": ("host_capacity", 1.0, False),
}
#: What a trace is on the side of its line where its pattern does not hold, where that is not
#: a healthy job: (labels, the finding codes of which one must appear). A "healthy" job whose
#: GPUs were busy less than half the time, with memory well used and cores to spare, has low
#: utilization that nothing generated explains: the profiler's case (cause 7).
OTHER_SIDE: dict[str, tuple[frozenset[int | str], tuple[str, ...]]] = {
    "healthy": (frozenset({7}), ("LOW_UTILIZATION_UNEXPLAINED",)),
}
#: Every pattern: (its deciding parameter as drawn, the rule thresholds it relates to, its
#: ground-truth line, or why it has none that is not the rule's own number). The patterns with
#: a line are those of ``TRUTH_LINES``; ``docs/diagnosis.md`` shows this table.
PATTERN_LINES: dict[str, tuple[str, str, str]] = {
    "healthy": (
        "GPUs' duty level 30-95 % (the mean, with idle edges and checkpoint dips, is the truth)",
        "`low_duty_pct` 50",
        "50 % mean duty; below it low utilization no generated cause explains (cause 7, "
        "`LOW_UTILIZATION_UNEXPLAINED`)",
    ),
    "idle-gpu": (
        "1 to all but one GPU never runs a kernel",
        "`unused_max_duty_pct` 1, `starved_min_span_pct` 25",
        "none: whether a GPU ran a kernel is a fact of the job, not a level",
    ),
    "dataloader": (
        "duty 12-43 % with cores 80-100 % busy, 1-8 cores per GPU",
        "`cpu_saturated_pct` 75, `stall_share_pct` 25",
        "none here: it lies far on the host-bound side of `host-bound`'s line, drawn there",
    ),
    "dataloader-main": (
        "a batch's kernels in 8-50 % of the readings, one core per GPU busy",
        "`main_process_min_cores` 0.85, `stall_share_pct` 25",
        "none: a loader in the training process is a fact of the program, not a level",
    ),
    "small-batch": (
        "duty 12-46 %, GPU memory 3-35 %, SM activity 10-30 % of busy time, cores 5-40 %",
        "`low_duty_pct` 50, `small_memory_pct` 40, `low_sm_active_pct` 25",
        "none: its truth is the kernels' size, with no line but the rule's 25 % SM activity "
        "(`busy-empty` draws cause 1 across its power line)",
    ),
    "no-amp": (
        "tensor activity 0-3 % of busy time",
        "`tensor_idle_pct` 5",
        "none: mixed precision is off or on, not a level",
    ),
    "near-oom": (
        "GPU memory peak 75-99.5 % (0.5-25 % free)",
        "`near_full_memory_pct` 95",
        "5 % free (a 95 % peak), the distance measured in free memory",
    ),
    "imbalance": (
        "spread of the GPUs' mean duty 15-55 points",
        "`imbalance_spread_pct` 30",
        "30 points",
    ),
    "comm-wait": (
        "waiting 25-60 % of the time, NVLink traffic while idle",
        "`comm_idle_traffic_pct` 20",
        "none: the rule reads the share of traffic moved while idle, which any wait makes "
        "high; a waiting share that makes a job communication-bound would be our number",
    ),
    "overtime": (
        "time limit 1.6-8 times the elapsed time",
        "`time_used_max_pct` 40, `time_unused_min_s` 3600",
        "2.5 times (40 % used)",
    ),
    "idle-tail": (
        "idle tail 300-1500 s, 12-28 % of the job",
        "`idle_edge_min_s` 600, `idle_edge_min_pct` 10, `idle_edge_major_pct` 30",
        "600 s",
    ),
    "idle-head": (
        "idle head 300-1500 s, 12-28 % of the job",
        "`idle_edge_min_s` 600, `idle_edge_min_pct` 10, `idle_edge_major_pct` 30",
        "600 s",
    ),
    "throttle": (
        "throttled by heat or a power brake 20-90 % of the time",
        "`throttle_min_pct` 10",
        "none: any such throttling is the site's fault; 10 % is when it is worth a report",
    ),
    "task-farm": (
        "one-core steps keeping their core 95-99.5 % busy, GPUs 55-75 % with idle phases",
        "`cpu_saturated_strict_pct` 90, `dataloader_max_duty_pct` 80, `idle_phase_min_s` 300",
        "none: steps bound to one core are a fact of the job",
    ),
    "task-farm-failed": (
        "as task-farm, every step failed",
        "(accounting's step states)",
        "none: an outcome",
    ),
    "task-farm-no-step-cpu": (
        "as task-farm, without step CPU time, read every 60 s",
        "(what the source lacks)",
        "none: what cannot be told",
    ),
    "ranks-one-gpu": (
        "every rank on the first GPU, the others holding a context",
        "`ranks_per_gpu_min` 4",
        "none: a binding fault, a fact",
    ),
    "ranks-no-process-list": (
        "as ranks-one-gpu, told from the step's task count",
        "(accounting's task count)",
        "none: a binding fault, a fact",
    ),
    "busy-empty": (
        "power 20-50 % of the limit at 93-99 % duty, memory controller 3-12 % or unknown",
        "`busy_low_power_pct` 35, `busy_low_memory_util_pct` 20",
        "35 % of the power limit",
    ),
    "memory-bound": (
        "memory controller busy 55-85 % at 20-32 % power",
        "`busy_low_memory_util_pct` 20",
        "none: bandwidth-bound or empty kernels are two kinds, with no level of their own "
        "between busy-empty's 3-12 % and these 55-85 %",
    ),
    "whole-node": (
        "request from 1 core per GPU to the node's cores (64-128); the node's memory or the "
        "memory requested",
        "`whole_node_alloc_factor` 2",
        "none: the truth, a whole node given, holds on both sides of the factor; the request "
        "is drawn across it, and reductions are judged against the truth, not the rule",
    ),
    "node-fail": ("a node fails mid-job", "(the job's state)", "none: an outcome"),
    "timeout-steps": ("the time limit ends the job", "(the job's state)", "none: an outcome"),
    "node-fail-failed": (
        "FAILED with a NODE_FAIL step",
        "(the states of the job and its steps)",
        "none: an outcome",
    ),
    "host-bound": (
        "host capacity 0.55-1.6 of the GPUs' fed rate (88-97 % duty): below 1 the GPUs run "
        "at that share and every core is pinned, above it the cores are busy 1/capacity",
        "`dataloader_max_duty_pct` 80, `cpu_saturated_strict_pct` 90",
        "capacity 1",
    ),
}
#: Relative distance from the line (percent of it) below which a trace is ``ambiguous``, and
#: below which it is ``near``; ``clear`` beyond.
AMBIGUOUS_PCT = 3.0
NEAR_PCT = 15.0


def margin_of(value: float, line: float) -> str:
    """``clear``, ``near`` or ``ambiguous``: the relative distance of ``value`` from ``line``."""
    distance = 100.0 * abs(value - line) / line
    if distance < AMBIGUOUS_PCT:
        return "ambiguous"
    return "near" if distance < NEAR_PCT else "clear"


# --------------------------------------------------------------------------- building blocks


def _steady(
    rng: random.Random, lo: float, hi: float, dips: bool = True
) -> Callable[[float], float]:
    """A duty cycle around a level drawn in [lo, hi], with an occasional checkpoint dip."""
    level = rng.uniform(lo, hi)
    period = rng.uniform(600, 3600)
    dip_s = rng.uniform(10, 40) if dips else 0.0

    def duty(t: float) -> float:
        return 0.0 if dip_s and (t % period) < dip_s else level

    return duty


def _window(inner: Callable[[float], float], start: float, end: float) -> Callable[[float], float]:
    """``inner`` between ``start`` and ``end`` seconds, idle outside."""
    return lambda t: inner(t) if start <= t < end else 0.0


def _base(rng: random.Random, pattern: str) -> _Plan:
    # 60 s: the sampling of other sites' monitoring systems (the real traces of the issue).
    interval = rng.choice((1.0, 2.0, 5.0, 10.0, 30.0, 60.0))
    lo = max(900.0, 40 * interval)
    hi = min(43200.0, 500 * interval)
    if hi < lo:
        hi = lo
    elapsed = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    model = rng.choice(GPU_MODELS)
    return _Plan(
        rng=rng,
        elapsed_s=elapsed,
        interval_s=interval,
        nodes=1,
        gpus_per_node=rng.choice((1, 1, 2, 4, 4, 8)),
        cpus_per_gpu=rng.choice((4, 6, 8, 12, 16)),
        model=model,
        noise_pct=rng.uniform(1.0, 10.0),
        gpm=rng.random() < 0.5,
        cpu_frac=_const(rng.uniform(0.3, 0.8)),
        rss_frac=rng.uniform(0.35, 0.85),
        time_limit_factor=rng.uniform(1.1, 2.0),
        level_pct=rng.uniform(58, 95),
    )


def _const(value: float) -> Callable[[float], float]:
    return lambda t: value


def _flag(value: bool) -> Callable[[float], bool]:
    return lambda t: value


def _healthy_gpu(p: _Plan) -> _Gpu:
    rng = p.rng
    head = rng.uniform(0, min(300.0, 0.05 * p.elapsed_s))
    tail_start = p.elapsed_s - rng.uniform(0, min(300.0, 0.05 * p.elapsed_s))
    return _Gpu(
        duty=_window(_steady(rng, p.level_pct - 3, p.level_pct + 3), head, tail_start),
        memory_frac=rng.uniform(0.45, 0.9),
        sm_frac=rng.uniform(0.6, 0.9),
        tensor_pct=rng.uniform(20, 60),
        nvlink_idle_bps=0.0,
    )


def _fill(p: _Plan, make: Callable[[_Plan, int, int], _Gpu]) -> None:
    p.gpus = [[make(p, n, g) for g in range(p.gpus_per_node)] for n in range(p.nodes)]


def _mean_duty(p: _Plan, points: int = 2000) -> float:
    """The mean duty cycle of the job's GPUs as generated, before reading noise: each GPU's
    duty on an even grid of ``points`` times over the job, averaged over the GPUs. Only for
    patterns whose duty is a function of the time alone (it draws nothing)."""
    times = [p.elapsed_s * (k + 0.5) / points for k in range(points)]
    gpus = [g for node in p.gpus for g in node]
    return sum(sum(g.duty(t) for t in times) / points for g in gpus) / len(gpus)


# --------------------------------------------------------------------------- the patterns


def _healthy(p: _Plan) -> None:
    if p.rng.random() < 0.2:
        p.nodes, p.gpus_per_node = 2, p.rng.choice((2, 4))
    _fill(p, lambda p, n, g: _healthy_gpu(p))


def _healthy_or_low(p: _Plan) -> None:
    """The ``healthy`` pattern: a job with its GPU memory well used (45-90 %) and cores to
    spare (30-60 % busy), its GPUs' duty level drawn across the 50 % line (the job's mean,
    with its idle edges and checkpoint dips, is the truth): healthy at or above it, low
    utilization with no generated cause below."""
    rng = p.rng
    p.level_pct = rng.uniform(30.0, 95.0)
    p.cpu_frac = _const(rng.uniform(0.3, 0.6))
    _healthy(p)
    p.truth = ("duty_pct", _mean_duty(p))


def _idle_gpu(p: _Plan) -> None:
    rng = p.rng
    p.gpus_per_node = rng.choice((1, 2, 2, 4, 4, 8))
    unused = rng.randint(1, max(1, p.gpus_per_node - 1)) if p.gpus_per_node > 1 else 1

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        if g >= p.gpus_per_node - unused:
            # Never touched; sometimes a stray context (a process, but no kernel ever).
            ctx = rng.random() < 0.3
            return _Gpu(duty=_const(0.0), memory_frac=0.005 if ctx else 0.0, process=_flag(ctx))
        return _healthy_gpu(p)

    _fill(p, make)


def _dataloader(p: _Plan) -> None:
    rng = p.rng
    p.cpus_per_gpu = rng.choice((1, 2, 2, 4, 6, 8))
    p.cpu_frac = _const(rng.uniform(0.8, 1.0))

    job_level = rng.uniform(12, 43)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        level = job_level + rng.uniform(-3, 3)

        def bursty(t: float) -> float:
            # A batch arrives, the GPU runs it, then waits for the next.
            return max(0.0, rng.gauss(level, level * 0.6))

        return _Gpu(
            duty=bursty,
            memory_frac=rng.uniform(0.2, 0.85),
        )

    _fill(p, make)


def _dataloader_main(p: _Plan) -> None:
    """Batches made in the training process (a DataLoader with ``num_workers=0``): one core
    per GPU busy, the others idle; the GPU runs each batch in a burst and waits for the next,
    so most readings see no kernel (an H100 fed this way read 0.1 % mean duty)."""
    rng = p.rng
    p.cpus_per_gpu = rng.choice((2, 4, 4, 6, 8))
    p.cpu_frac = _const(rng.uniform(0.95, 1.0) / p.cpus_per_gpu)
    seen = rng.uniform(0.08, 0.5)  # share of readings in which a batch's kernels show
    burst = rng.uniform(2.0, 30.0)  # duty cycle of such a reading

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        def duty(t: float) -> float:
            return rng.uniform(0.5 * burst, 1.5 * burst) if rng.random() < seen else 0.0

        return _Gpu(duty=duty, memory_frac=rng.uniform(0.05, 0.6))

    _fill(p, make)


def _small_batch(p: _Plan) -> None:
    rng = p.rng
    p.cpu_frac = _const(rng.uniform(0.05, 0.4))
    level = rng.uniform(12, 46)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        return _Gpu(
            duty=_steady(rng, level - 3, level + 3),
            memory_frac=rng.uniform(0.03, 0.35),
            sm_frac=rng.uniform(0.1, 0.3),
            tensor_pct=rng.uniform(5, 30),
        )

    _fill(p, make)


def _no_amp(p: _Plan) -> None:
    rng = p.rng
    p.gpm = True
    p.model = rng.choice([m for m in GPU_MODELS if m[2] >= (7, 0)])

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        gpu.tensor_pct = rng.uniform(0.0, 3.0)
        gpu.sm_frac = rng.uniform(0.5, 0.85)
        return gpu

    _fill(p, make)


def _near_oom(p: _Plan) -> None:
    rng = p.rng
    failed = rng.random() < 0.3
    # The job's peak, drawn across the 95 % line (each GPU a little below it).
    peak = rng.uniform(0.75, 0.995)
    # The definition is in free memory (within 5 % of capacity), so is the distance from it:
    # a 99 % peak is far past the line (1 % free of 5 %), not 4 % of 95 % from it.
    p.truth = ("memory_free_frac", 1.0 - peak)
    if failed and peak >= 0.95:
        p.state = "FAILED"

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        gpu.memory_frac = peak if n == 0 and g == 0 else rng.uniform(0.8 * peak, peak)
        return gpu

    _fill(p, make)


def _imbalance(p: _Plan) -> None:
    rng = p.rng
    if rng.random() < 0.3:
        p.nodes, p.gpus_per_node = 2, rng.choice((1, 2, 4))
        slow_node = True
    else:
        p.gpus_per_node = rng.choice((2, 4, 8))
        slow_node = False
    fast = rng.uniform(80, 97)
    # The spread of the mean duty cycles, drawn across the 30-point line.
    spread = rng.uniform(15.0, 55.0)
    p.truth = ("spread_pct", spread)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        busy = (n == 0) if slow_node else (g == 0)
        level = fast if busy else fast - spread
        gpu.duty = _steady(rng, level - 1.0, level + 1.0, dips=False)
        return gpu

    _fill(p, make)


def _comm_wait(p: _Plan) -> None:
    rng = p.rng
    p.model = rng.choice([m for m in GPU_MODELS if m[4]])
    if rng.random() < 0.3:
        p.nodes, p.gpus_per_node = 2, rng.choice((2, 4))
    else:
        p.gpus_per_node = rng.choice((2, 4, 8))
    wait_share = rng.uniform(0.25, 0.6)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        period = rng.uniform(10, 40) * p.interval_s
        gpu.duty = lambda t: 0.0 if (t % period) >= (1 - wait_share) * period else 90.0
        gpu.nvlink_busy_bps = rng.uniform(1e8, 1e9)
        gpu.nvlink_idle_bps = rng.uniform(5e9, 2e10)
        return gpu

    _fill(p, make)


def _overtime(p: _Plan) -> None:
    rng = p.rng
    # The limit over the elapsed time, drawn across the 2.5 line (40 % of the limit used);
    # long enough that the unused time is always over an hour (time_unused_min_s).
    factor = math.exp(rng.uniform(math.log(1.6), math.log(8.0)))
    p.truth = ("limit_factor", factor)
    p.elapsed_s = max(p.elapsed_s, 1200, int(3700 / (factor - 1)) + 1)
    p.time_limit_factor = factor
    _healthy(p)


def _idle_tail(p: _Plan) -> None:
    rng = p.rng
    # The tail's length, drawn across the 600 s line, in 12-28 % of the job (a share that
    # alone makes no tail: idle_edge_major_pct is 30).
    frac = rng.uniform(0.12, 0.28)
    tail = rng.uniform(300.0, 1500.0)
    p.truth = ("tail_s", tail)
    p.elapsed_s = int(tail / frac)
    end = p.elapsed_s - tail
    # Busy 80-95 % while working, so the job as a whole stays above the 50 % line of
    # ``healthy`` on both sides of the tail's own line.
    p.level_pct = rng.uniform(80.0, 95.0)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        gpu.duty = _window(gpu.duty, 0.0, end)
        return gpu

    _fill(p, make)


def _idle_head(p: _Plan) -> None:
    """The GPUs idle from the job's start (staging data, setup on the CPU) for a head drawn
    across the 600 s line, in 12-28 % of the job; busy 80-95 % afterwards."""
    rng = p.rng
    frac = rng.uniform(0.12, 0.28)
    head = rng.uniform(300.0, 1500.0)
    p.truth = ("head_s", head)
    p.elapsed_s = int(head / frac)
    p.level_pct = rng.uniform(80.0, 95.0)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        gpu.duty = _window(gpu.duty, head, float(p.elapsed_s))
        return gpu

    _fill(p, make)


def _throttle(p: _Plan) -> None:
    rng = p.rng
    share = rng.uniform(0.2, 0.9)
    # The site's faults: heat, or a power brake (the node's power delivery asserting the HW
    # brake) that holds the GPU below its board limit. A GPU held at its own limit by its power
    # cap is how compute-bound work runs (rules._reached_power_limit), not this pattern.
    bits = rng.choice((THROTTLE_HW_POWER_BRAKE, THROTTLE_SW_THERMAL))

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        gpu.throttle_share = share
        gpu.throttle_bits = bits
        gpu.power_cap_frac = 0.8 if bits == THROTTLE_HW_POWER_BRAKE else None
        return gpu

    _fill(p, make)


def _farm(p: _Plan, *, failing: bool) -> None:
    """A task farm on a whole-node site: 96 cores and 4 GPUs per node whatever the request;
    one ``srun`` step per task, bound to one core and one GPU, four at a time per node. Each
    step runs its GPU at a moderate duty cycle while its one core is pinned, then holds the GPU
    idle while that core post-processes and writes results."""
    rng = p.rng
    p.interval_s = rng.choice((10.0, 30.0, 60.0))
    p.nodes = rng.choice((1, 1, 2, 3))
    p.gpus_per_node = 4
    p.cpus_per_gpu = 1
    p.whole_node_cpus = 96
    p.gpm = False
    work_s = rng.uniform(15, 30) * 60
    idle_s = rng.uniform(8, 14) * 60
    period = work_s + idle_s
    cycles = rng.randint(4, 8)
    p.elapsed_s = int(cycles * period + rng.uniform(60, 300))
    level = rng.uniform(55, 75)
    # The cores of the node: one per running step, each pinned.
    p.cpu_frac = _const(4 / 96)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        offset = rng.uniform(0, 60)

        def duty(t: float) -> float:
            k, phase = divmod(t - offset, period)
            if t < offset or k >= cycles:
                return 0.0
            return level if phase < work_s else 0.0

        return _Gpu(duty=duty, memory_frac=rng.uniform(0.3, 0.6))

    _fill(p, make)
    step = 0
    for _n in range(p.nodes):
        for _g in range(p.gpus_per_node):
            for _k in range(cycles):
                elapsed = int(period)
                p.steps.append(
                    JobStep(
                        step_id=str(step),
                        cpus=1,
                        gpus=1,
                        nodes=1,
                        state="FAILED" if failing else "COMPLETED",
                        exit_code=1 if failing else 0,
                        exit_signal=0,
                        elapsed_s=elapsed,
                        total_cpu_s=round(elapsed * rng.uniform(0.95, 0.995), 3),
                    )
                )
                step += 1


def _task_farm(p: _Plan) -> None:
    _farm(p, failing=False)


def _task_farm_failed(p: _Plan) -> None:
    _farm(p, failing=True)


def _ranks_one_gpu(p: _Plan) -> None:
    """An MPI job whose ranks all selected device 0: it runs every rank's kernels, the other
    allocated GPUs hold a small context each and never run a kernel."""
    rng = p.rng
    p.gpus_per_node = rng.choice((2, 4, 4, 8))
    p.cpu_frac = _const(rng.uniform(0.2, 0.6))
    ranks = p.gpus_per_node

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        if g == 0:
            gpu = _healthy_gpu(p)
            gpu.duty = _steady(rng, 92, 99)
            gpu.processes = ranks
            return gpu
        return _Gpu(duty=_const(0.0), memory_frac=rng.uniform(0.004, 0.008))

    _fill(p, make)


def _busy_low_power(
    p: _Plan,
    mem_bw_of: Callable[[random.Random], float | None],
    memory_frac: tuple[float, float],
    power: tuple[float, float] = (0.2, 0.32),
) -> None:
    """A kernel nearly always running (93-99 % duty) at a fifth to a third of the power limit,
    no SM-activity metric (no DCGM profiling); ``mem_bw_of`` draws the memory controller's
    share of the kernels' time (``None``: not reported)."""
    rng = p.rng
    p.gpm = False
    p.cpu_frac = _const(rng.uniform(0.3, 0.6))
    frac = rng.uniform(*power)
    p.truth = ("power_frac", frac)
    mem_bw = mem_bw_of(rng)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        gpu.duty = _steady(rng, 93, 99)
        gpu.power_frac = frac
        gpu.memory_frac = rng.uniform(*memory_frac)
        gpu.mem_bw_frac = mem_bw
        return gpu

    _fill(p, make)


def _busy_empty(p: _Plan) -> None:
    """Busy, but nearly empty: the GPU always has a kernel running (99 % duty) yet draws a
    quarter of its power limit and moves little memory, as the site's source reports it (or
    not at all: the power proxy alone then)."""
    _busy_low_power(
        p,
        lambda rng: rng.uniform(0.03, 0.12) if rng.random() < 0.5 else None,
        (0.3, 0.7),
        power=(0.2, 0.5),  # across the 35 % line
    )


def _memory_bound(p: _Plan) -> None:
    """Busy at about a quarter of the power limit like ``busy-empty``, but the memory
    controller is busy most of the time: bandwidth-bound kernels (a stencil, an embedding
    lookup), not an empty GPU. No SM-activity metric, so memory bandwidth must tell them
    apart."""
    _busy_low_power(p, lambda rng: rng.uniform(0.55, 0.85), (0.45, 0.8))


def _whole_node(p: _Plan) -> None:
    """A healthy job on a whole-node site: it asked for one core per GPU up to the whole
    node's cores and got every core (no over-request can be acted on). Half the sites give
    the node's memory too (an exclusive partition), half the memory requested (``--exclusive``
    on a shared partition). From half the node's cores up, nothing in accounting tells the
    cores given from those asked for (at most twice the request, as hyper-thread rounding
    gives), so only the memory can say it, where the site gave it."""
    rng = p.rng
    p.whole_node_cpus = rng.choice((64, 96, 128))
    p.gpus_per_node = rng.choice((4, 4, 8))
    share = rng.uniform(0.03, 1.0)
    p.cpus_per_gpu = max(1, int(share * p.whole_node_cpus / p.gpus_per_node))
    p.whole_node_mem = rng.random() < 0.5
    if rng.random() < 0.3:
        p.nodes = 2
    _fill(p, lambda p, n, g: _healthy_gpu(p))


def _node_fail(p: _Plan) -> None:
    """A multi-node job ended by a node failure: healthy until then."""
    rng = p.rng
    p.nodes = rng.choice((2, 4, 8))
    p.gpus_per_node = rng.choice((2, 4))
    p.state = "NODE_FAIL"
    p.time_limit_factor = rng.uniform(1.5, 3.0)
    _fill(p, lambda p, n, g: _healthy_gpu(p))


def _killed_steps(p: _Plan, first: str | None = None) -> None:
    """One srun step per node, running to the job's end, where Slurm ended them (CANCELLED
    0:15 or FAILED 0:9, the first one ``first`` where given)."""
    end = 1.7e9 + p.elapsed_s
    for n in range(p.nodes):
        st = first if n == 0 and first else p.rng.choice(("CANCELLED", "FAILED"))
        sig = 0 if st == "NODE_FAIL" else (15 if st == "CANCELLED" else 9)
        p.steps.append(
            JobStep(
                str(n),
                p.cpus_per_gpu * p.gpus_per_node,
                p.gpus_per_node,
                1,
                st,
                0,
                sig,
                p.elapsed_s - 30,
                None,
                tasks=p.gpus_per_node,
                end_s=end - p.rng.uniform(0, 60),
            )
        )


def _timeout_steps(p: _Plan) -> None:
    """A healthy job that reached its time limit: Slurm ended it and its running steps."""
    _healthy(p)
    p.state = "TIMEOUT"
    p.time_limit_factor = 1.0
    _killed_steps(p)


def _node_fail_failed(p: _Plan) -> None:
    """A multi-node job that says FAILED after a node failed: one step NODE_FAIL, the others
    ended by Slurm at the end."""
    rng = p.rng
    p.nodes = rng.choice((2, 4))
    p.gpus_per_node = rng.choice((2, 4))
    p.state = "FAILED"
    _fill(p, lambda p, n, g: _healthy_gpu(p))
    _killed_steps(p, first="NODE_FAIL")


def _task_farm_no_step_cpu(p: _Plan) -> None:
    """The task farm read from dcgm-exporter every 60 s, with accounting that kept no step's
    CPU time: whether the steps were CPU-bound cannot be told."""
    _farm(p, failing=False)
    p.interval_s = 60.0
    p.source = "dcgm-exporter"
    p.steps = [
        JobStep(st.step_id, st.cpus, st.gpus, st.nodes, st.state, 0, 0, st.elapsed_s, None)
        for st in p.steps
    ]


def _host_bound(p: _Plan) -> None:
    """A job whose host part prepares the GPUs' work (a molecular-dynamics code, a data
    pipeline) with a capacity drawn across 1, the rate the GPUs could run at (88-97 % duty,
    fed): below it the GPUs run at that share of their fed rate while every core is pinned
    (host-bound); above it they run fed and the cores are busy 1/capacity of the time."""
    rng = p.rng
    fed = rng.uniform(88.0, 97.0)
    capacity = math.exp(rng.uniform(math.log(0.55), math.log(1.6)))
    p.truth = ("host_capacity", capacity)
    p.cpu_frac = _const(rng.uniform(0.94, 1.0) / max(1.0, capacity))
    level = fed * min(1.0, capacity)

    def make(p: _Plan, n: int, g: int) -> _Gpu:
        gpu = _healthy_gpu(p)
        gpu.duty = _steady(rng, level - 3, level + 3)
        return gpu

    _fill(p, make)


def _ranks_no_process_list(p: _Plan) -> None:
    """``ranks-one-gpu`` read from dcgm-exporter (no process list): one step's ranks, one
    per allocated GPU, all on the first."""
    _ranks_one_gpu(p)
    p.source = "dcgm-exporter"
    p.steps = [
        JobStep(
            "0",
            p.cpus_per_gpu * p.gpus_per_node,
            p.gpus_per_node,
            1,
            "COMPLETED",
            0,
            0,
            p.elapsed_s,
            None,
            tasks=p.gpus_per_node,
        )
    ]


_MAKERS: dict[str, Callable[[_Plan], None]] = {
    "healthy": _healthy_or_low,
    "idle-gpu": _idle_gpu,
    "dataloader": _dataloader,
    "dataloader-main": _dataloader_main,
    "small-batch": _small_batch,
    "no-amp": _no_amp,
    "near-oom": _near_oom,
    "imbalance": _imbalance,
    "comm-wait": _comm_wait,
    "overtime": _overtime,
    "idle-tail": _idle_tail,
    "idle-head": _idle_head,
    "throttle": _throttle,
    "task-farm": _task_farm,
    "task-farm-failed": _task_farm_failed,
    "ranks-one-gpu": _ranks_one_gpu,
    "busy-empty": _busy_empty,
    "memory-bound": _memory_bound,
    "whole-node": _whole_node,
    "node-fail": _node_fail,
    "timeout-steps": _timeout_steps,
    "node-fail-failed": _node_fail_failed,
    "task-farm-no-step-cpu": _task_farm_no_step_cpu,
    "host-bound": _host_bound,
    "ranks-no-process-list": _ranks_no_process_list,
}


# --------------------------------------------------------------------------- readings


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _node_record(
    p: _Plan, job_id: str, host: str, gpus: Sequence[_Gpu], start_s: float
) -> NodeRecord:
    rng = p.rng
    name, mem_gib, cc, power_limit, nvlink = p.model
    capacity = mem_gib * GIB
    infos = [
        GpuInfo(
            uuid=_uuid(rng),
            index=i,
            minor_number=i,
            name=name,
            memory_total_bytes=capacity,
            power_limit_w=power_limit,
            compute_capability=cc,
        )
        for i in range(len(gpus))
    ]
    cores = p.whole_node_cpus or p.cpus_per_gpu * len(gpus)
    agg = NodeAggregator(
        job_id=job_id,
        hostname=host,
        uid=1000,
        interval_s=p.interval_s,
        source=p.source,
        gpus=infos,
        started_s=start_s,
        idle_threshold_pct=1.0,
        timeline_points=512,
        allocated_cores=cores,
    )
    energy = [rng.randint(10**9, 10**10) for _ in gpus]
    nvl = [0 for _ in gpus]
    cpu_time = 0.0
    rss_peak = int(p.rss_frac * 4 * GIB * len(gpus))
    t = p.interval_s
    while t <= p.elapsed_s:
        samples = []
        for i, (gpu, info) in enumerate(zip(gpus, infos, strict=True)):
            base = gpu.duty(t)
            duty = 0.0 if base <= 0 else min(100.0, max(0.0, rng.gauss(base, p.noise_pct)))
            if base > 0 and duty <= 1.0:
                duty = 1.5  # a kernel ran, however little: not idle
            busy = duty / 100.0
            power = 0.15 * power_limit + 0.8 * power_limit * busy
            if gpu.power_frac is not None and base > 0:
                power = gpu.power_frac * power_limit
            if gpu.power_cap_frac is not None:
                power = min(power, gpu.power_cap_frac * power_limit)
            energy[i] += int(power * p.interval_s * 1000)
            idle = duty <= 1.0
            nvl[i] += int((gpu.nvlink_idle_bps if idle else gpu.nvlink_busy_bps) * p.interval_s)
            throttled = rng.random() < gpu.throttle_share
            mem = int(capacity * gpu.memory_frac * (1.0 if t > 30 else 0.5))
            proc = gpu.process(t)
            samples.append(
                GpuSample(
                    uuid=info.uuid,
                    time_s=start_s + t,
                    utilization_pct=round(duty, 1),
                    memory_used_bytes=mem if (proc or mem) else 0,
                    memory_total_bytes=capacity,
                    power_w=round(power, 1),
                    energy_mj=energy[i],
                    throttle_reasons=gpu.throttle_bits if throttled else 0,
                    nvlink_tx_bytes=nvl[i] // 2 if nvlink else None,
                    nvlink_rx_bytes=nvl[i] - nvl[i] // 2 if nvlink else None,
                    ecc_corrected_total=0,
                    ecc_uncorrected_total=0,
                    processes=tuple(
                        GpuProcess(4242 + 100 * i + k, mem // gpu.processes)
                        for k in range(gpu.processes)
                    )
                    if proc
                    else (),
                    memory_utilization_pct=None
                    if gpu.mem_bw_frac is None
                    else round(busy * gpu.mem_bw_frac * 100, 1),
                    sm_active_pct=round(busy * gpu.sm_frac * 100, 1) if p.gpm else None,
                    tensor_active_pct=round(busy * gpu.tensor_pct, 1) if p.gpm else None,
                )
            )
        noise = 0.03 if p.whole_node_cpus is None else 0.003
        cores_busy = max(0.0, min(1.0, rng.gauss(p.cpu_frac(t), noise))) * cores
        cpu_time += cores_busy * p.interval_s
        rss = int(rss_peak * min(1.0, 0.6 + 0.4 * t / p.elapsed_s))
        host_sample = HostSample(
            time_s=start_s + t,
            cpu_time_s=cpu_time,
            rss_bytes=rss,
            io_read_bytes=None,
            io_write_bytes=None,
            process_count=4,
            method="synthetic",
        )
        agg.add(start_s + t, samples, host_sample)
        t += p.interval_s
    return agg.record(ended_s=start_s + p.elapsed_s, complete=True)


def _job(p: _Plan, job_id: str, hosts: tuple[str, ...], nodes: Sequence[NodeRecord]) -> JobRecord:
    gpus = p.nodes * p.gpus_per_node
    cpus = p.cpus_per_gpu * gpus
    rss = max((n.host.rss_max_bytes or 0) for n in nodes if n.host) if nodes else 0
    cpu_s = sum((n.host.cpu_time_s or 0.0) for n in nodes if n.host)
    mem_per_node = math.ceil(rss / p.rss_frac / GIB) * GIB
    limit = math.ceil(p.elapsed_s * p.time_limit_factor / 60.0) * 60
    tres = Tres(cpus=cpus, mem_bytes=mem_per_node * p.nodes, nodes=p.nodes, gpus=gpus)
    alloc = tres
    if p.whole_node_cpus is not None:
        # The site gave whole nodes: every core, whatever was asked, and 512 GiB per node
        # (an exclusive partition) or the memory asked for (--exclusive on a shared one).
        alloc = Tres(
            cpus=p.whole_node_cpus * p.nodes,
            mem_bytes=512 * GIB * p.nodes if p.whole_node_mem else tres.mem_bytes,
            nodes=p.nodes,
            gpus=gpus,
        )
    step_cpu = [st.total_cpu_s for st in p.steps if st.total_cpu_s is not None]
    if step_cpu:
        cpu_s = sum(step_cpu)
    # Drawn after the readings, so the request's style leaves every other draw as it was.
    submit_line, directives, typed = _submit_line(p, mem_per_node)
    if typed:
        tres = Tres(
            cpus=tres.cpus,
            mem_bytes=tres.mem_bytes,
            nodes=tres.nodes,
            gpus=tres.gpus,
            gpu_types=((typed, gpus),),
        )
    start = 1.7e9
    return JobRecord(
        job_id=job_id,
        job_id_display=job_id,
        array_job_id=None,
        array_task_id=None,
        het_job_id=None,
        het_job_offset=None,
        user="alice",
        uid=1000,
        account="lab",
        partition="gpu",
        qos=None,
        job_name=f"train-{job_id}",
        work_dir="/home/alice/project",
        nodelist=hosts,
        state=p.state,
        cancelled_by_uid=None,
        exit_code=0 if p.state == "COMPLETED" else 1,
        exit_signal=0,
        derived_exit_code=1 if any(st.failed for st in p.steps) else 0,
        alloc_tres=alloc,
        req_tres=tres,
        alloc_cpus=alloc.cpus,
        req_mem_bytes=mem_per_node * p.nodes,
        max_rss_bytes=rss,
        total_cpu_s=cpu_s,
        elapsed_s=p.elapsed_s,
        time_limit_s=limit,
        submit_s=start - 60,
        start_s=start,
        end_s=start + p.elapsed_s,
        restarts=0,
        comment=None,
        admin_comment=None,
        mail_user=None,
        mail_type=None,
        steps=tuple(p.steps),
        submit_line=submit_line,
        batch_directives=directives,
    )


#: The request styles a synthetic job is submitted in (``analysis.request``).
GPU_STYLES = ("gres", "gres-typed", "gpus", "gpus-per-node", "gpus-per-task")
CPU_STYLES = ("cpus-per-gpu", "cpus-per-task")
MEM_STYLES = ("mem", "mem-per-gpu", "mem-per-cpu")


def _gpu_type_name(model: str) -> str:
    """``NVIDIA A100-SXM4-40GB`` -> ``a100``: the GRES type a site would give the model."""
    for word in model.replace("-", " ").split():
        if word[:1] in "AHVL" and word[1:2].isdigit():
            return word.lower()
    return "gpu"


#: Where a synthetic job's options are written: on the sbatch command line, or as its batch
#: script's ``#SBATCH`` lines (read from a site that keeps scripts) with a bare command line.
OPTION_PLACES = ("command line", "batch script")


def _submit_line(p: _Plan, mem_per_node: int) -> tuple[str, str | None, str | None]:
    """(the sbatch command line of the job, its script's ``#SBATCH`` lines, both in a drawn
    request style and place; the GPU type it names, if any)."""
    rng = p.rng
    gpu_style = rng.choice(GPU_STYLES)
    cpu_style = rng.choice(CPU_STYLES)
    mem_style = rng.choice(MEM_STYLES)
    per_node, nodes = p.gpus_per_node, p.nodes
    typed = _gpu_type_name(p.model[0]) if gpu_style == "gres-typed" else None
    words = ["sbatch", f"--nodes={nodes}"]
    if gpu_style in ("gres", "gres-typed"):
        words.append(f"--gres=gpu:{typed + ':' if typed else ''}{per_node}")
    elif gpu_style == "gpus":
        words.append(f"--gpus={per_node * nodes}")
    elif gpu_style == "gpus-per-node":
        words.append(f"--gpus-per-node={per_node}")
    else:
        words += [f"--ntasks={per_node * nodes}", "--gpus-per-task=1"]
    if cpu_style == "cpus-per-gpu":
        words.append(f"--cpus-per-gpu={p.cpus_per_gpu}")
    elif gpu_style == "gpus-per-task":
        words.append(f"--cpus-per-task={p.cpus_per_gpu}")
    else:
        words.append(f"--cpus-per-task={p.cpus_per_gpu * per_node}")
    mib = 1024**2
    if mem_style == "mem-per-gpu":
        words.append(f"--mem-per-gpu={mem_per_node // per_node // mib}M")
    elif mem_style == "mem-per-cpu":
        words.append(f"--mem-per-cpu={mem_per_node // (p.cpus_per_gpu * per_node) // mib}M")
    else:
        words.append(f"--mem={mem_per_node // mib}M")
    # Drawn last, so the place leaves the style's draws as they were.
    if rng.choice(OPTION_PLACES) == "batch script":
        return "sbatch job.sh", "\n".join(f"#SBATCH {w}" for w in words[1:]), typed
    words.append("job.sh")
    return " ".join(words), None, typed


def generate(pattern: str, seed: int, interval_s: float | None = None) -> Trace:
    """One trace of ``pattern``, fully determined by ``seed``. ``interval_s``: read the same
    job (the same plan: length, GPUs, duty cycles over time) every ``interval_s`` seconds
    instead of at the plan's own interval, as a coarser monitoring system would."""
    if pattern not in _MAKERS:
        raise ValueError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    rng = random.Random(f"{pattern}:{seed}")
    plan = _base(rng, pattern)
    _MAKERS[pattern](plan)
    if interval_s is not None:
        plan.interval_s = interval_s
    job_id = str(100000 + seed)
    hosts = tuple(f"gpu{n + 1:03d}" for n in range(plan.nodes))
    start = 1.7e9
    nodes = tuple(
        _node_record(plan, job_id, host, plan.gpus[n], start) for n, host in enumerate(hosts)
    )
    job = _job(plan, job_id, hosts, nodes)
    params: tuple[tuple[str, float], ...] = (
        ("elapsed_s", float(plan.elapsed_s)),
        ("interval_s", plan.interval_s),
        ("gpus", float(plan.nodes * plan.gpus_per_node)),
        ("nodes", float(plan.nodes)),
        ("noise_pct", round(plan.noise_pct, 2)),
    )
    labels, margin, expected = LABELS[pattern], "clear", None
    line = TRUTH_LINES.get(pattern)
    if plan.truth is not None and line is not None:
        name, value = plan.truth
        holds = value >= line[1] if line[2] else value < line[1]
        params += ((name, round(value, 4)),)
        margin = margin_of(value, line[1])
        if not holds:
            labels, expected = OTHER_SIDE.get(pattern, (frozenset(), ()))
    return Trace(
        name=f"{pattern}-{seed}",
        pattern=pattern,
        seed=seed,
        job=job,
        nodes=nodes,
        labels=labels,
        tolerated=TOLERATED.get(pattern, frozenset()),
        params=params,
        margin=margin,
        expected=expected,
        whole_node=plan.whole_node_cpus is not None,
    )


def corpus(n_per_pattern: int, seed: int, patterns: Sequence[str] = PATTERNS) -> list[Trace]:
    """``n_per_pattern`` traces of every pattern; trace seeds are ``seed * 100000 + i``."""
    return [generate(p, seed * 100000 + i) for p in patterns for i in range(n_per_pattern)]
