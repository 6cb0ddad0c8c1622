"""The jobs recorded on a real H100 (tests/data/traces/*-3/4.json and dataloader-2.json, by
benchmarks/device_record.py): what they showed the rules got wrong, held in place.

- A DataLoader with ``num_workers=0`` kept one of the job's 4 cores busy while the GPU read
  0.1 % mean duty: it was diagnosed GPU_UNUSED ("request fewer GPUs") and the idle cores
  CPU_OVERREQUESTED; it is input-bound in the main process, and no smaller request is advised.
- bf16 matrix products held the H100 at its 700 W limit, clocks lowered by the power cap for
  87 % of the job: a power-throttling warning on a healthy job; it is information now.
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
    assert "H100" in str(t.recorded.get("gpu")), t.recorded
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
