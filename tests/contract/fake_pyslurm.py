"""A stand-in for ``pyslurm`` shaped like pyslurm 25.11's documented ``pyslurm.db`` API.

Only what ``PyslurmSource`` reads exists: ``db.JobFilter(**kwargs)``, ``db.Jobs.load(filter)``
returning a dict-like collection (25.11's ``MultiClusterMap``) keyed by job id, ``db.Job``
attributes as documented, ``JobStatistics`` (``max_resident_memory`` bytes,
``total_cpu_time`` seconds) and ``TrackableResources`` (``cpu``/``mem``/``node``/``billing``
objects with ``count``, memory in MiB; ``gres`` mapping ``gpu`` / ``gpu:TYPE`` to ``GPU``).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrackableResource:
    count: int


@dataclass
class GPU:
    count: int
    type: str | None = None


@dataclass
class TrackableResources:
    cpu: TrackableResource | None = None
    mem: TrackableResource | None = None
    node: TrackableResource | None = None
    billing: TrackableResource | None = None
    gres: dict[str, GPU] = field(default_factory=dict)


def tres(
    cpu: int, mem_mib: int, node: int, billing: int, gpus: int = 0, gpu_type: str | None = None
) -> TrackableResources:
    gres: dict[str, GPU] = {}
    if gpus:
        gres["gpu"] = GPU(gpus)
        if gpu_type:
            gres[f"gpu:{gpu_type}"] = GPU(gpus, gpu_type)
    return TrackableResources(
        TrackableResource(cpu),
        TrackableResource(mem_mib),
        TrackableResource(node),
        TrackableResource(billing),
        gres,
    )


@dataclass
class JobStatistics:
    max_resident_memory: int | None = None
    total_cpu_time: float | None = None


@dataclass
class Job:
    id: int
    name: str = ""
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    user_name: str | None = None
    user_id: int | None = None
    state: str = "COMPLETED"
    cancelled_by: str | None = None
    exit_code: int = 0
    exit_code_signal: int = 0
    derived_exit_code: int = 0
    elapsed_time: int = 0
    time_limit: int | str | None = None
    submit_time: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    nodelist: str | None = None
    array_id: int | None = None
    array_task_id: int | None = None
    array_tasks_waiting: str | None = None
    heterogeneous_id: int | None = None
    heterogeneous_offset: int | None = None
    requeue_count: int = 0
    comment: str | None = None
    admin_comment: str | None = None
    working_directory: str | None = None
    cpus: int | None = None
    memory: int | None = None
    allocated_tres: TrackableResources | None = None
    requested_tres: TrackableResources | None = None
    stats: JobStatistics = field(default_factory=JobStatistics)


class JobFilter:
    def __init__(self, **kwargs: Any) -> None:
        self.ids: list[int] | None = None
        self.users: list[str] | None = None
        self.start_time: int | None = None
        self.end_time: int | None = None
        for key, value in kwargs.items():
            setattr(self, key, value)


class RPCError(Exception):
    pass


def make_module(jobs: list[Job], *, fail: bool = False) -> Any:
    """A ``pyslurm`` module whose database holds ``jobs``; ``calls`` records each load."""
    calls: list[JobFilter] = []

    class Jobs(dict[int, Job]):
        @staticmethod
        def load(db_filter: JobFilter | None = None) -> Jobs:
            calls.append(db_filter or JobFilter())
            if fail:
                raise RPCError("Failed to get Jobs from slurmdbd")
            out = Jobs()
            for job in jobs:
                base = job.array_id or job.heterogeneous_id or job.id
                if (
                    db_filter
                    and db_filter.ids
                    and job.id not in db_filter.ids
                    and base not in db_filter.ids
                ):
                    continue
                if db_filter and db_filter.users and job.user_name not in db_filter.users:
                    continue
                out[job.id] = job
            return out

    db = types.SimpleNamespace(JobFilter=JobFilter, Jobs=Jobs, Job=Job)
    return types.SimpleNamespace(db=db, calls=calls)
