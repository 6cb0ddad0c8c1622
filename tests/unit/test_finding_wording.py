"""Every finding template, rendered at the boundary cases a real job reaches (issue 14, part
2): no GPU of one used, one of one, all GPUs idle, one GPU, one node, one core, zero-length
phases, evidence an older analysis did not record. Each sentence must stay true and readable:
no "Only 0 of 1 GPUs worked", no "1 GPUs", no "0 s", no "None"/"nan"/"n/a", no unit without
its number.

Parametrized over the files in ``templates/findings``, so a new template is covered without
touching this test: the evidence keys it uses are read from the template itself and given the
scenario's value by name (a key the scenarios do not know gets one by its unit suffix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes
import pytest

from slurm_gpu.jobreport.adapter import findings_wording
from slurm_gpu.jobreport.templating import BUILTIN_DIR

TEMPLATES = sorted((BUILTIN_DIR / "findings").glob("*.j2"))
GIB = 1024**3

#: The boundary scenarios: evidence values by key (the union of the engine's keys).
SCENARIOS: dict[str, dict[str, Any]] = {
    "0 of 1 GPU used": {
        "gpus_allocated": 1,
        "gpus_used": 0,
        "duty_mean_pct": 0.0,
        "process_seen": False,
        "gpu_hours_wasted": 1.0,
        "gpu_hours_idle": 1.0,
        "nodes": 1,
        "nodes_expected": 1,
        "nodes_with_record": 0,
        "cpus_allocated": 1,
        "cpus_allocated_per_node": 1.0,
        "cpus_per_gpu": 1.0,
        "cores_busy_mean_per_node": 0.0,
        "cores_busy_peak_per_node": 0.0,
        "samples": 1,
        "samples_available": 0,
        "xid_count": 0,
        "ecc_uncorrected": 0,
        "ecc_corrected": 0,
        "gpus_near_full": 1,
        "gpus_context_only": 1,
        "gpus_on_node": 1,
        "processes_on_busy_gpu": 1,
    },
    "1 of 1 GPU used, one node, one core": {
        "gpus_allocated": 1,
        "gpus_used": 1,
        "duty_mean_pct": 100.0,
        "duty_min_pct": 100.0,
        "duty_max_pct": 100.0,
        "process_seen": True,
        "nodes": 1,
        "nodes_expected": 1,
        "nodes_with_record": 1,
        "cpus_allocated": 1,
        "cpus_allocated_per_node": 1.0,
        "cpus_per_gpu": 1.0,
        "min_cpus_per_gpu": 1,
        "cores_busy_mean_per_node": 1.0,
        "cores_busy_peak_per_node": 1.0,
        "samples": 1,
        "samples_available": 1,
        "xid_count": 1,
        "ecc_uncorrected": 1,
        "gpus_near_full": 1,
        "gpus_context_only": 1,
        "gpus_on_node": 2,
        "processes_on_busy_gpu": 2,
        "gpu_hours_wasted": 1.0,
        "gpu_hours_idle": 1.0,
    },
    "all 4 GPUs idle": {
        "gpus_allocated": 4,
        "gpus_used": 0,
        "duty_mean_pct": 0.0,
        "duty_min_pct": 0.0,
        "duty_max_pct": 0.0,
        "process_seen": None,
        "whole_node": 1,
        "nodes": 2,
        "nodes_expected": 2,
        "nodes_with_record": 1,
        "cpus_allocated": 64,
        "cpus_per_gpu": 16.0,
        "gpus_near_full": 4,
        "gpus_context_only": 3,
        "processes_on_busy_gpu": 4,
        "xid_count": 3,
        "ecc_uncorrected": None,
        "gpu_hours_wasted": 4.0,
        "gpu_hours_idle": 4.0,
    },
    "zero-length phases": {
        "elapsed_s": 0,
        "min_elapsed_s": 0,
        "idle_head_s": 0,
        "idle_tail_s": 0,
        "idle_head_pct": 0.0,
        "idle_tail_pct": 0.0,
        "idle_edge_min_s": 0,
        "idle_edge_min_pct": 0.0,
        "idle_edge_major_pct": 0.0,
        "time_limit_s": 0,
        "time_efficiency_pct": 0.0,
        "stall_share_pct": 0.0,
        "throttled_pct": 0.0,
        "gpu_hours_wasted": 0.0,
        "gpu_hours_idle": 0.0,
        "gpus_allocated": 2,
        "gpus_used": 1,
        "gpus_near_full": 2,
        "cpus_allocated": 2,
        "cpus_per_gpu": 2.0,
    },
    "unknowns an older analysis left out": {
        "process_seen": None,
        "cores_busy_peak_per_node": None,
        "cpus_allocated_per_node": None,
        "sm_active_mean_pct": None,
        "memory_peak_pct": None,
        "stall_share_pct": None,
        "mem_allocated_bytes": None,
        "ecc_uncorrected": None,
        "power_mean_w": None,
        "power_limit_w": None,
        "power_mean_of_limit_pct": None,
        "nvlink_idle_share_pct": None,
        "gpus_allocated": 2,
        "gpus_used": 1,
    },
}

#: Values for keys a scenario does not name: a plain mid case.
MID: dict[str, Any] = {
    "elapsed_s": 5400,
    "min_elapsed_s": 120,
    "time_limit_s": 86400,
    "mem_used_bytes": 3 * GIB,
    "host_rss_peak_bytes": 3 * GIB,
    "mem_allocated_bytes": 64 * GIB,
    "memory_peak_bytes": 39 * GIB,
    "memory_capacity_bytes": 40 * GIB,
    "power_mean_w": 110.0,
    "power_limit_w": 400.0,
    "compute_capability": 8.0,
    "imbalance_cv": 0.4,
    "nvlink_bytes": 10 * GIB,
    "whole_node": 0,
    "ranks_share_gpu": 0,
    "busy_nearly_empty": 0,
    "nodes": 2,
    "min_cpus_per_gpu": 4,
}


def _mid_by_suffix(key: str) -> Any:
    if key in MID:
        return MID[key]
    if key.endswith("_pct"):
        return 30.0
    if key.endswith("_s"):
        return 900
    if key.endswith("_bytes"):
        return 2 * GIB
    if key.endswith("_w"):
        return 200.0
    if "gpu_hours" in key:
        return 0.5
    return 2


def evidence_keys(path: Path) -> set[str]:
    """Every ``ev.KEY`` (or ``ev["KEY"]``) the template reads."""
    tree = jinja2.Environment().parse(path.read_text(encoding="utf-8"))
    keys = {
        n.attr
        for n in tree.find_all(jinja2.nodes.Getattr)
        if isinstance(n.node, jinja2.nodes.Name) and n.node.name == "ev"
    }
    for n in tree.find_all(jinja2.nodes.Getitem):
        named = isinstance(n.node, jinja2.nodes.Name) and n.node.name == "ev"
        if named and isinstance(n.arg, jinja2.nodes.Const):
            keys.add(str(n.arg.value))
    return keys


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, Any]
    subject: str | None = "node1:0"


#: Sentences that are wrong or useless, whatever the finding.
WRONG = [
    (re.compile(r"\bOnly 0 of\b"), "'Only 0 of N' worked"),
    (re.compile(r"\bOnly (\d+) of (the job's )?\1\b"), "'Only N of N'"),
    (
        re.compile(
            r"(?<![\d.,])1 (GPUs|nodes|cores|processes|errors|events|readings|ranks|CPUs)\b"
        ),
        "plural after 1",
    ),
    (re.compile(r"\(s\)"), "a hedged plural '(s)'"),
    (re.compile(r"(?<![\d.:])0 s\b"), "'0 s'"),
    (re.compile(r"(?<![\d-])00:00:00"), "a zero duration"),
    (re.compile(r"\b(None|nan|inf|n/a)\b"), "an unknown printed as a value"),
    (re.compile(r"(?<![\d)]) (%|GiB|W)(?![\w])"), "a unit without its number"),
    (re.compile(r"\{\{|\}\}|\(\s+\)|\s\.|\s,"), "template debris"),
    (re.compile(r"between (\S+ %) and \1"), "a range of one value"),
    (re.compile(r"\b0 (GPU|node|core|process)s? (was|were|ran|held)\b"), "a zero count as subject"),
]


def render(path: Path, scenario: str, severity: str = "warning") -> tuple[str, str]:
    values = SCENARIOS[scenario]
    ev = {k: values[k] if k in values else _mid_by_suffix(k) for k in evidence_keys(path)}
    word = findings_wording()
    return word(Finding(path.stem, severity, 6, ev))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_finding_wording_holds_at_the_boundaries(path: Path, scenario: str) -> None:
    for severity in ("info", "warning"):
        title, text = render(path, scenario, severity)
        assert title and text, f"{path.name} failed to render in {scenario!r}"
        for pattern, why in WRONG:
            found = pattern.search(title + "\n" + text)
            assert found is None, f"{path.name}, {scenario}: {why}: {found.group(0)!r} in {text!r}"


def test_the_reported_one_gpu_sentence_is_gone() -> None:
    # The case: a one-GPU job that never used its GPU.
    [path] = [p for p in TEMPLATES if p.stem == "GPU_UNUSED"]
    _, text = render(path, "0 of 1 GPU used")
    assert "Only 0 of 1 GPUs worked" not in text
    assert "request only those" not in text
    assert "1.00 GPU-hour" in text
    assert "It was the job's only GPU: the program ran on the CPU" in text
    assert "torch.cuda.is_available()" in text


def test_a_one_node_job_without_its_record_says_none_came() -> None:
    [path] = [p for p in TEMPLATES if p.stem == "NODE_RECORD_MISSING"]
    title, text = render(path, "0 of 1 GPU used")
    assert title == "Telemetry missing for the job's node"
    assert text.startswith("The job's node left no telemetry record")


def test_every_engine_code_has_a_template() -> None:
    from slurm_gpu.analysis.findings import Code

    assert {c.value for c in Code} <= {p.stem for p in TEMPLATES}


def test_one_gpu_job_that_never_used_its_gpu_gets_true_advice() -> None:
    # The reported job, through the real engine: one GPU, never used.
    from dataclasses import replace

    import gpueff_factory as F

    from slurm_gpu.analysis.engine import analyze
    from slurm_gpu.config import AnalysisSettings
    from slurm_gpu.records import Tres

    tres = Tres(cpus=8, mem_bytes=32 * GIB, nodes=1, gpus=1, gpu_types=(("a100", 1),), raw="x")
    job = replace(F.job(), alloc_tres=tres, req_tres=tres)
    analysis = analyze(job, [F.node_record(utils=([0.0] * 60,))], AnalysisSettings())
    [unused] = [f for f in analysis.findings if f.code.value == "GPU_UNUSED"]
    _, text = findings_wording()(unused)
    for pattern, why in WRONG:
        assert pattern.search(text) is None, f"{why} in {text!r}"
    assert "It was the job's only GPU" in text and "request only" not in text


def test_gpueff_report_of_a_one_core_job_says_one_core() -> None:
    from dataclasses import replace

    import gpueff_factory as F

    from slurm_gpu.jobreport.adapter import accounting_report
    from slurm_gpu.jobreport.terminal import TerminalRenderer

    report = replace(accounting_report(F.job(alloc_cpus=1, total_cpu_s=600.0)), cpus=1)
    text = TerminalRenderer(colour=False).report(report)
    assert "CPU time on 1 core)" in text and "1 cores" not in text
