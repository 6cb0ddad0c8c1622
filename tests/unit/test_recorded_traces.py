"""The diagnosis on jobs recorded on a real Slurm cluster (tests/data/traces): each one gets the
cause it is labelled with, and the healthy ones get no warning.

These traces went through Slurm, the prolog, the sampler and the epilog; none of their numbers
came from the code under test, which is what keeps the rules honest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu.analysis import Audience, Severity, analyze
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.errors import SpoolFormatError
from slurm_gpu.evaluation.recorded import (
    RecordedTrace,
    evaluate_recorded,
    load_corpus,
    load_trace,
    write_trace,
)
from slurm_gpu.evaluation.score import predicted

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
CORPUS = load_corpus(TRACES)


def test_the_corpus_covers_every_demo_pattern() -> None:
    patterns = {t.trace.pattern for t in CORPUS}
    assert patterns >= {
        "healthy",
        "idle-gpu",
        "dataloader",
        "small-batch",
        "near-oom",
        "imbalance",
        "overtime",
        "idle-tail",
    }


@pytest.mark.parametrize("trace", CORPUS, ids=lambda t: t.trace.name)
def test_each_recorded_job_gets_its_labelled_cause(trace: RecordedTrace) -> None:
    analysis = analyze(trace.trace.job, trace.trace.nodes, trace.settings(AnalysisSettings()))
    causes = predicted(analysis)
    codes = {f.code.value for f in analysis.findings}
    if trace.trace.labels:
        assert trace.trace.labels <= causes, (codes, causes)
        assert codes & set(trace.expected_codes), codes
        extra = causes - trace.trace.labels - trace.trace.tolerated
        assert not extra, f"unexpected causes {extra}: {codes}"
    else:
        warnings = [
            f.code.value
            for f in analysis.findings
            if f.audience is Audience.USER and f.severity is not Severity.INFO
        ]
        assert warnings == []


def test_the_recorded_corpus_scores_full_recall() -> None:
    ev = evaluate_recorded(CORPUS, AnalysisSettings())
    checked = set()
    for c in ev.causes:
        if c.labelled:
            checked.add(c.cause)
            assert c.recall == 1.0, c
    # Every cause the recorded corpus holds was checked (not passed for want of a label).
    assert checked >= {1, 2, 4, 5, 6}, checked
    assert ev.healthy_false_alarms == 0 and ev.healthy_traces > 0


def test_a_trace_is_judged_with_its_own_thresholds() -> None:
    trace = next(t for t in CORPUS if t.trace.pattern == "idle-tail")
    # With the site defaults (2 min before judging) a 40 s job is only "too short".
    default = analyze(trace.trace.job, trace.trace.nodes, AnalysisSettings())
    assert "IDLE_TAIL" not in {f.code.value for f in default.findings}
    assert trace.settings(AnalysisSettings()).min_elapsed_s < AnalysisSettings().min_elapsed_s


def test_round_trip_and_numbering(tmp_path: Path) -> None:
    source = json.loads(Path(CORPUS[0].path).read_text())
    first = write_trace(tmp_path, source)
    second = write_trace(tmp_path, source)
    assert first.name == f"{source['pattern']}-1.json"
    assert second.name == f"{source['pattern']}-2.json"
    again = load_trace(second)
    assert again.trace.job == CORPUS[0].trace.job
    assert again.trace.nodes == CORPUS[0].trace.nodes


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(format="other/1"),
        lambda d: d.update(labels=[9]),
        lambda d: d.update(analysis={"no_such_threshold": 1}),
        lambda d: d["job"].pop("user"),
    ],
)
def test_a_bad_file_is_a_typed_error_naming_it(tmp_path: Path, mutate: object) -> None:
    data = json.loads(Path(CORPUS[0].path).read_text())
    mutate(data)  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpoolFormatError, match=r"bad\.json"):
        load_trace(path)
