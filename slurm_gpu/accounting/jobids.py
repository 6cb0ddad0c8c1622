"""Job ids as users type them: ``1234``, ``1234_7``, ``1234_[1-5]``, ``1234+0``, ``1234.batch``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_gpu.errors import UsageError

_ID_RE = re.compile(
    r"(?P<job>\d+)(?:_(?P<task>\d+|\[[0-9,\-:%]+\])|\+(?P<offset>\d+))?(?:\.(?P<step>[A-Za-z0-9_+\-]+))?"
)


@dataclass(frozen=True, slots=True)
class JobId:
    """A parsed job id. ``step`` is dropped when asking accounting (steps fold into jobs)."""

    job: str
    array_task: str | None = None
    het_offset: int | None = None
    step: str | None = None

    @property
    def query(self) -> str:
        """The id to hand to ``sacct -j`` (without the step). A range of tasks asks for the
        whole array (``sacct -j 61_[1-3]`` is refused: "Bad job array element"); the caller
        keeps the tasks of ``tasks``."""
        if self.array_task is not None and self.tasks is not None:
            return self.job
        if self.array_task is not None:
            return f"{self.job}_{self.array_task}"
        if self.het_offset is not None:
            return f"{self.job}+{self.het_offset}"
        return self.job

    @property
    def tasks(self) -> frozenset[int] | None:
        """The task ids of a range (``[1-5]``, ``[1,3,7-11:2]``; a ``%N`` limit is ignored);
        ``None`` when the id names no range."""
        if self.array_task is None or not self.array_task.startswith("["):
            return None
        return expand_tasks(self.array_task)


#: Most tasks a range may name: Slurm's own MaxArraySize limit is at most 4,000,001.
MAX_RANGE_TASKS = 4_000_001


def expand_tasks(text: str) -> frozenset[int]:
    """The task ids of ``[1-3,5,7-11:2%4]``; raises ``UsageError`` for a malformed range."""
    body = text.strip("[]").split("%", 1)[0]
    tasks: set[int] = set()
    for part in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if m is None:
            raise UsageError(
                f"{text!r} is not a range of array tasks",
                hint="e.g. 1234_[1-5], 1234_[1,3,7-11:2]",
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise UsageError(
                f"{text!r} is not a range of array tasks",
                hint="a range goes up (1-5), with a positive step (1-11:2)",
            )
        named = (hi - lo) // step + 1 + len(tasks)
        if named > MAX_RANGE_TASKS:
            raise UsageError(
                f"{text!r} names {named:,} tasks",
                hint=f"no array has more than {MAX_RANGE_TASKS:,} (Slurm's largest MaxArraySize); "
                "give the tasks you want, or the array's id alone for all of them",
            )
        tasks.update(range(lo, hi + 1, step))
    return frozenset(tasks)


def parse_job_id(text: str) -> JobId:
    """Parse a user-typed job id; raises ``UsageError`` with a hint when it is not one."""
    match = _ID_RE.fullmatch(text.strip())
    if not match:
        raise UsageError(
            f"{text!r} is not a Slurm job id",
            hint="give a job id such as 1234, an array task 1234_7 or a het component 1234+0",
        )
    offset = match.group("offset")
    task = match.group("task")
    if task is not None and task.startswith("["):
        expand_tasks(task)  # a malformed range is the user's error now, not accounting's
    return JobId(
        job=match.group("job"),
        array_task=match.group("task"),
        het_offset=int(offset) if offset is not None else None,
        step=match.group("step"),
    )


def answers(
    typed: str,
    job_id: str,
    array_job_id: str | None,
    array_task_id: str | None,
    het_job_id: str | None,
    het_job_offset: int | None,
) -> bool:
    """Whether a job with these ids answers the id a user typed (``1234``: the job, or every
    task or component of it; ``1234_7``; ``1234_[1-3]``; ``1234+0``)."""
    parsed = parse_job_id(typed)
    tasks = parsed.tasks
    if tasks is not None:
        task = array_task_id or ""
        return array_job_id == parsed.job and task.isdigit() and int(task) in tasks
    if parsed.array_task is not None:
        return array_job_id == parsed.job and array_task_id == parsed.array_task
    if parsed.het_offset is not None:
        return het_job_id == parsed.job and het_job_offset == parsed.het_offset
    return parsed.job in (job_id, array_job_id, het_job_id)
