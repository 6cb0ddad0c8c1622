"""Our CPU and memory efficiencies against the real ``seff`` on the same real jobs.

``seff`` is Slurm's ``contribs/seff/seff`` from Debian's slurm-wlm source package of the
installed version (``share/testcluster/get-seff`` puts it in ``$TC_ROOT/bin/seff``; ``make deps``
runs it). Jobs with known behaviour are submitted as sgtest1, collected into the store, and then
seff's printed numbers are compared with ``gpueff --json`` (the job's owner, from the store) and
with ``slurm_gpu.analysis.metrics`` on the accounting record, to seff's two decimals.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import slurmtools

from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.analysis.metrics import (
    seff_cpu_efficiency_pct,
    seff_cpu_used_s,
    seff_mem_efficiency_pct,
    seff_ncpus,
    seff_pct_text,
)
from slurm_gpu.records import JobRecord

MIB = 1024**2

#: Child processes burn exactly this much CPU time each (process time, not wall time), so the
#: CPU efficiency is known whatever else the machine does.
BURN = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end:\n"
    "    pass\n"
)

#: A Python workload: burners (started before the memory is touched, so they share none of
#: it), then a block of written memory held until the job has run ``hold`` seconds.
WORKLOAD = f"""\
import subprocess, sys, time
t0 = time.monotonic()
burners, burn_s, mib, hold_s = (float(a) for a in sys.argv[1:5])
burn = {BURN!r}
procs = [subprocess.Popen([sys.executable, "-c", burn, str(burn_s)]) for _ in range(int(burners))]
block = b"\\x01" * (int(mib) << 20)
for p in procs:
    p.wait()
while time.monotonic() - t0 < hold_s:
    time.sleep(0.2)
print(len(block))
"""


@dataclass(frozen=True)
class Case:
    """One job: its sbatch options, its command, and what its numbers must roughly be."""

    options: tuple[str, ...]
    command: str
    cpu_pct: tuple[float, float]
    """Plausible range of seff's CPU efficiency (it must not agree on a meaningless 0)."""
    mem_pct: tuple[float, float]


CASES = {
    # One GPU, two cores burning 6 CPU-s each over ~20 s, ~200 MiB resident of --mem=1G.
    "gpu_burn": Case(
        ("--gres=gpu:1", "--cpus-per-task=2", "--mem=1G"),
        "python3 workload.py 2 6 200 20",
        (15.0, 60.0),
        (15.0, 30.0),
    ),
    # Two cores, mostly asleep: 1 CPU-s over ~15 s, ~50 MiB of --mem=500M.
    "sleepy": Case(
        ("--gres=gpu:1", "--cpus-per-task=2", "--mem=500M"),
        "python3 workload.py 1 1 50 15",
        (0.5, 15.0),
        (5.0, 25.0),
    ),
    # Memory per CPU: 3 cores × 256 MiB = 768 MiB allocated, ~100 MiB resident, one burner.
    "mem_per_cpu": Case(
        ("--gres=gpu:1", "--cpus-per-task=3", "--mem-per-cpu=256M"),
        "python3 workload.py 1 4 100 12",
        (3.0, 40.0),
        (8.0, 25.0),
    ),
}

#: A two-task srun step: seff 22.05 reports "Memory Utilized" as the largest task's peak ×
#: the step's task count ("estimated maximum"); we report the largest task's peak.
MULTI_TASK = Case(
    ("--gres=gpu:1", "--ntasks=2", "--mem-per-cpu=512M"),
    "srun python3 workload.py 0 0 150 15",
    (0.0, 100.0),
    (5.0, 50.0),
)


# --------------------------------------------------------------------------- seff's output


@dataclass(frozen=True)
class SeffReport:
    """The numbers ``seff JOBID`` printed, in seff's units."""

    text: str
    cores: int
    cpu_utilized_s: int
    cpu_efficiency: str
    """As printed, e.g. ``28.57%``."""
    core_walltime_s: int
    wall_clock_s: int
    memory_utilized: str
    """As printed, e.g. ``201.37 MB``."""
    memory_efficiency: str
    memory_allocated: str


def _duration_s(text: str) -> int:
    """seff's ``time2str`` back to seconds: ``[D-]HH:MM:SS``."""
    days, _, hms = text.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def kbytes2str(kbytes: float) -> str:
    """seff's ``kbytes2str``: KiB to ``%.2f`` in the largest binary unit below the value."""
    if kbytes == 0:
        return "0.00 MB"
    exp = int(math.log(kbytes) / math.log(1024))
    prefix = "KMGTPE"[exp] if exp < 6 else ""
    return f"{kbytes / 1024**exp:.2f} {prefix}B"


def _field(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text, re.MULTILINE)
    assert match is not None, f"seff printed no {pattern!r}:\n{text}"
    return match


def parse_seff(text: str) -> SeffReport:
    cores = re.search(r"^Cores: (\d+)$", text, re.MULTILINE)
    if cores is None:
        nodes = int(_field(r"^Nodes: (\d+)$", text)[1])
        ncores = nodes * int(_field(r"^Cores per node: (\d+)$", text)[1])
    else:
        ncores = int(cores[1])
    cpu = _field(r"^CPU Efficiency: ([\d.]+%) of (\S+) core-walltime$", text)
    mem = _field(r"^Memory Efficiency: ([\d.]+%) of ([\d.]+ \w+)", text)
    return SeffReport(
        text=text,
        cores=ncores,
        cpu_utilized_s=_duration_s(_field(r"^CPU Utilized: (\S+)$", text)[1]),
        cpu_efficiency=cpu[1],
        core_walltime_s=_duration_s(cpu[2]),
        wall_clock_s=_duration_s(_field(r"^Job Wall-clock time: (\S+)$", text)[1]),
        memory_utilized=_field(r"^Memory Utilized: ([\d.]+ \w+)", text)[1],
        memory_efficiency=mem[1],
        memory_allocated=mem[2],
    )


def seff_path() -> Path:
    return slurmtools.tc_root() / "bin" / "seff"


def run_seff(job_id: str) -> SeffReport:
    path = seff_path()
    if not path.is_file():
        pytest.fail(
            f"seff is missing ({path}): run share/testcluster/get-seff (make deps does)",
            pytrace=False,
        )
    proc = slurmtools.run_as(None, ["perl", str(path), job_id], check=False)
    assert proc.returncode == 0, f"seff {job_id} exited {proc.returncode}: {proc.stderr}"
    return parse_seff(proc.stdout)


# --------------------------------------------------------------------------- our side


@dataclass(frozen=True)
class Ours:
    gpueff: dict[str, Any]
    """The job's object in ``gpueff --json`` (as its owner, from the store)."""
    record: JobRecord
    """The accounting record (``SacctSource``, as root) the metrics are computed from."""


def _submit(case: Case, name: str) -> str:
    out = slurmtools.user_dir("sgtest1")
    (out / "workload.py").write_text(WORKLOAD)
    script = f"#!/bin/sh\n#SBATCH --time=00:05:00\n#SBATCH --job-name=seff-{name}\n{case.command}\n"
    return slurmtools.submit(script, "sgtest1", (f"--chdir={out}", *case.options))


def _collect(job_id: str) -> None:
    slurm_gpu = slurmtools.venv_python().parent / "slurm-gpu"
    cfg = str(slurmtools.slurm_gpu_config_path())
    slurmtools.run_as(
        None,
        [str(slurm_gpu), "--config", cfg, "collect", "--job", job_id, "--wait", "90"],
        timeout_s=120,
    )


def _ours(job_id: str) -> Ours:
    gpueff = slurmtools.venv_python().parent / "gpueff"
    cfg = str(slurmtools.slurm_gpu_config_path())
    proc = slurmtools.run_as("sgtest1", [str(gpueff), "--config", cfg, "--json", job_id])
    (job,) = json.loads(proc.stdout)["jobs"]
    assert job["telemetry"] == "final", job  # stored: the collector has ingested it
    record = SacctSource().get_jobs([job_id])[job_id]
    return Ours(gpueff=job, record=record)


@pytest.fixture(scope="module")
def jobs() -> dict[str, tuple[str, SeffReport, Ours]]:
    """name -> (job id, seff's report, our numbers), for every case and the multi-task job."""
    if not seff_path().is_file():
        pytest.fail(
            f"seff is missing ({seff_path()}): run share/testcluster/get-seff (make deps does)",
            pytrace=False,
        )
    cases = {**CASES, "multi_task": MULTI_TASK}
    ids = {name: _submit(case, name) for name, case in cases.items()}
    for name, job_id in ids.items():
        state = slurmtools.wait_done(job_id, timeout_s=240)
        assert state == "COMPLETED", f"{name} job {job_id} ended {state}"
    out = {}
    for name, job_id in ids.items():
        _collect(job_id)
        out[name] = (job_id, run_seff(job_id), _ours(job_id))
    return out


def _pct(value: float | None) -> str:
    return seff_pct_text(value)


# --------------------------------------------------------------------------- the comparisons


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_efficiency_agrees_with_seff(
    jobs: dict[str, tuple[str, SeffReport, Ours]], name: str
) -> None:
    job_id, seff, ours = jobs[name]
    low, high = CASES[name].cpu_pct
    assert low <= float(seff.cpu_efficiency.rstrip("%")) <= high, seff.text
    assert _pct(seff_cpu_efficiency_pct(ours.record)) == seff.cpu_efficiency, seff.text
    assert _pct(ours.gpueff["cpu_efficiency_pct"]) == seff.cpu_efficiency, (seff.text, ours)
    # The parts: cores, CPU Utilized, Job Wall-clock time, core-walltime.
    assert seff_ncpus(ours.record) == seff.cores == ours.gpueff["cpus"]
    assert seff_cpu_used_s(ours.record) == seff.cpu_utilized_s
    assert ours.record.elapsed_s == ours.gpueff["elapsed_s"] == seff.wall_clock_s
    assert seff.core_walltime_s == seff.wall_clock_s * seff.cores, job_id


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(CASES))
def test_memory_efficiency_agrees_with_seff(
    jobs: dict[str, tuple[str, SeffReport, Ours]], name: str
) -> None:
    _, seff, ours = jobs[name]
    low, high = CASES[name].mem_pct
    assert low <= float(seff.memory_efficiency.rstrip("%")) <= high, seff.text
    assert _pct(seff_mem_efficiency_pct(ours.record)) == seff.memory_efficiency, seff.text
    assert _pct(ours.gpueff["mem_efficiency_pct"]) == seff.memory_efficiency, (seff.text, ours)
    # Memory Utilized and the allocation, printed the way seff prints them.
    assert ours.record.max_rss_bytes is not None
    assert kbytes2str(ours.record.max_rss_bytes / 1024) == seff.memory_utilized, seff.text
    assert ours.gpueff["max_rss_bytes"] == ours.record.max_rss_bytes
    assert ours.record.alloc_tres.mem_bytes is not None
    assert kbytes2str(ours.record.alloc_tres.mem_bytes / 1024) == seff.memory_allocated


@pytest.mark.cluster
def test_multi_task_memory_is_seffs_estimate_divided_by_tasks(
    jobs: dict[str, tuple[str, SeffReport, Ours]],
) -> None:
    """seff 22.05 multiplies the largest task's peak by the step's tasks ("estimated
    maximum"); we keep the measured peak of the largest task. CPU still agrees."""
    _, seff, ours = jobs["multi_task"]
    assert "(estimated maximum)" in seff.text
    assert _pct(seff_cpu_efficiency_pct(ours.record)) == seff.cpu_efficiency, seff.text
    assert ours.record.max_rss_bytes is not None and ours.record.alloc_tres.mem_bytes
    tasks = 2
    assert kbytes2str(tasks * ours.record.max_rss_bytes / 1024) == seff.memory_utilized
    estimate = tasks * ours.record.max_rss_bytes / ours.record.alloc_tres.mem_bytes * 100
    assert _pct(estimate) == seff.memory_efficiency, seff.text
    assert _pct(ours.gpueff["mem_efficiency_pct"]) == _pct(estimate / tasks)


def test_seff_report_parser_reads_seffs_format() -> None:
    """The parser against seff's fixed print format (both the one-core and the node form)."""
    text = (
        "Job ID: 7\nCluster: c\nUser/Group: u/g\nState: COMPLETED (exit code 0)\n"
        "Nodes: 1\nCores per node: 2\nCPU Utilized: 00:00:12\n"
        "CPU Efficiency: 28.57% of 00:00:42 core-walltime\nJob Wall-clock time: 00:00:21\n"
        "Memory Utilized: 201.37 MB\nMemory Efficiency: 19.67% of 1.00 GB\n"
    )
    report = parse_seff(text)
    assert (report.cores, report.cpu_utilized_s, report.core_walltime_s) == (2, 12, 42)
    assert (report.cpu_efficiency, report.memory_efficiency) == ("28.57%", "19.67%")
    assert (report.memory_utilized, report.memory_allocated) == ("201.37 MB", "1.00 GB")
    assert _duration_s("1-02:03:04") == 93784
    assert kbytes2str(1024 * 1024) == "1.00 GB" and kbytes2str(0) == "0.00 MB"
    with pytest.raises(AssertionError):
        parse_seff("Job ID: 7\n")


def test_seff_is_the_installed_slurms() -> None:
    """get-seff records the source version it took seff from; it must be the installed one."""
    stamp = seff_path().with_name("seff.version")
    if not stamp.is_file():
        pytest.fail(f"{stamp} is missing: run share/testcluster/get-seff", pytrace=False)
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f=${source:Package} ${source:Version}", "slurm-client"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert stamp.read_text().strip() == installed
