"""Accounting asked before ``gpueff``'s report code is imported.

``gpueff JOBID`` on a job the collector has not answered for this user (a running job, the
newest job before its collection, another user's job) must ask accounting: ``sacct``, about
0.1 s of slurmdbd round trip. The console script (``cli.gpueff_entry``) learns that as soon as
the caller's report file is missing, before it imports the report code, click and jinja2
(about 0.1 s more). ``start`` asks accounting there, in a background thread, so the two
overlap; the console script hands the pending question to the full command (``cli.gpueff``,
through click's context object), whose composition root uses it instead of asking again.

The answer is used only for exactly the queries it was started for (what
``service.start_lookup`` asks when the store answers none of the ids); anything else is asked
afresh. Errors are raised where the answer is taken, as if asked then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slurm_gpu.accounting.jobids import parse_job_id
from slurm_gpu.background import InBackground

if TYPE_CHECKING:
    from slurm_gpu.config import Settings
    from slurm_gpu.records import JobRecord

#: The fields ``gpueff`` leaves out of accounting queries: QOS is not in the report, and naming
#: it costs sacct a slurmdbd table request.
OMIT: tuple[str, ...] = ("QOS",)

#: Seconds ``gpueff`` waits for the controller alone before it asks accounting as well
#: (``ControllerCorrected``'s ``hedge_s``). ``squeue`` answers in about 16 ms on the test
#: cluster, and a loaded controller in well under a second; a stopped or hung one makes
#: ``squeue`` retry for about 18 s, which a person should not wait when accounting knows.
CONTROLLER_HEDGE_S = 1.0


def open_for_gpueff(settings: Settings, *, controller: bool = True) -> Any:
    """The configured accounting source as ``gpueff`` asks it: as the calling user, without
    ``OMIT``, ``sacct``'s accounting and text queries at once (a person waits), and, with
    ``controller``, the controller asked first: a job it shows running is answered by
    ``squeue`` alone (``accounting.controller``), accounting asked as well when the controller
    is silent for ``CONTROLLER_HEDGE_S``."""
    from slurm_gpu.accounting import open_accounting

    source = open_accounting(settings, omit=OMIT, overlap_text=True)
    if not controller:
        return source
    from slurm_gpu.accounting.controller import ControllerCorrected, SqueueView, squeue_path_for

    acc = settings.accounting
    view = SqueueView(squeue_path=squeue_path_for(acc.sacct_path), timeout_s=acc.timeout_s)
    return ControllerCorrected(source, view, controller_first=True, hedge_s=CONTROLLER_HEDGE_S)


class EarlyAccounting:
    """An ``AccountingSource`` whose answer for ``queries`` was asked when it was made."""

    def __init__(self, source: Any, queries: Sequence[str]) -> None:
        self._source = source
        self.name: str = getattr(source, "name", "accounting")
        self.queries: tuple[str, ...] = tuple(queries)
        self._asked: InBackground[dict[str, JobRecord]] = InBackground(
            lambda: source.get_jobs(list(self.queries)), name="gpueff-early"
        )

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """The early answer when ``job_ids`` are the queries it was asked for; else ask."""
        if tuple(job_ids) != self.queries:
            jobs: dict[str, JobRecord] = self._source.get_jobs(job_ids)
            return jobs
        return self._asked.result()

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        """See ``AccountingSource.jobs_between`` (never asked early)."""
        jobs: list[JobRecord] = self._source.jobs_between(start_s, end_s, users)
        return jobs


def queries_for(ids: Sequence[str]) -> list[str]:
    """The accounting queries of ids as typed, in order, once each (as ``start_lookup``).
    Raises ``UsageError`` for a malformed id."""
    return list(dict.fromkeys(parse_job_id(i).query for i in ids))


def start(settings: Settings, ids: Sequence[str]) -> EarlyAccounting:
    """Ask accounting about ``ids`` (as typed) in the background, now."""
    return EarlyAccounting(open_for_gpueff(settings), queries_for(ids))
