"""Stored rows back into typed records, shared by every read path of the store.

``Store`` (SQLAlchemy) and ``sqlite_reader`` (the standard library's ``sqlite3``, for
``gpueff``) both hand their rows to these functions, so the two cannot drift apart. A row is
anything that exposes the table's columns as attributes: a SQLAlchemy ``Row`` or the named
tuples ``sqlite_reader`` builds. Nothing here imports a database library.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.records import (
    STALL_CPU_BINS,
    STALL_DUTY_BINS,
    GpuInfo,
    GpuSummary,
    HostSummary,
    JobRecord,
    JobStep,
    NodeRecord,
    Tres,
)
from slurm_gpu.store import codec
from slurm_gpu.store.actionrows import LiveAction, action_from_row


@dataclass(frozen=True, slots=True)
class CachedReport:
    """One job's ``gpueff`` report as rendered at collection (``schema.job_reports``). Here,
    not in ``store``: the report worker and ``gpueff`` use it without importing SQLAlchemy."""

    job_id: str
    typed_id: str
    render_key: str
    plain: str
    colour: str
    rendered_at_s: float
    """When it was rendered, seconds since the epoch."""


@dataclass(frozen=True, slots=True)
class StoredFinding:
    """A finding as stored: evidence and recommendation are decoded JSON."""

    code: str
    severity: str
    cause: int | None
    """Which of the seven causes (1–7); ``None`` when the finding is not one of them."""
    evidence: Mapping[str, Any]
    recommendation: Mapping[str, Any] | None
    analysis_version: str
    scope: str | None = None
    """``job``, ``node`` or ``gpu``; ``None`` when the analysis did not say."""
    subject: str | None = None
    """Host name or GPU UUID the finding is about, for node and GPU scope."""


@dataclass(frozen=True, slots=True)
class StoredJob:
    """One stored job: its accounting, its node records, its findings.

    ``nodes`` are rebuilt exactly as ingested (timelines only when asked for, and then at the
    store's quantised precision), so the analysis can be re-run from the store.
    """

    job: JobRecord
    telemetry: str
    telemetry_source: str | None
    interval_s: float | None
    missing_hosts: tuple[str, ...]
    nodes: tuple[NodeRecord, ...]
    findings: tuple[StoredFinding, ...]
    analysis_version: str | None
    gpu_hours: float | None
    """Allocated GPUs times elapsed hours; ``None`` without GPUs."""
    collected_at_s: float
    timeline_pruned_s: float | None = None
    """When the store's retention removed the job's timelines and rendered report (seconds
    since the epoch); ``None`` while they are kept (``slurm_gpu.store.prune``)."""
    live_actions: tuple[LiveAction, ...] = ()
    """The live policy's actions on the job while it ran (``live_actions``), oldest first."""

    @property
    def gpus(self) -> tuple[tuple[str, GpuSummary], ...]:
        """Every GPU of the job as (host, summary), in node and device order."""
        return tuple((n.hostname, g) for n in self.nodes for g in n.gpus)


def tres_from(d: Mapping[str, Any]) -> Tres:
    """A ``Tres`` from its stored JSON form (``jobs.tres_json``)."""
    return Tres(
        cpus=d["cpus"],
        mem_bytes=d["mem_bytes"],
        nodes=d["nodes"],
        gpus=d["gpus"],
        gpu_types=tuple((str(n), int(c)) for n, c in d["gpu_types"]),
        billing=d["billing"],
        raw=d["raw"],
    )


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split(",")) if text else ()


def gpu_from(r: Any) -> GpuSummary:
    """A ``GpuSummary`` from a ``job_gpus`` row."""
    cc = r.compute_capability
    info = GpuInfo(
        uuid=r.uuid,
        index=r.gpu_index,
        minor_number=r.minor_number,
        name=r.model,
        memory_total_bytes=r.memory_total_bytes,
        power_limit_w=r.power_limit_w,
        parent_uuid=r.parent_uuid,
        mig_profile=r.mig_profile,
        pci_bus_id=r.pci_bus_id,
        compute_capability=tuple(int(x) for x in cc.split(".")) if cc else None,  # type: ignore[arg-type]
    )
    return GpuSummary(
        info=info,
        samples=r.samples,
        samples_available=r.samples_available,
        first_time_s=r.first_time_s,
        last_time_s=r.last_time_s,
        utilization=codec.decode_distribution(r.util_hist),
        sub_samples=codec.decode_distribution(r.sub_util_hist),
        idle_samples=r.idle_samples,
        active_first_time_s=r.active_first_time_s,
        active_last_time_s=r.active_last_time_s,
        memory_used_max_bytes=r.memory_used_max_bytes,
        memory_used_mean_bytes=r.memory_used_mean_bytes,
        power_mean_w=r.power_mean_w,
        power_max_w=r.power_max_w,
        energy_j=r.energy_j,
        sm_clock_mean_mhz=r.sm_clock_mean_mhz,
        temperature_max_c=r.temperature_max_c,
        throttle_power_s=r.throttle_power_s,
        throttle_thermal_s=r.throttle_thermal_s,
        pcie_tx_mean_bytes_per_s=r.pcie_tx_mean_bytes_per_s,
        pcie_rx_mean_bytes_per_s=r.pcie_rx_mean_bytes_per_s,
        nvlink_bytes=r.nvlink_bytes,
        nvlink_bytes_while_idle=r.nvlink_bytes_while_idle,
        ecc_corrected=r.ecc_corrected,
        ecc_uncorrected=r.ecc_uncorrected,
        xid_events=_ints(r.xid_events),
        process_seen=bool(r.process_seen),
        max_processes=r.max_processes,
        pids=_ints(r.pids),
        sm_active_mean_pct=r.sm_active_mean_pct,
        tensor_active_mean_pct=r.tensor_active_mean_pct,
        process_list_unread=getattr(r, "process_list_unread", None),
        stall_grid=grid_from(getattr(r, "stall_grid", None)),
        memory_utilization_mean_pct=getattr(r, "memory_util_mean_pct", None),
    )


def grid_text(grid: Sequence[int]) -> str | None:
    """``GpuSummary.stall_grid`` as stored: sparse ``index:count`` pairs; ``None`` if empty."""
    if not grid:
        return None
    return ",".join(f"{i}:{n}" for i, n in enumerate(grid) if n)


def grid_from(text: str | None) -> tuple[int, ...]:
    """The grid of a stored ``stall_grid`` value (``None``: not counted)."""
    if text is None:
        return ()
    grid = [0] * (STALL_DUTY_BINS * STALL_CPU_BINS)
    for pair in filter(None, text.split(",")):
        index, count = pair.split(":")
        grid[int(index)] = int(count)
    return tuple(grid)


def host_summary_from(r: Any) -> HostSummary | None:
    """A ``HostSummary`` from a ``job_hosts`` row; ``None`` when the node had none."""
    if not r.has_host_summary:
        return None
    return HostSummary(
        method=r.method,
        samples=r.samples,
        cpu_time_s=r.cpu_time_s,
        cpu_cores_busy=codec.decode_distribution(r.cpu_busy_hist),
        allocated_cores=r.allocated_cores,
        rss_max_bytes=r.rss_max_bytes,
        rss_mean_bytes=r.rss_mean_bytes,
        io_read_bytes=r.io_read_bytes,
        io_write_bytes=r.io_write_bytes,
    )


def steps_json(steps: Sequence[JobStep]) -> str | None:
    """The ``jobs.steps_json`` value of a job's steps: a JSON list of their fields; ``None``
    when accounting gave no step."""
    if not steps:
        return None
    return json.dumps([dataclasses.asdict(step) for step in steps], separators=(",", ":"))


_STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(JobStep))


def steps_from(value: str | None) -> tuple[JobStep, ...]:
    """The steps of a ``jobs.steps_json`` value (``None``: stored before version 4, no step)."""
    if not value:
        return ()
    return tuple(
        JobStep(**{k: v for k, v in item.items() if k in _STEP_FIELDS})
        for item in json.loads(value)
    )


def job_from(r: Any) -> JobRecord:
    """The ``JobRecord`` from a ``jobs`` row."""
    tres = json.loads(r.tres_json)
    return JobRecord(
        job_id=r.job_id,
        job_id_display=r.job_id_display,
        array_job_id=r.array_job_id,
        array_task_id=r.array_task_id,
        het_job_id=r.het_job_id,
        het_job_offset=r.het_job_offset,
        user=r.user,
        uid=r.uid,
        account=r.account,
        partition=r.partition,
        qos=r.qos,
        job_name=r.job_name,
        work_dir=r.work_dir,
        nodelist=_split(r.nodelist),
        state=r.state,
        cancelled_by_uid=r.cancelled_by_uid,
        exit_code=r.exit_code,
        exit_signal=r.exit_signal,
        derived_exit_code=r.derived_exit_code,
        alloc_tres=tres_from(tres["alloc"]),
        req_tres=tres_from(tres["req"]),
        alloc_cpus=r.alloc_cpus,
        req_mem_bytes=r.req_mem_bytes,
        max_rss_bytes=r.max_rss_bytes,
        total_cpu_s=r.total_cpu_s,
        elapsed_s=r.elapsed_s,
        time_limit_s=r.time_limit_s,
        submit_s=r.submit_s,
        start_s=r.start_s,
        end_s=r.end_s,
        restarts=r.restarts,
        comment=r.comment,
        admin_comment=r.admin_comment,
        mail_user=r.mail_user,
        mail_type=r.mail_type,
        gres_gpu_detail=r.gres_gpu_detail,
        steps=steps_from(getattr(r, "steps_json", None)),
        # Since schema version 11 (``None`` on rows stored before: not known).
        submit_line=getattr(r, "submit_line", None),
        batch_directives=getattr(r, "batch_directives", None),
        reason=getattr(r, "reason", None),
    )


def group_by_job(rows: Sequence[Any]) -> dict[str, list[Any]]:
    """Rows keyed by their ``job_id``, in the order given."""
    out: dict[str, list[Any]] = {}
    for r in rows:
        out.setdefault(r.job_id, []).append(r)
    return out


def stored_job(
    r: Any,
    host_rows: list[Any],
    gpu_rows: list[Any],
    finding_rows: list[Any],
    tl_rows: list[Any],
    *,
    utilization_only: bool = False,
    action_rows: Sequence[Any] = (),
) -> StoredJob:
    """One ``StoredJob`` from its ``jobs`` row and its child rows (each in stored order);
    ``utilization_only``: timelines with GPU utilization alone (``codec.decode_timeline``)."""
    gpus_by_host: dict[str, list[GpuSummary]] = {}
    for g in gpu_rows:
        gpus_by_host.setdefault(g.host, []).append(gpu_from(g))
    tl_by_host = {
        t.host: codec.decode_timeline(t.data, utilization_only=utilization_only) for t in tl_rows
    }
    nodes = tuple(
        NodeRecord(
            job_id=r.job_id,
            hostname=h.host,
            uid=h.uid,
            interval_s=h.interval_s,
            source=h.source,
            started_s=h.started_s,
            ended_s=h.ended_s,
            gpus=tuple(gpus_by_host.get(h.host, [])),
            host=host_summary_from(h),
            timeline=tl_by_host.get(h.host, ()),
            complete=bool(h.complete),
            notes=tuple(h.notes.split("\n")) if h.notes else (),
        )
        for h in host_rows
    )
    findings = tuple(
        StoredFinding(
            code=f.code,
            severity=f.severity,
            cause=f.cause,
            evidence=json.loads(f.evidence),
            recommendation=None if f.recommendation is None else json.loads(f.recommendation),
            analysis_version=f.analysis_version,
            scope=f.scope,
            subject=f.subject,
        )
        for f in finding_rows
    )
    return StoredJob(
        job=job_from(r),
        telemetry=r.telemetry,
        telemetry_source=r.telemetry_source,
        interval_s=r.interval_s,
        missing_hosts=_split(r.missing_hosts),
        nodes=nodes,
        findings=findings,
        analysis_version=r.analysis_version,
        gpu_hours=r.gpu_hours,
        collected_at_s=r.collected_at_s,
        # Absent from a row of a store before schema version 4 (a reader of an old store).
        timeline_pruned_s=getattr(r, "timeline_pruned_s", None),
        live_actions=tuple(action_from_row(a) for a in action_rows),
    )
