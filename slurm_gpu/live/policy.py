"""The live policy's decisions (``slurm-gpu police``): pure, no I/O.

Given the running jobs' live data (``LiveJob`` per job and host), what Slurm says of those
jobs (``SlurmJob``: nodes, user, account, partition, QOS) and the policy's past actions, it
decides, per job and rule, to warn, to cancel, or to leave the job alone with a reason.

Safety first: a job is judged only on whole, fresh data. It is skipped when Slurm does not
list it as running, when a node of the job has no live data, when any node's last reading is
older than ``max_sample_age_s``, or when readings cover less than ``coverage_min`` of a GPU's
time since the job started (a sampler that was down). Exempt jobs are warned, never
cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_gpu.records import LiveGpu, LiveJob
from slurm_gpu.store.liveactions import LiveAction

RULES = ("never_used", "idle")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Thresholds and switches, from ``[live] police_*``."""

    grace_s: float = 1800.0
    idle_s: float = 3600.0
    max_sample_age_s: float = 120.0
    coverage_min: float = 0.9
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
class SlurmJob:
    """A running job as Slurm lists it (``squeue``)."""

    job_id: str
    user: str
    account: str
    partition: str
    qos: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """What the pass does with one job: ``warn``, ``cancel`` or ``skip`` (with why)."""

    job_id: str
    action: str
    rule: str
    """The rule that triggered (``never_used``, ``idle``), or ``""`` for a skip."""
    reason: str
    user: str = ""
    account: str = ""
    gpus: int = 0
    """GPUs the rule found idle."""
    idle_gpu_s: float = 0.0
    """Their idle GPU-seconds so far."""
    evidence: tuple[str, ...] = ()


def _warned(action: str) -> bool:
    return action in ("warned", "would_warn")


def _mode_actions(past: Sequence[LiveAction], dry_run: bool) -> list[LiveAction]:
    # A dry run's records never count as real warnings, and the other way round.
    return [a for a in past if a.action.startswith("would_") == dry_run]


def _idle_gpus(job: Sequence[LiveJob], rule: str, now_s: float, idle_s: float) -> list[LiveGpu]:
    gpus = [g for part in job for g in part.gpus]
    if rule == "never_used":
        return [g for g in gpus if g.active_first_s is None and (g.sampled_s or 0.0) >= idle_s]
    return [
        g
        for g in gpus
        if g.active_first_s is not None
        and g.idle_since_s is not None
        and now_s - g.idle_since_s >= idle_s
    ]


def _evidence(rule: str, gpus: Sequence[LiveGpu], now_s: float) -> tuple[str, ...]:
    lines = []
    for g in gpus:
        if rule == "never_used":
            lines.append(f"{g.uuid}: no kernel ran since the job started")
        else:
            since = now_s - (g.idle_since_s or now_s)
            lines.append(f"{g.uuid}: 0 % duty cycle for the last {since / 60:.0f} min")
    return tuple(lines)


def _data_problem(
    parts: Sequence[LiveJob], slurm: SlurmJob, cfg: PolicyConfig, now_s: float
) -> str:
    seen = {p.host for p in parts}
    missing = sorted(set(slurm.nodes) - seen)
    if missing:
        return f"partial data: no live data from {', '.join(missing)}"
    for p in parts:
        if now_s - p.updated_s > cfg.max_sample_age_s:
            return f"stale data: {p.host}'s last reading is {now_s - p.updated_s:.0f} s old"
        span = p.updated_s - p.started_s
        for g in p.gpus:
            if g.sampled_s is None or (span > 0 and g.sampled_s < cfg.coverage_min * span):
                return f"gaps: readings cover too little of {g.uuid}'s time on {p.host}"
    if not any(p.gpus for p in parts):
        return "no GPU in the live data"
    return ""


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


def decide(
    live: Sequence[LiveJob],
    slurm: Mapping[str, SlurmJob],
    past: Sequence[LiveAction],
    cfg: PolicyConfig,
    now_s: float,
) -> list[Decision]:
    """Every job's decision, worst first (most idle GPU-seconds); cancellations capped."""
    by_job: dict[str, list[LiveJob]] = {}
    for part in live:
        by_job.setdefault(part.job_id, []).append(part)
    history = _mode_actions(past, cfg.dry_run)
    user_last_warn: dict[str, float] = {}
    for a in history:
        if _warned(a.action):
            user_last_warn[a.user] = max(user_last_warn.get(a.user, 0.0), a.at_s)
    triggered: list[Decision] = []
    out: list[Decision] = []
    for job_id, parts in by_job.items():
        sj = slurm.get(job_id)
        if sj is None:
            out.append(Decision(job_id, "skip", "", "Slurm does not list the job as running"))
            continue
        problem = _data_problem(parts, sj, cfg, now_s)
        if problem:
            out.append(Decision(job_id, "skip", "", problem, sj.user, sj.account))
            continue
        if now_s - min(p.started_s for p in parts) < cfg.grace_s:
            out.append(Decision(job_id, "skip", "", "in its start-up grace", sj.user, sj.account))
            continue
        for rule in RULES:
            gpus = _idle_gpus(parts, rule, now_s, cfg.idle_s)
            if gpus:
                idle = sum((g.sampled_s or 0.0) - (g.busy_s or 0.0) for g in gpus)
                ev = _evidence(rule, gpus, now_s)
                triggered.append(
                    Decision(job_id, "", rule, "", sj.user, sj.account, len(gpus), idle, ev)
                )
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
            last_user = user_last_warn.get(d.user)
            if last_user is not None and now_s - last_user < cfg.user_interval_s:
                out.append(_with(d, "skip", "user warned recently; this warning waits"))
                continue
            user_last_warn[d.user] = now_s
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
    return Decision(
        d.job_id, action, d.rule, reason, d.user, d.account, d.gpus, d.idle_gpu_s, d.evidence
    )
