"""What the analysis says about a job: findings (a diagnosis, with numbers) and recommendations.

Findings carry a stable code, a severity, the cause (1–7, from the seven causes of low GPU
utilization) and the numbers behind them; the words live in ``templates/findings/<CODE>.j2`` so a
site can reword them without touching code. Evidence keys carry their unit in the name
(``duty_mean_pct``, ``idle_tail_s``, ``memory_peak_bytes``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

#: One number of evidence: a count, a measurement, or ``None`` when not reported.
Number = int | float | None


class Severity(StrEnum):
    """How much a finding matters. ``info`` findings are notes, not a diagnosis."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 for info, 1 for warning, 2 for critical: sorts most severe last."""
        return _RANK[self]


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class Audience(StrEnum):
    """Who can act on a finding: the job's user, or the site (hardware, cooling, power)."""

    USER = "user"
    SITE = "site"


class Scope(StrEnum):
    """What a finding is about: the whole job, one node of it, or one GPU (by UUID)."""

    JOB = "job"
    NODE = "node"
    GPU = "gpu"


class Code(StrEnum):
    """Stable finding codes. Never renumber or rename: stores and templates key on them."""

    # data quality (cause 7: without data there is no diagnosis)
    NO_TELEMETRY = "NO_TELEMETRY"
    TOO_SHORT = "TOO_SHORT"
    NODE_RECORD_MISSING = "NODE_RECORD_MISSING"
    GPU_LOST = "GPU_LOST"
    SOURCE_CANNOT_TELL = "SOURCE_CANNOT_TELL"
    # cause 6: allocation and scheduling
    GPU_UNUSED = "GPU_UNUSED"
    IDLE_HEAD = "IDLE_HEAD"
    IDLE_TAIL = "IDLE_TAIL"
    IDLE_PHASES = "IDLE_PHASES"
    RAGGED_TAIL = "RAGGED_TAIL"
    TIME_OVERREQUESTED = "TIME_OVERREQUESTED"
    CPU_OVERREQUESTED = "CPU_OVERREQUESTED"
    MEMORY_OVERREQUESTED = "MEMORY_OVERREQUESTED"
    GPU_OVERSIZED = "GPU_OVERSIZED"
    RANKS_SHARE_GPU = "RANKS_SHARE_GPU"
    # cause 2: data loading
    DATALOADER_BOUND = "DATALOADER_BOUND"
    TOO_FEW_CPUS_PER_GPU = "TOO_FEW_CPUS_PER_GPU"
    STEPS_CPU_BOUND = "STEPS_CPU_BOUND"
    # cause 1: not enough parallel work
    LOW_PARALLELISM = "LOW_PARALLELISM"
    # cause 3: architecture and hyper-parameters
    TENSOR_CORES_IDLE = "TENSOR_CORES_IDLE"
    # cause 4: memory
    GPU_MEMORY_NEAR_FULL = "GPU_MEMORY_NEAR_FULL"
    HOST_OUT_OF_MEMORY = "HOST_OUT_OF_MEMORY"
    # cause 5: communication
    GPU_IMBALANCE = "GPU_IMBALANCE"
    COMMUNICATION_WAIT = "COMMUNICATION_WAIT"
    # cause 7: low utilization that no specific rule explains
    LOW_UTILIZATION_UNEXPLAINED = "LOW_UTILIZATION_UNEXPLAINED"
    # the site's problems, not the user's
    GPU_THROTTLED_POWER = "GPU_THROTTLED_POWER"
    GPU_THROTTLED_THERMAL = "GPU_THROTTLED_THERMAL"
    GPU_HARDWARE_ERRORS = "GPU_HARDWARE_ERRORS"
    NODE_FAILED = "NODE_FAILED"
    # the job's own outcome (not a utilization cause)
    STEPS_FAILED = "STEPS_FAILED"
    TIME_LIMIT_REACHED = "TIME_LIMIT_REACHED"
    STEPS_ENDED_WITH_JOB = "STEPS_ENDED_WITH_JOB"
    # evidence from inside the job: its Python stacks (docs/stacks.md)
    STACK_PROFILE = "STACK_PROFILE"
    # memory of the user's similar jobs
    REPEATED_FINDINGS = "REPEATED_FINDINGS"


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """What is fixed about a code: its cause, audience and the profiler that looks deeper."""

    cause: int | None
    """1–7, or ``None`` for a site problem that is none of the seven causes."""
    audience: Audience
    profiler: str | None
    """Key of ``PROFILERS``: the tool that shows the suspected cause in detail."""
    also_causes: tuple[int, ...] = ()
    """Other causes the same pattern can stand for (reported, not scored)."""


CODES: Mapping[Code, CodeInfo] = {
    Code.NO_TELEMETRY: CodeInfo(7, Audience.SITE, None),
    Code.TOO_SHORT: CodeInfo(7, Audience.USER, None),
    Code.NODE_RECORD_MISSING: CodeInfo(7, Audience.SITE, None),
    Code.GPU_LOST: CodeInfo(None, Audience.SITE, "site_health"),
    Code.SOURCE_CANNOT_TELL: CodeInfo(7, Audience.SITE, None),
    Code.GPU_UNUSED: CodeInfo(6, Audience.USER, None),
    Code.IDLE_HEAD: CodeInfo(6, Audience.USER, "nsys"),
    Code.IDLE_TAIL: CodeInfo(6, Audience.USER, "nsys"),
    Code.IDLE_PHASES: CodeInfo(6, Audience.USER, "nsys"),
    Code.RAGGED_TAIL: CodeInfo(6, Audience.USER, "nsys", also_causes=(5,)),
    Code.TIME_OVERREQUESTED: CodeInfo(6, Audience.USER, None),
    Code.CPU_OVERREQUESTED: CodeInfo(6, Audience.USER, None),
    Code.MEMORY_OVERREQUESTED: CodeInfo(6, Audience.USER, None),
    Code.GPU_OVERSIZED: CodeInfo(6, Audience.USER, None, also_causes=(4,)),
    Code.RANKS_SHARE_GPU: CodeInfo(6, Audience.USER, "nsys_distributed", also_causes=(5,)),
    Code.DATALOADER_BOUND: CodeInfo(2, Audience.USER, "torch"),
    Code.TOO_FEW_CPUS_PER_GPU: CodeInfo(2, Audience.USER, "torch"),
    Code.STEPS_CPU_BOUND: CodeInfo(2, Audience.USER, "torch"),
    Code.LOW_PARALLELISM: CodeInfo(1, Audience.USER, "nsys", also_causes=(3,)),
    Code.TENSOR_CORES_IDLE: CodeInfo(3, Audience.USER, "nsys_gpu_metrics"),
    Code.GPU_MEMORY_NEAR_FULL: CodeInfo(4, Audience.USER, "torch_memory"),
    Code.HOST_OUT_OF_MEMORY: CodeInfo(4, Audience.USER, None),
    Code.GPU_IMBALANCE: CodeInfo(5, Audience.USER, "nsys_distributed"),
    Code.COMMUNICATION_WAIT: CodeInfo(5, Audience.USER, "nsys_distributed"),
    Code.LOW_UTILIZATION_UNEXPLAINED: CodeInfo(7, Audience.USER, "nsys"),
    Code.GPU_THROTTLED_POWER: CodeInfo(None, Audience.SITE, "site_health"),
    Code.GPU_THROTTLED_THERMAL: CodeInfo(None, Audience.SITE, "site_health"),
    Code.GPU_HARDWARE_ERRORS: CodeInfo(None, Audience.SITE, "site_health"),
    Code.NODE_FAILED: CodeInfo(None, Audience.SITE, "site_health"),
    Code.STEPS_FAILED: CodeInfo(None, Audience.USER, None),
    Code.TIME_LIMIT_REACHED: CodeInfo(None, Audience.USER, None),
    Code.STEPS_ENDED_WITH_JOB: CodeInfo(None, Audience.USER, None),
    Code.STACK_PROFILE: CodeInfo(None, Audience.USER, None),
    Code.REPEATED_FINDINGS: CodeInfo(None, Audience.USER, None),
}

#: The profiler to run for each suspected cause, as an exact command (cause 7: point people at
#: the tool that shows the cause). ``<command>`` stands for the job's own program and arguments.
PROFILERS: Mapping[str, str] = {
    "nsys": (
        "srun nsys profile --trace=cuda,nvtx,osrt --sample=cpu --duration=300 "
        "--output=nsys-%q{SLURM_JOB_ID}-%q{SLURM_PROCID} <command>"
    ),
    "nsys_gpu_metrics": (
        "srun nsys profile --trace=cuda,nvtx,cublas,cudnn --gpu-metrics-devices=all "
        "--duration=300 --output=nsys-%q{SLURM_JOB_ID}-%q{SLURM_PROCID} <command>"
    ),
    "nsys_distributed": (
        "NCCL_DEBUG=INFO srun nsys profile --trace=cuda,nvtx,osrt,mpi --duration=300 "
        "--output=nsys-%q{SLURM_JOB_ID}-%q{SLURM_PROCID} <command>"
    ),
    "torch": (
        "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, "
        "torch.profiler.ProfilerActivity.CUDA], schedule=torch.profiler.schedule(wait=1, "
        "warmup=1, active=5), on_trace_ready=torch.profiler.tensorboard_trace_handler("
        '"./profiler-logs")) as prof:  # then call prof.step() after every batch'
    ),
    "torch_memory": (
        "torch.cuda.memory._record_memory_history(max_entries=100000)  # then, after a few "
        'steps: torch.cuda.memory._dump_snapshot("memory-snapshot.pickle")'
    ),
    "site_health": "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER,ECC && dcgmi diag -r 2",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosis about a job, with the numbers that support it."""

    code: Code
    severity: Severity
    evidence: Mapping[str, Number]
    """Named numbers, the unit in each name (``duty_mean_pct``, ``idle_tail_s``)."""
    scope: Scope = Scope.JOB
    subject: str | None = None
    """Host name for ``Scope.NODE``, GPU UUID for ``Scope.GPU``, ``None`` for the job."""

    @property
    def cause(self) -> int | None:
        """Which of the seven causes (1–7); ``None`` for a site problem."""
        return CODES[self.code].cause

    @property
    def audience(self) -> Audience:
        """Who can act on it."""
        return CODES[self.code].audience

    @property
    def profiler(self) -> str | None:
        """Key of ``PROFILERS`` for the tool that shows this cause in detail."""
        return CODES[self.code].profiler

    @property
    def profiler_command(self) -> str | None:
        """The exact profiler command line, or ``None`` when no profiler helps."""
        key = self.profiler
        return PROFILERS[key] if key else None

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form (for the store and ``--json`` output)."""
        return {
            "code": self.code.value,
            "severity": self.severity.value,
            "cause": self.cause,
            "audience": self.audience.value,
            "scope": self.scope.value,
            "subject": self.subject,
            "evidence": dict(self.evidence),
            "profiler": self.profiler_command,
        }


class Option(StrEnum):
    """The ``#SBATCH`` option a recommendation changes."""

    GPUS = "gpus"
    MIG = "mig"
    CPUS_PER_GPU = "cpus_per_gpu"
    MEMORY = "memory"
    TIME = "time"
    SMALLER_GPU = "smaller_gpu"


#: The ``sbatch`` long option each kind of recommendation sets, where its lines do not say.
#: The enum's values are stored and cannot change; ``memory`` is ``--mem`` to sbatch.
OPTION_FLAGS: Mapping[Option, str] = {
    Option.GPUS: "--gres",
    Option.MIG: "--gres",
    Option.CPUS_PER_GPU: "--cpus-per-gpu",
    Option.MEMORY: "--mem",
    Option.TIME: "--time",
    Option.SMALLER_GPU: "--gres",
}

_LINE_FLAG = re.compile(r"^#SBATCH\s+(--[a-z][a-z-]*)")


def sbatch_flag(option: str, sbatch_lines: Sequence[str] = ()) -> str:
    """The sbatch long option a recommendation changes, for display: the last option its
    ``#SBATCH`` lines set (``--cpus-per-task``, ``--mem``), else the option's usual flag;
    never the enum's stored value (``memory`` is not an sbatch option)."""
    for line in reversed(sbatch_lines):
        match = _LINE_FLAG.match(line)
        if match:
            return match.group(1)
    try:
        return OPTION_FLAGS[Option(option)]
    except ValueError:
        return f"--{option.replace('_', '-')}"


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A better resource request for jobs like this one."""

    option: Option
    sbatch_lines: tuple[str, ...]
    """Copy-pasteable lines, e.g. ``#SBATCH --gres=gpu:1``."""
    current: str | None
    """What the job asked for, in the same form (``gpu:4``, ``04:00:00``); ``None`` if unknown."""
    proposed: str
    gpu_hours_saved: float | None
    """GPU-hours this job would have freed with the proposal; ``None`` where it frees none
    directly (a shorter ``--time`` lets the job start sooner, it does not save GPU time)."""
    safe_because: Mapping[str, Number] = field(default_factory=dict)
    """The observed peak the proposal keeps headroom over, and the headroom, unit in each name."""
    based_on_jobs: int = 1
    """How many jobs (this one plus similar past ones) the proposal covers."""
    finding: Code | None = None
    """The finding that motivated it, if any."""

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form."""
        return {
            "option": self.option.value,
            "sbatch_lines": list(self.sbatch_lines),
            "current": self.current,
            "proposed": self.proposed,
            "gpu_hours_saved": self.gpu_hours_saved,
            "safe_because": dict(self.safe_because),
            "based_on_jobs": self.based_on_jobs,
            "finding": self.finding.value if self.finding else None,
        }
