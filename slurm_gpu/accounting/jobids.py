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
        """The id to hand to ``sacct -j`` (without the step)."""
        if self.array_task is not None:
            return f"{self.job}_{self.array_task}"
        if self.het_offset is not None:
            return f"{self.job}+{self.het_offset}"
        return self.job


def parse_job_id(text: str) -> JobId:
    """Parse a user-typed job id; raises ``UsageError`` with a hint when it is not one."""
    match = _ID_RE.fullmatch(text.strip())
    if not match:
        raise UsageError(
            f"{text!r} is not a Slurm job id",
            hint="give a job id such as 1234, an array task 1234_7 or a het component 1234+0",
        )
    offset = match.group("offset")
    return JobId(
        job=match.group("job"),
        array_task=match.group("task"),
        het_offset=int(offset) if offset is not None else None,
        step=match.group("step"),
    )
