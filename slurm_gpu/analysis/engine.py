"""The analysis of one job: metrics, then findings, then recommendations. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.analysis.findings import (
    PROFILERS,
    Audience,
    Code,
    Finding,
    Recommendation,
    Severity,
)
from slurm_gpu.analysis.history import PastJob, repeated_codes, similar_jobs
from slurm_gpu.analysis.metrics import JobMetrics, job_metrics
from slurm_gpu.analysis.recommend import recommend
from slurm_gpu.analysis.rules import diagnose
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, NodeRecord

#: Bumped whenever a rule or a metric changes meaning; stored with every finding.
ANALYSIS_VERSION = "4"


@dataclass(frozen=True, slots=True)
class Analysis:
    """Everything the analysis says about one job."""

    job_id: str
    metrics: JobMetrics
    findings: tuple[Finding, ...]
    """Most severe first."""
    recommendations: tuple[Recommendation, ...]
    similar_jobs: int
    """How many similar past jobs the recommendations took into account."""
    version: str = ANALYSIS_VERSION

    @property
    def profiler_command(self) -> str | None:
        """The profiler for the most severe user finding that has one (cause 7: every report
        says how to look deeper); the general Nsight Systems command for a low-utilization
        job without one; ``None`` when nothing suspicious was found."""
        for f in self.findings:
            if f.audience is Audience.USER and f.profiler_command:
                return f.profiler_command
        if any(f.audience is Audience.USER and f.cause for f in self.findings):
            return PROFILERS["nsys"]
        return None


#: Elapsed times within this share of each other are "the same point" of a time-out.
SAME_POINT_PCT = 2.0


def remember(
    findings: tuple[Finding, ...], job: JobRecord, past: Sequence[PastJob]
) -> tuple[Finding, ...]:
    """``findings`` with what the user's recent similar jobs (``past``, newest first) had too:
    a time-out gets ``similar_timeouts`` (the last jobs in a row that timed out, and whether at
    the same elapsed time), and one note (``REPEATED_FINDINGS``, info) counts, once per code,
    how many of the last similar jobs in a row had the same warning or critical finding."""
    if not past:
        return findings
    out = []
    for f in findings:
        if f.code is Code.TIME_LIMIT_REACHED:
            timeouts = []
            for p in past:
                if p.state != "TIMEOUT":
                    break
                timeouts.append(p)
            if timeouts:
                same = all(
                    abs(p.elapsed_s - job.elapsed_s) <= SAME_POINT_PCT / 100.0 * job.elapsed_s
                    for p in timeouts
                )
                ev = {
                    **f.evidence,
                    "similar_timeouts": len(timeouts),
                    "similar_timeouts_same_point": int(same),
                }
                f = Finding(f.code, f.severity, ev, f.scope, f.subject)
        out.append(f)
    faults = [
        f.code.value
        for f in findings
        if f.severity is not Severity.INFO and f.code is not Code.TIME_LIMIT_REACHED
    ]
    repeats = repeated_codes(faults, past)
    if repeats:
        note: dict[str, int | float | None] = {f"repeat_{c}": n for c, n in repeats.items()}
        note["similar_jobs"] = len(past)
        out.append(Finding(Code.REPEATED_FINDINGS, Severity.INFO, note))
    return tuple(out)


def analyze(
    job: JobRecord,
    nodes: Sequence[NodeRecord],
    settings: AnalysisSettings,
    history: Sequence[PastJob] = (),
) -> Analysis:
    """Analyse one job from its accounting record, its nodes' sealed records (possibly fewer
    than its nodes, or none) and, optionally, the user's earlier jobs."""
    own = [n for n in nodes if n.job_id == job.job_id]
    metrics = job_metrics(job, own, settings)
    past = similar_jobs(job, history)
    findings = remember(diagnose(metrics, job, settings), job, past)
    recs = recommend(job, metrics, findings, settings, past)
    return Analysis(job.job_id, metrics, findings, recs, len(past))
