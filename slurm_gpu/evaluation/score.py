"""Scored evaluation of the diagnosis on labelled traces: per-cause precision and recall, false
alarms on healthy jobs, and the table written to ``docs/diagnosis.md``.

A trace's *predicted* causes are the causes of its user findings of severity warning or
critical, plus ``site`` when a site finding (throttling, hardware errors, a node failure) was
raised and ``outcome`` for a user finding about the job's own outcome (failed steps). A
predicted cause is a true positive when the trace is labelled with it or when the generator's
pattern makes it true as well (``TOLERATED``), otherwise a false positive. A healthy trace (one
that expects no finding at all, clear of any ground-truth line) with any warning or critical
finding is a false alarm.

The targets (``targets``) are judged on the held-out seed, clear of the lines, and on the
recorded traces, which weigh above the synthetic ones: one that disagrees with its label fails
the evaluation whatever the synthetic scores (a gate), and in the combined figures
(``combined``) each counts as ``RECORDED_WEIGHT`` synthetic traces.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.analysis import Analysis, Audience, Severity, analyze
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.evaluation.recs import RecCheck, check
from slurm_gpu.evaluation.traces import (
    AMBIGUOUS_PCT,
    EXPECTED_CODE,
    NEAR_PCT,
    OTHER_SIDE,
    PATTERN_LINES,
    PATTERNS,
    TRUTH_LINES,
    Trace,
)

CAUSES: tuple[int | str, ...] = (1, 2, 3, 4, 5, 6, 7, "site", "outcome")
MARGINS: tuple[str, ...] = ("clear", "near", "ambiguous")

#: The targets: recall and precision per cause clear of the lines on the held-out seed, false
#: alarms on healthy jobs (issue 26).
TARGET_RECALL = 0.95
TARGET_PRECISION = 0.95
TARGET_FALSE_ALARM_RATE = 0.05
#: In the combined figures, one recorded trace counts as this many synthetic ones.
RECORDED_WEIGHT = 10


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
        else:
            out.add("outcome")
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
    recommendations: int = 0
    rec_check: RecCheck | None = None
    """What is wrong with the trace's recommendation set."""
    margin: str = "clear"
    """The trace's distance from its pattern's ground-truth line (``traces.margin_of``)."""
    expected: tuple[str, ...] = ()
    """The finding codes of which one had to appear (none: a job expected to be healthy)."""

    @property
    def agrees(self) -> bool:
        """The diagnosis agrees with the label: the expected finding (or none) and no cause
        the trace is not labelled or tolerated with."""
        return self.expected_code_found and not self.false_positives


@dataclass(frozen=True, slots=True)
class MarginScore:
    """How often the diagnosis agreed with the labels at one distance from the line."""

    margin: str
    traces: int
    agreed: int


@dataclass(frozen=True, slots=True)
class CauseScore:
    """Precision and recall of one cause."""

    cause: int | str
    labelled: int
    predicted: int
    true_positive: int
    recall: float | None
    precision: float | None
    correct: int = 0
    """Predictions of the cause that were right (the numerator of precision)."""


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
    recommendations: int = 0
    """Recommendations made over the corpus."""
    recs_invalid: int = 0
    """Traces with a line that is not a real sbatch option of its form."""
    recs_below_use: int = 0
    """Traces with a proposal below the observed use."""
    recs_incoherent: int = 0
    """Traces with two proposals for the same option."""
    recs_not_actionable: int = 0
    """Traces with a reduction on a whole-node allocation."""
    margins: tuple[MarginScore, ...] = ()
    """Agreement by distance from the ground-truth line, over the patterns drawn across one."""

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
    expected = (
        trace.expected if trace.expected is not None else EXPECTED_CODE.get(trace.pattern, ())
    )
    return TraceResult(
        trace=trace.name,
        pattern=trace.pattern,
        labels=trace.labels,
        predicted=pred,
        codes=codes,
        expected_code_found=not expected or any(c in codes for c in expected),
        profiler_named=analysis.profiler_command is not None,
        false_positives=pred - trace.labels - trace.tolerated,
        recommendations=len(analysis.recommendations),
        rec_check=check(analysis, trace.job, whole_node=trace.whole_node),
        margin=trace.margin,
        expected=expected,
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
                correct=tp_precision,
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
    spanning = [r for r in results if r.pattern in TRUTH_LINES]
    margins = tuple(
        MarginScore(m, len(rs), sum(1 for r in rs if r.agrees))
        for m in MARGINS
        if (rs := [r for r in spanning if r.margin == m])
    )
    # Healthy: the traces that expect nothing at all (not the cannot-tell ones), clear of any
    # line (those near one are scored by their margin): the healthy patterns' and the healthy
    # side of the patterns drawn across a line.
    healthy = [r for r in results if not r.labels and not r.expected and r.margin == "clear"]
    # Reports of the user's utilization causes (1-7): outcomes and the site's are not.
    user = [r for r in results if any(isinstance(c, int) for c in r.labels)]
    return Evaluation(
        seed=seed,
        n_per_pattern=n_per_pattern,
        results=tuple(results),
        causes=tuple(causes),
        patterns=tuple(patterns),
        healthy_traces=len(healthy),
        healthy_false_alarms=sum(1 for r in healthy if r.predicted),
        profiler_coverage=(sum(1 for r in user if r.profiler_named) / len(user)) if user else None,
        recommendations=sum(r.recommendations for r in results),
        recs_invalid=sum(1 for r in results if r.rec_check and r.rec_check.invalid),
        recs_below_use=sum(1 for r in results if r.rec_check and r.rec_check.below_use),
        recs_incoherent=sum(1 for r in results if r.rec_check and r.rec_check.incoherent),
        recs_not_actionable=sum(1 for r in results if r.rec_check and r.rec_check.not_actionable),
        margins=margins,
    )


def run(
    traces: Sequence[Trace], settings: AnalysisSettings, *, seed: int, n_per_pattern: int
) -> Evaluation:
    """Analyse and score a corpus."""
    return score(
        [evaluate_trace(t, settings) for t in traces], seed=seed, n_per_pattern=n_per_pattern
    )


def at_margin(ev: Evaluation, margin: str) -> Evaluation:
    """``ev`` scored over its traces at one distance from the line (``clear``: also every
    trace of a pattern not drawn across one)."""
    return score(
        [r for r in ev.results if r.margin == margin], seed=ev.seed, n_per_pattern=ev.n_per_pattern
    )


@dataclass(frozen=True, slots=True)
class Target:
    """One target line of the evaluation and whether it is met."""

    name: str
    met: bool
    detail: str = ""


def targets(held_out: Evaluation, recorded: Evaluation | None = None) -> tuple[Target, ...]:
    """The targets, judged on the held-out corpus clear of the lines and on the recorded
    traces (a gate: one recorded trace that disagrees with its label fails it)."""
    clear = at_margin(held_out, "clear")
    low_recall = [
        f"cause {c.cause}: {c.recall:.2f}"
        for c in clear.causes
        if c.recall is not None and c.recall < TARGET_RECALL
    ]
    low_precision = [
        f"cause {c.cause}: {c.precision:.2f}"
        for c in clear.causes
        if c.precision is not None and c.precision < TARGET_PRECISION
    ]
    rate = clear.false_alarm_rate
    recs = (
        held_out.recs_invalid,
        held_out.recs_below_use,
        held_out.recs_incoherent,
        held_out.recs_not_actionable,
    )
    where = f"held-out seed {held_out.seed}, clear of the lines"
    out = [
        Target(
            f"recall ≥ {TARGET_RECALL:.2f} for every cause ({where})",
            not low_recall,
            ", ".join(low_recall),
        ),
        Target(
            f"precision ≥ {TARGET_PRECISION:.2f} for every cause ({where})",
            not low_precision,
            ", ".join(low_precision),
        ),
        Target(
            f"false alarms ≤ {TARGET_FALSE_ALARM_RATE * 100:g} % on healthy jobs ({where})",
            rate is not None and rate <= TARGET_FALSE_ALARM_RATE,
            f"{clear.healthy_false_alarms} of {clear.healthy_traces}",
        ),
        Target(
            f"no recommendation invalid for sbatch, below the observed use, set twice or a "
            f"reduction on a whole node (held-out seed {held_out.seed}, every trace)",
            not any(recs),
            ""
            if not any(recs)
            else "traces: {} invalid, {} below use, {} twice, {} whole node".format(*recs),
        ),
    ]
    if recorded is not None:
        wrong = [r.trace for r in recorded.results if not r.agrees]
        out.append(
            Target(
                "every recorded trace gets its labelled finding and no other cause",
                not wrong,
                ", ".join(wrong),
            )
        )
    return tuple(out)


def targets_met(found: Sequence[Target]) -> bool:
    """Whether every target is met."""
    return all(t.met for t in found)


@dataclass(frozen=True, slots=True)
class Combined:
    """One cause's recall and precision over the recorded traces and the held-out corpus
    clear of the lines, each recorded trace counting ``RECORDED_WEIGHT`` synthetic ones."""

    cause: int | str
    recall: float | None
    precision: float | None


def combined(held_out: Evaluation, recorded: Evaluation) -> tuple[Combined, ...]:
    """Per-cause figures in which the recorded traces weigh ``RECORDED_WEIGHT`` each."""
    clear = at_margin(held_out, "clear")
    w = RECORDED_WEIGHT
    out = []
    for cause in CAUSES:
        s, r = clear.cause(cause), recorded.cause(cause)
        labelled = s.labelled + w * r.labelled
        pred = s.predicted + w * r.predicted
        out.append(
            Combined(
                cause,
                (s.true_positive + w * r.true_positive) / labelled if labelled else None,
                (s.correct + w * r.correct) / pred if pred else None,
            )
        )
    return tuple(out)


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


def pattern_table(ev: Evaluation, *, lines: bool = True) -> list[str]:
    """Markdown rows: one per pattern; ``lines``: the corpus draws patterns across their
    ground-truth lines (the generated ones; not the recorded traces)."""
    rows = [
        "| pattern | traces | expected finding | share | traces with an extra cause |",
        "|---|---:|---|---:|---:|",
    ]
    for p in ev.patterns:
        code = " or ".join(f"`{c}`" for c in EXPECTED_CODE.get(p.pattern, ())) or "(none)"
        if lines and p.pattern in TRUTH_LINES:
            # Drawn across a line: the other side expects another finding, or none.
            other = " or ".join(f"`{c}`" for c in OTHER_SIDE.get(p.pattern, ((), ()))[1])
            code += f"; across the line {other or '(none)'}"
        rows.append(
            f"| {p.pattern} | {p.traces} | {code} | {p.detected / p.traces:.2f} | "
            f"{p.with_extra_causes} |"
        )
    return rows


def cause_margin_table(ev: Evaluation) -> list[str]:
    """Markdown rows: each cause's recall and precision by distance from the line, with the
    traces labelled with it and those predicting it in brackets."""
    parts = {m: at_margin(ev, m) for m in MARGINS}
    head = " | ".join(f"{m} recall | {m} precision" for m in MARGINS)
    rows = [f"| cause | {head} |", "|---|" + "---:|" * (2 * len(MARGINS))]
    for cause in CAUSES:
        cells = []
        for m in MARGINS:
            c = parts[m].cause(cause)
            cells.append(f"{_fmt(c.recall)} ({c.labelled})")
            cells.append(f"{_fmt(c.precision)} ({c.predicted})")
        rows.append(f"| {cause} | " + " | ".join(cells) + " |")
    return rows


def target_lines(found: Sequence[Target]) -> list[str]:
    """Markdown bullet lines: each target, met or not, and what missed it."""
    return [
        f"- {'met' if t.met else '**not met**'}: {t.name}" + (f" — {t.detail}" if t.detail else "")
        for t in found
    ]


def combined_table(held_out: Evaluation, recorded: Evaluation) -> list[str]:
    """Markdown rows: per cause, recorded, held-out clear of the lines, and the two combined
    with a recorded trace counting ``RECORDED_WEIGHT`` synthetic ones."""
    clear = at_margin(held_out, "clear")
    rows = [
        "| cause | recorded recall | recorded precision | held-out clear recall | "
        f"held-out clear precision | combined recall (×{RECORDED_WEIGHT}) | "
        f"combined precision (×{RECORDED_WEIGHT}) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in combined(held_out, recorded):
        r, s = recorded.cause(c.cause), clear.cause(c.cause)
        rows.append(
            f"| {c.cause} | {_fmt(r.recall)} | {_fmt(r.precision)} | {_fmt(s.recall)} | "
            f"{_fmt(s.precision)} | {_fmt(c.recall)} | {_fmt(c.precision)} |"
        )
    return rows


def margin_table(ev: Evaluation) -> list[str]:
    """Markdown rows: agreement with the labels by distance from the ground-truth line."""
    rows = [
        f"| distance from the line (patterns {', '.join(TRUTH_LINES)}) | traces | agree | share |",
        "|---|---:|---:|---:|",
    ]
    said = {
        "clear": f"clear (≥ {NEAR_PCT:g} %)",
        "near": f"near ({AMBIGUOUS_PCT:g}-{NEAR_PCT:g} %)",
        "ambiguous": f"ambiguous (< {AMBIGUOUS_PCT:g} %)",
    }
    for m in ev.margins:
        share = m.agreed / m.traces if m.traces else None
        rows.append(f"| {said[m.margin]} | {m.traces} | {m.agreed} | {_fmt(share)} |")
    return rows


def summary_lines(ev: Evaluation) -> list[str]:
    """Markdown bullet lines with the headline numbers."""
    return [
        f"- traces: {len(ev.results)} ({ev.n_per_pattern} per pattern, seed {ev.seed})",
        f"- false alarms on healthy jobs: {ev.healthy_false_alarms} of {ev.healthy_traces} "
        f"({_fmt(ev.false_alarm_rate)})",
        f"- reports naming a profiler command (unhealthy, user causes): "
        f"{_fmt(ev.profiler_coverage)}",
        f"- recommendations: {ev.recommendations}; traces with an invalid sbatch line: "
        f"{ev.recs_invalid}, with a proposal below the observed use: {ev.recs_below_use}, "
        f"with two proposals for one option: {ev.recs_incoherent}, with a reduction on a "
        f"whole-node allocation: {ev.recs_not_actionable}",
    ]


def pattern_lines_table() -> list[str]:
    """Markdown rows: every pattern, its deciding parameter, the thresholds it relates to and
    its ground-truth line (``traces.PATTERN_LINES``)."""
    rows = [
        "| pattern | deciding parameter, as drawn | rule thresholds | ground-truth line |",
        "|---|---|---|---|",
    ]
    for pattern in PATTERNS:
        drawn, thresholds, line = PATTERN_LINES[pattern]
        spans = "**drawn across** " if pattern in TRUTH_LINES else ""
        rows.append(f"| {pattern} | {drawn} | {thresholds} | {spans}{line} |")
    return rows


def markdown(
    held_out: Evaluation,
    tuning: Evaluation,
    settings_note: str = "",
    *,
    recorded: Evaluation | None = None,
    recorded_section: Sequence[str] = (),
) -> str:
    """The whole ``docs/diagnosis.md``: how the corpus is made and relates to the thresholds,
    the targets, the recorded traces' section (``recorded_section``, scored as ``recorded``),
    then the held-out and the tuning corpus."""
    spanning = ", ".join(TRUTH_LINES)
    found = targets(held_out, recorded)
    out = [
        "# Diagnosis quality",
        "",
        "Generated by `slurm-gpu evaluate --write docs/diagnosis.md`; do not edit by hand.",
        "",
        "Each synthetic trace is a Slurm accounting record plus per-node records built by the",
        "sampler's own streaming aggregates from generated readings, with varied job length,",
        "reading interval (1 s to 60 s, the sampling of other sites' monitoring systems), GPU",
        "and node count, GPU model and noise, submitted in a drawn request style (`--gres` with",
        "or without a type, `--gpus`, `--gpus-per-node`, `--gpus-per-task`; `--cpus-per-task` or",
        "`--cpus-per-gpu`; `--mem`, `--mem-per-gpu` or `--mem-per-cpu`), written either on the",
        "sbatch command line or as the batch script's `#SBATCH` lines (`slurm_gpu/evaluation`).",
        "Besides one pattern per cause, the corpus has the shapes real production jobs showed:",
        "task farms of one-core `srun` steps on a whole-node site with recurring idle phases",
        "(`task-farm`), the same with every step failed inside a COMPLETED job",
        "(`task-farm-failed`), and read from dcgm-exporter every 60 s with no step CPU time",
        '(`task-farm-no-step-cpu`: `SOURCE_CANNOT_TELL` expected, never "the CPUs were not the',
        'bottleneck"), MPI ranks all on one GPU while the others hold a context',
        "(`ranks-one-gpu`, and without a process list, told from the step's task count:",
        "`ranks-no-process-list`), busy but nearly empty GPUs without SM activity (`busy-empty`),",
        "memory-bound GPUs at the same low power (`memory-bound`, no finding expected), healthy",
        "jobs given whole nodes (`whole-node`, no finding expected), multi-node jobs ended by a",
        "node failure (`node-fail`) or saying FAILED with a NODE_FAIL step (`node-fail-failed`),",
        "healthy jobs ended by their time limit with their steps killed (`timeout-steps`: the",
        "time limit, not failed steps), jobs whose host part holds the GPUs back with every core",
        "pinned (`host-bound`), and DataLoaders in the training process (`dataloader-main`).",
        "",
        "## How the synthetic corpus relates to the thresholds",
        "",
        *textwrap.wrap(
            "The corpus is generated by us, with the rules' thresholds in view: it measures how "
            "the rules separate the patterns as we model them, not accuracy on real jobs. The "
            "recorded traces weigh more: one that disagrees with its label misses the targets "
            "whatever the synthetic scores, and in the combined figures each counts as "
            f"{RECORDED_WEIGHT} synthetic traces.",
            width=88,
        ),
        "",
        *textwrap.wrap(
            "Where a pattern's truth can be defined from the pattern itself, in "
            f"{len(TRUTH_LINES)} of {len(PATTERNS)} patterns ({spanning}), the generator draws "
            "its deciding parameter across that line (`traces.TRUTH_LINES`) and labels each "
            "trace by the side it fell on, not by what a rule says: on the far side a trace "
            "expects no finding (a `healthy` job below 50 % duty expects "
            "`LOW_UTILIZATION_UNEXPLAINED`, cause 7). The lines are where the rules' thresholds "
            "sit too, so clear of them the rules should agree; near them they can disagree "
            "(measured values carry noise and sampling; graded findings are info notes within "
            "`near_threshold_band_pct` of their threshold, and a note counts as the expected "
            "finding but not as a predicted cause). Agreement is reported by distance from the "
            f"line: clear (≥ {NEAR_PCT:g} % of the line away), near "
            f"({AMBIGUOUS_PCT:g}-{NEAR_PCT:g} %), ambiguous (< {AMBIGUOUS_PCT:g} %). The other "
            "patterns' ranges sit on one side of their thresholds, and their scores say only "
            "that the rules implement those numbers; the table says why each has no line of its "
            "own.",
            width=88,
            break_on_hyphens=False,
        ),
        "",
        *pattern_lines_table(),
        "",
        "The rules' thresholds were tuned on the *tuning* seed only; the *held-out* seed is a",
        "corpus they never saw, and the targets are judged on it, clear of the lines. A",
        "predicted cause counts as correct when the trace is labelled with it or the generator",
        "makes it true too (a small-batch job also fits a smaller GPU); `site` is throttling,",
        "hardware errors and node failures, reported to the site, not the user; `outcome` is",
        "the job's own outcome (failed steps, a time-out). Cause 7 (lack of monitoring) is the",
        "product itself: it is scored as the share of reports of user utilization causes that",
        "name a profiler command, and `LOW_UTILIZATION_UNEXPLAINED` is right only on the low",
        "side of `healthy` (elsewhere it counts against precision). Healthy jobs, for false",
        "alarms, are the traces that expect no finding at all, clear of any line. Findings of",
        "severity info are notes, not predictions.",
        "",
        "Recommendations are scored as a set per job (`slurm_gpu/evaluation/recs.py`), read in",
        "the job's own request style: every line must be `#SBATCH` with a real sbatch option and",
        "a value of its form; no proposal may fall below the observed use (GPUs used, the",
        "busiest cores on one node for the proposed GPU count, also where a GPU cut takes cores",
        "that come per GPU with it, the memory peak per node in any memory form, the elapsed",
        "time); no option may be proposed twice; and no CPU, memory or GPU-count reduction may",
        "be made on a whole-node allocation. `tests/integration/test_request_style_cluster.py`",
        "submits every recommended set with `sbatch --test-only` on the test cluster (22.05), and",
        "`tests/lab/test_lab_request_style.py` does the same on the 24.11 and 26.05 labs, with the",
        "same check (`tests/request_styles.py`) sized for a lab node.",
        "",
        "What the engine cannot tell, by source (`docs/telemetry.md` has the rule × source",
        "table; `SOURCE_CANNOT_TELL` names what a job's records lacked):",
        "",
        "- every source: when the job last checkpointed (the GPU-hours a node failure or a",
        "  time-out cost are the whole allocation, with those after the GPUs' last kernel",
        "  apart); a whole-node allocation on a shared partition when the job asked for a whole",
        "  node; options written as `#SBATCH` lines of the script where the site keeps no",
        "  scripts (the request style is read from `SubmitLine` over the script's directives,",
        "  which Slurm keeps only with `AccountingStoreFlags=job_script`; where neither says",
        "  anything, the usual forms are used: `--gres` on one node, `--gpus` on several,",
        "  `--cpus-per-task` (the form a script most often sets, which a `--cpus-per-gpu` line",
        "  beside it would make sbatch refuse), `--mem`); physical cores unless",
        "  `threads_per_core` is set;",
        "- accounting without step CPU time (`TotalCPU` per step): whether steps bound to fewer",
        "  cores than the node were CPU-bound (`STEPS_CPU_BOUND`), and so whether their GPUs'",
        "  steady low use was small work (`LOW_PARALLELISM`) or idle cores were over-requested;",
        "- the node hooks (NVML, virtual): records sealed before a counter existed lack it",
        "  (stall grid, unreadable process lists, memory bandwidth); idle phases are seen at the",
        "  timeline's resolution;",
        "- dcgm-exporter: data loading and cores per GPU (no host series); which processes held",
        "  a GPU (ranks sharing one are told from the steps' task counts, where accounting has",
        "  them); tensor-core use without DCGM profiling;",
        "- jobstats: processes (as dcgm-exporter), SM and tensor activity; busy-but-empty by",
        "  power alone (no memory bandwidth), so a bandwidth-bound job can read as nearly empty;",
        "- the slurm-gpu exporter via Prometheus: processes, SM activity;",
        "- Slurm accounting's GPU TRES (slurm-tres): anything over time (idle head, tail and",
        "  phases, ragged tails, data loading), processes, power, SM activity, GPU capacity.",
        "",
        "## Targets",
        "",
        *target_lines(found),
        "",
        f"Evaluation {'meets every target' if targets_met(found) else 'misses a target'}.",
    ]
    if recorded is not None:
        out += [
            "",
            "Per cause, the recorded traces, the held-out corpus clear of the lines, and both",
            f"combined with a recorded trace counting {RECORDED_WEIGHT} synthetic ones:",
            "",
            *combined_table(held_out, recorded),
        ]
    if settings_note:
        out += ["", settings_note]
    out += [line for line in recorded_section]
    for title, ev in (("Held-out", held_out), ("Tuning", tuning)):
        out += ["", f"## {title} corpus (seed {ev.seed})", "", *summary_lines(ev), ""]
        out += cause_table(ev)
        out += ["", "By distance from the line (traces labelled and predicting in brackets):", ""]
        out += cause_margin_table(ev)
        out += [""]
        out += margin_table(ev)
        out += [""]
        out += pattern_table(ev)
    return "\n".join(out) + "\n"
