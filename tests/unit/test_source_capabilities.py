"""Rules × sources: a rule that needs a signal the job's source lacks never fires on its
absence and says "cannot tell from <source>" instead (``sourcecaps``, ``rules.NEEDS``).

Each case first shows the finding from the hooks' full view of the same records, then the
same records read as coming from a coarser source: the finding is gone and the
``SOURCE_CANNOT_TELL`` note names its code and the source's label."""

from __future__ import annotations

from dataclasses import replace

import jinja2
import pytest
from analysis_factory import T0, gpu, host, job, node, timeline

from slurm_gpu.analysis.engine import analyze
from slurm_gpu.analysis.findings import Code, Finding
from slurm_gpu.analysis.rules import NEEDS, NEEDS_CODE
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.sourcecaps import CAPABILITIES, SIGNALS, capabilities_of, combined

S = AnalysisSettings()


def _as(nodes: list[NodeRecord], source: str) -> list[NodeRecord]:
    return [replace(n, source=source) for n in nodes]


def _codes(j: JobRecord, nodes: list[NodeRecord]) -> set[Code]:
    return {f.code for f in analyze(j, nodes, S).findings}


def _note(j: JobRecord, nodes: list[NodeRecord]) -> Finding:
    [note] = [f for f in analyze(j, nodes, S).findings if f.code is Code.SOURCE_CANNOT_TELL]
    return note


def _idle_head_case() -> tuple[JobRecord, list[NodeRecord]]:
    return job(), [node([gpu(active=(T0 + 1300, T0 + 3600))])]


def _idle_phases_case() -> tuple[JobRecord, list[NodeRecord]]:
    return job(elapsed=7200, limit=14400), [
        node(
            [gpu(duty=60.0, end=T0 + 7200, active=(T0 + 60, T0 + 7140))],
            end=T0 + 7200,
            tl=timeline(([80.0] * 10 + [0.0] * 10) * 6, [1.0] * 120),
        )
    ]


def _dataloader_case() -> tuple[JobRecord, list[NodeRecord]]:
    return job(cpus=2), [
        node(
            [gpu(duty=25.0)],
            tl=timeline([25.0] * 4, [1.9] * 4),
            host_summary=host(cores=2, busy_frac=0.95),
        )
    ]


def _ranks_share_case() -> tuple[JobRecord, list[NodeRecord]]:
    return job(gpus=2), [
        node([gpu("GPU-a", max_processes=4), gpu("GPU-b", duty=0.0, mem_frac=0.005)])
    ]


def _tensor_case() -> tuple[JobRecord, list[NodeRecord]]:
    return job(), [node([gpu(duty=90.0, sm_active_mean_pct=80.0, tensor_active_mean_pct=0.1)])]


def _low_parallelism_case() -> tuple[JobRecord, list[NodeRecord]]:
    return job(), [node([gpu(duty=20.0, mem_frac=0.1)])]


def test_idle_head_cannot_be_told_from_per_step_means() -> None:
    j, nodes = _idle_head_case()
    assert Code.IDLE_HEAD in _codes(j, nodes)
    coarse = _as(nodes, "slurm-tres")
    assert Code.IDLE_HEAD not in _codes(j, coarse)
    note = _note(j, coarse)
    assert note.evidence["cannot_tell_IDLE_HEAD"] == 1 and note.evidence["lacks_timeline"] == 1
    assert note.subject == CAPABILITIES["slurm-tres"].label


def test_idle_head_is_still_told_from_dcgm_exporter_series() -> None:
    j, nodes = _idle_head_case()
    coarse = [replace(n, interval_s=30.0) for n in _as(nodes, "dcgm-exporter")]
    assert Code.IDLE_HEAD in _codes(j, coarse)


def test_idle_phases_cannot_be_told_without_a_timeline() -> None:
    j, nodes = _idle_phases_case()
    assert Code.IDLE_PHASES in _codes(j, nodes)
    coarse = _as(nodes, "slurm-tres")
    assert Code.IDLE_PHASES not in _codes(j, coarse)
    assert _note(j, coarse).evidence["cannot_tell_IDLE_PHASES"] == 1


def test_ragged_tail_cannot_be_told_without_a_timeline() -> None:
    j = job(gpus=2)
    nodes = [node([gpu("GPU-a"), gpu("GPU-b", active=(T0 + 10, T0 + 1800))])]
    assert Code.RAGGED_TAIL in _codes(j, nodes)
    coarse = _as(nodes, "slurm-tres")
    assert Code.RAGGED_TAIL not in _codes(j, coarse)
    assert _note(j, coarse).evidence["cannot_tell_RAGGED_TAIL"] == 1


def test_dataloader_bound_cannot_be_asserted_without_host_series() -> None:
    j, nodes = _dataloader_case()
    assert Code.DATALOADER_BOUND in _codes(j, nodes)
    coarse = _as(nodes, "dcgm-exporter")
    codes = _codes(j, coarse)
    assert Code.DATALOADER_BOUND not in codes and Code.TOO_FEW_CPUS_PER_GPU not in codes
    # Nor does the same pattern read as too little parallel work: the cores were saturated.
    assert Code.LOW_PARALLELISM not in codes
    note = _note(j, coarse)
    assert note.evidence["cannot_tell_DATALOADER_BOUND"] == 1
    assert note.evidence["lacks_host_series"] == 1
    assert note.subject == "dcgm-exporter via Prometheus"


def test_dataloader_bound_is_told_from_jobstats_host_series() -> None:
    j, nodes = _dataloader_case()
    assert Code.DATALOADER_BOUND in _codes(j, _as(nodes, "jobstats"))


def test_ranks_sharing_a_gpu_cannot_be_told_without_a_process_list() -> None:
    j, nodes = _ranks_share_case()
    assert Code.RANKS_SHARE_GPU in _codes(j, nodes)
    coarse = _as(nodes, "jobstats")
    assert Code.RANKS_SHARE_GPU not in _codes(j, coarse)
    assert _note(j, coarse).evidence["cannot_tell_RANKS_SHARE_GPU"] == 1


def test_never_used_gpu_without_a_process_list_does_not_say_no_process_ran() -> None:
    j = job(gpus=2)
    # The hooks saw no process on the idle GPU; dcgm-exporter cannot know.
    nodes = [node([gpu("GPU-a"), gpu("GPU-b", duty=0.0, process=False)])]
    [full] = [f for f in analyze(j, nodes, S).findings if f.code is Code.GPU_UNUSED]
    assert full.evidence["process_seen"] == 0
    coarse = _as(nodes, "dcgm-exporter")
    found = analyze(j, coarse, S).findings
    [unused] = [f for f in found if f.code is Code.GPU_UNUSED]
    assert unused.evidence["process_seen"] is None
    assert _note(j, coarse).evidence["cannot_tell_process_on_unused_gpu"] == 1
    env = environment(jinja2.FileSystemLoader("templates/findings"))
    _, text = wording(env, unused)
    assert "no compute process was seen" not in text


def test_tensor_cores_idle_cannot_be_told_without_sm_activity() -> None:
    j, nodes = _tensor_case()
    assert Code.TENSOR_CORES_IDLE in _codes(j, nodes)
    coarse = _as(nodes, "jobstats")
    assert Code.TENSOR_CORES_IDLE not in _codes(j, coarse)
    assert _note(j, coarse).evidence["cannot_tell_TENSOR_CORES_IDLE"] == 1


def test_low_parallelism_cannot_be_told_from_per_step_means() -> None:
    j, nodes = _low_parallelism_case()
    assert Code.LOW_PARALLELISM in _codes(j, nodes)
    coarse = _as(nodes, "slurm-tres")
    codes = _codes(j, coarse)
    assert Code.LOW_PARALLELISM not in codes
    assert _note(j, coarse).evidence["cannot_tell_LOW_PARALLELISM"] == 1


def test_low_parallelism_by_power_is_told_from_dcgm_exporter_without_profiling() -> None:
    # Busy but nearly empty: no SM activity without profiling, power drawn is the proxy.
    j = job()
    nodes = [node([gpu(duty=90.0, power_mean_w=60.0)])]
    coarse = _as(nodes, "dcgm-exporter")
    assert Code.LOW_PARALLELISM in _codes(j, nodes) and Code.LOW_PARALLELISM in _codes(j, coarse)


def test_memory_rules_hold_for_every_source() -> None:
    j = job()
    nodes = [node([gpu(duty=90.0, mem_frac=0.97)])]
    for source in CAPABILITIES:
        assert Code.GPU_MEMORY_NEAR_FULL in _codes(j, _as(nodes, source)), source


def test_a_job_the_hooks_saw_whole_gets_no_cannot_tell_note() -> None:
    for make in (_idle_head_case, _idle_phases_case, _dataloader_case, _ranks_share_case):
        j, nodes = make()
        assert Code.SOURCE_CANNOT_TELL not in _codes(j, nodes)


def test_a_job_without_telemetry_gets_no_cannot_tell_note() -> None:
    assert Code.SOURCE_CANNOT_TELL not in _codes(job(), [])


@pytest.mark.parametrize("source", sorted(CAPABILITIES))
def test_every_rule_needing_a_signal_a_source_lacks_is_named(source: str) -> None:
    caps = capabilities_of(source)
    for rule, needs in NEEDS.items():
        assert set(needs) <= set(SIGNALS), rule
        assert rule in NEEDS_CODE
    j, nodes = _idle_head_case()
    found = analyze(j, _as(nodes, source), S).findings
    notes = [f for f in found if f.code is Code.SOURCE_CANNOT_TELL]
    if caps.timeline and caps.host_series and caps.sm_activity and caps.process_list:
        assert not notes
    else:
        [note] = notes
        for rule, needs in NEEDS.items():
            key = f"cannot_tell_{NEEDS_CODE[rule].value}"
            lacking = any(not getattr(caps, sig) for sig in needs)
            assert (key in note.evidence) == lacking, (source, rule)


def test_a_job_read_partly_from_a_coarser_source_is_judged_by_the_coarser_one() -> None:
    caps = combined(["nvml", "dcgm-exporter"])
    assert not caps.process_list and not caps.host_series and caps.timeline
    assert caps.label == "dcgm-exporter via Prometheus"
    assert combined([]).process_list and combined(["virtual"]).name == "virtual"


def test_unknown_source_names_read_as_the_hooks_full_view() -> None:
    caps = capabilities_of("synthetic")
    assert all(getattr(caps, sig) for sig in SIGNALS)


def test_the_cannot_tell_note_renders_with_the_source_label() -> None:
    j, nodes = _dataloader_case()
    note = _note(j, _as(nodes, "dcgm-exporter"))
    env = environment(jinja2.FileSystemLoader("templates/findings"))
    _, text = wording(env, note)
    assert text.startswith("Cannot tell from dcgm-exporter via Prometheus: ")
    assert "whether data loading held the GPUs back" in text


def test_every_rule_named_in_needs_is_a_rule_that_runs() -> None:
    from slurm_gpu.analysis.rules import RULES

    assert set(NEEDS) <= {r.__name__ for r in RULES}
