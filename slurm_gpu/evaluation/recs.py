"""Checks of a job's recommendation set as a whole: every line a real ``sbatch`` option with a
value of its form, no proposal below what the job was observed to use, no two proposals for
the same option, and no reduction the site's allocation makes meaningless (a whole node).

The evaluation counts the failures per corpus (``slurm-gpu evaluate``); the target is none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.analysis import Analysis, Option, Recommendation

#: sbatch's long options that a resource recommendation may set (sbatch(1), Slurm 22.05–25.05).
SBATCH_OPTIONS: frozenset[str] = frozenset(
    {
        "--gres",
        "--gpus",
        "--gpus-per-node",
        "--gpus-per-task",
        "--gpu-bind",
        "--cpus-per-task",
        "--cpus-per-gpu",
        "--mem",
        "--mem-per-cpu",
        "--mem-per-gpu",
        "--time",
        "--nodes",
        "--ntasks",
        "--ntasks-per-node",
        "--exclusive",
        "--array",
        "--partition",
        "--constraint",
    }
)

_LINE = re.compile(r"^#SBATCH (--[a-z][a-z-]*)(?:=(\S+))?$")
#: The value forms of the options the engine proposes.
_VALUES: dict[str, re.Pattern[str]] = {
    "--gres": re.compile(r"^gpu:(?:[A-Za-z0-9_.-]+:)?\d+$|^gpu:[0-9]g\.\d+gb(?::\d+)?$"),
    "--gpus": re.compile(r"^(?:[A-Za-z0-9_.-]+:)?\d+$"),
    "--cpus-per-gpu": re.compile(r"^[1-9]\d*$"),
    "--cpus-per-task": re.compile(r"^[1-9]\d*$"),
    "--mem": re.compile(r"^[1-9]\d*[KMGT]?$"),
    "--time": re.compile(r"^(?:\d+-)?\d{2}:\d{2}:\d{2}$"),
}
_MEM_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "": 1024**2}


@dataclass(frozen=True, slots=True)
class RecCheck:
    """What is wrong with one job's recommendation set (empty tuples: nothing)."""

    invalid: tuple[str, ...]
    """Lines that are not ``#SBATCH --real-option=value`` of the option's form."""
    below_use: tuple[str, ...]
    """Proposals below the observed use (GPUs used, busiest cores on a node, memory peak,
    elapsed time)."""
    incoherent: tuple[str, ...]
    """Options set by more than one recommendation."""
    not_actionable: tuple[str, ...]
    """CPU, memory or GPU-count reductions on a whole-node allocation."""

    @property
    def ok(self) -> bool:
        return not (self.invalid or self.below_use or self.incoherent or self.not_actionable)


def _mem_bytes(value: str) -> int | None:
    match = re.match(r"^(\d+)([KMGT]?)$", value)
    return int(match.group(1)) * _MEM_UNITS[match.group(2)] if match else None


def _seconds(value: str) -> int | None:
    match = re.match(r"^(?:(\d+)-)?(\d{2}):(\d{2}):(\d{2})$", value)
    if not match:
        return None
    days, h, m, s = (int(x) if x else 0 for x in match.groups())
    return days * 86400 + h * 3600 + m * 60 + s


def _gpu_count(value: str) -> int | None:
    if re.search(r"\dg\.\d+gb", value):
        return None  # a MIG slice: judged by its memory, not counted here
    tail = value.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def check(analysis: Analysis) -> RecCheck:
    """Check the recommendation set of one analysed job."""
    m = analysis.metrics
    recs: Sequence[Recommendation] = analysis.recommendations
    invalid: list[str] = []
    below: list[str] = []
    seen: dict[str, int] = {}
    not_actionable: list[str] = []
    gpus_after = m.gpus_allocated
    values: dict[str, str] = {}
    for r in recs:
        for line in r.sbatch_lines:
            match = _LINE.match(line)
            if not match or match.group(1) not in SBATCH_OPTIONS:
                invalid.append(line)
                continue
            flag, value = match.group(1), match.group(2) or ""
            form = _VALUES.get(flag)
            if form is not None and not form.match(value):
                invalid.append(line)
                continue
            seen[flag] = seen.get(flag, 0) + 1
            values[flag] = value
        if m.whole_node and r.option in (Option.GPUS, Option.CPUS_PER_GPU, Option.MEMORY):
            not_actionable.append(r.option.value)
    for flag in ("--gres", "--gpus"):
        if flag in values and (count := _gpu_count(values[flag])) is not None:
            gpus_after = count
            if count < m.gpus_used:
                below.append(f"{flag}={values[flag]} < {m.gpus_used} GPUs used")
    for flag in ("--cpus-per-gpu", "--cpus-per-task"):
        if flag in values and m.host_cores_peak is not None:
            per_node = max(1, gpus_after // max(m.nnodes, 1)) if flag == "--cpus-per-gpu" else 1
            cores = int(values[flag]) * per_node
            if cores < math.floor(m.host_cores_peak):
                below.append(f"{flag}={values[flag]} gives {cores} cores < peak")
    if "--mem" in values:
        proposed = _mem_bytes(values["--mem"])
        peaks = [v for v in (m.host_rss_peak_bytes, m.mem_used_bytes) if v is not None]
        if proposed is not None and peaks and proposed < max(peaks):
            below.append(f"--mem={values['--mem']} < memory peak")
    if "--time" in values:
        proposed_s = _seconds(values["--time"])
        if proposed_s is not None and proposed_s < m.elapsed_s:
            below.append(f"--time={values['--time']} < elapsed")
    incoherent = tuple(flag for flag, n in seen.items() if n > 1)
    return RecCheck(tuple(invalid), tuple(below), incoherent, tuple(not_actionable))
