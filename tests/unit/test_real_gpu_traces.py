"""The jobs recorded on a real H100 (tests/data/traces/*-3/4.json and dataloader-2.json, by
benchmarks/device_record.py): what they showed the rules got wrong, held in place.

- A DataLoader with ``num_workers=0`` kept one of the job's 4 cores busy while the GPU read
  0.1 % mean duty: it was diagnosed GPU_UNUSED ("request fewer GPUs") and the idle cores
  CPU_OVERREQUESTED; it is input-bound in the main process, and no smaller request is advised.
- bf16 matrix products held the H100 at its 700 W limit, clocks lowered by the power cap for
  87 % of the job: a power-throttling warning on a healthy job; it is information now.

And on a real H200 (host-bound-1, no-amp-1, timeout-steps-1, 2026-11-30):

- A host-bound pipeline (4 loader workers on 4 cores feeding bf16 products at 46 % duty) hit
  the 700 W cap in every burst but no 1 s reading went above 541 W: power throttling was a
  warning; the draw while busy is estimated now, and it is information.
"""

from __future__ import annotations

from pathlib import Path

from slurm_gpu.analysis import Severity, analyze
from slurm_gpu.analysis.findings import Code, Option
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.evaluation.recorded import load_trace

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def _analysis(name: str):  # type: ignore[no-untyped-def]
    t = load_trace(TRACES / name)
    assert "H100" in str(t.recorded.get("gpu")) or "H200" in str(t.recorded.get("gpu"))
    return analyze(t.trace.job, t.trace.nodes, t.settings(AnalysisSettings()))


def test_a_loader_in_the_main_process_is_input_bound_not_an_unused_gpu() -> None:
    a = _analysis("dataloader-2.json")
    codes = {f.code for f in a.findings}
    assert Code.GPU_UNUSED not in codes
    assert Code.CPU_OVERREQUESTED not in codes
    (f,) = [f for f in a.findings if f.code is Code.DATALOADER_BOUND]
    assert f.evidence["main_process"] == 1
    assert f.evidence["stall_share_pct"] is not None and f.evidence["stall_share_pct"] >= 25
    assert f.evidence["duty_mean_pct"] is not None and f.evidence["duty_mean_pct"] < 1
    # The cores are there already: no larger (nor smaller) CPU request.
    assert not [r for r in a.recommendations if r.option is Option.CPUS_PER_GPU]


def test_a_gpu_held_at_its_power_limit_is_information_not_a_warning() -> None:
    for name in ("healthy-3.json", "healthy-4.json", "idle-tail-3.json"):
        a = _analysis(name)
        power = [f for f in a.findings if f.code is Code.GPU_THROTTLED_POWER]
        assert power, name
        assert all(f.severity is Severity.INFO for f in power), name
        assert all(f.evidence["at_power_limit"] == 1 for f in power), name


def test_a_host_bound_pipeline_at_its_power_cap_in_bursts() -> None:
    a = _analysis("host-bound-1.json")
    (loader,) = [f for f in a.findings if f.code is Code.DATALOADER_BOUND]
    assert loader.severity is Severity.WARNING and loader.evidence["main_process"] == 0
    assert 30 < (loader.evidence["duty_mean_pct"] or 0) < 70  # moderate duty, every core busy
    assert (loader.evidence["cores_busy_mean"] or 0) >= 3.5
    (power,) = [f for f in a.findings if f.code is Code.GPU_THROTTLED_POWER]
    assert power.severity is Severity.INFO
    assert (power.evidence["power_max_w"] or 0) < 0.8 * 700  # the readings never showed it
    assert (power.evidence["power_busy_w"] or 0) >= 0.95 * 700


def test_four_ranks_keeping_one_gpu_busy_are_a_note() -> None:
    a = _analysis("no-amp-1.json")
    (ranks,) = [f for f in a.findings if f.code is Code.RANKS_SHARE_GPU]
    assert ranks.severity is Severity.INFO
    assert ranks.evidence["processes_on_busy_gpu"] == 4  # the real process list saw them
    assert ranks.evidence["gpus_context_only"] == 0
    assert Code.GPU_UNUSED not in {f.code for f in a.findings}


def test_a_job_killed_at_its_time_limit_mid_step() -> None:
    t = load_trace(TRACES / "timeout-steps-1.json")
    assert t.recorded["time_limit"]["sigkill"] is False  # SIGTERM ended it inside a step
    assert t.recorded["workload_report"]["in_step"] is True
    a = _analysis("timeout-steps-1.json")
    (f,) = [f for f in a.findings if f.code is Code.TIME_LIMIT_REACHED]
    assert f.evidence["steps_ended_by_time_limit"] == 1
