"""The analysis engine: metrics, findings (the seven causes of low GPU utilization) and
recommendations, as pure functions of a job's accounting record and its node records.

The names below load their module on first use (PEP 562): ``gpueff`` words stored findings
with ``analysis.wording`` and ``analysis.findings`` only, and importing a submodule runs this
file first, so it must not pull in the engine (metrics, rules, history: about 20 ms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurm_gpu.lazy import lazy_exports

if TYPE_CHECKING:
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

#: Exported name -> the module that defines it.
_HOMES = {
    "ANALYSIS_VERSION": "engine",
    "Analysis": "engine",
    "analyze": "engine",
    "CODES": "findings",
    "PROFILERS": "findings",
    "Audience": "findings",
    "Code": "findings",
    "Finding": "findings",
    "Option": "findings",
    "Recommendation": "findings",
    "Scope": "findings",
    "Severity": "findings",
    "PastJob": "history",
    "DataStatus": "metrics",
    "GpuMetrics": "metrics",
    "JobMetrics": "metrics",
}


__getattr__ = lazy_exports(globals(), _HOMES)


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
