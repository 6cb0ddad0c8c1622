"""The diagnosis on the shapes of real jobs that the engine got wrong (issue: a diagnosis that
holds on real jobs). Each test is named after the real case it reproduces; inputs are built
with the same factories as the rule tests, the wording rendered from the real templates."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import jinja2
import pytest
from analysis_factory import GIB, T0, gpu, host, job, node, timeline

from slurm_gpu.analysis import Analysis, Code, Option, Severity, analyze, metrics
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.evaluation.traces import corpus
from slurm_gpu.jobreport.adapter import recommendation_from_mapping
from slurm_gpu.records import Tres

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))

#: sbatch's long options that a resource recommendation may set (sbatch(1), Slurm 22.05-24.05).
REAL_SBATCH_OPTIONS = frozenset(
    {
        "--gres",
        "--gpus",
        "--gpus-per-node",
        "--gpus-per-task",
        "--gpus-per-socket",
        "--cpus-per-task",
        "--cpus-per-gpu",
        "--mem",
        "--mem-per-cpu",
        "--mem-per-gpu",
        "--time",
        "--nodes",
        "--ntasks",
        "--ntasks-per-node",
        "--exclusive",
        "--gpu-bind",
        "--array",
        "--partition",
        "--constraint",
    }
)
_OPTION = re.compile(r"^#SBATCH (--[a-z-]+)(=\S+)?$")


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def text_of(a: Analysis, code: Code) -> str:
    f = finding(a, code)
    assert f is not None, [x.code for x in a.findings]
    return wording(ENV, f)[1]


# --------------------------------------------------------------------------- item 13


def test_task_farm_idle_tail_of_a_900s_job_is_found() -> None:
    # GPUs busy for the first 340 s of a 900 s job, idle for the last 560 s (62 %): below
    # the 600 s absolute floor, yet most of the job.
    end = T0 + 900
    g = gpu(duty=[90.0] * 34 + [0.0] * 56, start=T0, end=end, active=(T0 + 10, T0 + 340))
    a = analyze(job(elapsed=900, limit=1800), [node([g], end=end)], S)
    tail = finding(a, Code.IDLE_TAIL)
    assert tail is not None and tail.severity is Severity.WARNING
    assert tail.evidence["idle_tail_s"] == 550
    assert tail.evidence["idle_edge_major_pct"] == S.idle_edge_major_pct  # the threshold
    assert finding(a, Code.LOW_UTILIZATION_UNEXPLAINED) is None


def test_short_idle_tail_of_a_900s_job_is_still_not_reported() -> None:
    # 120 s of 900 s (13 %): neither 600 s nor a third of the job.
    end = T0 + 900
    g = gpu(duty=[90.0] * 78 + [0.0] * 12, start=T0, end=end, active=(T0 + 10, T0 + 770))
    a = analyze(job(elapsed=900, limit=1800), [node([g], end=end)], S)
    assert finding(a, Code.IDLE_TAIL) is None


# --------------------------------------------------------------------------- item 14


def _cpu_job(efficiency_pct: float) -> Analysis:
    cpus, elapsed = 16, 3600
    used = efficiency_pct / 100.0 * cpus * elapsed
    n = node(host_summary=host(cores=cpus, busy_frac=efficiency_pct / 100.0))
    return analyze(job(cpus=cpus, total_cpu=used, elapsed=elapsed), [n], S)


def test_jobs_on_the_cpu_efficiency_line_get_no_warning_either_side() -> None:
    below, at = _cpu_job(24.99), _cpu_job(25.0)
    assert finding(at, Code.CPU_OVERREQUESTED) is None
    note = finding(below, Code.CPU_OVERREQUESTED)
    assert note is not None and note.severity is Severity.INFO
    assert note.evidence["cpu_efficiency_max_pct"] == S.cpu_efficiency_max_pct
    assert "25 %" in text_of(below, Code.CPU_OVERREQUESTED)  # the line it was held against
    # A note is not a diagnosis: no smaller --cpus-per-gpu follows from it.
    assert not [r for r in below.recommendations if r.option is Option.CPUS_PER_GPU]


def test_cpu_efficiency_far_below_the_line_is_still_a_warning() -> None:
    f = finding(_cpu_job(10.0), Code.CPU_OVERREQUESTED)
    assert f is not None and f.severity is Severity.WARNING


# --------------------------------------------------------------------------- item 11


def _moderate_duty(cores_busy: float) -> Analysis:
    # Two cores for one GPU at ~60 % duty, the GPU stalling while the cores are pinned.
    tl = timeline([60.0] * 20, [cores_busy] * 20)
    n = node([gpu(duty=60.0)], tl=tl, host_summary=host(cores=2, busy_frac=cores_busy / 2))
    return analyze(job(cpus=2, total_cpu=cores_busy * 3600), [n], S)


def test_dataloader_stalls_at_60pct_duty_with_saturated_cores_are_found() -> None:
    a = _moderate_duty(1.92)
    f = finding(a, Code.DATALOADER_BOUND)
    assert f is not None and f.evidence["stall_share_pct"] == 100.0
    assert finding(a, Code.TOO_FEW_CPUS_PER_GPU) is not None


def test_60pct_duty_with_cores_not_pinned_is_not_dataloader_bound() -> None:
    assert finding(_moderate_duty(1.5), Code.DATALOADER_BOUND) is None


# --------------------------------------------------------------------------- items 5, 7, 8


def _four_ranks_on_gpu0() -> Analysis:
    busy = gpu("GPU-0", duty=99.0, max_processes=4, pids=(11, 12, 13, 14))
    ctx = [gpu(f"GPU-{i}", duty=0.0, mem_frac=0.005) for i in (1, 2, 3)]
    n = node([busy, *ctx], host_summary=host(cores=16, busy_frac=0.25))
    return analyze(job(gpus=4, cpus=16, total_cpu=4 * 3600.0), [n], S)


def test_cfd_four_mpi_ranks_on_one_gpu_get_binding_advice_not_fewer_gpus() -> None:
    a = _four_ranks_on_gpu0()
    shared = finding(a, Code.RANKS_SHARE_GPU)
    assert shared is not None and shared.evidence["processes_on_busy_gpu"] == 4
    assert shared.evidence["gpus_context_only"] == 3
    assert not [r for r in a.recommendations if r.option is Option.GPUS]
    # One finding for the one fault: the three context-only GPUs are the sharing's, not
    # three more "never used" paragraphs with the same advice (issue 26, point 6).
    assert finding(a, Code.GPU_UNUSED) is None
    assert shared.severity is Severity.CRITICAL and shared.evidence["gpu_hours_wasted"] == 3.0
    text = text_of(a, Code.RANKS_SHARE_GPU)
    assert "--gpus-per-task=1" in text and "request only those" not in text
    assert "3 other allocated GPUs held only a context" in text and "3.00 GPU-hours idle" in text


def test_unreadable_process_list_is_not_worded_as_no_process() -> None:
    # The process list could not be read: even the GPU at 99 % shows no process.
    busy = gpu("GPU-0", duty=99.0, process=False)
    idle = gpu("GPU-1", duty=0.0, process=False)
    a = analyze(job(gpus=2), [node([busy, idle])], S)
    unused = finding(a, Code.GPU_UNUSED)
    assert unused is not None and unused.evidence["process_seen"] is None
    text = text_of(a, Code.GPU_UNUSED)
    assert "no process" not in text and "could not be read" in text


def _one_of_four_gpus_used() -> Analysis:
    """4 GPUs, 8 cores each; one GPU used, 4 cores busy at the peak."""
    tl = timeline([90.0] * 10, [4.0] * 10, n_gpus=4)
    gpus = [gpu("GPU-0", duty=90.0)] + [gpu(f"GPU-{i}", duty=0.0, process=False) for i in (1, 2, 3)]
    n = node(gpus, tl=tl, host_summary=host(cores=32, busy_frac=4 / 32))
    return analyze(job(gpus=4, cpus=32, total_cpu=4 * 3600.0), [n], S)


def test_fewer_gpus_proposal_keeps_cores_for_the_ranks_that_were_busy() -> None:
    # Sized for the current 4 GPUs, --cpus-per-gpu=2 with --gres=gpu:1 gives the job 2 cores.
    a = _one_of_four_gpus_used()
    gpus_rec = next(r for r in a.recommendations if r.option is Option.GPUS)
    cpus_rec = next(r for r in a.recommendations if r.option is Option.CPUS_PER_GPU)
    assert gpus_rec.sbatch_lines == ("#SBATCH --gres=gpu:1",)
    cores_after = int(cpus_rec.proposed) * 1
    assert cores_after >= 4 * (1 + S.headroom_cpu_pct / 100.0)


# --------------------------------------------------------------------------- item 6


def test_busy_gpu_at_a_quarter_of_its_power_limit_is_nearly_empty_by_proxy() -> None:
    # 99 % duty at 109 W of 400 W, no SM-activity metric (A100 without DCGM profiling).
    g = gpu(duty=99.0, power_mean_w=109.0, sm_active_mean_pct=None)
    a = analyze(job(), [node([g])], S)
    f = finding(a, Code.LOW_PARALLELISM)
    assert f is not None and f.evidence["busy_nearly_empty"] == 1
    assert f.evidence["sm_active_mean_pct"] is None
    assert f.evidence["power_mean_of_limit_pct"] == 27.2
    assert "proxy" in text_of(a, Code.LOW_PARALLELISM)


def test_busy_gpu_at_full_power_is_not_nearly_empty() -> None:
    g = gpu(duty=99.0, power_mean_w=350.0, sm_active_mean_pct=None)
    assert finding(analyze(job(), [node([g])], S), Code.LOW_PARALLELISM) is None


def test_busy_gpu_at_low_power_and_7_pct_memory_bandwidth_is_nearly_empty_by_both_proxies() -> None:
    # The real case: 99 % duty at 109 W of 400 W and 7 % memory bandwidth, no SM activity.
    g = gpu(duty=99.0, power_mean_w=109.0, sm_active_mean_pct=None, memory_utilization_mean_pct=7.0)
    a = analyze(job(), [node([g])], S)
    f = finding(a, Code.LOW_PARALLELISM)
    assert f is not None and f.evidence["busy_nearly_empty"] == 1
    assert f.evidence["memory_util_mean_pct"] == 7.0
    assert f.evidence["busy_low_memory_util_pct"] == S.busy_low_memory_util_pct
    text = text_of(a, Code.LOW_PARALLELISM)
    assert "memory bandwidth in use 7 % of the time" in text, text
    assert "power and memory bandwidth are the proxies" in text, text


def test_memory_bound_kernels_at_low_power_are_not_nearly_empty() -> None:
    # Low power alone would call it empty; the memory controller busy 65 % of the time says
    # the kernels stream memory (bandwidth-bound), which a larger batch does not fix.
    g = gpu(
        duty=99.0, power_mean_w=109.0, sm_active_mean_pct=None, memory_utilization_mean_pct=65.0
    )
    assert finding(analyze(job(), [node([g])], S), Code.LOW_PARALLELISM) is None


def test_busy_empty_without_memory_utilization_says_power_alone_is_the_proxy() -> None:
    g = gpu(duty=99.0, power_mean_w=109.0, sm_active_mean_pct=None)
    a = analyze(job(), [node([g])], S)
    assert finding(a, Code.LOW_PARALLELISM).evidence["memory_util_mean_pct"] is None  # type: ignore[union-attr]
    assert "power is the proxy here" in text_of(a, Code.LOW_PARALLELISM)


# --------------------------------------------------------------------------- item 1


def _whole_node_job(**over: object):  # type: ignore[no-untyped-def]
    """96 cores and 512 GiB allocated, one core and 10 GiB used, 4 GPUs of which 1 busy."""
    j = job(gpus=4, cpus=96, mem=512 * GIB, total_cpu=3600.0, max_rss=10 * GIB)
    return replace(j, **over)


def _whole_node_nodes():  # type: ignore[no-untyped-def]
    gpus = [gpu("GPU-0", duty=90.0)] + [gpu(f"GPU-{i}", duty=0.0, process=False) for i in (1, 2, 3)]
    h = host(cores=96, busy_frac=1 / 96, rss_max_bytes=10 * GIB)
    return [node(gpus, host_summary=h, tl=timeline([90.0] * 10, [1.0] * 10, n_gpus=4))]


def test_exclusive_partition_gets_no_cpu_or_memory_overrequest() -> None:
    s = replace(S, exclusive_partitions=("gpu",))
    a = analyze(_whole_node_job(), _whole_node_nodes(), s)
    codes = {f.code for f in a.findings}
    assert Code.CPU_OVERREQUESTED not in codes and Code.MEMORY_OVERREQUESTED not in codes
    kinds = {r.option for r in a.recommendations}
    assert not kinds & {Option.GPUS, Option.CPUS_PER_GPU, Option.MEMORY}
    text = text_of(a, Code.GPU_UNUSED)
    assert "whole nodes" in text and "request only those" not in text


def test_exclusive_job_detected_from_accounting_gets_no_overrequest() -> None:
    # Asked for 4 cores and 30 GiB, was given the whole node (96 cores, 512 GiB).
    req = Tres(cpus=4, mem_bytes=30 * GIB, nodes=1, gpus=4)
    a = analyze(_whole_node_job(req_tres=req), _whole_node_nodes(), S)
    assert a.metrics.whole_node
    codes = {f.code for f in a.findings}
    assert Code.CPU_OVERREQUESTED not in codes and Code.MEMORY_OVERREQUESTED not in codes
    assert not [r for r in a.recommendations if r.option is not Option.TIME]


def test_shared_node_job_still_gets_its_overrequest_findings() -> None:
    a = analyze(_whole_node_job(), _whole_node_nodes(), S)
    assert not a.metrics.whole_node
    assert {Code.CPU_OVERREQUESTED, Code.MEMORY_OVERREQUESTED} <= {f.code for f in a.findings}


# --------------------------------------------------------------------------- item 9


def test_cpu_evidence_mean_and_peak_are_both_per_node() -> None:
    # Two nodes, 32 cores each, ~5 cores busy on each: job-wide 10, per node 5.
    tl = timeline([90.0] * 10, [5.0] * 10)
    nodes = [
        node(hostname=h, tl=tl, host_summary=host(cores=32, busy_frac=5 / 32)) for h in ("a", "b")
    ]
    j = job(gpus=2, cpus=64, total_cpu=10 * 3600.0, nodes=("a", "b"))
    f = finding(analyze(j, nodes, S), Code.CPU_OVERREQUESTED)
    assert f is not None
    assert f.evidence["cores_busy_mean_per_node"] == 5.0
    assert f.evidence["cores_busy_peak_per_node"] == 5.0
    assert f.evidence["cpus_allocated_per_node"] == 32.0


def test_idle_gpu_hours_have_one_definition() -> None:
    j = job(gpus=2)
    nodes = [node([gpu("GPU-a", duty=[0.0] * 25 + [90.0] * 75), gpu("GPU-b", duty=0.0)])]
    m = metrics.job_metrics(j, nodes, S)
    assert m.gpu_hours_wasted == metrics.wasted_gpu_hours(m.gpus, m.elapsed_s)
    assert m.gpu_hours_wasted == pytest.approx(1.25)  # GPU-b whole, GPU-a a quarter


# --------------------------------------------------------------------------- item 8, as a set


def _all_analyses() -> list[Analysis]:
    out = [analyze(t.job, t.nodes, S) for t in corpus(6, 7)]
    out += [_four_ranks_on_gpu0(), _one_of_four_gpus_used(), _cpu_job(10.0), _moderate_duty(1.92)]
    out.append(analyze(job(state="OUT_OF_MEMORY"), [node()], S))
    return out


def test_every_recommended_option_is_a_real_sbatch_option() -> None:
    shown = 0
    for a in _all_analyses():
        for r in a.recommendations:
            for line in r.sbatch_lines:
                match = _OPTION.match(line)
                assert match and match.group(1) in REAL_SBATCH_OPTIONS, line
            view = recommendation_from_mapping(r.to_dict())
            flag = view.text.split(":", 1)[0]
            assert flag in REAL_SBATCH_OPTIONS, view.text
            shown += 1
    assert shown  # the corpus does produce recommendations


def test_memory_recommendation_is_shown_as_mem_not_memory() -> None:
    a = analyze(job(state="OUT_OF_MEMORY"), [node()], S)
    r = next(r for r in a.recommendations if r.option is Option.MEMORY)
    assert recommendation_from_mapping(r.to_dict()).text.startswith("--mem: ")


def test_recommended_cores_and_memory_never_fall_below_observed_peak() -> None:
    checked = {Option.CPUS_PER_GPU: 0, Option.MEMORY: 0}
    for a in _all_analyses():
        m = a.metrics
        gpus_after = m.gpus_allocated
        for r in a.recommendations:
            if r.option is Option.GPUS:
                gpus_after = int(r.safe_because["gpus_used_max"] or 0)
        for r in a.recommendations:
            if r.option is Option.CPUS_PER_GPU and m.host_cores_peak is not None:
                checked[r.option] += 1
                per_node = max(1, gpus_after // m.nnodes) if m.gpus_allocated else 1
                need = m.host_cores_peak * (1 + S.headroom_cpu_pct / 100.0)
                assert int(r.proposed) * per_node >= math.floor(need), (a.job_id, r)
            if r.option is Option.MEMORY and m.host_rss_peak_bytes is not None:
                checked[r.option] += 1
                line = r.sbatch_lines[0]
                assert line.startswith("#SBATCH --mem=")
                value = line.split("=", 1)[1]
                size = int(value[:-1]) * (GIB if value.endswith("G") else 1024**2)
                assert size >= m.host_rss_peak_bytes, (a.job_id, r)
    # Both branches were taken: the set holds CPU and memory proposals to judge.
    assert all(checked.values()), checked
