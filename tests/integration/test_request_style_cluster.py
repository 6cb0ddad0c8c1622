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
headroom. The check itself is ``tests/request_styles.py``, shared with the version lab's
``tests/lab/test_lab_request_style.py`` (24.11, 26.05).

Runs only ``sbatch --test-only`` (no job starts) and reads nothing of the cluster's own hooks.
On a running cluster, without restarting it:

    SLURM_GPU_TC_NO_START=1 .venv/bin/pytest -q tests/integration/test_request_style_cluster.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import slurmtools
from request_styles import GIB, OLD_TYPED_GRES_IN_A_GPUS_SCRIPT, JobShape, StyleCase, check_style

from slurm_gpu.config import AnalysisSettings

pytestmark = pytest.mark.cluster

#: 3 busy cores, 512 MiB of memory of 4 GiB asked; memory findings from 1 GiB unused (the test
#: node is small); everything else as shipped.
SHAPE = JobShape(
    peak_cores=3.0,
    rss_bytes=GIB // 2,
    mem_bytes=4 * GIB,
    settings=AnalysisSettings(mem_unused_min_bytes=GIB),
)

CASES = [
    StyleCase("--gres=gpu:2 -c 8 --mem=4G", ("#SBATCH --gres=gpu:1",)),
    StyleCase("--gres=gpu:a100:2 --cpus-per-gpu=2 --mem=4G", ("#SBATCH --gres=gpu:a100:1",)),
    StyleCase("--gpus=2 --cpus-per-gpu=2 --mem-per-gpu=2G", ("#SBATCH --gpus=1",)),
    StyleCase(
        "--gpus-per-node=2 --cpus-per-task=8 --mem-per-cpu=512M", ("#SBATCH --gpus-per-node=1",)
    ),
    StyleCase("--ntasks=2 --gpus-per-task=1 --cpus-per-task=2 --mem=4G", ("#SBATCH --ntasks=1",)),
    StyleCase("--gpus=a100:2 --cpus-per-gpu=4 --mem=4G", ("#SBATCH --gpus=a100:1",)),
    # The same options written as the batch script's #SBATCH lines, submitted bare.
    StyleCase("--gpus=2 --cpus-per-gpu=2 --mem-per-gpu=2G", ("#SBATCH --gpus=1",), in_script=True),
    StyleCase(
        "--ntasks=2 --gpus-per-task=1 --cpus-per-task=2 --mem=4G",
        ("#SBATCH --ntasks=1",),
        in_script=True,
    ),
]


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


@pytest.mark.parametrize(
    "case", CASES, ids=[("script: " if c.in_script else "") + c.options for c in CASES]
)
def test_recommended_set_in_the_jobs_style_is_accepted_and_covers_the_peak(
    case: StyleCase, job_dir: Path
) -> None:
    check_style(case, SHAPE, lambda options: _test_only(options, job_dir))


def test_the_old_typed_gres_line_in_a_gpus_script_is_what_sbatch_refuses(job_dir: Path) -> None:
    # Why the style matters: --gres=gpu:a100:1 pasted into a --gpus=2 script.
    proc = _test_only(OLD_TYPED_GRES_IN_A_GPUS_SCRIPT, job_dir)
    assert proc.returncode != 0
