"""Ranks sharing a GPU, told from accounting where no process list is, and from the process
count where every GPU is shared (issue 26, point 4). Each test is named after the real case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import gpu, job, node

from slurm_gpu.analysis import Analysis, Code, Severity, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobStep

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def four_rank_job(tasks: int | None) -> object:
    step = JobStep("0", 32, 4, 1, "COMPLETED", 0, 0, 3600, 3600.0 * 4, tasks=tasks)
    return replace(job(gpus=4, cpus=32, total_cpu=4 * 3600.0), steps=(step,))


def dcgm_node() -> object:
    """One GPU at 99 %, three with a small context and no kernel; no process list."""
    gpus = [gpu("GPU-0", duty=99.0, process=False)]
    gpus += [gpu(f"GPU-{i}", duty=0.0, mem_frac=0.006, process=False) for i in (1, 2, 3)]
    return replace(node(gpus), source="dcgm-exporter")


def test_four_tasks_four_gpus_one_busy_three_with_a_context_from_dcgm_names_the_sharing() -> None:
    # The real case: dcgm-exporter (no process list), step with NTasks=4 on one node.
    a = analyze(four_rank_job(4), [dcgm_node()], S)  # type: ignore[arg-type, list-item]
    f = finding(a, Code.RANKS_SHARE_GPU)
    assert f is not None and f.severity is Severity.CRITICAL
    assert f.evidence["tasks_per_node"] == 4 and f.evidence["gpus_context_only"] == 3
    assert f.evidence["processes_on_busy_gpu"] is None
    text = wording(ENV, f)[1]
    assert "4 ranks" in text and "--gpus-per-task=1" in text
    # The binding is the fix: no "request fewer GPUs".
    assert not any(r.finding is Code.GPU_UNUSED for r in a.recommendations)
    note = finding(a, Code.SOURCE_CANNOT_TELL)
    assert note is None or "cannot_tell_RANKS_SHARE_GPU" not in note.evidence


def test_without_a_task_count_the_same_job_is_cannot_tell() -> None:
    a = analyze(four_rank_job(None), [dcgm_node()], S)  # type: ignore[arg-type, list-item]
    assert finding(a, Code.RANKS_SHARE_GPU) is None
    note = finding(a, Code.SOURCE_CANNOT_TELL)
    assert note is not None and note.evidence["cannot_tell_RANKS_SHARE_GPU"] == 1


def test_one_task_per_gpu_is_not_sharing() -> None:
    a = analyze(four_rank_job(1), [dcgm_node()], S)  # type: ignore[arg-type, list-item]
    assert finding(a, Code.RANKS_SHARE_GPU) is None


def test_twelve_processes_per_gpu_time_sliced_at_30_percent_power_is_named() -> None:
    # The real case: 12 ranks on each of 4 GPUs (processes recorded), 30 % of the power limit.
    gpus = [gpu(f"GPU-{i}", duty=95.0, max_processes=12, power_mean_w=120.0) for i in range(4)]
    a = analyze(job(gpus=4, cpus=48), [node(gpus)], S)
    f = finding(a, Code.RANKS_SHARE_GPU)
    assert f is not None and f.severity is Severity.WARNING
    assert f.evidence["processes_on_busy_gpu"] == 12 and f.evidence["gpus_context_only"] == 0
    assert "12 processes time-sliced" in wording(ENV, f)[1]


def test_mps_style_sharing_at_full_power_is_only_a_note() -> None:
    gpus = [gpu(f"GPU-{i}", duty=95.0, max_processes=12, power_mean_w=380.0) for i in range(4)]
    f = finding(analyze(job(gpus=4, cpus=48), [node(gpus)], S), Code.RANKS_SHARE_GPU)
    assert f is not None and f.severity is Severity.INFO
