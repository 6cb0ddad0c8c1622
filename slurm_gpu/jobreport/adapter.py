"""Build the report view model from accounting, sealed/stored telemetry, live spool and findings.

This is the one module that knows the shapes of the other parts (``JobRecord``, ``NodeRecord``,
the store's stored job, the analysis engine's findings, the spool's live summary); the
renderers see only ``slurm_gpu.jobreport.model``. Pure: no I/O.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from slurm_gpu.analysis.energy import GpuEnergy, JobEnergy, job_energy
from slurm_gpu.analysis.findings import sbatch_flag
from slurm_gpu.config import EnergySettings
from slurm_gpu.jobreport import fmt
from slurm_gpu.jobreport.model import (
    LIVE_SOURCE_PROMETHEUS,
    LIVE_SOURCE_SPOOL,
    FindingView,
    GpuLine,
    JobReport,
    LiveActionView,
    RecommendationView,
    Telemetry,
    TelemetryStatus,
)
from slurm_gpu.records import GpuSummary, JobRecord, NodeRecord, TimelinePoint
from slurm_gpu.store.actionrows import TAKEN, stopped_per_action

#: Sparkline width in points: enough to see the shape of a job, narrow enough for a terminal.
SPARK_POINTS = 24

RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "CONFIGURING"})
NOT_STARTED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
#: States of a job that has not ended: every other one has.
_NOT_ENDED_STATES = NOT_STARTED_STATES | RUNNING_STATES

#: A wording function: finding -> (title, text). The analysis engine's templates supply it.
Wording = Callable[[Any], tuple[str, str]]


def accounting_report(job: JobRecord, *, min_elapsed_s: float = 60.0) -> JobReport:
    """The report of a job before any telemetry is known: accounting part and a status.

    A job that has not ended has no exit code yet (``None``: accounting's ``0:0`` is a
    placeholder); one that has not started has no allocation, so its GPUs and their type
    are the ones it asked for."""
    # Ended while it waited (cancelled, or a dependency never met): accounting gives it no
    # nodes and no allocation, and "no GPU was allocated" would hide what it asked for.
    never_ran = (
        job.state not in _NOT_ENDED_STATES
        and not job.nodelist
        and not job.alloc_tres.gpus
        and bool(job.req_tres.gpus)
    )
    started = job.state not in NOT_STARTED_STATES and not never_ran
    tres = job.alloc_tres if started or job.alloc_tres.gpus else job.req_tres
    gpus = tres.gpus or 0
    if job.state in NOT_STARTED_STATES:
        status, note = TelemetryStatus.NOT_STARTED, "The job has not started yet."
    elif never_ran:
        status = TelemetryStatus.NOT_STARTED
        note = f"The job never started: it ended {job.state} before it was given its GPUs."
    elif gpus == 0:
        status, note = TelemetryStatus.NO_GPU, "No GPU was allocated to this job."
    elif job.state not in RUNNING_STATES and job.elapsed_s < min_elapsed_s:
        status = TelemetryStatus.TOO_SHORT
        note = (
            f"The job ran {job.elapsed_s} s, too short for a GPU reading "
            f"(at least {min_elapsed_s:g} s needed)."
        )
    elif job.state in RUNNING_STATES:
        status = TelemetryStatus.NO_TELEMETRY
        note = "The job runs, but no live GPU summary is readable for it yet."
    else:
        status = TelemetryStatus.PENDING
        note = "GPU telemetry for this job has not been collected yet; try again in a minute."
    model = None
    if tres.gpu_types:
        model = ", ".join(name for name, _ in tres.gpu_types)
    ended = started and job.state not in RUNNING_STATES
    return JobReport(
        job_id=job.job_id,
        job_id_display=job.job_id_display,
        job_name=job.job_name,
        user=job.user,
        account=job.account,
        partition=job.partition,
        state=job.state,
        exit_code=job.exit_code if ended else None,
        exit_signal=job.exit_signal if ended else None,
        elapsed_s=job.elapsed_s,
        time_limit_s=job.time_limit_s,
        start_s=job.start_s,
        end_s=job.end_s,
        nodes=job.nodelist,
        cpus=job.alloc_cpus if job.alloc_cpus is not None else job.alloc_tres.cpus,
        gpus_allocated=gpus,
        gpu_model=model,
        req_mem_bytes=job.req_mem_bytes,
        max_rss_bytes=job.max_rss_bytes,
        total_cpu_s=job.total_cpu_s,
        telemetry=status,
        telemetry_note=note,
        array_job_id=job.array_job_id,
        mail_user=job.mail_user,
    )


def _spark(timeline: Sequence[TimelinePoint], gpu: int, points: int) -> tuple[float | None, ...]:
    """Down-sample one GPU's utilization timeline to at most ``points`` means."""
    utils = [p.gpu_utilization_pct for p in timeline]
    if utils and min(map(len, utils)) > gpu:
        values: list[float | None] = list(map(operator.itemgetter(gpu), utils))
    else:
        values = [u[gpu] if gpu < len(u) else None for u in utils]
    n = len(values)
    if n <= points:
        return tuple(values)
    bounds = [(i * n // points, (i + 1) * n // points) for i in range(points)]
    if None not in values:
        # Every reading present (the usual case): the same sums, without filtering each chunk
        # (n > points, so no chunk is empty).
        full = cast(list[float], values)
        return tuple(sum(full[lo:hi]) / (hi - lo) for lo, hi in bounds)
    out: list[float | None] = []
    for lo, hi in bounds:
        chunk = [v for v in values[lo:hi] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return tuple(out)


def gpu_line(
    node: str,
    summary: GpuSummary,
    spark: tuple[float | None, ...] = (),
    observed_s: float | None = None,
) -> GpuLine:
    """One GPU's line from its summary; ``observed_s`` (the record's span, seconds) is the
    throttling denominator of records sealed before the known time was counted."""
    util = summary.utilization
    known = [p for p in summary.throttle_pct(observed_s) if p is not None]
    return GpuLine(
        node=node,
        uuid=summary.info.uuid,
        name=summary.info.name,
        slot=summary.info.minor_number
        if summary.info.minor_number is not None
        else summary.info.index,
        duty_mean_pct=util.mean,
        duty_p50_pct=util.percentile(50),
        # Over the readings the GPU answered, as the analysis and the store count it.
        idle_fraction=(summary.idle_samples / summary.samples_available)
        if summary.samples_available
        else None,
        sm_active_mean_pct=summary.sm_active_mean_pct,
        memory_peak_bytes=summary.memory_used_max_bytes,
        memory_total_bytes=summary.info.memory_total_bytes,
        power_mean_w=summary.power_mean_w,
        power_limit_w=summary.info.power_limit_w,
        energy_j=summary.energy_j,
        process_seen=summary.process_state,
        spark_pct=spark,
        throttled_pct=max(known) if known else None,
        throttle_unknown=summary.throttle_power_known_s == 0.0
        and summary.throttle_thermal_known_s == 0.0,
    )


def gpu_lines_from_records(
    records: Iterable[NodeRecord], *, spark_points: int = SPARK_POINTS
) -> tuple[GpuLine, ...]:
    """Per-GPU lines of every node record, nodes in name order, GPUs in record order."""
    lines: list[GpuLine] = []
    for rec in sorted(records, key=lambda r: r.hostname):
        for i, summary in enumerate(rec.gpus):
            spark = _spark(rec.timeline, i, spark_points)
            lines.append(gpu_line(rec.hostname, summary, spark, rec.ended_s - rec.started_s))
    return tuple(lines)


_UNITS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("_pct", lambda v: fmt.pct(v, 0 if abs(v) >= 10 else 1)),
    ("_bytes", fmt.size),
    ("_s", fmt.duration),
    ("_j", fmt.energy),
    ("_w", fmt.watts),
    ("_gpu_hours", fmt.hours),
)


def evidence_pair(key: str, value: Any) -> tuple[str, str]:
    """(label, value) for one evidence number, formatted by the unit in its name."""
    if value is None:
        return key.replace("_", " "), fmt.NA
    if isinstance(value, int | float) and not isinstance(value, bool):
        for suffix, formatter in _UNITS:
            if key.endswith(suffix):
                return key[: -len(suffix)].replace("_", " "), formatter(value)
        text = f"{value:.3g}" if isinstance(value, float) else str(value)
        return key.replace("_", " "), text
    return key.replace("_", " "), fmt.clean(value)


#: First or last words of evidence keys that count things (``gpus_used``, ``nodes``,
#: ``xid_count``, ``idle_phases``): shown to people as plain numbers.
_COUNT_WORDS = frozenset(
    {"gpus", "nodes", "steps", "samples", "count", "processes", "phases", "cpus", "tasks"}
)


def for_people(key: str, value: Any) -> bool:
    """Whether an evidence item is shown to people: a number with a unit in its key
    (``_pct``, ``_bytes``, ``_s``, ``_j``, ``_w``, ``_gpu_hours``) or a count, and not a
    flag (``True``/``False``, ``process_seen 0``) nor an identifier or free text (those
    stay in ``--json`` and behind ``--debug``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if any(key.endswith(suffix) for suffix, _ in _UNITS):
        return True
    words = key.split("_")
    return words[0] in _COUNT_WORDS or words[-1] in _COUNT_WORDS


def finding_view(finding: Any, wording: Wording | None = None) -> FindingView:
    """A finding (anything with ``code``, ``severity``, ``cause``, ``evidence``) with words."""
    code = str(finding.code)
    severity = str(getattr(finding, "severity", "info"))
    severity = getattr(getattr(finding, "severity", None), "value", severity)
    cause = getattr(finding, "cause", None)
    if cause is not None and not isinstance(cause, int):
        cause = getattr(cause, "value", None)
    evidence_raw = getattr(finding, "evidence", ()) or ()
    items = evidence_raw.items() if isinstance(evidence_raw, Mapping) else evidence_raw
    listed = [(str(k), v) for k, v in items]
    pairs = tuple(evidence_pair(k, v) for k, v in listed)
    people = tuple(p for p, (k, v) in zip(pairs, listed, strict=True) if for_people(k, v))
    if wording is not None:
        title, text = wording(finding)
    else:
        title, text = code.replace("_", " ").capitalize(), ""
    return FindingView(
        code=code,
        severity=str(severity),
        cause=cause if isinstance(cause, int) else None,
        title=title,
        text=text,
        evidence=pairs,
        evidence_keys=tuple(k for k, _ in listed),
        people_evidence=people,
    )


_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def sort_findings(findings: Iterable[FindingView]) -> tuple[FindingView, ...]:
    """Most severe first; stable within a severity."""
    return tuple(sorted(findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3)))


def recommendation_view(rec: Any) -> RecommendationView:
    """A recommendation (``text``/``summary``, ``sbatch_lines``, ``gpu_hours_saved``)."""
    text = getattr(rec, "text", None) or getattr(rec, "summary", None) or ""
    lines = tuple(getattr(rec, "sbatch_lines", ()) or ())
    saved = getattr(rec, "gpu_hours_saved", None)
    return RecommendationView(
        text=str(text),
        sbatch_lines=lines,
        gpu_hours_saved=float(saved) if saved is not None else None,
    )


def with_telemetry(
    report: JobReport,
    gpus: Sequence[GpuLine],
    *,
    live: bool,
    live_updated_s: float | None = None,
    findings: Sequence[FindingView] = (),
    recommendations: Sequence[RecommendationView] = (),
    notes: Sequence[str] = (),
    timeline_note: str = "",
    live_actions: Sequence[LiveActionView] = (),
    live_source: str = "",
    energy_settings: EnergySettings | None = None,
) -> JobReport:
    """The report with its GPU part filled in (final or live); ``energy_settings`` price the
    energy (``None``: kWh and the idle share only)."""
    from dataclasses import replace

    if not gpus:
        return replace(
            report,
            telemetry=TelemetryStatus.NO_TELEMETRY,
            telemetry_note="No GPU telemetry was recorded for this job.",
            live_actions=tuple(live_actions),
        )
    if live:
        status, note = TelemetryStatus.LIVE, "The job is running: GPU numbers are live, so far."
    else:
        status, note = TelemetryStatus.FINAL, ""
    models = sorted({g.name for g in gpus if g.name})
    return replace(
        report,
        telemetry=status,
        telemetry_note=note,
        live_updated_s=live_updated_s,
        live_source=(live_source or None) if live else None,
        gpus=tuple(gpus),
        gpu_model=", ".join(models) if models else report.gpu_model,
        findings=sort_findings(findings),
        recommendations=tuple(recommendations),
        notes=tuple(notes),
        timeline_note=timeline_note,
        live_actions=tuple(live_actions),
        energy=report_energy(report, gpus, energy_settings),
    )


def report_energy(
    report: JobReport, gpus: Sequence[GpuLine], settings: EnergySettings | None
) -> JobEnergy | None:
    """The job's energy, cost and CO2 from its GPU lines, over its run (a running job: from
    its start until now, its elapsed time)."""
    end_s = report.end_s
    if end_s is None and report.start_s is not None:
        end_s = report.start_s + report.elapsed_s
    return job_energy(
        (GpuEnergy(g.energy_j, g.duty_mean_pct, g.idle_fraction) for g in gpus),
        start_s=report.start_s,
        end_s=end_s,
        settings=settings or EnergySettings(),
        unused_max_duty_pct=report.unused_max_duty_pct,
    )


# --------------------------------------------------------------------------- store and spool


def recommendation_from_mapping(rec: Mapping[str, Any]) -> RecommendationView:
    """A stored recommendation (``Recommendation.to_dict()``) for display."""
    lines = tuple(str(x) for x in rec.get("sbatch_lines") or ())
    option = sbatch_flag(str(rec["option"]), lines) if rec.get("option") else ""
    current, proposed = rec.get("current"), rec.get("proposed")
    if option and proposed:
        text = f"{option}: {current} -> {proposed}" if current else f"{option}: {proposed}"
    else:
        text = ""
    saved = rec.get("gpu_hours_saved")
    return RecommendationView(
        text=text,
        sbatch_lines=lines,
        gpu_hours_saved=float(saved) if isinstance(saved, int | float) else None,
    )


def telemetry_from_stored(
    stored: Any, wording: Wording | None = None, *, spark_points: int = SPARK_POINTS
) -> Telemetry:
    """The final GPU part from the store's ``StoredJob`` (nodes, findings, recommendations)."""
    gpus = gpu_lines_from_records(stored.nodes, spark_points=spark_points)
    findings = []
    recs: list[RecommendationView] = []
    seen_lines: set[tuple[str, ...]] = set()
    for f in stored.findings:
        findings.append(finding_view(f, wording))
        rec = getattr(f, "recommendation", None)
        if rec:
            view = recommendation_from_mapping(rec)
            if view.sbatch_lines not in seen_lines:
                seen_lines.add(view.sbatch_lines)
                recs.append(view)
    notes = []
    for node in stored.nodes:
        notes.extend(node.notes)
    if getattr(stored, "missing_hosts", ()):
        notes.append("no record from " + ", ".join(stored.missing_hosts))
    return Telemetry(
        gpus=gpus,
        live=False,
        findings=tuple(findings),
        recommendations=tuple(recs),
        notes=tuple(notes),
        timeline_note=timeline_gone_note(getattr(stored, "timeline_pruned_s", None)),
        live_actions=live_action_views(stored.job, getattr(stored, "live_actions", ())),
    )


def live_action_views(job: JobRecord, actions: Iterable[Any]) -> tuple[LiveActionView, ...]:
    """The live policy's actions on ``job`` as its owner sees them: the warnings and
    cancellations it took, oldest first; dry-run ("would") actions are left out, since they
    did not happen (admins see them in the weekly report)."""
    taken = sorted((a for a in actions if a.action in TAKEN), key=lambda a: a.at_s)
    stopped = stopped_per_action(taken, job.start_s, job.time_limit_s)
    return tuple(
        LiveActionView(
            at_s=a.at_s,
            after_start_s=None if job.start_s is None else max(0.0, a.at_s - job.start_s),
            rule=a.rule,
            action=a.action,
            gpus=a.gpus,
            idle_gpu_hours=a.idle_gpu_s / 3600.0,
            stopped_gpu_hours=gh,
        )
        for a, gh in zip(taken, stopped, strict=True)
    )


def timeline_gone_note(pruned_s: float | None) -> str:
    """The report's line for a job whose timeline the store's retention deleted (``pruned_s``:
    when, seconds since the epoch); empty while the timeline is kept."""
    if pruned_s is None:
        return ""
    day = time.strftime("%Y-%m-%d", time.gmtime(pruned_s))
    return (
        f"Timeline deleted on {day} by the site's retention: no sparkline; "
        "the numbers above and the findings are kept."
    )


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


#: Seconds a node's timestamp may be ahead of this host's clock and still be taken as
#: current: a summary written while this host reads it, clocks a second or two apart. Beyond
#: it a node's clock is wrong (or this host's), and a stopped sampler's last numbers would
#: pass for current ones for as long as the clocks disagree: its age cannot be told.
CLOCK_AHEAD_TOLERANCE_S = 5.0


#: What a spool summary that is not current says of the cause, by ``_not_current``'s kind.
_WHY_NOT_CURRENT = {
    "old": "its sampler stopped writing, or the node is gone",
    "ahead": "a clock is wrong, so how old it is cannot be told",
}


def _not_current(
    updated_s: float, ref_s: float, clock_s: float, stale_after_s: float
) -> tuple[str, str]:
    """Why data last written at ``updated_s`` (the node's clock) are not current, as (kind,
    words): ``("ahead", "dated N ahead of this host's clock")`` when later than ``clock_s``
    (this host's now) by more than ``CLOCK_AHEAD_TOLERANCE_S``, ``("old", "N old")`` when
    more than ``stale_after_s`` before ``ref_s`` (now, or an ended job's end), ``("", "")``
    when current. Seconds since the epoch."""
    if updated_s - clock_s > CLOCK_AHEAD_TOLERANCE_S:
        return "ahead", f"dated {fmt.duration(updated_s - clock_s)} ahead of this host's clock"
    if ref_s - updated_s > stale_after_s:
        return "old", f"{fmt.duration(ref_s - updated_s)} old"
    return "", ""


def _unknown_readings(line: GpuLine) -> GpuLine:
    """``line`` of a host whose data are stale: the GPU is named, every reading unknown."""
    from dataclasses import replace

    return replace(
        line,
        duty_mean_pct=None,
        idle_fraction=None,
        memory_peak_bytes=None,
        power_mean_w=None,
        energy_j=None,
        process_seen=None,
    )


def telemetry_from_live(
    summaries: Sequence[Mapping[str, Any]],
    nodes: Sequence[str],
    *,
    now_s: float,
    stale_after_s: float,
    clock_s: float,
) -> Telemetry:
    """The live GPU part from the sampler's ``<host>.live.json`` summaries (one per node), for
    the job's accounting node list ``nodes``.

    Missing or stale data are unknown, never idle (as ``telemetry_from_prometheus``): a summary
    last written more than ``stale_after_s`` before ``now_s`` (its sampler hung or killed, the
    node gone), or dated ahead of this host's clock ``clock_s`` (a clock is wrong: its age
    cannot be told), keeps its GPU lines with every reading unknown, and a note says so; a
    node of ``nodes`` with no summary here is named in a note. ``now_s`` is an ended job's
    end (its summaries stopped with it), ``clock_s`` always this host's time."""
    lines: list[GpuLine] = []
    notes: list[str] = []
    updated: list[float] = []
    fresh_updated: list[float] = []
    for summary in sorted(summaries, key=lambda s: str(s.get("hostname", ""))):
        host = str(summary.get("hostname", "?"))
        u = _num(summary.get("updated_s"))
        kind, why = ("", "") if u is None else _not_current(u, now_s, clock_s, stale_after_s)
        stale = bool(kind)
        if u is not None and kind != "ahead":  # an age that can be told
            updated.append(u)
            if not stale:
                fresh_updated.append(u)
        if stale:
            notes.append(
                f"{host}: its live summary is {why} ({_WHY_NOT_CURRENT[kind]}); "
                "its GPUs are shown as unknown"
            )
        for i, g in enumerate(summary.get("gpus") or ()):
            samples = _int(g.get("samples"))
            idle = _int(g.get("idle_samples"))
            seen = g.get("process_seen")
            line = GpuLine(
                node=host,
                uuid=str(g.get("uuid", "")),
                name=g.get("name") if isinstance(g.get("name"), str) else None,
                slot=_int(g.get("minor_number")) if "minor_number" in g else i,
                duty_mean_pct=_num(g.get("utilization_mean_pct")),
                duty_p50_pct=None,
                idle_fraction=(idle / samples) if samples and idle is not None else None,
                sm_active_mean_pct=None,
                memory_peak_bytes=_int(g.get("memory_used_max_bytes")),
                memory_total_bytes=_int(g.get("memory_total_bytes")),
                power_mean_w=_num(g.get("power_mean_w")),
                power_limit_w=_num(g.get("power_limit_w")),
                energy_j=_num(g.get("energy_j")),
                process_seen=seen if isinstance(seen, bool) else None,
            )
            lines.append(_unknown_readings(line) if stale else line)
    missing = sorted(set(nodes) - {str(s.get("hostname", "?")) for s in summaries})
    if missing:
        notes.append(
            f"no live summary readable on this host from {', '.join(missing)}: its GPUs are unknown"
        )
    latest = fresh_updated or updated
    return Telemetry(
        gpus=tuple(lines),
        live=True,
        updated_s=max(latest) if latest else None,
        notes=tuple(notes),
        source=LIVE_SOURCE_SPOOL,
    )


def telemetry_from_prometheus(
    parts: Sequence[Any], nodes: Sequence[str], *, now_s: float, stale_after_s: float
) -> Telemetry | None:
    """The live GPU part of one job from Prometheus' series (``prometheus.livejobs.live_jobs``:
    one ``LiveJob`` per host), for the job's accounting node list ``nodes``.

    Missing or stale data are unknown, never idle: a host whose last reading (the time its
    sampler read, on the node's clock) is older than ``stale_after_s`` or dated ahead of
    ``now_s`` (a clock is wrong) keeps its GPU lines with every number unknown, a node of the
    job with no series at all is named in a note. ``None`` when no host has series."""
    if not parts:
        return None
    lines: list[GpuLine] = []
    notes: list[str] = []
    fresh_updated: list[float] = []
    for part in sorted(parts, key=lambda p: str(p.host)):
        kind, why = _not_current(part.updated_s, now_s, now_s, stale_after_s)
        stale = bool(kind)
        if stale:
            notes.append(f"{part.host}: Prometheus' data are {why}, its GPUs are shown as unknown")
        else:
            fresh_updated.append(part.updated_s)
        for i, g in enumerate(part.gpus):
            sampled = g.sampled_s
            line = GpuLine(
                node=part.host,
                uuid=g.uuid,
                name=None,
                slot=i,  # Prometheus has no minor number: the GPU's place on its host
                duty_mean_pct=g.utilization_mean_pct,
                duty_p50_pct=None,
                idle_fraction=None,
                sm_active_mean_pct=None,
                memory_peak_bytes=g.memory_used_max_bytes,
                memory_total_bytes=g.memory_total_bytes,
                power_mean_w=g.energy_j / sampled if g.energy_j is not None and sampled else None,
                power_limit_w=None,
                energy_j=g.energy_j,
                process_seen=None,
            )
            lines.append(_unknown_readings(line) if stale else line)
    missing = sorted(set(nodes) - {p.host for p in parts})
    if missing:
        notes.append(
            "no live data in Prometheus from "
            + ", ".join(missing)
            + " (its exporter is down or not scraped yet): its GPUs are unknown"
        )
    # No host current: the newest age that can be told (a host's dated ahead cannot).
    told = fresh_updated or [p.updated_s for p in parts if p.updated_s <= now_s]
    return Telemetry(
        gpus=tuple(lines),
        live=True,
        updated_s=max(told) if told else None,
        notes=tuple(notes),
        source=LIVE_SOURCE_PROMETHEUS,
    )


def findings_wording(override_dir: str = "", *, cache: bool = False) -> Wording:
    """Wording of stored or fresh findings from ``templates/findings/<CODE>.j2`` (a site's
    ``override_dir`` first). A code without a template falls back to its name, so a newer
    analysis never breaks an older site's templates. With ``cache``, compiled templates are
    kept in ``templating.compiled_cache()``.

    Imports the analysis package's wording and finding tables only, not the engine."""
    import jinja2

    from slurm_gpu.analysis import wording as words
    from slurm_gpu.analysis.findings import CODES, PROFILERS, Code
    from slurm_gpu.jobreport.templating import BUILTIN_DIR, compiled_cache

    paths = [p for p in (override_dir, str(BUILTIN_DIR / "findings")) if p]
    env = words.environment(jinja2.FileSystemLoader(paths))
    if cache:
        env.bytecode_cache = compiled_cache()

    def word(finding: Any) -> tuple[str, str]:
        code = str(getattr(finding.code, "value", finding.code))
        try:
            template = env.get_template(words.template_name(code))
        except jinja2.TemplateNotFound:
            return code.replace("_", " ").capitalize(), ""
        profiler = None
        if code in Code.__members__:
            key = CODES[Code(code)].profiler
            profiler = PROFILERS[key] if key else None
        severity = finding.severity
        ctx = template.new_context(
            {
                "ev": dict(finding.evidence or {}),
                "subject": getattr(finding, "subject", None),
                "code": code,
                "cause": finding.cause,
                "severity": str(getattr(severity, "value", severity)),
                "profiler": profiler,
            }
        )
        try:
            title = "".join(template.blocks["title"](ctx)).strip()
            text = "".join(template.blocks["text"](ctx)).strip()
        except (jinja2.TemplateError, KeyError, TypeError, ValueError):
            # Evidence from an older analysis may lack a key a newer template uses.
            return code.replace("_", " ").capitalize(), ""
        return title, text

    return word
