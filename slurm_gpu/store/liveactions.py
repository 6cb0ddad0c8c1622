"""The live policy's actions in the store (table ``live_actions``, schema version 7).

``slurm-gpu police`` records every warning and cancellation, and every one it would have made
in a dry run, before it acts on the next job; it reads them back to warn once per job and
rule, to throttle per user and to count a job's warnings before a cancellation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from sqlalchemy import Engine, or_, select
from sqlalchemy.exc import SQLAlchemyError

from slurm_gpu.errors import StoreError
from slurm_gpu.store import schema

_CHUNK = 500


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


def record_actions(engine: Engine, actions: Sequence[LiveAction]) -> None:
    """Insert ``actions`` in one transaction; ``StoreError`` when the store refuses."""
    if not actions:
        return
    try:
        with engine.begin() as conn:
            conn.execute(schema.live_actions.insert(), [asdict(a) for a in actions])
    except SQLAlchemyError as exc:
        raise StoreError(
            f"cannot record the live policy's actions ({type(exc).__name__})",
            hint="check the store (slurm-gpu store info)",
        ) from None


def actions_for(
    engine: Engine, job_ids: Iterable[str], users: Iterable[str], since_s: float
) -> list[LiveAction]:
    """Every action on ``job_ids``, and the actions on ``users``' jobs since ``since_s``."""
    t = schema.live_actions
    jobs, names = sorted(set(job_ids)), sorted(set(users))
    out: dict[int, LiveAction] = {}
    try:
        with engine.connect() as conn:
            for i in range(0, max(len(jobs), len(names), 1), _CHUNK):
                cond = or_(
                    t.c.job_id.in_(jobs[i : i + _CHUNK]),
                    (t.c.user.in_(names[i : i + _CHUNK])) & (t.c.at_s >= since_s),
                )
                for row in conn.execute(select(t).where(cond)):
                    m = row._mapping
                    out[int(m["id"])] = LiveAction(
                        **{k: m[k] for k in LiveAction.__dataclass_fields__}
                    )
    except SQLAlchemyError as exc:
        raise StoreError(
            f"cannot read the live policy's past actions ({type(exc).__name__})",
            hint="run: slurm-gpu store migrate",
        ) from None
    return [out[k] for k in sorted(out)]
