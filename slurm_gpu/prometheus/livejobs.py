"""slurm-gpu's own exporter series, read back from Prometheus as live jobs.

Series become the same ``LiveJob``/``LiveGpu`` records that the node's live files give
(``live.snapshot``), so the live view, the policy and a running job's report do not care where
their numbers came from.
"""

from __future__ import annotations

import re
from typing import Any

from slurm_gpu.gcpace import with_fewer_collections
from slurm_gpu.prometheus.client import PrometheusClient, Sample
from slurm_gpu.records import LiveGpu, LiveJob

#: The window of ``slurm_gpu_gpu:utilization:ratio_15m``, seconds.
RECENT_WINDOW_S = 900.0
_JOB_ID = re.compile(r"[0-9]{1,20}")

_VIEW_NAMES = (
    "slurm_gpu_gpu_(busy_seconds_total|sampled_seconds_total|utilization_ratio"
    "|idle_since_timestamp_seconds|first_active_timestamp_seconds|memory_used_bytes"
    "|memory_total_bytes|power_watts)|slurm_gpu_job_(start|last_sample)_timestamp_seconds"
)
#: The raw series the view needs, in one query.
VIEW_SERIES = f'{{__name__=~"{_VIEW_NAMES}"}}'
#: One job's report (``gpueff``) also shows the peak memory and the energy so far.
_JOB_NAMES = _VIEW_NAMES + "|slurm_gpu_gpu_(memory_used_max_bytes|energy_joules_total)"
#: The 15-minute duty cycle: the recording rule, or its expression where the rule is missing.
RECENT_RULE = "slurm_gpu_gpu:utilization:ratio_15m"
RECENT_EXPR = (
    "increase(slurm_gpu_gpu_busy_seconds_total[15m])"
    " / (increase(slurm_gpu_gpu_sampled_seconds_total[15m]) > 0)"
)


def job_queries(job_id: str) -> tuple[str, str, str]:
    """(raw series, recent rule, recent expression) of one job only: every selector carries
    ``job_id="N"``. ``job_id`` is a raw Slurm job id (digits), checked here, so no user text
    ever reaches a query."""
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a raw job id: {job_id!r}")
    sel = f'job_id="{job_id}"'
    return (
        f'{{__name__=~"{_JOB_NAMES}",{sel}}}',
        f"{RECENT_RULE}{{{sel}}}",
        f"increase(slurm_gpu_gpu_busy_seconds_total{{{sel}}}[15m])"
        f" / (increase(slurm_gpu_gpu_sampled_seconds_total{{{sel}}}[15m]) > 0)",
    )


_GPU_FIELDS = {
    "slurm_gpu_gpu_busy_seconds_total": "busy_s",
    "slurm_gpu_gpu_sampled_seconds_total": "sampled_s",
    "slurm_gpu_gpu_utilization_ratio": "utilization_pct",
    "slurm_gpu_gpu_idle_since_timestamp_seconds": "idle_since_s",
    "slurm_gpu_gpu_first_active_timestamp_seconds": "active_first_s",
    "slurm_gpu_gpu_memory_used_bytes": "memory_used_bytes",
    "slurm_gpu_gpu_memory_total_bytes": "memory_total_bytes",
    "slurm_gpu_gpu_power_watts": "power_w",
    "slurm_gpu_gpu_memory_used_max_bytes": "memory_used_max_bytes",
    "slurm_gpu_gpu_energy_joules_total": "energy_j",
    RECENT_RULE: "utilization_recent_pct",
}
_RATIO_FIELDS = {"utilization_pct", "utilization_recent_pct"}
_INT_FIELDS = {"memory_used_bytes", "memory_total_bytes", "memory_used_max_bytes"}


@with_fewer_collections
def live_jobs(client: PrometheusClient, job_id: str | None = None) -> list[LiveJob]:
    """Every running job's GPUs as Prometheus holds them now, one ``LiveJob`` per job and
    host; with ``job_id`` (a raw id), that job's only (``gpueff``: the query names the one
    job accounting showed the caller). Series without a job id, host or GPU UUID are
    ignored. Built with fewer garbage collections (``gcpace``): at 10,000 jobs of 2 GPUs the
    answers are 180,000 samples, which collections at the default thresholds scanned again
    and again (a quarter of the CPU, ``docs/performance.md``)."""
    series, rule, expr = (
        (VIEW_SERIES, RECENT_RULE, RECENT_EXPR) if job_id is None else job_queries(job_id)
    )
    samples = client.query(series)
    recent = client.query(rule)
    if not recent and samples:
        recent = client.query(expr)  # the recording rules are not loaded
    jobs: dict[tuple[str, str], dict[str, Any]] = {}
    gpus: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for s in samples + [Sample({**r.labels, "__name__": RECENT_RULE}, r.value) for r in recent]:
        name, jid, host = (s.labels.get(k, "") for k in ("__name__", "job_id", "host"))
        if not _JOB_ID.fullmatch(jid) or not host:
            continue
        if job_id is not None and jid != job_id:
            continue  # never more than was asked for, whatever the server answered
        key = (jid, host)
        job = jobs.setdefault(key, {"labels": s.labels})
        if name == "slurm_gpu_job_start_timestamp_seconds":
            job["started_s"] = s.value
        elif name == "slurm_gpu_job_last_sample_timestamp_seconds":
            job["updated_s"] = s.value
        elif name in _GPU_FIELDS and s.labels.get("gpu_uuid"):
            field = _GPU_FIELDS[name]
            value: Any = s.value * 100.0 if field in _RATIO_FIELDS else s.value
            if field in _INT_FIELDS:
                value = int(value)
            gpus.setdefault(key, {}).setdefault(s.labels["gpu_uuid"], {})[field] = value
    out = []
    for key, job in sorted(jobs.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        if "started_s" not in job or "updated_s" not in job:
            continue  # a job's series half gone (it is ending): not a whole picture
        labels = job["labels"]
        out.append(
            LiveJob(
                job_id=key[0],
                host=key[1],
                user=labels.get("user", ""),
                account=labels.get("account", ""),
                partition=labels.get("partition", ""),
                uid=None,
                started_s=job["started_s"],
                updated_s=job["updated_s"],
                interval_s=0.0,
                cpu_time_s=None,
                rss_bytes=None,
                allocated_cores=None,
                gpus=tuple(
                    _gpu(uuid, fields) for uuid, fields in sorted(gpus.get(key, {}).items())
                ),
            )
        )
    return out


def _gpu(uuid: str, f: dict[str, Any]) -> LiveGpu:
    return LiveGpu(
        uuid=uuid,
        available=True,
        utilization_pct=f.get("utilization_pct"),
        utilization_recent_pct=f.get("utilization_recent_pct"),
        utilization_mean_pct=(
            100.0 * f["busy_s"] / f["sampled_s"] if f.get("sampled_s") and "busy_s" in f else None
        ),
        recent_window_s=RECENT_WINDOW_S,
        busy_s=f.get("busy_s"),
        sampled_s=f.get("sampled_s"),
        idle_since_s=f.get("idle_since_s"),
        active_first_s=f.get("active_first_s"),
        memory_used_bytes=f.get("memory_used_bytes"),
        memory_total_bytes=f.get("memory_total_bytes"),
        memory_used_max_bytes=f.get("memory_used_max_bytes"),
        power_w=f.get("power_w"),
        energy_j=f.get("energy_j"),
    )
