"""The analysis of one job: metrics, then findings, then recommendations. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.analysis.findings import PROFILERS, Audience, Finding, Recommendation
from slurm_gpu.analysis.history import PastJob, similar_jobs
from slurm_gpu.analysis.metrics import JobMetrics, job_metrics
from slurm_gpu.analysis.recommend import recommend
from slurm_gpu.analysis.rules import diagnose
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, NodeRecord

#: Bumped whenever a rule or a metric changes meaning; stored with every finding.
ANALYSIS_VERSION = "3"


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
    findings = diagnose(metrics, job, settings)
    past = similar_jobs(job, history)
    recs = recommend(job, metrics, findings, settings, past)
    return Analysis(job.job_id, metrics, findings, recs, len(past))
