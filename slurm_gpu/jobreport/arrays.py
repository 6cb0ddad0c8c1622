"""The summary row of a job array's table (``gpueff ARRAYID``): what the tasks spent together.

Pure: computed from the tasks' ``JobReport`` view models, like every other number shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.jobreport import fmt
from slurm_gpu.jobreport.model import JobReport


@dataclass(frozen=True, slots=True)
class Spread:
    """Minimum, mean and maximum of one quantity over the tasks that have it."""

    low: float
    mean: float
    high: float
    count: int
    """How many tasks had a value (the others are unknown, not zero)."""


def spread(values: Sequence[float | None]) -> Spread | None:
    """The spread of the known values; ``None`` when none is known."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return Spread(min(known), sum(known) / len(known), max(known), len(known))


@dataclass(frozen=True, slots=True)
class ArraySummary:
    """The tasks of one array, together."""

    tasks: int
    elapsed_s: Spread | None
    """Elapsed time per task, seconds."""
    busy_pct: Spread | None
    """Mean GPU duty cycle per task with GPU numbers, percent."""
    gpu_hours: float
    """GPU-hours allocated, all tasks."""
    gpu_hours_idle: float | None
    """Idle GPU-hours of the tasks with GPU numbers; ``None`` when no task has any."""
    energy_j: float | None
    """GPU energy of all tasks that reported it, joules."""


def summarize(reports: Sequence[JobReport]) -> ArraySummary:
    """The summary of an array's tasks."""
    idle = [r.gpu_hours_wasted for r in reports if r.gpu_hours_wasted is not None]
    energy = [r.energy_j for r in reports if r.energy_j is not None]
    return ArraySummary(
        tasks=len(reports),
        elapsed_s=spread([float(r.elapsed_s) for r in reports]),
        busy_pct=spread([r.duty_mean_pct if r.has_gpu_numbers else None for r in reports]),
        gpu_hours=sum(r.gpu_hours_allocated for r in reports),
        gpu_hours_idle=sum(idle) if idle else None,
        energy_j=sum(energy) if energy else None,
    )


def summary_lines(s: ArraySummary) -> list[str]:
    """The summary in words, one quantity a line, for the terminal."""
    lines = [f"All {s.tasks} tasks:"]
    if s.elapsed_s is not None:
        e = s.elapsed_s
        lines.append(
            f"  elapsed  min {fmt.duration(e.low)}, mean {fmt.duration(e.mean)}, "
            f"max {fmt.duration(e.high)}"
        )
    if s.busy_pct is not None:
        b = s.busy_pct
        of = "" if b.count == s.tasks else f" (of the {b.count} tasks with GPU numbers)"
        lines.append(
            f"  GPU busy min {fmt.pct(b.low)}, mean {fmt.pct(b.mean)}, max {fmt.pct(b.high)}{of}"
        )
    idle = "" if s.gpu_hours_idle is None else f", {fmt.hours(s.gpu_hours_idle)} idle"
    lines.append(f"  GPU-hours {fmt.hours(s.gpu_hours)} allocated in all{idle}")
    if s.energy_j is not None:
        lines.append(f"  GPU energy {fmt.energy_total(s.energy_j)} in all")
    return lines
