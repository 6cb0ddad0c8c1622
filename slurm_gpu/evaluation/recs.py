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
from slurm_gpu.analysis.request import Request, request_of
from slurm_gpu.records import JobRecord

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
    "--gpus-per-node": re.compile(r"^(?:[A-Za-z0-9_.-]+:)?\d+$"),
    "--gpus-per-task": re.compile(r"^(?:[A-Za-z0-9_.-]+:)?\d+$"),
    "--ntasks": re.compile(r"^[1-9]\d*$"),
    "--ntasks-per-node": re.compile(r"^[1-9]\d*$"),
    "--mem-per-gpu": re.compile(r"^[1-9]\d*[KMGT]?$"),
    "--mem-per-cpu": re.compile(r"^[1-9]\d*[KMGT]?$"),
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
    """CPU, memory or GPU-count reductions on a whole-node allocation (as accounting shows it,
    or as the generator made it where accounting cannot show it)."""

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


def check(
    analysis: Analysis, job: JobRecord | None = None, *, whole_node: bool = False
) -> RecCheck:
    """Check the recommendation set of one analysed job; ``job``: its accounting record, whose
    request style (``analysis.request``) says how the lines are read (per node, per task, per
    GPU), and whether its cores come per GPU; ``whole_node``: the site gave the job whole
    nodes, whatever the analysis concluded from accounting (a generated trace's truth)."""
    m = analysis.metrics
    req = request_of(job) if job is not None else Request()
    recs: Sequence[Recommendation] = analysis.recommendations
    invalid: list[str] = []
    below: list[str] = []
    seen: dict[str, int] = {}
    not_actionable: list[str] = []
    nodes = max(m.nnodes, 1)
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
        on_whole_node = m.whole_node or whole_node
        if on_whole_node and r.option in (Option.GPUS, Option.CPUS_PER_GPU, Option.MEMORY):
            not_actionable.append(r.option.value)
    # The GPUs each form asks for in all: --gres and --gpus-per-node per node, --gpus in all,
    # --ntasks times the job's --gpus-per-task.
    per_node_forms = {"--gres": nodes, "--gpus-per-node": nodes, "--gpus": 1}
    said = ""
    for flag, times in per_node_forms.items():
        if flag in values and (count := _gpu_count(values[flag])) is not None:
            gpus_after, said = count * times, f"{flag}={values[flag]}"
    if "--ntasks" in values and req.gpus_per_task:
        gpus_after = int(values["--ntasks"]) * req.gpus_per_task
        said = f"--ntasks={values['--ntasks']}"
    if gpus_after < m.gpus_used:
        below.append(f"{said}: {gpus_after} GPUs < {m.gpus_used} GPUs used")
    gpus_per_node = max(1, gpus_after // nodes)
    cpu_flags = [f for f in ("--cpus-per-gpu", "--cpus-per-task") if f in values]
    if m.host_cores_peak is not None:
        for flag in cpu_flags:
            if flag == "--cpus-per-gpu":
                per_node = gpus_per_node if m.gpus_allocated else 1
            elif req.gpu_form == "gpus-per-task" and req.gpus_per_task:
                per_node = max(1, gpus_per_node // req.gpus_per_task)
            else:
                per_node = max(1, (req.ntasks or 1) // nodes)
            cores = int(values[flag]) * per_node
            if cores < math.floor(m.host_cores_peak):
                below.append(f"{flag}={values[flag]} gives {cores} cores < peak")
        if not cpu_flags and req.cores_per_gpu and gpus_after < m.gpus_allocated:
            # A GPU cut takes its cores with it where they come per GPU.
            per_gpu = (m.host_cores_allocated_per_node or m.ncpus) / (m.gpus_allocated / nodes)
            if per_gpu * gpus_per_node < math.floor(m.host_cores_peak):
                below.append(f"{gpus_after} GPUs leave {per_gpu * gpus_per_node:g} cores < peak")
    peaks = [v for v in (m.host_rss_peak_bytes, m.mem_used_bytes) if v is not None]
    mem_per_node = None
    if "--mem" in values:
        mem_per_node = _mem_bytes(values["--mem"])
    elif "--mem-per-gpu" in values and (each := _mem_bytes(values["--mem-per-gpu"])):
        mem_per_node = each * gpus_per_node
    elif "--mem-per-cpu" in values and (each := _mem_bytes(values["--mem-per-cpu"])):
        mem_per_node = each * int(m.host_cores_allocated_per_node or m.ncpus)
    if mem_per_node is not None and peaks and mem_per_node < max(peaks):
        below.append(f"{mem_per_node} bytes per node < memory peak")
    if "--time" in values:
        proposed_s = _seconds(values["--time"])
        if proposed_s is not None and proposed_s < m.elapsed_s:
            below.append(f"--time={values['--time']} < elapsed")
    incoherent = tuple(flag for flag, n in seen.items() if n > 1)
    return RecCheck(tuple(invalid), tuple(below), incoherent, tuple(not_actionable))
