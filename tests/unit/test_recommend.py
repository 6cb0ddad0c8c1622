"""Recommendations: concrete #SBATCH lines, never below the observed peak plus headroom."""

from __future__ import annotations

from dataclasses import replace

import pytest
from analysis_factory import GIB, T0, gpu, host, job, node, timeline
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpu.analysis import Option, PastJob, analyze
from slurm_gpu.analysis.recommend import format_time, round_time_s
from slurm_gpu.config import AnalysisSettings

S = AnalysisSettings()


def rec(a, option):  # type: ignore[no-untyped-def]
    return next((r for r in a.recommendations if r.option is option), None)


def past(**over: object) -> PastJob:
    base = PastJob(
        job_id="1",
        user="alice",
        job_name="train",
        work_dir="/home/alice",
        state="COMPLETED",
        elapsed_s=3600,
        gpus_allocated=4,
        gpus_used=1,
        gpu_memory_peak_bytes=None,
        host_rss_peak_bytes=None,
        host_cores_peak=None,
    )
    return replace(base, **over)  # type: ignore[arg-type]


def test_fewer_gpus_with_saved_gpu_hours_and_type_kept() -> None:
    gs = [gpu("GPU-a")] + [gpu(f"GPU-{i}", duty=0.0, process=False) for i in range(3)]
    a = analyze(job(gpus=4, gpu_types=(("a100", 4),)), [node(gs)], S)
    r = rec(a, Option.GPUS)
    assert r.sbatch_lines == ("#SBATCH --gres=gpu:a100:1",)
    assert r.gpu_hours_saved == pytest.approx(3.0)
    assert r.safe_because["gpus_used_max"] == 1


def test_history_keeps_gpus_a_similar_job_used() -> None:
    gs = [gpu("GPU-a")] + [gpu(f"GPU-{i}", duty=0.0, process=False) for i in range(3)]
    a = analyze(job(gpus=4), [node(gs)], S, history=[past(gpus_used=2, job_id="7")])
    r = rec(a, Option.GPUS)
    assert r.sbatch_lines == ("#SBATCH --gres=gpu:2",) and r.based_on_jobs == 2
    # A job of another name is not similar.
    a2 = analyze(job(gpus=4), [node(gs)], S, history=[past(gpus_used=4, job_name="other")])
    assert rec(a2, Option.GPUS).sbatch_lines == ("#SBATCH --gres=gpu:1",)


def test_time_is_rounded_up_with_headroom_and_history() -> None:
    a = analyze(job(elapsed=3600, limit=86400), [node()], S)
    r = rec(a, Option.TIME)
    # 3600 s × 1.3 = 4680 s → next 15 minutes: 01:30:00.
    assert r.sbatch_lines == ("#SBATCH --time=01:30:00",) and r.current == "1-00:00:00"
    h = analyze(job(elapsed=3600, limit=86400), [node()], S, history=[past(elapsed_s=20000)])
    # 20000 × 1.3 = 26000 s, past the 4 h mark → whole hours: 08:00:00.
    assert rec(h, Option.TIME).proposed == "08:00:00"


def test_no_shorter_time_when_a_similar_job_timed_out() -> None:
    a = analyze(job(elapsed=3600, limit=86400), [node()], S, history=[past(state="TIMEOUT")])
    assert rec(a, Option.TIME) is None


def test_memory_and_cpus_down_to_peak_plus_headroom() -> None:
    tl = timeline([90.0] * 5, [1.0, 2.0, 3.2, 2.0, 1.0])
    n = node(tl=tl, host_summary=host(cores=32, busy_frac=0.06, rss_max_bytes=5 * GIB))
    j = job(cpus=32, total_cpu=32 * 0.06 * 3600, max_rss=5 * GIB, mem=128 * GIB)
    a = analyze(j, [n], S)
    mem = rec(a, Option.MEMORY)
    assert mem.sbatch_lines == ("#SBATCH --mem=7G",)  # 5 GiB × 1.25 → 6.25 → 7 GiB
    cpu = rec(a, Option.CPUS_PER_GPU)
    # No CPU option on the submit line: per task, the common form (the script may set it).
    assert cpu.sbatch_lines == ("#SBATCH --cpus-per-task=4",)  # 3.2 cores × 1.25 → 4


def test_no_cpu_reduction_without_an_observed_peak() -> None:
    n = replace(node(), host=None)
    a = analyze(job(cpus=32, total_cpu=2 * 3600.0), [n], S)
    assert rec(a, Option.CPUS_PER_GPU) is None


def test_more_cpus_for_a_dataloader_bound_job() -> None:
    tl = timeline([25.0] * 10, [1.9] * 10)
    n = node([gpu(duty=25.0)], tl=tl, host_summary=host(cores=2, busy_frac=0.95))
    a = analyze(job(cpus=2), [n], S)
    assert rec(a, Option.CPUS_PER_GPU).sbatch_lines == ("#SBATCH --cpus-per-task=4",)


def test_host_oom_asks_for_more_memory() -> None:
    a = analyze(job(state="OUT_OF_MEMORY", max_rss=16 * GIB, mem=16 * GIB), [node()], S)
    assert rec(a, Option.MEMORY).sbatch_lines == ("#SBATCH --mem=20G",)


def test_mig_profile_only_where_configured() -> None:
    n = node([gpu(duty=15.0, mem_frac=0.08, capacity_gib=80)])  # 6.4 GiB peak
    assert rec(analyze(job(), [n], S), Option.MIG) is None
    mig = replace(S, mig_partitions=("gpu-mig",))
    r = rec(analyze(job(), [n], mig), Option.MIG)
    # 6.4 GiB × 1.2 = 7.7 GiB = 8.2 GB → 1g.10gb.
    assert r.sbatch_lines == ("#SBATCH --partition=gpu-mig", "#SBATCH --gres=gpu:1g.10gb:1")
    assert r.gpu_hours_saved == pytest.approx(6 / 7, abs=1e-3)


def test_time_formatting() -> None:
    assert format_time(59) == "00:00:59"
    assert format_time(90061) == "1-01:01:01"
    assert round_time_s(1, S) == 900


@settings(max_examples=60, deadline=None)
@given(
    rss_gib=st.floats(0.1, 100.0),
    cores_peak=st.floats(0.1, 30.0),
    elapsed=st.integers(600, 200_000),
)
def test_never_below_the_peak_plus_headroom(
    rss_gib: float, cores_peak: float, elapsed: int
) -> None:
    rss = int(rss_gib * GIB)
    tl = timeline([90.0, 90.0], [cores_peak, cores_peak / 2])
    n = node(
        tl=tl,
        end=T0 + elapsed,
        host_summary=host(cores=64, busy_frac=0.01, rss_max_bytes=rss, elapsed=elapsed),
    )
    j = job(
        cpus=64,
        total_cpu=64 * 0.01 * elapsed,
        max_rss=rss,
        mem=512 * GIB,
        elapsed=elapsed,
        limit=10 * elapsed,
    )
    a = analyze(j, [n], S)
    # 1 % of 64 cores busy, at most 100 of 512 GiB, a tenth of the limit used: each of the three
    # is over-requested, so each branch below must be taken (not pass for want of a proposal).
    assert {r.option for r in a.recommendations} >= {
        Option.MEMORY,
        Option.CPUS_PER_GPU,
        Option.TIME,
    }, [r.option for r in a.recommendations]
    for r in a.recommendations:
        if r.option is Option.MEMORY:
            assert int(r.proposed[:-1]) * GIB >= rss * 1.25
        if r.option is Option.CPUS_PER_GPU:
            assert int(r.proposed) >= cores_peak * 1.25
        if r.option is Option.TIME:
            h, m, s = (int(x) for x in r.proposed.split("-")[-1].split(":"))
            days = int(r.proposed.split("-")[0]) if "-" in r.proposed else 0
            assert days * 86400 + h * 3600 + m * 60 + s >= elapsed * 1.3
