"""Findings that share a cause and a remedy are one finding naming the GPUs, and whole-node
wording agrees across rules (issue 26, points 6 and 5's LOW_PARALLELISM). Each test is named
after the real case."""

from __future__ import annotations

from pathlib import Path

import jinja2
from analysis_factory import gpu, host, job, node

from slurm_gpu.analysis import Code, analyze
from slurm_gpu.analysis.rules import SUBJECT_MAX_CHARS, name_gpus
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))


def test_four_gpu_job_with_three_unused_gpus_gets_one_paragraph_naming_the_three() -> None:
    # The real case: the same full "never used" paragraph printed three times.
    gpus = [gpu("GPU-0", duty=90.0)]
    gpus += [gpu(f"GPU-{i}", duty=0.0, process=False) for i in (1, 2, 3)]
    a = analyze(job(gpus=4, cpus=32), [node(gpus, host_summary=host(cores=32))], S)
    unused = [f for f in a.findings if f.code is Code.GPU_UNUSED]
    assert len(unused) == 1
    (f,) = unused
    assert f.subject == "GPU-1, GPU-2, GPU-3" and f.evidence["gpus_unused"] == 3
    assert f.evidence["gpu_hours_wasted"] == 3.0
    title, text = wording(ENV, f)
    assert title == "3 allocated GPUs were never used"
    assert text.count("ran no kernel") == 1 and "3 GPUs (GPU-1, GPU-2, GPU-3)" in text


def test_unused_gpus_known_empty_and_unknown_stay_two_findings() -> None:
    # Different things known of them, different wording: one finding each.
    gpus = [gpu("GPU-0", duty=90.0), gpu("GPU-1", duty=0.0, process=False)]
    known = node(gpus)
    unknown = node(
        [gpu("GPU-2", duty=90.0, process=False), gpu("GPU-3", duty=0.0, process=False)],
        hostname="gpu002",
    )
    j = job(gpus=4, cpus=16, nodes=("gpu001", "gpu002"))
    unused = [f for f in analyze(j, [known, unknown], S).findings if f.code is Code.GPU_UNUSED]
    assert sorted(f.evidence["process_seen"] is None for f in unused) == [False, True]


def test_many_gpus_are_named_within_the_stores_subject_column() -> None:
    uuids = [f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(16)]
    named = name_gpus(uuids)
    assert len(named) <= SUBJECT_MAX_CHARS and named.startswith("GPU-00000000")
    assert "more" in name_gpus(uuids * 4)


def test_low_parallelism_on_a_whole_node_partition_does_not_say_fewer_gpus() -> None:
    # The real case: LOW_PARALLELISM said "fewer GPUs" while GPU_UNUSED in the same report said
    # fewer GPUs free nothing on that whole-node partition.
    whole = AnalysisSettings(exclusive_partitions=("gpu",))
    gpus = [gpu(f"GPU-{i}", duty=20.0, mem_frac=0.1) for i in range(4)]
    a = analyze(
        job(gpus=4, cpus=32), [node(gpus, host_summary=host(cores=32, busy_frac=0.1))], whole
    )
    f = next(f for f in a.findings if f.code is Code.LOW_PARALLELISM)
    text = wording(ENV, f)[1]
    assert "fewer GPUs would free nothing" in text and "batch size, fewer GPUs" not in text
    shared = analyze(
        job(gpus=4, cpus=32), [node(gpus, host_summary=host(cores=32, busy_frac=0.1))], S
    )
    g = next(f for f in shared.findings if f.code is Code.LOW_PARALLELISM)
    assert "fewer GPUs" in wording(ENV, g)[1]
