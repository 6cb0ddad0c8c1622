"""Every recommended set, in the job's own request style, is accepted by ``sbatch --test-only``
on Slurm 24.11 and 26.05 and never asks for less than the observed peak plus headroom (issue
26, point 5): the check of ``tests/integration/test_request_style_cluster.py`` (22.05), with
the same styles and the same code (``tests/request_styles.py``), sized for a lab node (2 CPUs,
4000 MB, 4 GPUs: share/testlab/start).

Runs only ``sbatch --test-only`` as ``labuser1`` (no job starts).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from labtools import Lab

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from request_styles import (
    GIB,
    OLD_TYPED_GRES_IN_A_GPUS_SCRIPT,
    JobShape,
    StyleCase,
    check_style,
)

from slurm_gpu.config import AnalysisSettings

MIB = 1024**2
USER = "labuser1"

#: 1.5 busy cores (2 with headroom: a GPU cut must keep both of the node's CPUs), 384 MiB of
#: memory of 3 GiB asked; memory findings from 512 MiB unused (a lab node has 4000 MB).
SHAPE = JobShape(
    peak_cores=1.5,
    rss_bytes=384 * MIB,
    mem_bytes=3 * GIB,
    settings=AnalysisSettings(mem_unused_min_bytes=GIB // 2),
)

#: The 22.05 check's styles, each with the same total: 2 CPUs and 3 GiB for 2 GPUs.
CASES = [
    StyleCase("--gres=gpu:2 -c 2 --mem=3G", ("#SBATCH --gres=gpu:1", "#SBATCH --mem=1G")),
    StyleCase(
        "--gres=gpu:a100:2 --cpus-per-gpu=1 --mem=3G",
        ("#SBATCH --gres=gpu:a100:1", "#SBATCH --cpus-per-gpu=2"),
    ),
    StyleCase(
        "--gpus=2 --cpus-per-gpu=1 --mem-per-gpu=1536M",
        ("#SBATCH --gpus=1", "#SBATCH --cpus-per-gpu=2", "#SBATCH --mem-per-gpu=1G"),
    ),
    StyleCase(
        "--gpus-per-node=2 --cpus-per-task=2 --mem-per-cpu=1536M",
        ("#SBATCH --gpus-per-node=1", "#SBATCH --mem-per-cpu=512M"),
    ),
    StyleCase(
        "--ntasks=2 --gpus-per-task=1 --cpus-per-task=1 --mem=3G",
        ("#SBATCH --ntasks=1", "#SBATCH --cpus-per-task=2"),
    ),
    StyleCase(
        "--gpus=a100:2 --cpus-per-gpu=1 --mem=3G",
        ("#SBATCH --gpus=a100:1", "#SBATCH --cpus-per-gpu=2"),
    ),
    # Written as the batch script's #SBATCH lines and submitted bare.
    StyleCase(
        "--gpus=2 --cpus-per-gpu=1 --mem-per-gpu=1536M",
        ("#SBATCH --gpus=1", "#SBATCH --cpus-per-gpu=2", "#SBATCH --mem-per-gpu=1G"),
        in_script=True,
    ),
]


def _test_only(lab: Lab, options: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = ["sbatch", "--test-only", "--time=00:10:00", f"--chdir=/home/{USER}"]
    argv += [f"{k}={v}" for k, v in options.items()]
    argv.append("--wrap=true")
    return lab.run(argv, user=USER, check=False)


@pytest.mark.parametrize(
    "case", CASES, ids=[("script: " if c.in_script else "") + c.options for c in CASES]
)
def test_recommended_set_in_the_jobs_style_is_accepted_and_covers_the_peak(
    lab: Lab, case: StyleCase
) -> None:
    after, processors = check_style(case, SHAPE, lambda options: _test_only(lab, options))
    print(f"[{lab.version}] {case.options} -> {after}: {processors} processors")


def test_the_old_typed_gres_line_in_a_gpus_script_is_what_sbatch_refuses(lab: Lab) -> None:
    # Why the style matters: --gres=gpu:a100:1 pasted into a --gpus=2 script.
    proc = _test_only(lab, OLD_TYPED_GRES_IN_A_GPUS_SCRIPT)
    print(f"[{lab.version}] rc={proc.returncode} {proc.stderr.strip()}")
    assert proc.returncode != 0, (lab.version, proc.stdout, proc.stderr)
    # Both versions give 22.05's reason (seen on 24.11.5 and 26.05.5).
    assert "Invalid GRES specification (with and without type identification)" in proc.stderr
