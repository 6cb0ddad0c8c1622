"""The live policy's decisions (``slurm-gpu police``): pure, no I/O.

Given Slurm's running GPU jobs (``SlurmJob``: nodes, GPU indices per node, start time), the
evidence over the policy's window for each job and host (``PartWindow``) and the policy's past
actions, it decides, per job, to warn, to cancel, or to leave the job alone with a reason.
Every running GPU job gets a decision in every pass; its ``status`` says whether it was judged
and, if not, why (``docs/live.md``, "What the policy never acts on").

Safety first, in this order: a job is never acted on when Slurm's detail of it contradicts
itself; when a series of the job does not come from the node it names, or names GPUs Slurm did
not allocate it there: other GPU numbers (``gpu_index``) than Slurm's indices on that node,
or another number of GPUs (``mismatch``); when a node of the job sends nothing (``no_data``,
``partial``); when a node's series were not scraped within ``max_sample_age_s`` by
Prometheus' clock or its readings stopped advancing (``stale``); during ``grace_s`` from
Slurm's start time (``grace``); and when a GPU's signals are missing or disagree
(``not_judged``). A GPU is idle only if two independent signals agree over the whole window:
the utilisation series' maximum stays at or below the idle threshold, and the busy-seconds
counter grew by at most the threshold's share of the sampled-seconds counter, which itself
grew by at least ``coverage_min`` of the window. Exempt jobs are warned, never cancelled. The
node's clock is never used to decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from slurm_gpu.live.allocation import SlurmJob
from slurm_gpu.prometheus.windows import same_host
from slurm_gpu.records import GpuWindow, PartWindow
from slurm_gpu.store.liveactions import LiveAction

__all__ = ["RULES", "Decision", "PolicyConfig", "SlurmJob", "decide", "same_host"]

RULES = ("never_used", "idle")

#: Why a job was not judged, in the order the checks run (``Decision.status``).
STATUSES = (
    "judged",
    "not_running",
    "mismatch",
    "no_data",
    "partial",
    "stale",
    "grace",
    "not_judged",
)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Thresholds and switches, from ``[live] police_*`` (seconds, percent)."""

    grace_s: float = 1800.0
    idle_s: float = 3600.0
    """The window: a GPU must be idle over all of it."""
    max_sample_age_s: float = 120.0
    coverage_min: float = 0.9
    idle_threshold_pct: float = 1.0
    """``telemetry.idle_threshold_pct``: at or below, a duty cycle is idle."""
    scrape_job: str = "slurm-gpu"
    """Prometheus' ``job`` label of the exporters' scrape; "" accepts any."""
    bind_gpus: str = "index"
    """``index``: the ``gpu_index`` numbers of a job's GPU series on a node must be the GPU
    indices Slurm allocated it there; ``count``: only as many (``police_bind_gpus``)."""
    user_interval_s: float = 3600.0
    dry_run: bool = False
    cancel: bool = False
    cancel_after_warnings: int = 2
    cancel_grace_s: float = 1800.0
    max_cancels_per_pass: int = 5
    exempt_users: frozenset[str] = field(default_factory=frozenset)
    exempt_accounts: frozenset[str] = field(default_factory=frozenset)
    exempt_partitions: frozenset[str] = field(default_factory=frozenset)
    exempt_qos: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the pass does with one job: ``warn``, ``cancel`` or ``skip`` (with why)."""

    job_id: str
    action: str
    rule: str
    """The rule that triggered (``never_used``, ``idle``), or ``""``."""
    reason: str
    user: str = ""
    account: str = ""
    gpus: int = 0
    """GPUs the rule found idle."""
    idle_gpu_s: float = 0.0
    """Their idle GPU-seconds so far."""
    evidence: tuple[str, ...] = ()
    status: str = "judged"
    """``judged``, or why not (``STATUSES``)."""
    skew_s: float | None = None
    """Largest node clock skew seen among the job's hosts, seconds (shown, never used)."""


def _warned(action: str) -> bool:
    return action in ("warned", "would_warn")


def _mode_actions(past: Sequence[LiveAction], dry_run: bool) -> list[LiveAction]:
    # A dry run's records never count as real warnings, and the other way round.
    return [a for a in past if a.action.startswith("would_") == dry_run]


def judge_gpu(g: GpuWindow, cfg: PolicyConfig, span_s: float | None) -> tuple[str, str]:
    """(``idle`` | ``busy`` | ``unknown``, why) of one GPU from its two signals. One scrape
    above the threshold in the window makes it busy, whatever else is said of it (nothing is
    done to a busy GPU, so its other figures need not be read). ``span_s``: the node's start
    to last reading, for the readings' coverage since the job started."""
    if g.util_max_pct is not None and g.util_max_pct > cfg.idle_threshold_pct:
        return "busy", f"{g.uuid}: up to {g.util_max_pct:.0f} % in the window"
    if g.util_max_pct is None or g.util_points == 0 or g.seen_age_s is None:
        return "unknown", f"{g.uuid}: no utilisation series in the window"
    if g.seen_age_s > cfg.max_sample_age_s:
        return "unknown", f"{g.uuid}: last scraped {g.seen_age_s:.0f} s ago"
    if g.busy_growth_s is None or g.sampled_growth_s is None:
        return "unknown", f"{g.uuid}: no busy or sampled counter over the window"
    if g.counter_reset:
        return "unknown", f"{g.uuid}: its counters restarted in the window"
    if g.busy_growth_s > cfg.idle_threshold_pct / 100.0 * max(g.sampled_growth_s, 0.0):
        return "unknown", (
            f"{g.uuid}: signals disagree: utilisation at most {g.util_max_pct:.0f} % but "
            f"{g.busy_growth_s:.0f} busy s of {g.sampled_growth_s:.0f} sampled s"
        )
    if g.sampled_growth_s < cfg.coverage_min * g.window_s:
        return "unknown", (
            f"{g.uuid}: readings cover {g.sampled_growth_s:.0f} s of the {g.window_s:.0f} s window"
        )
    span = span_s or 0.0
    if g.sampled_s is None or (span > 0 and g.sampled_s < cfg.coverage_min * span):
        return "unknown", f"gaps: readings cover too little of {g.uuid}'s time since the start"
    if g.ever_used is None:
        return "unknown", f"{g.uuid}: not known whether it was ever used"
    return "idle", ""


def _evidence(g: GpuWindow, rule: str) -> str:
    head = "no kernel ran since the job started; " if rule == "never_used" else ""
    return (
        f"{g.uuid}: {head}at most {g.util_max_pct or 0.0:.0f} % duty cycle over the last "
        f"{g.window_s / 60:.0f} min ({g.util_points} scrapes), "
        f"{g.busy_growth_s or 0.0:.0f} busy s of {g.sampled_growth_s or 0.0:.0f} sampled s"
    )


def _exempt(slurm: SlurmJob, cfg: PolicyConfig) -> str:
    for what, value, exempt in (
        ("user", slurm.user, cfg.exempt_users),
        ("account", slurm.account, cfg.exempt_accounts),
        ("partition", slurm.partition, cfg.exempt_partitions),
        ("QOS", slurm.qos, cfg.exempt_qos),
    ):
        if value in exempt:
            return f"exempt {what} {value}"
    return ""


def _claims(parts: Sequence[PartWindow], max_age_s: float) -> dict[tuple[str, str], set[str]]:
    """(host, GPU UUID) -> the jobs whose fresh series name that GPU. An ended job's series
    that linger after a Prometheus restart (5 minutes, stale) claim nothing."""
    out: dict[tuple[str, str], set[str]] = {}
    for p in parts:
        if p.seen_age_s is None or p.seen_age_s > max_age_s:
            continue
        for g in p.gpus:
            out.setdefault((p.host, g.uuid), set()).add(p.job_id)
    return out


def _mismatch(
    sj: SlurmJob,
    parts: Sequence[PartWindow],
    claims: Mapping[tuple[str, str], set[str]],
    cfg: PolicyConfig,
) -> str:
    if sj.conflict:
        return sj.conflict
    for p in parts:
        if p.sources > 1:
            return f"series of {p.host} came from {p.sources} scrape targets"
        if len(p.targets) != 1 or not same_host(p.targets[0], p.host):
            came = ", ".join(t or "no target label" for t in p.targets)
            return f"series naming host {p.host} came from target(s) {came}"
        if cfg.scrape_job and p.scrape_jobs != (cfg.scrape_job,):
            return f"series of {p.host} came from scrape job(s) {', '.join(p.scrape_jobs)}"
        allocated = sj.gpu_idx.get(p.host)
        if not allocated:
            return f"series from {p.host}, where Slurm allocated the job no GPU"
        if len(p.gpus) != len(allocated):
            return f"{len(p.gpus)} GPU series on {p.host}; Slurm allocated {len(allocated)}"
        if cfg.bind_gpus != "count":
            why = _unbound(p, allocated)
            if why:
                return why
        for g in p.gpus:
            others = claims.get((p.host, g.uuid), set()) - {sj.job_id}
            if others:
                return f"{g.uuid} on {p.host} is claimed by job(s) {', '.join(sorted(others))}"
    return ""


def _unbound(p: PartWindow, allocated: Sequence[int]) -> str:
    """Why the GPUs of ``p``'s series are not the GPUs Slurm allocated there ("" when they
    are): each names one number (``gpu_index``), and these are Slurm's indices."""
    named: list[int] = []
    for g in p.gpus:
        values = set(g.gpu_index)
        if not values or values == {""}:
            return (
                f"{g.uuid} on {p.host}: its series carry no gpu_index, so which GPU they describe "
                "is not known (an exporter from before the label: upgrade it; MIG slices have "
                'none: [live] police_bind_gpus = "count")'
            )
        if len(values) > 1:
            names = " and ".join(f"GPU {v}" if v else "no GPU" for v in sorted(values, key=_order))
            return f"{g.uuid} on {p.host} is named {names} at once"
        [value] = values
        if not (value.isascii() and value.isdigit() and len(value) <= 9):
            return f"{g.uuid} on {p.host}: unreadable gpu_index"
        named.append(int(value))
    if sorted(named) != sorted(allocated):
        return (
            f"series on {p.host} name GPU(s) {_ids(named)}; Slurm allocated the job "
            f"{_ids(allocated)} there"
        )
    return ""


def _order(value: str) -> tuple[int, int, str]:
    # Numbers first, by value, then anything else ("": no label).
    digits = value.isascii() and value.isdigit() and len(value) <= 9
    return (0, int(value), "") if digits else (1, 0, value)


def _ids(numbers: Sequence[int]) -> str:
    return ", ".join(str(n) for n in sorted(numbers))


def _data_problem(
    sj: SlurmJob, parts: Sequence[PartWindow], cfg: PolicyConfig, now_s: float
) -> tuple[str, str]:
    seen = {p.host for p in parts}
    missing = sorted(set(sj.gpu_idx) - seen)
    if missing and not parts:
        return "no_data", f"no live data from {', '.join(missing)}"
    if missing:
        return "partial", f"partial data: no live data from {', '.join(missing)}"
    for p in parts:
        if p.seen_age_s is None or p.seen_age_s > cfg.max_sample_age_s:
            age = "never" if p.seen_age_s is None else f"{p.seen_age_s:.0f} s ago"
            return "stale", f"stale data: {p.host} last scraped {age} (Prometheus' clock)"
        if not p.advanced:
            return "stale", (
                f"frozen data: {p.host}'s readings did not advance in {cfg.max_sample_age_s:.0f} s"
            )
    if sj.start_s is None:
        return "not_judged", "Slurm gave no start time"
    if now_s - sj.start_s < cfg.grace_s:
        return "grace", "in its start-up grace"
    return "", ""


def _skew(parts: Sequence[PartWindow]) -> float | None:
    skews = [p.skew_s for p in parts if p.skew_s is not None]
    return max(skews, key=abs) if skews else None


def decide(
    parts: Sequence[PartWindow],
    slurm: Mapping[str, SlurmJob],
    past: Sequence[LiveAction],
    cfg: PolicyConfig,
    now_s: float,
) -> list[Decision]:
    """A decision for every running GPU job and every job seen in the live data; acted ones
    worst first (most idle GPU-seconds), cancellations capped."""
    by_job: dict[str, list[PartWindow]] = {}
    for p in parts:
        by_job.setdefault(p.job_id, []).append(p)
    claims = _claims(parts, cfg.max_sample_age_s)
    history = _mode_actions(past, cfg.dry_run)
    user_last_warn: dict[str, float] = {}
    for a in history:
        if _warned(a.action):
            user_last_warn[a.user] = max(user_last_warn.get(a.user, 0.0), a.at_s)
    triggered: list[Decision] = []
    out: list[Decision] = []
    for job_id in sorted(set(by_job) - set(slurm), key=int):
        out.append(
            Decision(
                job_id,
                "skip",
                "",
                "Slurm lists no such running GPU job",
                status="not_running",
                skew_s=_skew(by_job[job_id]),
            )
        )
    for job_id in sorted(slurm, key=int):
        sj, jparts = slurm[job_id], by_job.get(job_id, [])
        skew = _skew(jparts)
        base = Decision(job_id, "skip", "", "", sj.user, sj.account, skew_s=skew)
        why = _mismatch(sj, jparts, claims, cfg)
        if why:
            out.append(replace(base, reason=why, status="mismatch"))
            continue
        status, why = _data_problem(sj, jparts, cfg, now_s)
        if status:
            out.append(replace(base, reason=why, status=status))
            continue
        judged = [(g, *judge_gpu(g, cfg, p.span_s)) for p in jparts for g in p.gpus]
        unknown = [w for _, s, w in judged if s == "unknown"]
        if unknown:
            out.append(replace(base, reason=unknown[0], status="not_judged"))
            continue
        found = False
        for rule in RULES:
            gpus = [
                g
                for g, s, _ in judged
                if s == "idle"
                and (
                    (
                        rule == "never_used"
                        and g.ever_used is False
                        and (g.sampled_s or 0.0) >= cfg.idle_s
                    )
                    or (rule == "idle" and g.ever_used is not False)
                )
            ]
            if gpus:
                found = True
                idle = sum(max(0.0, (g.sampled_s or 0.0) - (g.busy_s or 0.0)) for g in gpus)
                ev = tuple(_evidence(g, rule) for g in gpus)
                triggered.append(
                    replace(base, rule=rule, gpus=len(gpus), idle_gpu_s=idle, evidence=ev)
                )
        if not found:
            out.append(replace(base, reason="no GPU idle over the whole window"))
    triggered.sort(key=lambda d: (-d.idle_gpu_s, int(d.job_id), d.rule))
    cancels = 0
    acted: set[str] = set()  # one action per job and pass
    for d in triggered:
        if d.job_id in acted:
            out.append(_with(d, "skip", "one action per job and pass"))
            continue
        sj = slurm[d.job_id]
        job_warnings = [a for a in history if a.job_id == d.job_id and _warned(a.action)]
        if not any(a.rule == d.rule for a in job_warnings):
            # Interval from earlier passes only: one pass's warnings to a user go out as one
            # mail (police groups them), however many jobs (array tasks) it names.
            last_user = user_last_warn.get(d.user)
            if last_user is not None and now_s - last_user < cfg.user_interval_s:
                out.append(_with(d, "skip", "user warned recently; this warning waits"))
                continue
            acted.add(d.job_id)
            out.append(_with(d, "warn", "first warning for this rule"))
            continue
        exempt = _exempt(sj, cfg)
        last = max(a.at_s for a in job_warnings)
        if not cfg.cancel:
            out.append(_with(d, "skip", "already warned; cancellation is off"))
        elif exempt:
            out.append(_with(d, "skip", f"already warned; {exempt}: never cancelled"))
        elif now_s - last < cfg.cancel_grace_s:
            out.append(_with(d, "skip", "in the grace period after its last warning"))
        elif len(job_warnings) < cfg.cancel_after_warnings:
            acted.add(d.job_id)
            n = len(job_warnings) + 1
            out.append(_with(d, "warn", f"warning {n} of {cfg.cancel_after_warnings}"))
        elif cancels >= cfg.max_cancels_per_pass:
            out.append(_with(d, "skip", "cancellation cap of this pass reached"))
        else:
            cancels += 1
            acted.add(d.job_id)
            out.append(_with(d, "cancel", f"still idle after {len(job_warnings)} warning(s)"))
    return out


def _with(d: Decision, action: str, reason: str) -> Decision:
    return replace(d, action=action, reason=reason)
