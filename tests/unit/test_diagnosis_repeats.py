"""Repeated-fault memory from the store (issue 26, point 7): the same finding, or the same
time-out, across the user's recent similar jobs, said once with the count. Each test is named
after the real case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import gpu, job, node

from slurm_gpu.analysis import Analysis, Code, PastJob, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))


def past(i: int, **over: object) -> PastJob:
    base = PastJob(
        job_id=str(i),
        user="alice",
        job_name="train",
        work_dir="/home/alice",
        state="COMPLETED",
        elapsed_s=3600,
        gpus_allocated=2,
        gpus_used=1,
        gpu_memory_peak_bytes=None,
        host_rss_peak_bytes=None,
        host_cores_peak=None,
        account="lab",
    )
    return replace(base, **over)  # type: ignore[arg-type]


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def unused_gpu_job() -> tuple[object, list[object]]:
    return job(gpus=2), [node([gpu("GPU-a"), gpu("GPU-b", duty=0.0, process=False)])]


def test_the_same_unused_gpu_as_the_last_five_jobs_is_said_once_with_the_count() -> None:
    j, nodes = unused_gpu_job()
    history = [past(i, finding_codes=("GPU_UNUSED",)) for i in range(5)]
    history.append(past(9))  # an older job without it ends the run
    a = analyze(j, nodes, S, history=history)  # type: ignore[arg-type]
    notes = [f for f in a.findings if f.code is Code.REPEATED_FINDINGS]
    assert len(notes) == 1
    assert notes[0].evidence["repeat_GPU_UNUSED"] == 5
    assert "GPU_UNUSED in the last 5 jobs" in wording(ENV, notes[0])[1]


def test_jobs_of_another_account_are_not_similar() -> None:
    j, nodes = unused_gpu_job()
    history = [past(i, finding_codes=("GPU_UNUSED",), account="other") for i in range(3)]
    a = analyze(j, nodes, S, history=history)  # type: ignore[arg-type]
    assert finding(a, Code.REPEATED_FINDINGS) is None


def test_this_job_timed_out_at_the_same_point_as_the_last_two() -> None:
    j = job(state="TIMEOUT", elapsed=3600, limit=3600)
    history = [past(i, state="TIMEOUT", elapsed_s=3600) for i in range(2)]
    a = analyze(j, [node()], S, history=history)
    f = finding(a, Code.TIME_LIMIT_REACHED)
    assert f is not None
    assert f.evidence["similar_timeouts"] == 2 and f.evidence["similar_timeouts_same_point"] == 1
    text = wording(ENV, f)[1]
    assert "Your last 2 similar jobs timed out too, at the same point (01:00:00)" in text
    # Said once: the time-out is not repeated in the note as well.
    assert finding(a, Code.REPEATED_FINDINGS) is None
