"""Metrics: seff agreement, per-GPU numbers, GPU-hours, and "not enough data" edge cases."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest
from analysis_factory import GIB, T0, gpu, host, job, node

from slurm_gpu.analysis.metrics import (
    DataStatus,
    job_metrics,
    seff_cpu_efficiency_pct,
    seff_cpu_used_s,
    seff_mem_efficiency_pct,
    seff_pct_text,
)
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import Tres

S = AnalysisSettings()


# --------------------------------------------------------------------------- seff


@pytest.mark.parametrize(
    ("total_cpu", "expected"),
    [(3599.4, 3599), (3599.5, 3600), (0.49, 0), (12.0, 12), (7.999999, 8)],
)
def test_cpu_used_rounds_microseconds_half_up_like_seff(total_cpu: float, expected: int) -> None:
    assert seff_cpu_used_s(job(total_cpu=total_cpu)) == expected


def test_cpu_efficiency_is_cput_over_core_walltime() -> None:
    # seff: CPU Utilized 01:00:00, 4 cores × 02:00:00 → "CPU Efficiency: 12.50%".
    j = job(cpus=4, elapsed=7200, total_cpu=3600.0)
    assert seff_pct_text(seff_cpu_efficiency_pct(j)) == "12.50%"


def test_cpu_count_falls_back_to_tres_then_one() -> None:
    j = job(cpus=None, elapsed=100, total_cpu=50.0)
    j = replace(j, alloc_tres=Tres(cpus=None, nodes=1))
    assert seff_pct_text(seff_cpu_efficiency_pct(j)) == "50.00%"  # ncpus 1, as seff
    j2 = replace(job(cpus=None, elapsed=100, total_cpu=50.0), alloc_tres=Tres(cpus=2, nodes=1))
    assert seff_pct_text(seff_cpu_efficiency_pct(j2)) == "25.00%"


def test_memory_efficiency_is_maxrss_over_allocated_memory() -> None:
    j = job(max_rss=3 * GIB, mem=16 * GIB)
    assert seff_pct_text(seff_mem_efficiency_pct(j)) == "18.75%"
    # Without AllocTRES mem, the multiplied-out ReqMem (older seff's $reqmem) is used.
    j2 = replace(j, alloc_tres=Tres(cpus=8, nodes=1, gpus=1), req_mem_bytes=12 * GIB)
    assert seff_pct_text(seff_mem_efficiency_pct(j2)) == "25.00%"


def test_zero_seconds_is_not_enough_data_not_zero_percent() -> None:
    j = job(elapsed=0, total_cpu=0.0)
    assert seff_cpu_efficiency_pct(j) is None
    assert seff_pct_text(None) == "n/a"
    assert seff_mem_efficiency_pct(job(max_rss=None)) is None
    assert seff_mem_efficiency_pct(job(mem=None)) is None


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl not installed")
@pytest.mark.parametrize(
    ("total_cpu", "cpus", "elapsed", "rss_kib", "mem_kib"),
    [
        (1234.5678, 3, 777, 1_000_001, 3_000_000),
        (5.0, 7, 3, 1, 3),
        (86399.9, 64, 1801, 123_456_789, 262_144_000),
        (0.0, 1, 61, 0, 1024),
    ],
)
def test_percentages_print_exactly_as_seffs_perl_arithmetic(
    total_cpu: float, cpus: int, elapsed: int, rss_kib: int, mem_kib: int
) -> None:
    """Run seff's own expressions in Perl on the same numbers and compare the printed text."""
    sec = int(total_cpu)
    usec = round((total_cpu - sec) * 1e6)
    script = (
        f"my $cput = {sec} + int(({usec} / 1000000) + 0.5);"
        f"my $cw = {elapsed} * {cpus};"
        'printf("%.2f%%\\n", $cput / $cw * 100);'
        f"my $mem = {rss_kib}; my $alloc = {mem_kib};"
        'printf("%.2f%%\\n", $mem / $alloc * 100);'
    )
    out = subprocess.run(["perl", "-e", script], capture_output=True, text=True, check=True)
    perl_cpu, perl_mem = out.stdout.split()
    j = job(
        cpus=cpus,
        elapsed=elapsed,
        total_cpu=sec + usec / 1e6,
        max_rss=rss_kib * 1024,
        mem=mem_kib * 1024,
    )
    assert seff_pct_text(seff_cpu_efficiency_pct(j)) == perl_cpu
    assert seff_pct_text(seff_mem_efficiency_pct(j)) == perl_mem


# --------------------------------------------------------------------------- GPUs


def test_gpu_numbers_and_gpu_hours() -> None:
    busy = gpu("GPU-a", duty=[0.0] * 25 + [80.0] * 75)
    unused = gpu("GPU-b", duty=0.0, process=False)
    m = job_metrics(job(gpus=2), [node([busy, unused])], S)
    assert m.status is DataStatus.OK
    a, b = m.gpus
    assert a.duty_mean_pct == pytest.approx(60.0)
    assert a.idle_share_pct == pytest.approx(25.0)
    assert a.used and not b.used and not b.process_seen
    assert m.gpu_hours_allocated == pytest.approx(2.0)
    assert m.gpu_hours_busy == pytest.approx(0.6)
    # Wasted: GPU-a idle a quarter of the hour, GPU-b the whole hour.
    assert m.gpu_hours_wasted == pytest.approx(1.25)
    assert m.gpus_used == 1


def test_idle_head_and_tail_allow_one_interval() -> None:
    g = gpu(active=(T0 + 610, T0 + 3000))
    m = job_metrics(job(), [node([g], interval=10.0)], S)
    assert m.gpus[0].idle_head_s == pytest.approx(600.0)
    assert m.gpus[0].idle_tail_s == pytest.approx(590.0)


def test_memory_power_energy_and_missing_fields() -> None:
    g = gpu(mem_frac=0.5, capacity_gib=40)
    m = job_metrics(job(), [node([g])], S).gpus[0]
    assert m.memory_peak_pct == pytest.approx(50.0)
    assert m.power_mean_of_limit_pct == pytest.approx(62.5)
    assert m.energy_kwh == pytest.approx(0.25)
    g2 = gpu(mem_frac=None, power_mean_w=None, energy_j=None)
    m2 = job_metrics(job(), [node([g2])], S).gpus[0]
    assert m2.memory_peak_pct is None and m2.power_mean_of_limit_pct is None
    assert m2.energy_kwh is None


def test_imbalance_spread_and_cv() -> None:
    gs = [gpu("GPU-a", duty=90.0), gpu("GPU-b", duty=30.0)]
    m = job_metrics(job(gpus=2), [node(gs)], S)
    assert m.imbalance_spread_pct == pytest.approx(60.0)
    assert m.imbalance_cv == pytest.approx(0.5)


def test_node_spread_across_nodes() -> None:
    n1 = node([gpu("GPU-a", duty=90.0)], hostname="a")
    n2 = node([gpu("GPU-b", duty=40.0)], hostname="b")
    m = job_metrics(job(gpus=2, nodes=("a", "b")), [n1, n2], S)
    assert m.node_spread_pct == pytest.approx(50.0)
    assert m.nodes_with_record == 2


# --------------------------------------------------------------------------- edge cases


def test_zero_second_job_is_too_short() -> None:
    m = job_metrics(job(elapsed=0, total_cpu=0.0), [node()], S)
    assert m.status is DataStatus.TOO_SHORT
    assert m.cpu_efficiency_pct is None and m.time_efficiency_pct is None


def test_no_records_is_no_telemetry() -> None:
    m = job_metrics(job(), [], S)
    assert m.status is DataStatus.NO_TELEMETRY
    assert m.gpu_hours_busy is None and m.gpu_hours_wasted is None and m.duty_mean_pct is None
    assert m.gpu_hours_allocated == pytest.approx(1.0)


def test_no_gpu_job() -> None:
    m = job_metrics(job(gpus=0), [], S)
    assert m.status is DataStatus.NO_GPU


def test_gpu_without_readings_is_no_telemetry() -> None:
    g = gpu(duty=[], process=False)
    m = job_metrics(job(), [node([g])], S)
    assert m.status is DataStatus.NO_TELEMETRY
    assert m.gpus[0].duty_mean_pct is None and m.gpus[0].idle_share_pct is None


def test_one_sample_is_not_enough_for_a_gpu() -> None:
    m = job_metrics(job(), [node([gpu(duty=[50.0])])], S)
    assert not m.gpus[0].enough_data
    assert m.gpus[0].duty_p50_pct == 50.0


def test_vanished_gpu_uses_the_answered_readings() -> None:
    g = replace(gpu(duty=[80.0] * 40), samples=100)
    m = job_metrics(job(), [node([g])], S).gpus[0]
    assert m.samples_available == 40 and m.samples == 100
    assert m.duty_mean_pct == pytest.approx(80.0)


def test_host_missing_gives_no_cpu_peak_but_seff_still_works() -> None:
    n = replace(node(), host=None)
    m = job_metrics(job(), [n], S)
    assert m.host_cores_peak is None and m.host_rss_peak_bytes is None
    assert m.cpu_efficiency_pct == pytest.approx(50.0)


def test_stall_share_from_timeline() -> None:
    from analysis_factory import timeline

    tl = timeline([20, 20, 90, 90], [7.5, 7.8, 3.0, 3.0])
    m = job_metrics(job(), [node([gpu(duty=55.0)], tl=tl, host_summary=host(cores=8))], S)
    assert m.stall_share_pct == pytest.approx(50.0)
    assert m.host_cores_peak == pytest.approx(7.8)
