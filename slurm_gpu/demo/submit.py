"""Submitting the demo jobs to a cluster and finding what the hooks captured for them.

The command runner is injected (``Runner``) so that tests can fake Slurm's commands; the CLI
passes ``subprocess.run``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu.capture.spool import list_sealed, read_record
from slurm_gpu.errors import SlurmGpuError, SpoolFormatError, UsageError
from slurm_gpu.records import GpuSummary, HostSummary, NodeRecord
from slurm_gpu.resources import data_dir

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv``, capturing text output, with a timeout so a hung daemon cannot hang us."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


def default_scripts_dir() -> Path:
    """``share/demo`` of a source checkout (the package lives beside it)."""
    return data_dir("share") / "demo"


@dataclass(frozen=True, slots=True)
class Submitted:
    pattern: str
    job_id: str


#: Submission order: with four GPUs, first-in-first-out scheduling then runs the eighteen GPUs of
#: the demo in rounds: 2+2; 2+1+1; 1+1+1+1, the task farm's 2 (~70 s) taking the first two
#: GPUs that free up; the four ranks sharing a GPU last, when all four are free. The task farm
#: and the ranks keep cores busy, so they never run beside the dataloader job, whose diagnosis
#: depends on the CPU time its own workers get.
DEMO_ORDER = (
    "healthy",
    "idle-gpu",
    "imbalance",
    "dataloader",
    "small-batch",
    "near-oom",
    "overtime",
    "idle-tail",
    "busy-empty",
    "task-farm",
    "ranks-share-gpu",
)

#: Patterns submitted with ``--mail-type=END``: their owner gets the e-mail after the job.
MAILED = ("idle-gpu", "dataloader", "small-batch", "near-oom")


def demo_order(patterns: Sequence[str]) -> list[str]:
    """``patterns`` in submission order (unknown names last, as given)."""
    rank = {p: i for i, p in enumerate(DEMO_ORDER)}
    return sorted(patterns, key=lambda p: rank.get(p, len(rank)))


def mail_program(runner: Runner = run_command) -> str | None:
    """Slurm's configured ``MailProg`` (from ``scontrol show config``), ``None`` if unknown."""
    result = runner(["scontrol", "show", "config"])
    if result.returncode != 0:
        return None
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MailProg":
            return value.strip() or None
    return None


def submit_all(
    scripts: Sequence[Path],
    *,
    user: str | None,
    python: str,
    config_path: str | None,
    extra_args: Mapping[str, Sequence[str]] | None = None,
    runner: Runner = run_command,
) -> list[Submitted]:
    """Submit each script with ``sbatch`` (as ``user`` through ``runuser`` when given).

    The job gets ``SLURM_GPU_PYTHON`` (the interpreter with slurm_gpu installed) and
    ``SLURM_GPU_CONFIG``; its output goes to ``/tmp/slurm-gpu-demo-<user>-<jobid>.out``.
    ``extra_args`` adds sbatch options per pattern (``--mail-type=END``).
    Raises ``UsageError`` with sbatch's message when a submission is refused.
    """
    export = f"ALL,SLURM_GPU_PYTHON={python}"
    if config_path:
        export += f",SLURM_GPU_CONFIG={config_path}"
    out = []
    for script in scripts:
        argv = [
            "sbatch",
            "--parsable",
            "--chdir=/tmp",
            "--output=/tmp/slurm-gpu-demo-%u-%j.out",
            f"--export={export}",
            *(extra_args or {}).get(script.name.removesuffix(".sbatch"), ()),
            str(script),
        ]
        if user:
            argv = ["runuser", "-u", user, "--", *argv]
        result = runner(argv)
        if result.returncode != 0:
            raise UsageError(
                f"sbatch refused {script.name}: {result.stderr.strip() or result.stdout.strip()}",
                hint="is the test cluster running? (share/testcluster/start)",
            )
        job_id = result.stdout.strip().split(";")[0]
        out.append(Submitted(script.name.removesuffix(".sbatch"), job_id))
    return out


def active_jobs(job_ids: Sequence[str], runner: Runner = run_command) -> set[str]:
    """Which of ``job_ids`` squeue still lists (pending, running or completing)."""
    result = runner(["squeue", "-h", "-o", "%i"])
    if result.returncode != 0:
        raise UsageError(f"squeue failed: {result.stderr.strip()}", hint="is slurmctld running?")
    listed = {line.strip() for line in result.stdout.splitlines()}
    return {j for j in job_ids if j in listed}


#: Seconds between two progress lines while no job ends (``wait_for``).
PROGRESS_EVERY_S = 30.0


def wait_for(
    job_ids: Sequence[str],
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    runner: Runner = run_command,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[str], None] | None = None,
) -> set[str]:
    """Wait until none of ``job_ids`` is in squeue any more; returns those still there at the
    timeout (empty when all ended). ``progress`` gets a line (``3 of 11 jobs done, 42 s``)
    at the start, whenever a job ends and every ``PROGRESS_EVERY_S`` in between, so that a
    wait of minutes is never silent."""
    start = clock()
    deadline = start + timeout_s
    said: tuple[int, float] | None = None
    while True:
        left = active_jobs(job_ids, runner)
        now = clock()
        done = len(job_ids) - len(left)
        if progress is not None and (
            said is None or done != said[0] or now - said[1] >= PROGRESS_EVERY_S
        ):
            progress(f"  {done} of {len(job_ids)} jobs done, {now - start:.0f} s")
            said = (done, now)
        if not left or now >= deadline:
            return left
        sleep(poll_s)


def job_states(job_ids: Sequence[str], runner: Runner = run_command) -> dict[str, str]:
    """Final state of each job from sacct (empty where sacct does not answer)."""
    if not job_ids:
        return {}
    result = runner(["sacct", "-n", "-P", "-X", "-o", "JobIDRaw,State", "-j", ",".join(job_ids)])
    states: dict[str, str] = {}
    if result.returncode == 0:
        for line in result.stdout.splitlines():
            job, _, state = line.partition("|")
            states[job.strip()] = state.split(" ")[0]
    return states


def find_records(
    spool_dir: str,
    job_ids: Sequence[str],
    *,
    wait_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, list[NodeRecord] | str]:
    """Sealed records per job id, or a short reason why there is none.

    Waits up to ``wait_s`` for epilogs that are still sealing.
    """
    found: dict[str, list[NodeRecord] | str] = {}
    waited = 0.0
    while True:
        sealed = [s for s in list_sealed(spool_dir) if s.job_id in job_ids]
        for job in job_ids:
            records: list[NodeRecord] = []
            for entry in sealed:
                if entry.job_id != job:
                    continue
                try:
                    records.append(read_record(entry.path))
                except (SpoolFormatError, SlurmGpuError) as exc:
                    found[job] = f"unreadable record: {exc}"
            if records:
                found[job] = records
        missing = [j for j in job_ids if j not in found]
        if not missing or waited >= wait_s:
            break
        sleep(1.0)
        waited += 1.0
    for job in job_ids:
        if job not in found:
            job_dir = os.path.join(spool_dir, job)
            found[job] = (
                "spool exists but no sealed record (epilog not run, or already collected)"
                if os.path.isdir(job_dir)
                else "nothing captured in the spool (hooks not installed, or already collected)"
            )
    return found


def describe_gpu(gpu: GpuSummary) -> str:
    """One line about one GPU of a sealed record."""
    util = gpu.utilization
    mean = util.mean
    mem = gpu.memory_used_max_bytes
    parts = [
        f"{gpu.info.uuid} (minor {gpu.info.minor_number})",
        f"{gpu.samples_available}/{gpu.samples} readings",
        f"util mean {mean:.1f}%" if mean is not None else "util n/a",
        f"p10 {util.percentile(10):.0f} p90 {util.percentile(90):.0f}" if util.n else "",
        f"mem max {mem / 2**30:.1f} GiB" if mem is not None else "mem n/a",
        "process seen" if gpu.process_seen else "NO PROCESS",
    ]
    if gpu.nvlink_bytes:
        parts.append(f"nvlink {gpu.nvlink_bytes / 1e9:.1f} GB")
    return ", ".join(p for p in parts if p)


def describe_host(host: HostSummary) -> str:
    """One line about the job's CPU and memory on one node."""
    busy = host.cpu_cores_busy.mean
    parts = [
        f"cpu {host.cpu_time_s:.1f} s" if host.cpu_time_s is not None else "cpu n/a",
        f"cores busy mean {busy:.0f}% of {host.allocated_cores}" if busy is not None else "",
        f"rss max {host.rss_max_bytes / 2**20:.0f} MiB" if host.rss_max_bytes else "",
        f"({host.method})",
    ]
    return ", ".join(p for p in parts if p)
