"""Every recommended set, in the job's own request style, is accepted by ``sbatch --test-only``
on the test cluster, and never asks for less than the observed peak plus headroom (issue 26,
point 5).

Each case is a job as accounting would give it (its SubmitLine in one request style: ``--gres``
with and without a type, ``--gpus``, ``--gpus-per-node``, ``--gpus-per-task``, with
``--cpus-per-task`` or ``--cpus-per-gpu``, ``--mem``, ``--mem-per-gpu`` or ``--mem-per-cpu``)
and one GPU of two unused. The recommended lines replace the options they name in the job's own
option set, as a user pasting them into the script would, and ``sbatch --test-only`` must
accept the result; the processors it would allocate must cover the busiest cores plus
``headroom_cpu_pct``, and the GPUs and memory asked for the GPUs used and the memory peak plus
headroom.

Runs only ``sbatch --test-only`` (no job starts) and reads nothing of the cluster's own hooks.
Run it alone, under the cluster lock, without the directory's conftest (which, as root, would
run the cluster's start script):

    flock /work/cluster.lock env PYTHONPATH=$PWD .venv/bin/python -m pytest -p no:cacheprovider \\
        --noconftest -q tests/integration/test_request_style_cluster.py
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

import slurmtools
from analysis_factory import GIB, gpu, host, job, node, timeline

from slurm_gpu.analysis import analyze
from slurm_gpu.analysis.request import request_of
from slurm_gpu.config import AnalysisSettings

pytestmark = pytest.mark.cluster

#: Memory findings from 1 GiB unused (the test node is small); everything else as shipped.
S = AnalysisSettings(mem_unused_min_bytes=GIB)
PEAK_CORES = 3.0
RSS = GIB // 2

#: (submit line options, the lines the advice must hold).
CASES: list[tuple[str, tuple[str, ...]]] = [
    ("--gres=gpu:2 -c 8 --mem=4G", ("#SBATCH --gres=gpu:1",)),
    ("--gres=gpu:a100:2 --cpus-per-gpu=2 --mem=4G", ("#SBATCH --gres=gpu:a100:1",)),
    ("--gpus=2 --cpus-per-gpu=2 --mem-per-gpu=2G", ("#SBATCH --gpus=1",)),
    ("--gpus-per-node=2 --cpus-per-task=8 --mem-per-cpu=512M", ("#SBATCH --gpus-per-node=1",)),
    ("--ntasks=2 --gpus-per-task=1 --cpus-per-task=2 --mem=4G", ("#SBATCH --ntasks=1",)),
    ("--gpus=a100:2 --cpus-per-gpu=4 --mem=4G", ("#SBATCH --gpus=a100:1",)),
]

_OPTION = re.compile(r"^(--[a-z-]+|-[A-Za-z])(?:=(.*))?$")
_SHORT = {"-c": "--cpus-per-task", "-n": "--ntasks", "-G": "--gpus", "-N": "--nodes"}


def _options(text: str) -> dict[str, str]:
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


def _mem(value: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": GIB, "T": 1024 * GIB}
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value) * 1024**2


def _cpus(options: dict[str, str]) -> int:
    """The CPUs Slurm allocates for ``options`` (2 GPUs): per GPU, or per task × tasks."""
    if "--cpus-per-gpu" in options:
        return int(options["--cpus-per-gpu"]) * 2
    return int(options.get("--cpus-per-task", "1")) * int(options.get("--ntasks", "1"))


def _analysis(options: str):  # type: ignore[no-untyped-def]
    cpus = _cpus(_options(options))
    j = job(gpus=2, cpus=cpus, mem=4 * GIB, max_rss=RSS, total_cpu=PEAK_CORES * 3600.0)
    j = replace(j, submit_line=f"sbatch {options} job.sh")
    tl = timeline([90.0] * 10, [PEAK_CORES] * 10, n_gpus=2)
    gpus = [gpu("GPU-0", duty=90.0), gpu("GPU-1", duty=0.0, process=False)]
    rec = node(
        gpus, tl=tl, host_summary=host(cores=cpus, busy_frac=PEAK_CORES / cpus, rss_max_bytes=RSS)
    )
    return analyze(j, [rec], S)


def _test_only(options: dict[str, str], job_dir: Path) -> subprocess.CompletedProcess[str]:
    argv = ["sbatch", "--test-only", "--time=00:10:00", *(f"{k}={v}" for k, v in options.items())]
    argv.append("--wrap=true")
    return slurmtools.run_as("sgtest1", argv, cwd=job_dir, check=False)


@pytest.fixture(scope="module")
def job_dir() -> Iterator[Path]:
    if not slurmtools.controller_up():
        pytest.fail("slurmctld does not answer: the test cluster must be running", pytrace=False)
    path = slurmtools.user_dir("sgtest1")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(("options", "expected"), CASES, ids=[c[0] for c in CASES])
def test_recommended_set_in_the_jobs_style_is_accepted_and_covers_the_peak(
    options: str, expected: tuple[str, ...], job_dir: Path
) -> None:
    before = _options(options)
    assert _test_only(before, job_dir).returncode == 0  # the job as it was submitted
    a = _analysis(options)
    lines = [line for r in a.recommendations for line in r.sbatch_lines]
    for want in expected:
        assert want in lines, lines
    after = dict(before)
    for line in lines:
        name, _, value = line.removeprefix("#SBATCH ").partition("=")
        after[name] = value
    proc = _test_only(after, job_dir)
    assert proc.returncode == 0, (after, proc.stderr)
    # "sbatch: Job N to start at T using P processors on nodes ..."
    processors = re.search(r"using (\d+) processors", proc.stderr + proc.stdout)
    assert processors, proc.stderr
    need_cores = math.ceil(PEAK_CORES * (1 + S.headroom_cpu_pct / 100.0) - 1e-9)
    assert int(processors.group(1)) >= need_cores, (after, proc.stderr)
    req = request_of(
        replace(job(), submit_line="sbatch " + " ".join(f"{k}={v}" for k, v in after.items()))
    )
    gpus = {
        "--gres": lambda v: int(v.rsplit(":", 1)[-1]),
        "--gpus": lambda v: int(v.rsplit(":", 1)[-1]),
        "--gpus-per-node": lambda v: int(v.rsplit(":", 1)[-1]),
    }
    got = [f(after[k]) for k, f in gpus.items() if k in after]
    if req.gpus_per_task:
        got.append(int(after["--ntasks"]) * req.gpus_per_task)
    assert got and min(got) >= a.metrics.gpus_used
    gpu_count = min(got)
    if "--mem" in after:
        mem = _mem(after["--mem"])
    elif "--mem-per-gpu" in after:
        mem = _mem(after["--mem-per-gpu"]) * gpu_count
    else:
        mem = _mem(after["--mem-per-cpu"]) * int(processors.group(1))
    assert mem >= RSS * (1 + S.headroom_mem_pct / 100.0)


def test_the_old_typed_gres_line_in_a_gpus_script_is_what_sbatch_refuses(job_dir: Path) -> None:
    # Why the style matters: --gres=gpu:a100:1 pasted into a --gpus=2 script.
    proc = _test_only({"--gpus": "2", "--gres": "gpu:a100:1"}, job_dir)
    assert proc.returncode != 0
