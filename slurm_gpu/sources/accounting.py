"""The accounting-only source (``slurm-tres``): per-step GPU means from Slurm accounting.

Where Slurm's NVML GPU plugin runs (``AccountingStorageTRES=gres/gpumem,gres/gpuutil``, an
``acct_gather`` of tasks, real NVIDIA GPUs), slurmstepd records for every step the GPU
utilisation and GPU memory of its tasks in ``TRESUsageInAve`` (mean over the tasks) and
``TRESUsageInMax`` (the largest task)::

    cpu=00:56:24,energy=0,fs/disk=350130624578,gres/gpumem=38888M,gres/gpuutil=100,mem=...

This is the floor where nothing else exists: per step, one mean duty cycle and one GPU memory
peak, no time series, no process list, no host series, no power (``sourcecaps``:
``slurm-tres``). Each node of the job gets a ``NodeRecord`` built through the same streaming
aggregates the hooks use, one reading per step that ran there:

* a task's ``gres/gpuutil`` is taken as the sum over the GPUs it used (the plugin adds the
  per-device figures), so a GPU's duty cycle is ``TRESUsageInAve`` divided by the step's GPUs
  per task (its ``gres/gpu`` over ``NTasks``), at most 100 %; likewise ``gres/gpumem`` of
  ``TRESUsageInMax`` per GPU for the memory peak. With one GPU per task, the common case,
  the figure is read as it is;
* the ``extern`` step never runs the job's programs and is skipped; the ``batch`` step counts
  only on a node where no numbered (``srun``) step ran, since a script that launches steps
  holds no GPU itself and would read as an idle GPU;
* the GPUs are named ``<host>/gpu<i>`` (accounting does not know their UUIDs) and their
  capacity is unknown, so rules on the share of GPU memory used stay silent;
* a node of the job with no step reading is reported missing; when no step of the job has
  ``gres/gpuutil`` at all (Slurm's plugin not running), every node is.

One ``sacct`` call per job, asking only for fields no user can type.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.accounting.runner import CommandRunner, SubprocessRunner
from slurm_gpu.accounting.sacct import SACCT_ENV, split_records
from slurm_gpu.accounting.tres import mem_bytes, parse_tres
from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.config import Settings
from slurm_gpu.errors import AccountingError, SlurmGpuError, TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuSample, JobRecord, NodeRecord
from slurm_gpu.sourcecaps import CAPABILITIES, SourceCapabilities
from slurm_gpu.sources.base import SourceResult

NAME = "slurm-tres"

#: Fields of the per-step query, ``JobIDRaw`` repeated last as the record terminator.
STEP_FIELDS: tuple[str, ...] = (
    "JobIDRaw",
    "NodeList",
    "NTasks",
    "AllocTRES",
    "ElapsedRaw",
    "Start",
    "End",
    "TRESUsageInAve",
    "TRESUsageInMax",
    "JobIDRaw",
)
DELIM = "\x1f|\x1f"


@dataclasses.dataclass(frozen=True, slots=True)
class StepUsage:
    """One step's GPU usage as accounting recorded it."""

    step_id: str
    hosts: tuple[str, ...]
    start_s: float | None
    end_s: float | None
    elapsed_s: float
    gpus_per_task: int
    """The step's GPUs over its tasks (at least 1)."""
    util_pct: float | None
    """``gres/gpuutil`` of ``TRESUsageInAve`` per GPU, percent (``None``: not recorded)."""
    mem_max_bytes: int | None
    """``gres/gpumem`` of ``TRESUsageInMax`` per GPU, bytes."""


def usage_value(tres: str, name: str) -> str | None:
    """The value of ``name`` in a TRES usage list (``gres/gpuutil=100,...``), else ``None``."""
    for entry in tres.split(","):
        key, sep, value = entry.strip().partition("=")
        if sep and key == name:
            return value.strip()
    return None


def parse_steps(stdout: bytes | str, job_id: str) -> list[StepUsage]:
    """The steps of ``job_id`` in the output of the per-step query. Lines of other jobs and
    malformed lines are skipped."""
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    rows, _ = split_records(text, STEP_FIELDS, DELIM)
    out: list[StepUsage] = []
    for row in rows:
        rec = dict(zip(STEP_FIELDS, row, strict=False))
        raw = rec.get("JobIDRaw", "")
        head, dot, step = raw.partition(".")
        if head != job_id or not dot or step == "extern":
            continue
        try:
            hosts = expand_hostlist(rec.get("NodeList", ""))
        except SlurmGpuError:
            continue
        ave = rec.get("TRESUsageInAve", "")
        peak = rec.get("TRESUsageInMax", "")
        tasks = _int(rec.get("NTasks", ""))
        gpus = parse_tres(rec.get("AllocTRES", "")).gpus if rec.get("AllocTRES") else None
        per_task = max(1, round(gpus / tasks)) if gpus and tasks else 1
        util = _float(usage_value(ave, "gres/gpuutil"))
        mem_text = usage_value(peak, "gres/gpumem")
        mem = mem_bytes(mem_text) if mem_text else None
        elapsed = _float(rec.get("ElapsedRaw", ""))
        out.append(
            StepUsage(
                step_id=step,
                hosts=hosts,
                start_s=_float(rec.get("Start", "")),
                end_s=_float(rec.get("End", "")),
                elapsed_s=elapsed if elapsed is not None else 0.0,
                gpus_per_task=per_task,
                util_pct=None if util is None else min(100.0, util / per_task),
                mem_max_bytes=None if mem is None else mem // per_task,
            )
        )
    return out


def node_records(job: JobRecord, steps: Sequence[StepUsage], *, idle_pct: float) -> SourceResult:
    """The job's node records from its steps' usage (module docstring)."""
    hosts = job.nodelist
    nnodes = max(1, len(hosts))
    gpus_per_node = math.ceil((job.alloc_tres.gpus or 0) / nnodes)
    measured = [s for s in steps if s.util_pct is not None]
    if not measured or gpus_per_node == 0:
        note = "no gres/gpuutil in accounting (Slurm's NVML GPU plugin not recording)"
        return SourceResult((), tuple(hosts), (note,))
    nodes: list[NodeRecord] = []
    missing: list[str] = []
    start = job.start_s or min((s.start_s or 0.0) for s in measured)
    end = job.end_s or max((s.end_s or start) for s in measured)
    for host in hosts:
        here = [s for s in measured if host in s.hosts]
        numbered = [s for s in here if s.step_id[:1].isdigit()]
        here = numbered or here
        if not here:
            missing.append(host)
            continue
        infos = [GpuInfo(uuid=f"{host}/gpu{i}", index=i) for i in range(gpus_per_node)]
        agg = NodeAggregator(
            job_id=job.job_id,
            hostname=host,
            uid=job.uid,
            interval_s=float(max(1, job.elapsed_s)),
            source=NAME,
            gpus=infos,
            started_s=start,
            idle_threshold_pct=idle_pct,
        )
        for s in sorted(here, key=lambda s: s.end_s or 0.0):
            t = s.end_s or end
            samples = [
                GpuSample(
                    uuid=info.uuid,
                    time_s=t,
                    utilization_pct=s.util_pct,
                    memory_used_bytes=s.mem_max_bytes,
                    processes=None,
                )
                for info in infos
            ]
            agg.add(t, samples, None)
        record = agg.record(
            ended_s=end,
            complete=True,
            notes=(f"per-step means of {len(here)} step(s) from Slurm accounting",),
        )
        # Per-step means are no time series: the aggregates' buckets would read as one.
        nodes.append(dataclasses.replace(record, timeline=()))
    return SourceResult(tuple(nodes), tuple(missing), ())


class SlurmTresSource:
    """``TelemetrySource`` reading per-step GPU TRES with ``sacct`` (``runner`` injectable)."""

    def __init__(
        self,
        *,
        sacct_path: str = "sacct",
        timeout_s: float = 60.0,
        idle_pct: float = 1.0,
        runner: CommandRunner | None = None,
    ) -> None:
        self.sacct_path = sacct_path
        self.timeout_s = timeout_s
        self.idle_pct = idle_pct
        self.runner: CommandRunner = runner or SubprocessRunner()

    @property
    def capabilities(self) -> SourceCapabilities:
        return CAPABILITIES[NAME]

    def argv(self, job_id: str) -> list[str]:
        """The per-step query of one job."""
        return [
            self.sacct_path,
            "--parsable2",
            "--noheader",
            f"--delimiter={DELIM}",
            "--format=" + ",".join(STEP_FIELDS),
            f"--jobs={job_id}",
        ]

    def records_for(self, job: JobRecord) -> SourceResult:
        """See ``TelemetrySource.records_for``; ``TelemetryUnavailableError`` when sacct
        cannot be run or fails."""
        env: Mapping[str, str] = SACCT_ENV
        try:
            done = self.runner(self.argv(job.job_id), env=env, timeout_s=self.timeout_s)
        except AccountingError as exc:
            raise TelemetryUnavailableError(f"sacct for job {job.job_id}: {exc}") from None
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0][:200]
            raise TelemetryUnavailableError(
                f"sacct for job {job.job_id} exited {done.returncode}: {first}"
            )
        steps = parse_steps(done.stdout, job.job_id)
        return node_records(job, steps, idle_pct=self.idle_pct)


def make_source(settings: Settings, name: str) -> SlurmTresSource:
    """The registry's factory (``sources.registry``)."""
    return SlurmTresSource(
        sacct_path=settings.accounting.sacct_path,
        timeout_s=settings.accounting.timeout_s,
        idle_pct=settings.telemetry.idle_threshold_pct,
    )


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


__all__ = [
    "DELIM",
    "NAME",
    "STEP_FIELDS",
    "SlurmTresSource",
    "StepUsage",
    "make_source",
    "node_records",
    "parse_steps",
    "usage_value",
]
