"""Scored evaluation of the diagnosis on labelled traces: per-cause precision and recall, false
alarms on healthy jobs, and the table written to ``docs/diagnosis.md``.

A trace's *predicted* causes are the causes of its user findings of severity warning or
critical, plus ``site`` when a site finding (throttling, hardware errors) was raised. A
predicted cause is a true positive when the trace is labelled with it or when the generator's
pattern makes it true as well (``TOLERATED``), otherwise a false positive. A healthy trace with
any warning or critical finding is a false alarm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.analysis import Analysis, Audience, Severity, analyze
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.evaluation.traces import EXPECTED_CODE, PATTERNS, Trace

CAUSES: tuple[int | str, ...] = (1, 2, 3, 4, 5, 6, 7, "site")


def predicted(analysis: Analysis) -> frozenset[int | str]:
    """The causes an analysis names (warning or critical findings only)."""
    out: set[int | str] = set()
    for f in analysis.findings:
        if f.severity is Severity.INFO:
            continue
        if f.audience is Audience.SITE:
            out.add("site")
        elif f.cause is not None:
            out.add(f.cause)
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class TraceResult:
    """One trace's outcome."""

    trace: str
    pattern: str
    labels: frozenset[int | str]
    predicted: frozenset[int | str]
    codes: tuple[str, ...]
    expected_code_found: bool
    profiler_named: bool
    false_positives: frozenset[int | str]


@dataclass(frozen=True, slots=True)
class CauseScore:
    """Precision and recall of one cause."""

    cause: int | str
    labelled: int
    predicted: int
    true_positive: int
    recall: float | None
    precision: float | None


@dataclass(frozen=True, slots=True)
class PatternScore:
    """How often the expected finding code appeared for a pattern."""

    pattern: str
    traces: int
    detected: int
    with_extra_causes: int


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The scores of one corpus."""

    seed: int
    n_per_pattern: int
    results: tuple[TraceResult, ...]
    causes: tuple[CauseScore, ...]
    patterns: tuple[PatternScore, ...]
    healthy_traces: int
    healthy_false_alarms: int
    profiler_coverage: float | None
    """Share of unhealthy, user-cause traces whose report names a profiler command."""

    @property
    def false_alarm_rate(self) -> float | None:
        """False alarms over healthy traces."""
        return self.healthy_false_alarms / self.healthy_traces if self.healthy_traces else None

    def cause(self, cause: int | str) -> CauseScore:
        """The score of one cause."""
        return next(c for c in self.causes if c.cause == cause)


def evaluate_trace(trace: Trace, settings: AnalysisSettings) -> TraceResult:
    """Analyse one trace and compare with its labels."""
    analysis = analyze(trace.job, trace.nodes, settings)
    pred = predicted(analysis)
    codes = tuple(f.code.value for f in analysis.findings)
    expected = EXPECTED_CODE.get(trace.pattern)
    return TraceResult(
        trace=trace.name,
        pattern=trace.pattern,
        labels=trace.labels,
        predicted=pred,
        codes=codes,
        expected_code_found=not expected or any(c in codes for c in expected),
        profiler_named=analysis.profiler_command is not None,
        false_positives=pred - trace.labels - trace.tolerated,
    )


def score(results: Sequence[TraceResult], *, seed: int, n_per_pattern: int) -> Evaluation:
    """Aggregate per-trace results into per-cause and per-pattern scores."""
    causes = []
    for cause in CAUSES:
        labelled = [r for r in results if cause in r.labels]
        pred = [r for r in results if cause in r.predicted]
        tp_recall = sum(1 for r in labelled if cause in r.predicted)
        tp_precision = sum(1 for r in pred if cause not in r.false_positives)
        causes.append(
            CauseScore(
                cause=cause,
                labelled=len(labelled),
                predicted=len(pred),
                true_positive=tp_recall,
                recall=tp_recall / len(labelled) if labelled else None,
                precision=tp_precision / len(pred) if pred else None,
            )
        )
    patterns = []
    for pattern in PATTERNS:
        rs = [r for r in results if r.pattern == pattern]
        if not rs:
            continue
        patterns.append(
            PatternScore(
                pattern=pattern,
                traces=len(rs),
                detected=sum(1 for r in rs if r.expected_code_found),
                with_extra_causes=sum(1 for r in rs if r.false_positives),
            )
        )
    healthy = [r for r in results if not r.labels]
    user = [r for r in results if r.labels and "site" not in r.labels]
    return Evaluation(
        seed=seed,
        n_per_pattern=n_per_pattern,
        results=tuple(results),
        causes=tuple(causes),
        patterns=tuple(patterns),
        healthy_traces=len(healthy),
        healthy_false_alarms=sum(1 for r in healthy if r.predicted),
        profiler_coverage=(sum(1 for r in user if r.profiler_named) / len(user)) if user else None,
    )


def run(
    traces: Sequence[Trace], settings: AnalysisSettings, *, seed: int, n_per_pattern: int
) -> Evaluation:
    """Analyse and score a corpus."""
    return score(
        [evaluate_trace(t, settings) for t in traces], seed=seed, n_per_pattern=n_per_pattern
    )


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def cause_table(ev: Evaluation) -> list[str]:
    """Markdown rows: one per cause."""
    rows = [
        "| cause | labelled | predicted | recall | precision |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in ev.causes:
        rows.append(
            f"| {c.cause} | {c.labelled} | {c.predicted} | {_fmt(c.recall)} | {_fmt(c.precision)} |"
        )
    return rows


def pattern_table(ev: Evaluation) -> list[str]:
    """Markdown rows: one per pattern."""
    rows = [
        "| pattern | traces | expected finding | share | traces with an extra cause |",
        "|---|---:|---|---:|---:|",
    ]
    for p in ev.patterns:
        code = " or ".join(f"`{c}`" for c in EXPECTED_CODE.get(p.pattern, ())) or "(none)"
        rows.append(
            f"| {p.pattern} | {p.traces} | {code} | {p.detected / p.traces:.2f} | "
            f"{p.with_extra_causes} |"
        )
    return rows


def summary_lines(ev: Evaluation) -> list[str]:
    """Markdown bullet lines with the headline numbers."""
    return [
        f"- traces: {len(ev.results)} ({ev.n_per_pattern} per pattern, seed {ev.seed})",
        f"- false alarms on healthy jobs: {ev.healthy_false_alarms} of {ev.healthy_traces} "
        f"({_fmt(ev.false_alarm_rate)})",
        f"- reports naming a profiler command (unhealthy, user causes): "
        f"{_fmt(ev.profiler_coverage)}",
    ]


def markdown(held_out: Evaluation, tuning: Evaluation, settings_note: str = "") -> str:
    """The whole ``docs/diagnosis.md``."""
    out = [
        "# Diagnosis quality",
        "",
        "Generated by `slurm-gpu evaluate --write docs/diagnosis.md`; do not edit by hand.",
        "",
        "Each synthetic trace is a Slurm accounting record plus per-node records built by the",
        "sampler's own streaming aggregates from generated readings, with varied job length,",
        "reading interval, GPU and node count, GPU model and noise (`slurm_gpu/evaluation`).",
        "The rules' thresholds were tuned on the *tuning* seed only; the *held-out* seed is a",
        "corpus the thresholds never saw. Targets: recall ≥ 0.90 for every cause, ≤ 5 % false",
        "alarms on healthy jobs. A predicted cause counts as correct when the trace is labelled",
        "with it or the generator makes it true too (a small-batch job also fits a smaller",
        "GPU); `site` is throttling and hardware errors, reported to the site, not the user.",
        "Cause 7 (lack of monitoring) is the product itself: it is scored as the share of",
        "reports that name a profiler command, and `LOW_UTILIZATION_UNEXPLAINED` findings",
        "count against precision. Findings of severity info (a value within",
        "`near_threshold_band_pct` of its threshold) are notes, not predictions.",
        "",
        "What the engine cannot tell from the signals it has (`docs/analysis.md`): GPU stalls",
        "and busy cores are correlated on the downsampled timeline, not at the sampling",
        "resolution; without SM activity, a busy-but-nearly-empty GPU is judged by power",
        "alone (memory bandwidth is not in the record); an unreadable process list is told",
        'from "no process" only on a node where some GPU ran kernels; a whole-node',
        "allocation is seen from `exclusive_partitions` or from more allocated than requested",
        "CPUs or memory, not when the request was a whole node; steps, their exit codes and",
        "node failures are not used yet; recurring mid-job idle phases and ragged tails are",
        "not detected. The corpus has no task-farm, MPI-rank-binding or whole-node patterns",
        "yet: the unit tests `tests/unit/test_diagnosis_real_cases.py` cover those shapes.",
    ]
    if settings_note:
        out += ["", settings_note]
    for title, ev in (("Held-out", held_out), ("Tuning", tuning)):
        out += ["", f"## {title} corpus (seed {ev.seed})", "", *summary_lines(ev), ""]
        out += cause_table(ev)
        out += [""]
        out += pattern_table(ev)
    return "\n".join(out) + "\n"
