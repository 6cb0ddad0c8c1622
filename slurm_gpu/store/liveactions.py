"""The live policy's actions in the store (table ``live_actions``, schema version 7).

``slurm-gpu police`` records every warning and cancellation, and every one it would have made
in a dry run, before it acts on the next job; it reads them back to warn once per job and
rule, to throttle per user and to count a job's warnings before a cancellation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict

from sqlalchemy import Engine, delete, or_, select
from sqlalchemy.exc import SQLAlchemyError

from slurm_gpu.errors import StoreError
from slurm_gpu.store import schema
from slurm_gpu.store.actionrows import LiveAction

__all__ = ["LiveAction", "actions_for", "forget_reports", "record_actions"]

_CHUNK = 500

log = logging.getLogger("slurm_gpu.store.liveactions")


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
    forget_reports(engine, [a.job_id for a in actions])


def forget_reports(engine: Engine, job_ids: Sequence[str]) -> None:
    """Delete the rendered reports (``job_reports``) of ``job_ids``: a job collected before
    its action was recorded (it ended during the policy's pass) would otherwise keep a report
    without the action. ``gpueff`` then renders it afresh from the store, and ``slurm-gpu
    store reports`` renders it again. Best effort: the actions are recorded already."""
    ids = sorted(set(job_ids))
    r = schema.job_reports
    try:
        with engine.begin() as conn:
            for i in range(0, len(ids), _CHUNK):
                conn.execute(delete(r).where(r.c.job_id.in_(ids[i : i + _CHUNK])))
    except SQLAlchemyError as exc:
        log.warning("cannot forget the reports of actioned jobs (%s)", type(exc).__name__)


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
