"""Recurring mid-job idle phases and ragged tails (issue 11, item 3), each test named after
the real case it reproduces."""

from __future__ import annotations

from pathlib import Path

import jinja2
from analysis_factory import T0, gpu, host, job, node, timeline

from slurm_gpu.analysis import Analysis, Code, Severity, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def _task_farm_timeline(cycles: int) -> tuple[list[float], list[float]]:
    """One-minute buckets: 28 min at 68 % with 1 core busy, then 12 min idle with 1 core busy
    writing results, ``cycles`` times."""
    utils: list[float] = []
    cores: list[float] = []
    for _ in range(cycles):
        utils += [68.0] * 28 + [0.0] * 12
        cores += [1.0] * 28 + [1.0] * 12
    utils += [68.0] * 28
    cores += [1.0] * 28
    return utils, cores


def test_task_farm_step_idles_its_gpu_12_minutes_every_40_minutes() -> None:
    utils, cores = _task_farm_timeline(20)
    elapsed = len(utils) * 60
    end = T0 + elapsed
    share = sum(1 for u in utils if u == 0.0) / len(utils)
    gpus = [
        gpu(
            f"GPU-{i}",
            duty=[68.0] * int(1000 * (1 - share)) + [0.0] * int(1000 * share),
            end=end,
            active=(T0 + 60, end - 60),
        )
        for i in range(4)
    ]
    rec = node(gpus, end=end, tl=timeline(utils, cores, n_gpus=4), host_summary=host(cores=96))
    a = analyze(job(gpus=4, cpus=96, elapsed=elapsed, limit=elapsed * 2), [rec], S)
    f = finding(a, Code.IDLE_PHASES)
    assert f is not None and f.severity is Severity.WARNING
    assert f.evidence["idle_phases_max_per_gpu"] == 20
    assert f.evidence["idle_phases"] == 80
    assert f.evidence["idle_phase_mean_s"] == 720
    # 4 GPUs × 20 × 12 min = 16 GPU-hours.
    assert f.evidence["gpu_hours_idle_phases"] == 16.0
    assert f.evidence["cores_busy_in_phases"] == 1.0
    text = wording(ENV, f)[1]
    assert "80 times" in text and "00:12:00" in text and "16.00 GPU-hours" in text
    assert "1.0 core busy" in text
    assert finding(a, Code.LOW_UTILIZATION_UNEXPLAINED) is None


def test_two_mid_job_pauses_are_not_recurring() -> None:
    utils, cores = _task_farm_timeline(2)
    elapsed = len(utils) * 60
    end = T0 + elapsed
    rec = node(
        [gpu(duty=60.0, end=end, active=(T0 + 60, end - 60))],
        end=end,
        tl=timeline(utils, cores),
    )
    a = analyze(job(elapsed=elapsed, limit=elapsed * 2), [rec], S)
    assert finding(a, Code.IDLE_PHASES) is None


def test_idle_head_and_tail_are_not_counted_as_mid_job_phases() -> None:
    utils = [0.0] * 30 + [90.0] * 60 + [0.0] * 30
    rec = node(
        [gpu(duty=45.0, active=(T0 + 1800, T0 + 5400), end=T0 + 7200)],
        end=T0 + 7200,
        tl=timeline(utils, [2.0] * len(utils)),
    )
    a = analyze(job(elapsed=7200, limit=14400), [rec], S)
    assert finding(a, Code.IDLE_PHASES) is None
    assert a.metrics.gpus[0].idle_phases == 0


def test_for_40_minutes_only_3_of_12_gpus_still_worked() -> None:
    # Three nodes of 4 GPUs; all work until 10 h 20 min, then 9 GPUs stop and 3 go on for
    # 40 more minutes: 9 × 40 min = 6 GPU-hours idle.
    elapsed = 11 * 3600
    end = T0 + elapsed
    stop_early = end - 40 * 60
    nodes = []
    for n in range(3):
        gpus = [
            gpu(
                f"GPU-{n}{i}",
                duty=85.0,
                end=end,
                active=(T0 + 10, end if (n, i) in {(0, 0), (1, 0), (2, 0)} else stop_early),
            )
            for i in range(4)
        ]
        nodes.append(node(gpus, hostname=f"gpu00{n}", end=end))
    hosts = tuple(f"gpu00{n}" for n in range(3))
    a = analyze(job(gpus=12, cpus=48, elapsed=elapsed, limit=2 * elapsed, nodes=hosts), nodes, S)
    f = finding(a, Code.RAGGED_TAIL)
    assert f is not None
    assert f.evidence["gpus_used"] == 12 and f.evidence["gpus_still_working"] == 3
    assert f.evidence["last_stretch_s"] == 2400
    assert f.evidence["gpu_hours_ragged"] == 6.0
    text = wording(ENV, f)[1]
    assert "only 3 of 12 still worked" in text and "00:40:00" in text and "6.00 GPU-hours" in text


def test_gpus_that_end_together_have_no_ragged_tail() -> None:
    gpus = [gpu(f"GPU-{i}", active=(T0 + 10, T0 + 3600 - 20 * i)) for i in range(4)]
    a = analyze(job(gpus=4), [node(gpus)], S)
    assert finding(a, Code.RAGGED_TAIL) is None
