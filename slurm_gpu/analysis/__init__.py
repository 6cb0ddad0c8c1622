"""The analysis engine: metrics, findings (the seven causes of low GPU utilization) and
recommendations, as pure functions of a job's accounting record and its node records."""

from slurm_gpu.analysis.engine import ANALYSIS_VERSION, Analysis, analyze
from slurm_gpu.analysis.findings import (
    CODES,
    PROFILERS,
    Audience,
    Code,
    Finding,
    Option,
    Recommendation,
    Scope,
    Severity,
)
from slurm_gpu.analysis.history import PastJob
from slurm_gpu.analysis.metrics import DataStatus, GpuMetrics, JobMetrics

__all__ = [
    "ANALYSIS_VERSION",
    "CODES",
    "PROFILERS",
    "Analysis",
    "Audience",
    "Code",
    "DataStatus",
    "Finding",
    "GpuMetrics",
    "JobMetrics",
    "Option",
    "PastJob",
    "Recommendation",
    "Scope",
    "Severity",
    "analyze",
]
