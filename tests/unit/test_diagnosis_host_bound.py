"""Host-bound jobs at any duty, on physical cores where the topology is known (issue 26,
point 3). Each test is named after the real case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import gpu, host, job, node, timeline

from slurm_gpu.analysis import Analysis, Code, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings

S = AnalysisSettings()
SMT = replace(S, threads_per_core=2)
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def md_job(utils: list[float], busy_cores: float) -> tuple[object, object]:
    """4 GPUs on a node of 48 cores / 96 threads (Slurm allocates 96 CPUs); one hour in
    60 s buckets; ``busy_cores`` cores busy throughout."""
    n = len(utils)
    mean = sum(utils) / n
    j = job(gpus=4, cpus=96, total_cpu=busy_cores * 3600.0)
    gpus = [gpu(f"GPU-{i}", duty=mean) for i in range(4)]
    rec = node(
        gpus,
        host_summary=host(cores=96, busy_frac=busy_cores / 96),
        tl=timeline(utils, [busy_cores] * n, n_gpus=4),
    )
    return j, rec


def test_md_job_at_65_percent_with_every_physical_core_busy_on_smt_nodes_is_host_bound() -> None:
    # The real case: GPUs 55-75 % busy, all 48 physical cores saturated (48 of 96 threads):
    # a clean report, as the cores read 50 % busy and the rule was off above 50 % duty.
    utils = [55.0, 75.0] * 30
    j, rec = md_job(utils, 48.0)
    a = analyze(j, [rec], SMT)  # type: ignore[arg-type, list-item]
    f = finding(a, Code.DATALOADER_BOUND)
    assert f is not None and f.evidence["physical_cores"] == 1
    text = wording(ENV, f)[1]
    assert "host-bound" in text and "physical cores" in text


def test_the_same_job_without_the_topology_is_counted_in_cpus_and_says_so() -> None:
    utils = [55.0, 75.0] * 30
    j, rec = md_job(utils, 48.0)
    a = analyze(j, [rec], S)  # type: ignore[arg-type, list-item]
    assert not a.metrics.physical_cores
    assert finding(a, Code.DATALOADER_BOUND) is None  # 48 of 96 CPUs: not saturated
    # All 96 threads busy: host-bound, said to be counted in Slurm's CPUs.
    j, rec = md_job(utils, 96.0)
    f = finding(analyze(j, [rec], S), Code.DATALOADER_BOUND)  # type: ignore[arg-type, list-item]
    assert f is not None and f.evidence["physical_cores"] == 0
    assert "core topology is not configured" in wording(ENV, f)[1]


def test_host_bound_above_80_percent_mean_duty_is_found_too() -> None:
    # Half the time at 99 %, half at 70 % while the cores are pinned: mean 84.5 %, above
    # dataloader_max_duty_pct, where the rule used to be off.
    utils = [99.0, 70.0] * 30
    j, rec = md_job(utils, 48.0)
    a = analyze(j, [rec], SMT)  # type: ignore[arg-type, list-item]
    assert finding(a, Code.DATALOADER_BOUND) is not None


def test_healthy_job_at_90_percent_with_idle_cores_stays_clean() -> None:
    j, rec = md_job([90.0] * 60, 20.0)
    a = analyze(j, [rec], SMT)  # type: ignore[arg-type, list-item]
    assert finding(a, Code.DATALOADER_BOUND) is None
