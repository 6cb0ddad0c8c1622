"""What Slurm says of the running jobs: who, where, since when, and which GPUs on which node.

The live policy and the live view start from Slurm's running jobs, not from the live data, so
a job whose node sends nothing is still listed (with its reason). Two commands, one call each
per pass whatever the number of jobs:

- ``squeue -h -t R -o '%A|%u|%a|%P|%q|%S|%N'`` with ``SLURM_TIME_FORMAT=%s``: raw job id, user,
  account, partition, QOS, start time (unix seconds, slurmctld's clock) and node list;
- ``scontrol -d show job``: per job and node, the GPU indices Slurm allocated
  (``Nodes=gpu-01 CPU_IDs=0-7 Mem=0 GRES=gpu:a100:2(IDX:0-1)``).

A job that holds no GPU on any node is not a GPU job and is left out. A job whose detail is
contradictory (a node listed twice, a record given twice: a job name can hold a line break)
keeps ``conflict`` set and is never acted on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.accounting.runner import CommandRunner
from slurm_gpu.errors import AccountingError
from slurm_gpu.textsafe import clean_command_message

#: squeue's format: raw job id (unique per array element), user, account, partition, QOS,
#: start time, node list. None of these may contain "|" (Slurm's names).
SQUEUE_FORMAT = "%A|%u|%a|%P|%q|%S|%N"
#: squeue's times as unix seconds (a strftime format; Slurm hands it to strftime).
TIME_FORMAT = "%s"

_DETAIL = re.compile(r"^\s+Nodes=(\S+) CPU_IDs=\S* Mem=\S+ GRES=(\S*)\s*$")
_GPU_GRES = re.compile(r"gpu(?::[^:(,]+)?:\d+\(IDX:([0-9,\-]+)\)")
_JOB_ID = re.compile(r"^JobId=([0-9]+)\b")


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """A running job as Slurm lists it."""

    job_id: str
    user: str
    account: str
    partition: str
    qos: str
    nodes: tuple[str, ...]
    start_s: float | None = None
    """Start time by slurmctld's clock, unix seconds; ``None`` when squeue gave none."""
    gpu_idx: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """GPU indices Slurm allocated, per node (``scontrol -d show job``); empty: not read."""
    conflict: str = ""
    """Why Slurm's detail of the job cannot be trusted ("" when it can)."""


def _cmd(slurm_bin: str, name: str) -> str:
    return f"{slurm_bin.rstrip('/')}/{name}" if slurm_bin else name


def parse_squeue(text: str) -> dict[str, SlurmJob]:
    """Running jobs by raw id from ``SQUEUE_FORMAT`` lines; unreadable lines are dropped."""
    jobs = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 7 or not fields[0].isdigit():
            continue
        job_id, user, account, partition, qos, start, nodes = fields
        try:
            hosts = expand_hostlist(nodes)
        except Exception:
            continue  # a node list we cannot read: the job is not judged (missing in Slurm)
        try:
            start_s: float | None = float(start)
        except ValueError:
            start_s = None
        jobs[job_id] = SlurmJob(job_id, user, account, partition, qos, tuple(hosts), start_s)
    return jobs


def _indices(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(part)
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_gpu_detail(text: str) -> tuple[dict[str, dict[str, tuple[int, ...]]], set[str]]:
    """(job id -> node -> GPU indices, ids whose detail contradicts itself) from
    ``scontrol -d show job``."""
    alloc: dict[str, dict[str, tuple[int, ...]]] = {}
    conflicts: set[str] = set()
    seen_records: set[str] = set()
    job = ""
    for line in text.splitlines():
        m = _JOB_ID.match(line)
        if m:
            job = m.group(1)
            if job in seen_records:
                conflicts.add(job)
            seen_records.add(job)
            continue
        d = _DETAIL.match(line)
        if not d or not job:
            continue
        idx: list[int] = []
        try:
            for found in _GPU_GRES.findall(d.group(2)):
                idx.extend(_indices(found))
            nodes = expand_hostlist(d.group(1))
        except Exception:
            conflicts.add(job)
            continue
        per_node = alloc.setdefault(job, {})
        for node in nodes:
            if node in per_node:
                conflicts.add(job)
            per_node[node] = tuple(sorted(set(idx)))
    return alloc, conflicts


def running_gpu_jobs(
    runner: CommandRunner, slurm_bin: str, timeout_s: float
) -> dict[str, SlurmJob]:
    """Slurm's running jobs that hold a GPU on some node, by raw id, with their GPU indices;
    ``AccountingError`` when either command fails."""
    queue = _run(
        runner, [_cmd(slurm_bin, "squeue"), "-h", "-t", "R", "-o", SQUEUE_FORMAT], timeout_s
    )
    detail = _run(runner, [_cmd(slurm_bin, "scontrol"), "-d", "show", "job"], timeout_s)
    alloc, conflicts = parse_gpu_detail(detail)
    out = {}
    for job_id, job in parse_squeue(queue).items():
        per_node = {n: i for n, i in alloc.get(job_id, {}).items() if i}
        if not per_node:
            continue  # no GPU on any node: not a GPU job
        why = ""
        if job_id in conflicts:
            why = "Slurm's detail of the job contradicts itself"
        elif not set(per_node) <= set(job.nodes):
            why = "Slurm's GPU detail names a node outside the job's node list"
        out[job_id] = SlurmJob(
            job.job_id,
            job.user,
            job.account,
            job.partition,
            job.qos,
            job.nodes,
            job.start_s,
            per_node,
            why,
        )
    return out


def _run(runner: CommandRunner, argv: list[str], timeout_s: float) -> str:
    result = runner(argv, env={"SLURM_TIME_FORMAT": TIME_FORMAT}, timeout_s=timeout_s)
    if result.returncode != 0:
        name = argv[0].rsplit("/", 1)[-1]
        raise AccountingError(
            f"{name} failed (exit {result.returncode}): {clean_command_message(result.stderr)}",
            hint="slurmctld must answer for the live policy and view",
        )
    return result.stdout.decode("utf-8", "replace")
