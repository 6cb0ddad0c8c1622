"""A "cannot tell" path where a rule's deciding signal is missing (issue 26, point 2): no rule
states the opposite of what it could not measure, and ``SOURCE_CANNOT_TELL`` gives the
record's own interval. Each test is named after the real case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import GIB, T0, gpu, host, job, node

from slurm_gpu.analysis import Analysis, Code, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, JobStep, Tres

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))
HOURS = 10 * 3600


def codes(a: Analysis) -> set[Code]:
    return {f.code for f in a.findings}


def farm(step_cpu: float | None) -> JobRecord:
    """Four one-core steps at a time on a 96-core node, each step's core 98 % busy; accounting
    with (``step_cpu`` = 0.98) or without (``None``) each step's TotalCPU."""
    steps = tuple(
        JobStep(
            str(i),
            1,
            1,
            1,
            "COMPLETED",
            0,
            0,
            HOURS,
            None if step_cpu is None else step_cpu * HOURS,
        )
        for i in range(4)
    )
    j = job(gpus=4, cpus=96, elapsed=HOURS, limit=2 * HOURS, total_cpu=None, mem=512 * GIB)
    return replace(j, steps=steps, req_tres=Tres(cpus=96, mem_bytes=512 * GIB, nodes=1, gpus=4))


def farm_node(source: str, interval: float) -> object:
    gpus = [gpu(f"GPU-{i}", duty=35.0, mem_frac=0.2, end=T0 + HOURS) for i in range(4)]
    rec = node(
        gpus, end=T0 + HOURS, host_summary=host(cores=96, busy_frac=4 / 96), interval=interval
    )
    return replace(rec, source=source)


def test_task_farm_of_one_cpu_steps_from_dcgm_at_60s_cannot_tell_not_cpus_not_bottleneck() -> None:
    # The real case: dcgm-exporter scraped every 60 s, accounting without step TotalCPU; the
    # report said "steadily under-used ... while the CPUs were not the bottleneck".
    a = analyze(farm(None), [farm_node("dcgm-exporter", 60.0)], S)  # type: ignore[list-item]
    assert Code.LOW_PARALLELISM not in codes(a)
    assert Code.CPU_OVERREQUESTED not in codes(a)
    assert Code.LOW_UTILIZATION_UNEXPLAINED not in codes(a)
    (note,) = [f for f in a.findings if f.code is Code.SOURCE_CANNOT_TELL]
    assert note.evidence["cannot_tell_STEPS_CPU_BOUND"] == 1
    assert note.evidence["cannot_tell_LOW_PARALLELISM"] == 1
    assert note.evidence["lacks_step_cpu_time"] == 1
    # The record's own interval, not the capability table's typical 30 s.
    assert note.evidence["source_interval_s"] == 60.0
    text = wording(ENV, note)[1]
    assert "every 60 s" in text and "every 30 s" not in text
    assert "TotalCPU" in text and "not the bottleneck" not in text


def test_the_same_farm_from_the_hooks_without_step_cpu_time_cannot_tell_either() -> None:
    a = analyze(farm(None), [farm_node("virtual", 10.0)], S)  # type: ignore[list-item]
    assert Code.LOW_PARALLELISM not in codes(a)
    (note,) = [f for f in a.findings if f.code is Code.SOURCE_CANNOT_TELL]
    assert note.evidence["cannot_tell_STEPS_CPU_BOUND"] == 1


def test_the_same_farm_with_step_cpu_time_is_steps_cpu_bound() -> None:
    a = analyze(farm(0.98), [farm_node("dcgm-exporter", 60.0)], S)  # type: ignore[list-item]
    assert Code.STEPS_CPU_BOUND in codes(a)
    assert Code.LOW_PARALLELISM not in codes(a)


def test_small_work_from_dcgm_with_no_cpu_time_anywhere_is_not_told_cpus_were_fine() -> None:
    # No host series (dcgm-exporter) and no TotalCPU in accounting: nothing measured the CPUs.
    j = job(gpus=1, cpus=8, total_cpu=None)
    rec = replace(node([gpu(duty=30.0, mem_frac=0.1)]), source="dcgm-exporter")
    a = analyze(j, [rec], S)
    assert Code.LOW_PARALLELISM not in codes(a)
    (note,) = [f for f in a.findings if f.code is Code.SOURCE_CANNOT_TELL]
    assert note.evidence["cannot_tell_LOW_PARALLELISM"] == 1
    assert note.evidence["lacks_job_cpu_time"] == 1
    assert "the job's TotalCPU" in wording(ENV, note)[1]
