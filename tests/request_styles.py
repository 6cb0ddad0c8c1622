"""The request-style check shared by the test cluster (22.05) and the version lab (24.11, 26.05):
every recommended set, in the job's own request style, is accepted by that Slurm's
``sbatch --test-only`` and never asks for less than the observed peak plus headroom (issue 26,
point 5).

A ``StyleCase`` is a job as accounting would give it: its SubmitLine in one request style
(``--gres`` with and without a type, ``--gpus``, ``--gpus-per-node``, ``--gpus-per-task``, with
``--cpus-per-task`` or ``--cpus-per-gpu``, ``--mem``, ``--mem-per-gpu`` or ``--mem-per-cpu``)
and one GPU of two unused; a ``JobShape`` is what it used (busiest cores, memory peak) and its
memory request, sized by each cluster for its nodes. ``check_style`` applies the recommended
lines to the job's own option set, as a user pasting them into the script would, asks the
cluster's ``sbatch --test-only`` (a callable of the options) and checks the processors it
would allocate against the busiest cores plus ``headroom_cpu_pct``, and the GPUs and memory
asked against the GPUs used and the memory peak plus ``headroom_mem_pct``.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "unit"))

from analysis_factory import GIB, gpu, host, job, node, timeline

from slurm_gpu.accounting.batchscript import directives_of
from slurm_gpu.analysis import analyze
from slurm_gpu.analysis.engine import Analysis
from slurm_gpu.analysis.request import request_of
from slurm_gpu.config import AnalysisSettings

#: ``sbatch --test-only`` of an option set ({long option: value}).
TestOnly = Callable[[dict[str, str]], "subprocess.CompletedProcess[str]"]

#: The old advice pasted into a ``--gpus=2`` script: a typed ``--gres`` next to an untyped
#: ``--gpus`` (22.05: "Invalid GRES specification (with and without type identification)").
OLD_TYPED_GRES_IN_A_GPUS_SCRIPT = {"--gpus": "2", "--gres": "gpu:a100:1"}


@dataclass(frozen=True, slots=True)
class StyleCase:
    """One request style: the job's options and the lines the advice must hold.
    ``in_script``: the options are the batch script's ``#SBATCH`` lines (one a line) and the
    submit line is a plain ``sbatch job.sh``; else they are on the submit line."""

    options: str
    expected: tuple[str, ...]
    in_script: bool = False


@dataclass(frozen=True, slots=True)
class JobShape:
    """What the job used and asked, sized for one cluster's nodes."""

    peak_cores: float
    """Busiest cores of the job (cores)."""
    rss_bytes: int
    """Memory peak (bytes)."""
    mem_bytes: int
    """The job's memory request, the same total in every style of the cluster (bytes)."""
    settings: AnalysisSettings


_OPTION = re.compile(r"^(--[a-z-]+|-[A-Za-z])(?:=(.*))?$")
_SHORT = {"-c": "--cpus-per-task", "-n": "--ntasks", "-G": "--gpus", "-N": "--nodes"}
_UNITS = {"K": 1024, "M": 1024**2, "G": GIB, "T": 1024 * GIB}


def options_of(text: str) -> dict[str, str]:
    """``--gres=gpu:2 -c 8`` -> {``--gres``: ``gpu:2``, ``--cpus-per-task``: ``8``}."""
    words = text.split()
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        match = _OPTION.match(words[i])
        assert match, words[i]
        name, value = match.group(1), match.group(2)
        if value is None:
            i += 1
            value = words[i]
        out[_SHORT.get(name, name)] = value
        i += 1
    return out


def mem_bytes(value: str) -> int:
    """sbatch's memory size (``512M``, ``4G``; MiB without a unit) in bytes."""
    if value[-1] in _UNITS:
        return int(value[:-1]) * _UNITS[value[-1]]
    return int(value) * 1024**2


def cpus_of(options: dict[str, str]) -> int:
    """The CPUs Slurm allocates for ``options`` (2 GPUs): per GPU, or per task × tasks."""
    if "--cpus-per-gpu" in options:
        return int(options["--cpus-per-gpu"]) * 2
    return int(options.get("--cpus-per-task", "1")) * int(options.get("--ntasks", "1"))


def analysis_of(options: str, shape: JobShape, *, in_script: bool = False) -> Analysis:
    """The diagnosis of a 2-GPU job submitted with ``options`` (on its submit line, or as its
    script's ``#SBATCH`` lines with ``in_script``): GPU-0 busy, GPU-1 never used,
    ``shape.peak_cores`` busy cores and ``shape.rss_bytes`` of memory throughout an hour."""
    cpus = cpus_of(options_of(options))
    j = job(
        gpus=2,
        cpus=cpus,
        mem=shape.mem_bytes,
        max_rss=shape.rss_bytes,
        total_cpu=shape.peak_cores * 3600.0,
    )
    if in_script:
        script = "#!/bin/sh\n" + "".join(f"#SBATCH {o}\n" for o in shlex.split(options))
        j = replace(j, submit_line="sbatch job.sh", batch_directives=directives_of(script))
    else:
        j = replace(j, submit_line=f"sbatch {options} job.sh")
    tl = timeline([90.0] * 10, [shape.peak_cores] * 10, n_gpus=2)
    gpus = [gpu("GPU-0", duty=90.0), gpu("GPU-1", duty=0.0, process=False)]
    summary = host(cores=cpus, busy_frac=shape.peak_cores / cpus, rss_max_bytes=shape.rss_bytes)
    return analyze(j, [node(gpus, tl=tl, host_summary=summary)], shape.settings)


def _gpus_asked(after: dict[str, str]) -> int:
    """The GPUs the option set asks for (the smallest of its GPU options)."""
    got = [
        int(after[k].rsplit(":", 1)[-1])
        for k in ("--gres", "--gpus", "--gpus-per-node")
        if k in after
    ]
    req = request_of(
        replace(job(), submit_line="sbatch " + " ".join(f"{k}={v}" for k, v in after.items()))
    )
    if req.gpus_per_task:
        got.append(int(after["--ntasks"]) * req.gpus_per_task)
    assert got, after
    return min(got)


def check_style(
    case: StyleCase, shape: JobShape, test_only: TestOnly
) -> tuple[dict[str, str], int]:
    """The whole check of one style on one cluster; returns the recommended option set and
    the processors ``sbatch --test-only`` said it would allocate for it."""
    before = options_of(case.options)
    proc = test_only(before)
    assert proc.returncode == 0, ("the job as submitted", before, proc.stderr)
    a = analysis_of(case.options, shape, in_script=case.in_script)
    lines = [line for r in a.recommendations for line in r.sbatch_lines]
    for want in case.expected:
        assert want in lines, lines
    after = dict(before)
    for line in lines:
        name, _, value = line.removeprefix("#SBATCH ").partition("=")
        after[name] = value
    proc = test_only(after)
    assert proc.returncode == 0, (after, proc.stderr)
    # "sbatch: Job N to start at T using P processors on nodes ..."
    processors = re.search(r"using (\d+) processors", proc.stderr + proc.stdout)
    assert processors, proc.stderr
    allocated = int(processors.group(1))
    settings = shape.settings
    need_cores = math.ceil(shape.peak_cores * (1 + settings.headroom_cpu_pct / 100.0) - 1e-9)
    assert allocated >= need_cores, (after, proc.stderr)
    gpu_count = _gpus_asked(after)
    assert gpu_count >= a.metrics.gpus_used, (after, a.metrics.gpus_used)
    if "--mem" in after:
        mem = mem_bytes(after["--mem"])
    elif "--mem-per-gpu" in after:
        mem = mem_bytes(after["--mem-per-gpu"]) * gpu_count
    else:
        mem = mem_bytes(after["--mem-per-cpu"]) * allocated
    assert mem >= shape.rss_bytes * (1 + settings.headroom_mem_pct / 100.0), (after, mem)
    return after, allocated
