"""Diagnosis rules, one scenario each, on constructed inputs (including the edge cases)."""

from __future__ import annotations

from dataclasses import replace

from analysis_factory import GIB, T0, gpu, host, job, node, timeline

from slurm_gpu.analysis import Audience, Code, Severity, analyze
from slurm_gpu.config import AnalysisSettings

S = AnalysisSettings()


def codes(j, nodes, s: AnalysisSettings = S) -> set[Code]:  # type: ignore[no-untyped-def]
    return {f.code for f in analyze(j, nodes, s).findings}


def test_healthy_job_has_no_finding() -> None:
    assert codes(job(), [node()]) == set()


def test_unused_gpu_is_critical_and_scoped_to_its_uuid() -> None:
    a = analyze(job(gpus=2), [node([gpu("GPU-a"), gpu("GPU-b", duty=0.0, process=False)])], S)
    unused = [f for f in a.findings if f.code is Code.GPU_UNUSED]
    assert len(unused) == 1
    assert unused[0].subject == "GPU-b" and unused[0].severity is Severity.CRITICAL
    assert unused[0].cause == 6 and unused[0].evidence["process_seen"] == 0
    assert a.findings[0].code is Code.GPU_UNUSED  # most severe first


def test_context_without_kernels_is_still_unused() -> None:
    assert Code.GPU_UNUSED in codes(
        job(gpus=2), [node([gpu("GPU-a"), gpu("GPU-b", duty=0.0, process=True)])]
    )


def test_dataloader_bound_from_timeline_and_too_few_cpus() -> None:
    tl = timeline([25.0] * 10, [1.9] * 10)
    n = node([gpu(duty=25.0, mem_frac=0.6)], tl=tl, host_summary=host(cores=2, busy_frac=0.95))
    found = codes(job(cpus=2), [n])
    assert {Code.DATALOADER_BOUND, Code.TOO_FEW_CPUS_PER_GPU} <= found
    assert Code.LOW_PARALLELISM not in found


def test_dataloader_without_timeline_falls_back_to_cpu_efficiency() -> None:
    n = node([gpu(duty=25.0)], host_summary=host(cores=8, busy_frac=0.95))
    found = codes(job(cpus=8, total_cpu=8 * 0.95 * 3600), [n])
    assert Code.DATALOADER_BOUND in found and Code.TOO_FEW_CPUS_PER_GPU not in found


def test_small_batch_is_low_parallelism_not_dataloader() -> None:
    tl = timeline([25.0] * 10, [1.0] * 10)
    n = node([gpu(duty=25.0, mem_frac=0.1)], tl=tl)
    found = codes(job(), [n])
    assert Code.LOW_PARALLELISM in found and Code.DATALOADER_BOUND not in found
    assert Code.GPU_OVERSIZED in found  # also true: a smaller slice would do


def test_busy_duty_cycle_with_low_sm_activity_is_low_parallelism() -> None:
    n = node([gpu(duty=90.0, sm_active_mean_pct=10.0)])
    assert Code.LOW_PARALLELISM in codes(job(), [n])


def test_tensor_cores_idle_only_from_compute_capability_7() -> None:
    busy = {"duty": 90.0, "sm_active_mean_pct": 60.0, "tensor_active_mean_pct": 1.0}
    assert Code.TENSOR_CORES_IDLE in codes(job(), [node([gpu(**busy)])])  # type: ignore[arg-type]
    old = gpu(cc=(6, 0), **busy)  # type: ignore[arg-type]
    assert Code.TENSOR_CORES_IDLE not in codes(job(), [node([old])])
    unknown = gpu(duty=90.0, tensor_active_mean_pct=None)
    assert Code.TENSOR_CORES_IDLE not in codes(job(), [node([unknown])])


def test_near_full_memory_and_critical_when_failed() -> None:
    n = node([gpu(mem_frac=0.97)])
    a = analyze(job(state="FAILED"), [n], S)
    f = next(f for f in a.findings if f.code is Code.GPU_MEMORY_NEAR_FULL)
    assert f.severity is Severity.CRITICAL and f.cause == 4
    assert f.evidence["memory_peak_pct"] == 97.0


def test_host_out_of_memory_end() -> None:
    found = codes(job(state="OUT_OF_MEMORY", max_rss=16 * GIB), [node()])
    assert Code.HOST_OUT_OF_MEMORY in found and Code.MEMORY_OVERREQUESTED not in found


def test_imbalance_across_gpus() -> None:
    n = node([gpu("GPU-a", duty=95.0), gpu("GPU-b", duty=40.0)])
    a = analyze(job(gpus=2), [n], S)
    f = next(f for f in a.findings if f.code is Code.GPU_IMBALANCE)
    assert f.evidence["duty_max_pct"] == 95.0 and f.evidence["duty_min_pct"] == 40.0


def test_communication_wait_from_nvlink_while_idle() -> None:
    nvl = {"nvlink_bytes": 10**12, "nvlink_bytes_while_idle": 6 * 10**11}
    duty = [0.0] * 40 + [90.0] * 60
    gs = [gpu(u, duty=duty, **nvl) for u in ("GPU-a", "GPU-b")]  # type: ignore[arg-type]
    assert Code.COMMUNICATION_WAIT in codes(job(gpus=2), [node(gs)])
    single = [gpu(duty=duty, **nvl)]  # type: ignore[arg-type]
    assert Code.COMMUNICATION_WAIT not in codes(job(), [node(single)])


def test_time_overrequested_only_for_completed_jobs() -> None:
    assert Code.TIME_OVERREQUESTED in codes(job(elapsed=3600, limit=86400), [node()])
    assert Code.TIME_OVERREQUESTED not in codes(
        job(elapsed=3600, limit=86400, state="FAILED"), [node()]
    )
    # A 30-minute limit on a 10-minute job: small ratio but too little unused time to matter.
    short = job(elapsed=600, limit=1800, total_cpu=8 * 0.5 * 600)
    assert Code.TIME_OVERREQUESTED not in codes(short, [node(end=T0 + 600)])


def test_cpu_and_memory_overrequested() -> None:
    j = job(cpus=32, total_cpu=2 * 3600.0, max_rss=2 * GIB, mem=64 * GIB)
    n = node(host_summary=host(cores=32, busy_frac=2 / 32, rss_max_bytes=2 * GIB))
    found = codes(j, [n])
    assert {Code.CPU_OVERREQUESTED, Code.MEMORY_OVERREQUESTED} <= found


def test_idle_head_and_tail_thresholds() -> None:
    long_head = gpu(active=(T0 + 1210, T0 + 3600))
    assert Code.IDLE_HEAD in codes(job(), [node([long_head])])
    short_head = gpu(active=(T0 + 130, T0 + 3600))
    assert Code.IDLE_HEAD not in codes(job(), [node([short_head])])
    tail = gpu(active=(T0 + 20, T0 + 2400))
    assert Code.IDLE_TAIL in codes(job(), [node([tail])])


def test_throttling_and_hardware_errors_are_for_the_site() -> None:
    g = gpu(throttle_power_s=1800.0, ecc_uncorrected=2, xid_events=(13, 79))
    a = analyze(job(), [node([g])], S)
    site = {f.code for f in a.findings if f.audience is Audience.SITE}
    assert {Code.GPU_THROTTLED_POWER, Code.GPU_HARDWARE_ERRORS} <= site
    hw = next(f for f in a.findings if f.code is Code.GPU_HARDWARE_ERRORS)
    assert hw.evidence["xid_count"] == 1 and hw.evidence["xid_0"] == 79  # 13 is the user's


def _power_finding(duty: float, mean_w: float, max_w: float):  # type: ignore[no-untyped-def]
    """The power-throttling finding of a 700 W GPU throttled most of the job, whose timeline's
    lowest reading is 81 W (its idle draw) and the others its mean."""
    g = gpu(duty=duty, power_mean_w=mean_w, power_max_w=max_w, throttle_power_s=3000.0)
    g = replace(g, info=replace(g.info, power_limit_w=700.0))
    tl = tuple(
        replace(p, gpu_power_w=(w,))
        for p, w in zip(timeline([duty] * 10, [1.0] * 10), [81.0] + [mean_w] * 9, strict=True)
    )
    (f,) = [f for f in analyze(job(), [node([g], tl=tl)], S).findings
            if f.code is Code.GPU_THROTTLED_POWER]  # fmt: skip
    return f


def test_a_gpu_at_its_cap_in_bursts_shorter_than_a_reading_is_information() -> None:
    # A host-bound job on a 700 W H200: kernels at the cap in bursts of ~50 ms, 46 % of the
    # time; no 1 s power reading above 541 W. Idle draw 81 W: 81 + (456 - 81) / 0.46 = 896 W.
    f = _power_finding(46.0, 456.0, 541.0)
    assert f.severity is Severity.INFO and f.evidence["at_power_limit"] == 1
    assert f.evidence["power_busy_w"] == 896.2


def test_a_gpu_held_below_its_cap_at_high_duty_is_still_a_warning() -> None:
    # A power brake holding a 700 W GPU near 80 % of its limit while busy 92 % of the time:
    # its draw while busy, 81 + (520 - 81) / 0.92 = 558 W, is far from the cap.
    f = _power_finding(92.0, 520.0, 560.0)
    assert f.severity is Severity.WARNING and "at_power_limit" not in f.evidence


def test_a_low_duty_gpu_gets_no_estimate_of_its_busy_draw() -> None:
    # At 10 % duty, 81 + (150 - 81) / 0.1 = 771 W would call any draw above idle a full one.
    assert _power_finding(10.0, 150.0, 200.0).severity is Severity.WARNING


def test_application_xid_alone_is_not_a_hardware_error() -> None:
    assert Code.GPU_HARDWARE_ERRORS not in codes(job(), [node([gpu(xid_events=(13, 31))])])


def test_unexplained_low_utilization_points_to_a_profiler() -> None:
    n = node([gpu(duty=[0.0] * 55 + [95.0] * 45, mem_frac=0.7)])
    a = analyze(job(), [n], S)
    assert [f.code for f in a.findings] == [Code.LOW_UTILIZATION_UNEXPLAINED]
    assert a.profiler_command is not None and "nsys profile" in a.profiler_command


def test_thresholds_come_from_settings() -> None:
    n = node([gpu("GPU-a", duty=95.0), gpu("GPU-b", duty=70.0)])
    assert Code.GPU_IMBALANCE not in codes(job(gpus=2), [n])
    strict = replace(S, imbalance_spread_pct=20.0)
    assert Code.GPU_IMBALANCE in codes(job(gpus=2), [n], strict)


# --------------------------------------------------------------------------- edge cases


def test_zero_second_job_only_says_too_short() -> None:
    assert codes(job(elapsed=0, total_cpu=0.0, limit=86400), [node()]) == {Code.TOO_SHORT}


def test_very_short_job_with_unused_gpu_is_not_diagnosed() -> None:
    n = node([gpu(duty=0.0, process=False, n=3)], end=T0 + 30)
    assert codes(job(elapsed=30, total_cpu=10.0), [n]) == {Code.TOO_SHORT}


def test_no_telemetry_still_checks_accounting() -> None:
    found = codes(job(elapsed=3600, limit=86400), [])
    assert found == {Code.NO_TELEMETRY, Code.TIME_OVERREQUESTED}


def test_one_sample_gpu_is_not_called_unused() -> None:
    n = node([gpu("GPU-a"), gpu("GPU-b", duty=[0.0], process=False)])
    assert Code.GPU_UNUSED not in codes(job(gpus=2), [n])


def test_vanished_gpu_is_reported() -> None:
    g = replace(gpu(duty=[80.0] * 40), samples=100)
    a = analyze(job(), [node([g])], S)
    lost = [f for f in a.findings if f.code is Code.GPU_LOST]
    assert lost and lost[0].audience is Audience.SITE and lost[0].evidence["samples"] == 100


def test_missing_fields_do_not_break_rules() -> None:
    g = gpu(mem_frac=None, power_mean_w=None, energy_j=None, nvlink_bytes=None, cc=None)
    n = replace(node([g]), host=None)
    j = replace(job(), total_cpu_s=None, max_rss_bytes=None, req_mem_bytes=None, time_limit_s=None)
    assert codes(j, [n]) == set()


def test_multi_node_with_one_record_missing() -> None:
    j = job(gpus=2, nodes=("a", "b"))
    n = node([gpu("GPU-a")], hostname="a")
    found = codes(j, [n])
    assert Code.NODE_RECORD_MISSING in found and Code.GPU_UNUSED not in found


def test_records_of_other_jobs_are_ignored() -> None:
    other = node([gpu(duty=0.0, process=False)], job_id="99")
    assert codes(job(), [other]) == {Code.NO_TELEMETRY}
