"""What the controller (``squeue``) says of live jobs that accounting does not show started.

slurmctld tells slurmdbd of a job's submission and start through a queue of its own, so
``sacct`` lags the controller: by seconds on a loaded controller, by minutes to hours while
slurmdbd restarts or works off a backlog, and not at all while slurmdbd is down (``sacct``
fails). In that window a job that ``squeue`` shows RUNNING is still PENDING in ``sacct``
(once seen on the test cluster as a bare record named "allocation", with no partition and no
CPUs), or absent. ``ControllerCorrected`` wraps an accounting source for the views a person
reads (``gpueff``, the job page): for just those jobs it asks ``squeue``, as the caller (so
Slurm's ``PrivateData`` applies as to ``sacct``), and takes the controller's word for the
ones it shows running. Accounting's record of a job that has started is never replaced, and a
job the controller shows ended is left to accounting, which will catch up: an ended job's
report needs its exit code and end time, which only accounting keeps. A job the controller
shows waiting (PENDING) is taken from it only where accounting has no record of it at all:
slurmdbd hears of a submission seconds later (15 s once on the test cluster, where ``gpueff``
said "not found" of a job ``squeue`` showed pending); a record it has is kept whole.

With ``controller_first`` (``gpueff``, the job page), the controller is asked first: a job it
shows running is answered from it alone, without ``sacct`` (about 7 ms against 0.2 s on the test
cluster, and no slurmdbd round trip); anything else (an ended job, a whole array, a job the
controller does not show) is asked of accounting as before, with the controller's answer reused.
With ``hedge_s`` as well, a controller silent for that long (stopped, hung, failing over:
``squeue`` retries its connection for about 18 s before it gives up) is not waited for:
accounting is asked at once, its answer taken for the jobs it shows started, and the
controller given ``hedge_s`` more for the others (its answer then taken as above); only when
accounting fails is the controller, the one source left, waited for to the end.

``squeue --Format`` is asked for the job's name (text its owner chose) and otherwise only for
fields no user can type (ids, state, node list, times, user, account, partition, CPUs, TRES,
time limit, run time). Every field ends with a delimiter drawn at random for that query
(``query_delimiter``), which a name written before the query cannot hold, so a name cannot
forge a field or a job; an answer that does not split into whole records is dropped. The name
is cleaned where it enters (``slurm_gpu.textsafe``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from slurm_gpu.accounting.base import AccountingSource
from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.accounting.jobids import answers, parse_job_id
from slurm_gpu.accounting.runner import CommandRunner, SubprocessRunner

# The same readings of Slurm's empty values, numbers and epoch times as sacct's.
from slurm_gpu.accounting.sacct import _epoch, _opt_int, parse_duration
from slurm_gpu.accounting.sacct import _opt_str as _opt
from slurm_gpu.accounting.tres import parse_tres
from slurm_gpu.accounting.usertext import JOB_NAME_MAX_LEN
from slurm_gpu.background import InBackground
from slurm_gpu.errors import AccountingError
from slurm_gpu.records import JobRecord, Tres
from slurm_gpu.textsafe import clean_user_text

#: States in which a job holds its allocation: the controller's word is taken for these.
LIVE_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "CONFIGURING"})
#: States in which accounting shows a job that has not started (or that it has not heard of
#: starting yet).
NOT_STARTED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
#: A job waiting to start: the controller's word is taken for it only where accounting has no
#: record of it (slurmdbd hears of a submission seconds to minutes later).
WAITING_STATES = frozenset({"PENDING"})
#: The states of the jobs the controller is asked about: running or waiting.
_SHOWN_STATES = LIVE_STATES | WAITING_STATES

#: ``squeue --Format`` fields, in order.
FIELDS: tuple[str, ...] = (
    "JobID",
    "JobArrayID",
    "ArrayJobID",
    "ArrayTaskID",
    "HetJobID",
    "HetJobOffset",
    "State",
    "NodeList",
    "StartTime",
    "SubmitTime",
    "UserName",
    "UserID",
    "Account",
    "Partition",
    "NumCPUs",
    "tres-alloc",
    "TimeLimit",
    "TimeUsed",
    "Name",
)

#: Bytes of ``squeue`` output read at most: a few hundred per job, and only the jobs asked.
MAX_OUTPUT_BYTES = 1 << 20


def query_delimiter() -> str:
    """The end of each field of one ``squeue`` query: 16 random hex digits between unit
    separators (it starts with a separator, so ``--Format`` cannot read it as a width)."""
    return "\x1f" + os.urandom(8).hex() + "\x1f"


def squeue_path_for(sacct_path: str) -> str:
    """The squeue beside an absolute ``sacct_path`` (the client commands ship together),
    else ``squeue`` from PATH."""
    if os.path.isabs(sacct_path):
        return os.path.join(os.path.dirname(sacct_path), "squeue")
    return "squeue"


@dataclass(frozen=True, slots=True)
class LiveJob:
    """One job as the controller shows it. Times are epoch seconds."""

    job_id: str
    job_id_display: str
    job_name: str
    """Cleaned and bounded (``JOB_NAME_MAX_LEN``)."""
    array_job_id: str | None
    array_task_id: str | None
    het_job_id: str | None
    het_job_offset: int | None
    state: str
    nodelist: tuple[str, ...]
    start_s: float | None
    submit_s: float | None
    user: str
    uid: int | None
    account: str | None
    partition: str | None
    cpus: int | None
    tres: Tres
    time_limit_s: int | None
    used_s: int | None = None
    """Run time so far, seconds, without the time the job was suspended (``TimeUsed``)."""


def parse_squeue(text: str, delimiter: str) -> list[LiveJob]:
    """The jobs of ``squeue --noheader --Format`` output asked with ``FIELDS``, each field
    ended by ``delimiter``. An answer that does not split into whole records gives ``[]``; a
    record whose id is not a number or whose host list cannot be read is skipped."""
    tokens = text.split(delimiter)
    width = len(FIELDS)
    if len(tokens) % width != 1 or tokens[-1].strip():
        return []
    jobs: list[LiveJob] = []
    for first in range(0, len(tokens) - 1, width):
        values = tokens[first : first + width]
        if first:
            if not values[0].startswith("\n"):
                return []
            values[0] = values[0][1:]
        row = dict(zip(FIELDS, values, strict=True))
        job = _live_job({k: (v if k == "Name" else v.strip()) for k, v in row.items()})
        if job is not None:
            jobs.append(job)
    return jobs


def _live_job(row: Mapping[str, str]) -> LiveJob | None:
    if not row["JobID"].isdigit():
        return None
    try:
        nodes = expand_hostlist(row["NodeList"]) if _opt(row["NodeList"]) else ()
    except AccountingError:
        return None
    limit = parse_duration(row["TimeLimit"])
    het = _opt_int(row["HetJobID"])
    return LiveJob(
        job_id=row["JobID"],
        job_id_display=row["JobArrayID"] or row["JobID"],
        job_name=clean_user_text(row["Name"], JOB_NAME_MAX_LEN),
        array_job_id=_opt(row["ArrayJobID"]) if _opt(row["ArrayTaskID"]) else None,
        array_task_id=_opt(row["ArrayTaskID"]),
        het_job_id=str(het) if het else None,
        het_job_offset=_opt_int(row["HetJobOffset"]) if het else None,
        state=row["State"].split()[0] if row["State"] else "",
        nodelist=nodes,
        start_s=_epoch(row["StartTime"]),
        submit_s=_epoch(row["SubmitTime"]),
        user=row["UserName"],
        uid=_opt_int(row["UserID"]),
        account=_opt(row["Account"]),
        partition=_opt(row["Partition"]),
        cpus=_opt_int(row["NumCPUs"]),
        tres=parse_tres(_opt(row["tres-alloc"])),
        time_limit_s=int(limit) if limit is not None else None,
        used_s=int(used) if (used := parse_duration(row["TimeUsed"])) is not None else None,
    )


def _answers(typed: str, job: JobRecord | LiveJob) -> bool:
    """Whether accounting's or the controller's ``job`` answers the id a user typed."""
    return answers(
        typed, job.job_id, job.array_job_id, job.array_task_id, job.het_job_id, job.het_job_offset
    )


def corrected(job: JobRecord | None, live: LiveJob, now_s: float) -> JobRecord:
    """Accounting's record of a job (``None``: accounting has none) as the controller shows
    it running (or waiting: its TRES is then its request, as ``squeue`` prints it): state,
    nodes, start, elapsed time and allocation from the controller; what the
    controller does not tell (its request, its comment and directory) kept from accounting; the
    name is the controller's (accounting's unsettled record names every job "allocation")."""
    # Slurm's own run time (suspended time left out, as sacct's Elapsed), else since the start.
    elapsed = live.used_s
    if elapsed is None:
        elapsed = int(max(0.0, now_s - live.start_s)) if live.start_s is not None else 0
    if job is None:
        return JobRecord(
            job_id=live.job_id,
            job_id_display=live.job_id_display,
            array_job_id=live.array_job_id,
            array_task_id=live.array_task_id,
            het_job_id=live.het_job_id,
            het_job_offset=live.het_job_offset,
            user=live.user,
            uid=live.uid,
            account=live.account,
            partition=live.partition,
            qos=None,
            job_name=live.job_name,
            work_dir=None,
            nodelist=live.nodelist,
            state=live.state,
            cancelled_by_uid=None,
            exit_code=None,
            exit_signal=None,
            derived_exit_code=None,
            alloc_tres=live.tres,
            req_tres=live.tres,
            alloc_cpus=live.cpus,
            req_mem_bytes=live.tres.mem_bytes,
            max_rss_bytes=None,
            total_cpu_s=None,
            elapsed_s=elapsed,
            time_limit_s=live.time_limit_s,
            submit_s=live.submit_s,
            start_s=live.start_s,
            end_s=None,
            restarts=0,
            comment=None,
            admin_comment=None,
            mail_user=None,
            mail_type=None,
        )
    return replace(
        job,
        job_name=live.job_name,
        state=live.state,
        nodelist=live.nodelist,
        start_s=live.start_s,
        end_s=None,
        elapsed_s=elapsed,
        alloc_tres=live.tres,
        req_tres=job.req_tres if job.req_tres.gpus is not None else live.tres,
        alloc_cpus=live.cpus,
        partition=job.partition or live.partition,
        account=job.account or live.account,
        time_limit_s=live.time_limit_s if live.time_limit_s is not None else job.time_limit_s,
        exit_code=None,
        exit_signal=None,
    )


class SqueueView:
    """Asks ``squeue`` (as the calling user) for the jobs of some ids."""

    def __init__(
        self,
        *,
        squeue_path: str = "squeue",
        timeout_s: float = 30.0,
        runner: CommandRunner | None = None,
    ) -> None:
        self.squeue_path = squeue_path
        self.timeout_s = timeout_s
        self.runner = runner or SubprocessRunner()

    def argv(self, queries: Sequence[str], delimiter: str) -> list[str]:
        fmt = ",".join(f"{name}:0{delimiter}" for name in FIELDS)
        return [
            self.squeue_path,
            "--noheader",
            "--states=all",
            f"--jobs={','.join(queries)}",
            f"--Format={fmt}",
        ]

    def jobs(self, queries: Sequence[str]) -> list[LiveJob]:
        """The controller's jobs answering ``queries`` (``[]`` when it knows none of them:
        squeue exits 1 with "Invalid job id specified" when every id is unknown or ended long
        ago). Raises ``AccountingError`` when squeue cannot run or prints more than
        ``MAX_OUTPUT_BYTES``."""
        if not queries:
            return []
        delimiter = query_delimiter()
        done = self.runner(
            self.argv(queries, delimiter),
            env={"SLURM_TIME_FORMAT": "%s"},
            timeout_s=self.timeout_s,
            max_stdout=MAX_OUTPUT_BYTES + 1,
        )
        if done.returncode != 0:
            return []
        if len(done.stdout) > MAX_OUTPUT_BYTES:
            raise AccountingError(
                f"{self.squeue_path} printed over {MAX_OUTPUT_BYTES} bytes",
                hint="ask for fewer jobs at once",
            )
        text = done.stdout.decode("utf-8", "replace")
        jobs = parse_squeue(text, delimiter)
        return [j for j in jobs if any(_answers(q, j) for q in queries)]


class ControllerCorrected:
    """An ``AccountingSource`` whose answers for live jobs accounting has not seen start
    come from the controller (module docstring). Asks ``squeue`` only for the ids accounting
    answered with no started job (or, when accounting cannot be asked, for all of them); with
    ``controller_first``, asks it first, and accounting only for what it cannot answer alone;
    with ``hedge_s`` too, asks accounting as well once the controller has been silent that many
    seconds (module docstring)."""

    def __init__(
        self,
        source: AccountingSource,
        view: SqueueView,
        *,
        controller_first: bool = False,
        hedge_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._view = view
        self._first = controller_first
        self._hedge_s = hedge_s
        self._clock = clock
        self.name: str = source.name

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """See ``AccountingSource.get_jobs``. When accounting cannot be asked, the controller
        answers if it shows every id running; otherwise accounting's error is raised."""
        asked: list[LiveJob] | None = None
        # The controller was asked and could not answer (squeue failed or timed out): it is
        # not asked a second time, which would wait as long again (a hung munged makes every
        # Slurm command wait its whole timeout).
        failed = False
        silent: InBackground[list[LiveJob]] | None = None  # the controller, still asked
        hedge_s = self._hedge_s
        if self._first and job_ids:
            if hedge_s is None:
                asked = _answer(lambda: self._live(job_ids))
                failed = asked is None
            else:
                pending = InBackground(lambda: self._live(job_ids), name="squeue")
                if pending.wait(hedge_s):
                    asked = _answer(pending.result)
                    failed = asked is None
                else:
                    silent = pending
            running = _running(asked or [])
            if asked is not None and all(_alone(q, running) for q in job_ids):
                now_s = self._clock()
                return {j.job_id: corrected(None, j, now_s) for j in running}
        try:
            found = self._source.get_jobs(job_ids)
        except AccountingError as error:
            if silent is not None:
                # Accounting failed: the controller is the one source left, and is waited for.
                asked, silent = _answer(silent.result), None
                failed = asked is None
            elif asked is None and not failed:
                asked = _answer(lambda: self._live(job_ids))
                failed = asked is None
            live = asked or []
            if not job_ids or not all(any(_answers(q, j) for j in live) for q in job_ids):
                # Accounting's error, not the controller's; saying that neither answered.
                raise (_neither_answered(error) if failed else error) from None
            return {j.job_id: corrected(None, j, self._clock()) for j in live}
        unsure = [q for q in job_ids if not _started(q, found)]
        if not unsure:
            return found
        if silent is not None and hedge_s is not None:
            # Still silent after ``hedge_s`` more: accounting's answer stands, as when the
            # controller cannot be asked.
            asked = (_answer(silent.result) or []) if silent.wait(hedge_s) else []
        if asked is not None:
            live = [j for j in asked if any(_answers(q, j) for q in unsure)]
        elif failed:
            live = []
        else:
            live = self._second_opinion(unsure)
        out = dict(found)
        now_s = self._clock()
        for job in live:
            known = out.get(job.job_id)
            if job.state in WAITING_STATES:
                # Waiting: only for what accounting has no record of at all (its lag after a
                # submission); a record it has (a requeued job's runs) is kept whole.
                typed = [q for q in unsure if _answers(q, job)]
                if known is None and not any(_answers(q, f) for q in typed for f in found.values()):
                    out[job.job_id] = corrected(None, job, now_s)
            elif known is None or known.state in NOT_STARTED_STATES:
                out[job.job_id] = corrected(known, job, now_s)
        return out

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        """See ``AccountingSource.jobs_between`` (accounting's answer, uncorrected)."""
        return self._source.jobs_between(start_s, end_s, users)

    def _live(self, queries: Sequence[str]) -> list[LiveJob]:
        """The controller's running and waiting jobs of ``queries``."""
        return [j for j in self._view.jobs(queries) if j.state in _SHOWN_STATES]

    def _second_opinion(self, queries: Sequence[str]) -> list[LiveJob]:
        """The controller's running and waiting jobs of ``queries``; ``[]`` when it cannot be
        asked (it is a second opinion: accounting's answer, or its error, stands)."""
        return _answer(lambda: self._live(queries)) or []


def _running(jobs: Sequence[LiveJob]) -> list[LiveJob]:
    """The jobs that hold their allocation (the controller answers these alone)."""
    return [j for j in jobs if j.state in LIVE_STATES]


def _neither_answered(error: AccountingError) -> AccountingError:
    """Accounting's ``error`` when the controller could not be asked either: neither daemon
    answering points at what both commands need on this host."""
    return AccountingError(
        error.message,
        stderr=error.stderr,
        hint="squeue did not answer either: when no Slurm command answers, munged on this host "
        f"or the network is the usual cause (`munge -n | unmunge` tells); {error.hint}",
    )


def _answer(ask: Callable[[], list[LiveJob]]) -> list[LiveJob] | None:
    """The controller's answer, or ``None`` when it could not be asked (accounting alone then
    answers, as without the controller)."""
    try:
        return ask()
    except AccountingError:
        return None


def _started(typed: str, found: Mapping[str, JobRecord]) -> bool:
    """Whether accounting answered ``typed`` with jobs none of which it shows not started."""
    matched = [j for j in found.values() if _answers(typed, j)]
    return bool(matched) and all(j.state not in NOT_STARTED_STATES for j in matched)


def _alone(typed: str, live: Sequence[LiveJob]) -> bool:
    """Whether the controller's running jobs answer ``typed`` whole: one job, running, and not
    a task or component of a job the id names as a whole (whose ended parts only accounting
    keeps)."""
    matched = [j for j in live if _answers(typed, j)]
    if len(matched) != 1:
        return False
    parsed = parse_job_id(typed)
    (job,) = matched
    if job.array_task_id is not None and parsed.array_task is None:
        return False
    if job.het_job_id is not None and parsed.het_offset is None:
        return False
    return parsed.tasks is None
