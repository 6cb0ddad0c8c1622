"""A small-batch job on a whole GPU (issue 26, point 8): the remedy is said to belong to cause
1 (more work per GPU), and a MIG slice or a smaller GPU is suggested only where the site has
them, with the exact request. Each test is named after the real case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import gpu, job, node

from slurm_gpu.analysis import Analysis, Code, Option, Severity, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def test_small_batch_on_a_whole_a100_without_smaller_gpus_names_cause_1_as_the_remedy() -> None:
    # The real case: LOW_PARALLELISM and GPU_OVERSIZED side by side, each with its own advice,
    # on a site that has neither MIG slices nor smaller GPUs.
    a = analyze(job(), [node([gpu(duty=15.0, mem_frac=0.08)])], S)
    assert finding(a, Code.LOW_PARALLELISM) is not None
    f = finding(a, Code.GPU_OVERSIZED)
    assert f is not None and f.severity is Severity.INFO
    assert f.evidence["with_low_parallelism"] == 1 and f.evidence["site_has_smaller"] == 0
    text = wording(ENV, f)[1]
    assert "cause 1" in text and "no MIG slices or smaller GPUs" in text
    assert not any(r.option in (Option.MIG, Option.SMALLER_GPU) for r in a.recommendations)


def test_site_with_a_smaller_gpu_type_gets_its_exact_request_in_the_jobs_form() -> None:
    site = replace(S, smaller_gpu_types=("gpu-small:l4:24", "t4:16", "a100:80"))
    j = replace(job(), submit_line="sbatch --gpus=1 train.sh")
    a = analyze(j, [node([gpu(duty=15.0, mem_frac=0.08)])], site)
    f = finding(a, Code.GPU_OVERSIZED)
    assert f is not None and f.severity is Severity.WARNING
    r = next(r for r in a.recommendations if r.option is Option.SMALLER_GPU)
    # 6.4 GiB × 1.2 fits the 16 GiB t4 (smallest first), not on another partition.
    assert r.sbatch_lines == ("#SBATCH --gpus=t4:1",)
    assert "If the work cannot grow" in wording(ENV, f)[1]


def test_site_with_mig_partitions_gets_the_slice_in_the_jobs_form() -> None:
    site = replace(S, mig_partitions=("gpu-mig",))
    j = replace(job(), submit_line="sbatch --gpus=1 train.sh")
    a = analyze(j, [node([gpu(duty=15.0, mem_frac=0.08)])], site)
    r = next(r for r in a.recommendations if r.option is Option.MIG)
    assert r.sbatch_lines == ("#SBATCH --partition=gpu-mig", "#SBATCH --gpus=1g.10gb:1")
