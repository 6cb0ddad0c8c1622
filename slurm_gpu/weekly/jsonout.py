"""The weekly report's aggregates as a versioned JSON document.

The document is ``{"format": "slurm-gpu.report.weekly", "version": N, "report": {...}}`` where
``report`` mirrors ``slurm_gpu.weekly.model.WeeklyReport`` field by field (times in epoch
seconds, GPU-hours, percentages; ``null`` for "not measured"). ``docs/report.md`` lists the
fields; ``REPORT_SCHEMA_VERSION`` changes when one changes meaning or disappears.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from slurm_gpu.weekly.model import REPORT_SCHEMA_VERSION, WeeklyReport

FORMAT = "slurm-gpu.report.weekly"


def _clean(obj: Any) -> Any:
    # JSON has no NaN or infinity; "not measured" is null.
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def to_document(report: WeeklyReport) -> dict[str, Any]:
    """The JSON-ready mapping of ``report``."""
    return {
        "format": FORMAT,
        "version": REPORT_SCHEMA_VERSION,
        "report": _clean(dataclasses.asdict(report)),
    }


def render_json(report: WeeklyReport) -> str:
    """``report`` as indented JSON text (keys in declaration order)."""
    return json.dumps(to_document(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
