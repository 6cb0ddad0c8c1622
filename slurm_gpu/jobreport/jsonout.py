"""``gpueff --json``: the versioned, documented machine-readable form of a report.

The schema is ``SCHEMA`` below (JSON Schema draft 2020-12) and is documented in
``docs/gpueff.md``. Bump ``SCHEMA_VERSION`` on any change that removes or renames a field or
changes a unit; adding a field keeps the version. Unknown values are ``null``, never ``0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slurm_gpu.jobreport.model import JobReport, TelemetryStatus

SCHEMA_ID = "https://slurm-gpu.org/schemas/gpueff/v1.json"
SCHEMA_VERSION = 1

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}

_GPU = {
    "type": "object",
    "required": [
        "node",
        "uuid",
        "name",
        "slot",
        "duty_mean_pct",
        "duty_p50_pct",
        "idle_fraction",
        "sm_active_mean_pct",
        "memory_peak_bytes",
        "memory_total_bytes",
        "power_mean_w",
        "power_limit_w",
        "energy_j",
        "process_seen",
        "timeline_utilization_pct",
    ],
    "additionalProperties": False,
    "properties": {
        "node": {"type": "string"},
        "uuid": {"type": "string"},
        "name": _STR,
        "slot": _INT,
        "duty_mean_pct": _NUM,
        "duty_p50_pct": _NUM,
        "idle_fraction": _NUM,
        "sm_active_mean_pct": _NUM,
        "memory_peak_bytes": _INT,
        "memory_total_bytes": _INT,
        "power_mean_w": _NUM,
        "power_limit_w": _NUM,
        "energy_j": _NUM,
        "process_seen": {"type": ["boolean", "null"]},
        "timeline_utilization_pct": {"type": "array", "items": _NUM},
        "throttled_pct": _NUM,
    },
}

_ENERGY = {
    "type": "object",
    "required": ["kwh", "idle_kwh", "idle_share", "cost", "currency", "co2_kg"],
    "additionalProperties": False,
    "properties": {
        "kwh": {"type": "number"},
        "idle_kwh": _NUM,
        "idle_share": _NUM,
        "cost": _NUM,
        "currency": {"type": "string"},
        "co2_kg": _NUM,
    },
}

_FINDING = {
    "type": "object",
    "required": ["code", "severity", "cause", "title", "text", "evidence"],
    "additionalProperties": False,
    "properties": {
        "code": {"type": "string"},
        "severity": {"type": "string"},
        "cause": {"type": ["integer", "null"], "minimum": 1, "maximum": 7},
        "title": {"type": "string"},
        "text": {"type": "string"},
        "evidence": {"type": "object", "additionalProperties": {"type": "string"}},
        "evidence_keys": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

_RECOMMENDATION = {
    "type": "object",
    "required": ["text", "sbatch_lines", "gpu_hours_saved"],
    "additionalProperties": False,
    "properties": {
        "text": {"type": "string"},
        "sbatch_lines": {"type": "array", "items": {"type": "string"}},
        "gpu_hours_saved": _NUM,
    },
}

_LIVE_ACTION = {
    "type": "object",
    "required": [
        "at_s",
        "after_start_s",
        "rule",
        "action",
        "gpus",
        "idle_gpu_hours",
        "stopped_gpu_hours",
    ],
    "additionalProperties": False,
    "properties": {
        "at_s": {"type": "number"},
        "after_start_s": _NUM,
        "rule": {"type": "string"},
        "action": {"enum": ["warned", "cancelled"]},
        "gpus": {"type": "integer"},
        "idle_gpu_hours": {"type": "number"},
        "stopped_gpu_hours": _NUM,
    },
}

_JOB = {
    "type": "object",
    "additionalProperties": False,
    "required": [
        "job_id",
        "job_id_display",
        "array_job_id",
        "job_name",
        "user",
        "account",
        "partition",
        "state",
        "exit_code",
        "elapsed_s",
        "time_limit_s",
        "start_s",
        "end_s",
        "nodes",
        "cpus",
        "gpus_allocated",
        "gpu_model",
        "req_mem_bytes",
        "max_rss_bytes",
        "total_cpu_s",
        "cpu_efficiency_pct",
        "mem_efficiency_pct",
        "telemetry",
        "telemetry_note",
        "live_updated_s",
        "gpu_hours_allocated",
        "gpu_hours_idle",
        "energy_j",
        "gpus",
        "findings",
        "recommendations",
        "live_actions",
    ],
    "properties": {
        "job_id": {"type": "string"},
        "job_id_display": {"type": "string"},
        "array_job_id": _STR,
        "job_name": {"type": "string"},
        "user": {"type": "string"},
        "account": _STR,
        "partition": _STR,
        "state": {"type": "string"},
        "exit_code": _INT,
        "exit_signal": _INT,
        "elapsed_s": {"type": "integer"},
        "time_limit_s": _INT,
        "start_s": _NUM,
        "end_s": _NUM,
        "nodes": {"type": "array", "items": {"type": "string"}},
        "cpus": _INT,
        "gpus_allocated": {"type": "integer"},
        "gpu_model": _STR,
        "req_mem_bytes": _INT,
        "max_rss_bytes": _INT,
        "total_cpu_s": _NUM,
        "cpu_efficiency_pct": _NUM,
        "mem_efficiency_pct": _NUM,
        "telemetry": {"enum": [s.value for s in TelemetryStatus]},
        "telemetry_note": {"type": "string"},
        "live_updated_s": _NUM,
        "live_source": {"enum": ["spool", "prometheus", None]},
        "notes": {"type": "array", "items": {"type": "string"}},
        "gpu_hours_allocated": {"type": "number"},
        "gpu_hours_idle": _NUM,
        "energy_j": _NUM,
        "energy": {"oneOf": [{"type": "null"}, _ENERGY]},
        "gpus": {"type": "array", "items": _GPU},
        "findings": {"type": "array", "items": _FINDING},
        "recommendations": {"type": "array", "items": _RECOMMENDATION},
        "live_actions": {"type": "array", "items": _LIVE_ACTION},
    },
}

#: The whole document ``gpueff --json`` prints.
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "gpueff report",
    "type": "object",
    "required": ["schema", "version", "jobs", "not_found"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": "gpueff"},
        "version": {"const": SCHEMA_VERSION},
        "jobs": {"type": "array", "items": _JOB},
        "not_found": {"type": "array", "items": {"type": "string"}},
    },
}


def job_json(r: JobReport) -> dict[str, Any]:
    """One report as a JSON-ready mapping (see ``SCHEMA``)."""
    return {
        "job_id": r.job_id,
        "job_id_display": r.job_id_display,
        "array_job_id": r.array_job_id,
        "job_name": r.job_name,
        "user": r.user,
        "account": r.account,
        "partition": r.partition,
        "state": r.state,
        "exit_code": r.exit_code,
        "exit_signal": r.exit_signal,
        "elapsed_s": r.elapsed_s,
        "time_limit_s": r.time_limit_s,
        "start_s": r.start_s,
        "end_s": r.end_s,
        "nodes": list(r.nodes),
        "cpus": r.cpus,
        "gpus_allocated": r.gpus_allocated,
        "gpu_model": r.gpu_model,
        "req_mem_bytes": r.req_mem_bytes,
        "max_rss_bytes": r.max_rss_bytes,
        "total_cpu_s": r.total_cpu_s,
        "cpu_efficiency_pct": r.cpu_efficiency_pct,
        "mem_efficiency_pct": r.mem_efficiency_pct,
        "telemetry": r.telemetry.value,
        "telemetry_note": r.telemetry_note,
        "live_updated_s": r.live_updated_s,
        "live_source": r.live_source,
        "notes": list(r.notes),
        "gpu_hours_allocated": r.gpu_hours_allocated,
        "gpu_hours_idle": r.gpu_hours_wasted,
        "energy_j": r.energy_j,
        "energy": None
        if r.energy is None
        else {
            "kwh": r.energy.kwh,
            "idle_kwh": r.energy.idle_kwh,
            "idle_share": r.energy.idle_share,
            "cost": r.energy.cost,
            "currency": r.energy.currency,
            "co2_kg": r.energy.co2_kg,
        },
        "gpus": [
            {
                "node": g.node,
                "uuid": g.uuid,
                "name": g.name,
                "slot": g.slot,
                "duty_mean_pct": g.duty_mean_pct,
                "duty_p50_pct": g.duty_p50_pct,
                "idle_fraction": g.idle_fraction,
                "sm_active_mean_pct": g.sm_active_mean_pct,
                "memory_peak_bytes": g.memory_peak_bytes,
                "memory_total_bytes": g.memory_total_bytes,
                "power_mean_w": g.power_mean_w,
                "power_limit_w": g.power_limit_w,
                "energy_j": g.energy_j,
                "process_seen": g.process_seen,
                "timeline_utilization_pct": list(g.spark_pct),
                "throttled_pct": g.throttled_pct,
            }
            for g in r.gpus
        ],
        "findings": [
            {
                "code": f.code,
                "severity": f.severity,
                "cause": f.cause,
                "title": f.title,
                "text": f.text,
                "evidence": dict(f.evidence),
                "evidence_keys": dict(f.keyed_evidence),
            }
            for f in r.findings
        ],
        "recommendations": [
            {
                "text": rec.text,
                "sbatch_lines": list(rec.sbatch_lines),
                "gpu_hours_saved": rec.gpu_hours_saved,
            }
            for rec in r.recommendations
        ],
        "live_actions": [
            {
                "at_s": a.at_s,
                "after_start_s": a.after_start_s,
                "rule": a.rule,
                "action": a.action,
                "gpus": a.gpus,
                "idle_gpu_hours": a.idle_gpu_hours,
                "stopped_gpu_hours": a.stopped_gpu_hours,
            }
            for a in r.live_actions
        ],
    }


def document(reports: Sequence[JobReport], not_found: Sequence[str] = ()) -> dict[str, Any]:
    """The whole ``--json`` document."""
    return {
        "schema": "gpueff",
        "version": SCHEMA_VERSION,
        "jobs": [job_json(r) for r in reports],
        "not_found": list(not_found),
    }
