"""The live policy's recorded actions as typed records, with no database library.

``slurm_gpu.store.liveactions`` writes and reads them with SQLAlchemy for ``slurm-gpu police``;
``Store`` and ``sqlite_reader`` read a job's actions with the job (``StoredJob.live_actions``)
for its report and the weekly report. The one definition of the GPU-hours an action stopped
from being wasted (``stopped_gpu_hours``) lives here, so every place that shows it agrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Actions the policy really took: the ones shown to the job's owner.
TAKEN = ("warned", "cancelled")
#: What a dry run records instead (``[live] dry_run``): shown to admins only (weekly report).
DRY_RUN = ("would_warn", "would_cancel")


@dataclass(frozen=True, slots=True)
class LiveAction:
    """One action of the live policy on a running job."""

    job_id: str
    rule: str
    action: str
    """``warned``, ``cancelled``, ``would_warn`` or ``would_cancel``."""
    user: str
    account: str
    at_s: float
    gpus: int
    idle_gpu_s: float
    """Idle GPU-seconds of the rule's GPUs at the time of the action."""
    detail: str


def action_from_row(r: Any) -> LiveAction:
    """A ``LiveAction`` from a ``live_actions`` row (SQLAlchemy ``Row`` or named tuple)."""
    return LiveAction(
        job_id=str(r.job_id),
        rule=str(r.rule),
        action=str(r.action),
        user=str(r.user),
        account=str(r.account),
        at_s=float(r.at_s),
        gpus=int(r.gpus),
        idle_gpu_s=float(r.idle_gpu_s),
        detail=str(r.detail),
    )


def stopped_gpu_hours(
    action: str, gpus: int, at_s: float, start_s: float | None, time_limit_s: int | None
) -> float | None:
    """GPU-hours the action stopped from being wasted: for a cancellation, the idle GPUs
    (``gpus``) times the time left until the job's time limit at the cancellation (an upper
    bound: the job might have ended sooner); 0 for any other action (a warning is counted,
    not credited). ``None`` for a cancellation of a job without a known start or time limit.
    Times in seconds since the epoch and seconds; the result in hours."""
    if action != "cancelled":
        return 0.0
    if start_s is None or not time_limit_s:
        return None
    left_s = max(0.0, start_s + time_limit_s - at_s)
    return gpus * left_s / 3600.0


def stopped_per_action(
    actions: Sequence[Any], start_s: float | None, time_limit_s: int | None
) -> list[float | None]:
    """``stopped_gpu_hours`` of each of one job's ``actions`` (records with ``action``,
    ``gpus`` and ``at_s``), in their order, crediting only the job's first cancellation: a
    job asked to stop twice (it had not ended by the next pass) is stopped once."""
    first = min((a.at_s for a in actions if a.action == "cancelled"), default=None)
    out: list[float | None] = []
    credited = False
    for a in actions:
        if a.action == "cancelled" and (credited or a.at_s != first):
            out.append(0.0)
            continue
        credited = credited or a.action == "cancelled"
        out.append(stopped_gpu_hours(a.action, a.gpus, a.at_s, start_s, time_limit_s))
    return out
