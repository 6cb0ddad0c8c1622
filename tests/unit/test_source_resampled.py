"""The same job seen through the hooks and through a coarser source gets the same findings.

Each synthetic job (``slurm_gpu.evaluation.traces``, every pattern) is read twice from the
same plan: by the hooks every 5 s, and by a Prometheus source every 30 s and every 60 s
(``generate(..., interval_s=)``), its records then stripped to what that source has
(``dcgm-exporter``: no process list, no host series; ``jobstats``: no process list, no SM
activity). Both are analysed against the same accounting record. The tolerances, stated in
``docs/telemetry.md`` ("Coarser sources: what holds"):

* findings: the same codes, less those the coarse source says it cannot tell
  (``SOURCE_CANNOT_TELL``), for jobs with at least ``MIN_READINGS`` readings at the coarse
  interval;
* the job's mean duty cycle: within the sampling error of the coarser mean (three standard
  deviations of a mean of ``n`` readings with the trace's per-reading noise) plus the
  quantisation of the job's two edges (one interval each);
* an idle head or tail: within one coarse interval of the hooks' figure.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from slurm_gpu.analysis.engine import Analysis, analyze
from slurm_gpu.analysis.findings import Code
from slurm_gpu.analysis.rules import _explains
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.evaluation.traces import PATTERNS, generate
from slurm_gpu.records import NodeRecord

S = AnalysisSettings()
HOOKS_INTERVAL_S = 5.0
MIN_READINGS = 30
SEEDS = range(3)


def seen_by(node: NodeRecord, source: str) -> NodeRecord:
    """``node`` as ``source`` would have it: no process list; dcgm-exporter has nothing of
    the host, jobstats no SM or tensor activity."""
    gpus = tuple(
        dataclasses.replace(
            g,
            process_seen=False,
            max_processes=0,
            pids=(),
            process_list_unread=g.samples_available,
            stall_grid=(),
            **(
                {"sm_active_mean_pct": None, "tensor_active_mean_pct": None}
                if source == "jobstats"
                else {}
            ),
        )
        for g in node.gpus
    )
    if source == "dcgm-exporter":
        timeline = tuple(
            dataclasses.replace(p, host_cpu_cores=None, host_rss_max_bytes=None)
            for p in node.timeline
        )
        return dataclasses.replace(node, source=source, gpus=gpus, host=None, timeline=timeline)
    return dataclasses.replace(node, source=source, gpus=gpus)


def _cannot_tell(a: Analysis) -> set[str]:
    return {
        key.removeprefix("cannot_tell_")
        for f in a.findings
        if f.code is Code.SOURCE_CANNOT_TELL
        for key in f.evidence
        if key.startswith("cannot_tell_")
    }


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("source", ["dcgm-exporter", "jobstats"])
def test_a_coarser_source_finds_what_the_hooks_find(pattern: str, source: str) -> None:
    compared = edges = 0
    for seed in SEEDS:
        hooks = generate(pattern, seed, HOOKS_INTERVAL_S)
        full = analyze(hooks.job, hooks.nodes, S)
        for interval in (30.0, 60.0):
            readings = hooks.job.elapsed_s / interval
            if readings < MIN_READINGS:
                continue
            coarse_trace = generate(pattern, seed, interval)
            coarse = analyze(hooks.job, [seen_by(n, source) for n in coarse_trace.nodes], S)
            where = f"{pattern} seed {seed} at {interval:g} s from {source}"
            # What a source cannot tell is compared apart: the hooks' own record may lack a
            # signal too (no step CPU time, no process list), and say so.
            told = {Code.SOURCE_CANNOT_TELL.value}
            full_codes = {f.code.value for f in full.findings} - told
            want = full_codes - _cannot_tell(coarse)
            got = {f.code.value for f in coarse.findings} - told
            # Ranks sharing one GPU fold the GPUs they left unused into their finding; a source
            # that cannot see the ranks still sees those GPUs unused, and says that alone.
            if "RANKS_SHARE_GPU" in full_codes - want:
                got -= {Code.GPU_UNUSED.value}
            # "Nothing explains the low use" is said only where every rule that could explain
            # it ran: a source that cannot tell one of them (data loading without host series)
            # names that rule instead.
            if any(_explains(Code(c)) for c in _cannot_tell(coarse) if c in Code.__members__):
                want -= {Code.LOW_UTILIZATION_UNEXPLAINED.value}
            assert got == want, where
            noise = dict(hooks.params)["noise_pct"]
            tol = 3 * noise / math.sqrt(readings) + 100.0 * 2 * interval / hooks.job.elapsed_s
            a, b = full.metrics.duty_mean_pct, coarse.metrics.duty_mean_pct
            assert (a is None) == (b is None), where
            if a is not None and b is not None:
                assert abs(a - b) <= tol, where
            for f in full.findings:
                for g in coarse.findings:
                    if f.code is not g.code:
                        continue
                    for key in ("idle_head_s", "idle_tail_s"):
                        x, y = f.evidence.get(key), g.evidence.get(key)
                        if x is not None and y is not None:
                            edges += 1
                            assert abs(x - y) <= interval, (where, key)
            compared += 1
    if compared == 0:
        pytest.skip(f"every {pattern} job of these seeds is shorter than {MIN_READINGS} readings")
    if pattern in ("idle-tail", "idle-head"):
        assert edges, pattern  # the idle edge was compared, not skipped for want of one


def test_what_the_coarse_source_cannot_tell_is_said_not_guessed() -> None:
    hooks = generate("dataloader", 1, HOOKS_INTERVAL_S)
    assert Code.DATALOADER_BOUND in {f.code for f in analyze(hooks.job, hooks.nodes, S).findings}
    coarse = generate("dataloader", 1, 60.0)
    a = analyze(hooks.job, [seen_by(n, "dcgm-exporter") for n in coarse.nodes], S)
    codes = {f.code for f in a.findings}
    assert Code.DATALOADER_BOUND not in codes
    assert Code.LOW_UTILIZATION_UNEXPLAINED not in codes  # not "no rule explains it"
    assert "DATALOADER_BOUND" in _cannot_tell(a)
