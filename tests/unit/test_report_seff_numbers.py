"""gpueff's CPU and memory efficiencies (the report model) equal the analysis engine's seff
formulas on the same accounting record, printed to seff's two decimals.

``tests/integration/test_seff_agreement.py`` compares both with the real seff on real jobs;
this keeps the two implementations from drifting apart on inputs the cluster rarely produces.
"""

from __future__ import annotations

import pytest
from analysis_factory import GIB, job

from slurm_gpu.analysis.metrics import (
    seff_cpu_efficiency_pct,
    seff_mem_efficiency_pct,
    seff_pct_text,
)
from slurm_gpu.jobreport.adapter import accounting_report

MIB = 1024**2


@pytest.mark.parametrize(
    ("cpus", "elapsed", "total_cpu"),
    [
        (2, 21, 12.49),  # rounds down: 12 s, 28.57% (unrounded: 29.74%)
        (2, 21, 12.5),  # half up: 13 s, 30.95%
        (2, 16, 2.47),  # a sleeping job: 2 s, 6.25%
        (3, 13, 4.501),
        (1, 7200, 3599.4),
        (8, 3600, 14400.0),
        (4, 1, 0.2),  # rounds to 0 s: 0.00%, as seff prints it
    ],
)
def test_cpu_efficiency_is_seffs(cpus: int, elapsed: int, total_cpu: float) -> None:
    record = job(cpus=cpus, elapsed=elapsed, total_cpu=total_cpu)
    report = accounting_report(record)
    assert seff_pct_text(report.cpu_efficiency_pct) == seff_pct_text(
        seff_cpu_efficiency_pct(record)
    )


def test_unrounded_cpu_time_would_disagree() -> None:
    # The case the cluster showed: 12.49 CPU-s on 2 cores over 21 s. seff prints 28.57%.
    report = accounting_report(job(cpus=2, elapsed=21, total_cpu=12.49))
    assert seff_pct_text(report.cpu_efficiency_pct) == "28.57%"
    assert seff_pct_text(100 * 12.49 / 42) != "28.57%"


@pytest.mark.parametrize(
    ("max_rss", "mem"),
    [(210 * MIB, 1 * GIB), (55 * MIB, 500 * MIB), (105 * MIB, 768 * MIB), (8 * GIB, 16 * GIB)],
)
def test_memory_efficiency_is_seffs(max_rss: int, mem: int) -> None:
    record = job(max_rss=max_rss, mem=mem)
    report = accounting_report(record)
    assert seff_pct_text(report.mem_efficiency_pct) == seff_pct_text(
        seff_mem_efficiency_pct(record)
    )


def test_unknown_inputs_are_not_a_number() -> None:
    assert accounting_report(job(total_cpu=None)).cpu_efficiency_pct is None
    assert accounting_report(job(elapsed=0)).cpu_efficiency_pct is None
    assert accounting_report(job(max_rss=None)).mem_efficiency_pct is None
    assert accounting_report(job(mem=None)).mem_efficiency_pct is None
