"""The mail program's decisions: enrich this mail, queue it for a digest, or hand it back.

Slurm runs ``MailProg -s SUBJECT USER`` as SlurmUser with the job in the environment
(``SLURM_JOB_ID``, ``SLURM_JOB_MAIL_TYPE``, ``SLURM_JOB_STATE``, ``SLURM_ARRAY_JOB_ID``…). Only
END and FAIL mails of GPU jobs are enriched; everything else goes to the site's ordinary mail
program unchanged (the CLI does that exec). All I/O goes through injected seams so the tests
drive the real logic with a real SMTP server and fake accounting.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from slurm_gpu.accounting.base import AccountingSource
from slurm_gpu.errors import StoreNotReadyError
from slurm_gpu.jobreport.model import JobReport, Telemetry
from slurm_gpu.jobreport.service import TelemetryReader, report_for
from slurm_gpu.notify.message import MessageBuilder, recipient_address
from slurm_gpu.notify.state import MailState, PendingMail
from slurm_gpu.notify.transport import Mailer
from slurm_gpu.records import JobRecord

#: SLURM_JOB_MAIL_TYPE values (Slurm writes "Ended"/"Failed"; --mail-type spells END/FAIL).
ENRICHED_MAIL_TYPES = frozenset({"END", "ENDED", "FAIL", "FAILED"})

_WHOLE_ARRAY_RE = re.compile(r"Job_id=\d+_\*")


class Outcome(StrEnum):
    """What the mail program did with one invocation."""

    FALLBACK = "fallback"
    """Not ours to enrich: the site's mail program must send it as it is."""
    SENT = "sent"
    QUEUED = "queued"
    """Throttled: the job waits for the user's next digest."""
    DUPLICATE = "duplicate"
    """Already sent or queued for this job."""


@dataclass(frozen=True, slots=True)
class MailRequest:
    """One invocation as Slurm made it."""

    subject: str
    recipients: tuple[str, ...]
    job_id: str | None
    mail_type: str | None
    job_state: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    array_task_count: int | None = None
    """``SLURM_ARRAY_TASK_COUNT``: how many tasks a whole-array mail is about."""

    @classmethod
    def from_env(
        cls, subject: str, recipients: Sequence[str], environ: Mapping[str, str]
    ) -> MailRequest:
        """The request from MailProg's arguments and environment."""
        return cls(
            subject=subject,
            recipients=tuple(recipients),
            job_id=environ.get("SLURM_JOB_ID") or None,
            mail_type=environ.get("SLURM_JOB_MAIL_TYPE") or None,
            job_state=environ.get("SLURM_JOB_STATE") or None,
            array_job_id=environ.get("SLURM_ARRAY_JOB_ID") or None,
            array_task_id=environ.get("SLURM_ARRAY_TASK_ID") or None,
            array_task_count=_count(environ.get("SLURM_ARRAY_TASK_COUNT")),
        )

    @property
    def enrichable(self) -> bool:
        """Whether this is an END or FAIL mail about a known job, to exactly one recipient."""
        return (
            self.job_id is not None
            and self.job_id.isdigit()
            and (self.mail_type or "").strip().upper() in ENRICHED_MAIL_TYPES
            and len(self.recipients) == 1
        )

    @property
    def whole_array(self) -> bool:
        """Whether Slurm mails about a whole array (one mail when every task ended)."""
        return bool(self.array_job_id) and (
            not self.array_task_id or bool(_WHOLE_ARRAY_RE.search(self.subject))
        )

    @property
    def query(self) -> str:
        """The id accounting is asked about: the array for a whole-array mail, else the job."""
        if self.whole_array and self.array_job_id:
            return self.array_job_id
        return self.job_id or ""

    @property
    def key(self) -> str:
        """The job this mail is about, as the mail state records it (``array:N`` for arrays)."""
        return f"array:{self.query}" if self.whole_array else self.job_id or ""


def _count(text: str | None) -> int | None:
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


@dataclass(frozen=True, slots=True)
class NotifyOptions:
    """The ``[mail]`` settings the decisions need (seconds in names)."""

    recipient_domain: str = ""
    wait_for_record_s: float = 120.0
    poll_interval_s: float = 3.0
    digest_window_s: float = 3600.0
    max_per_user_per_window: int = 3
    min_elapsed_s: float = 30.0


class WaitingReader:
    """A ``TelemetryReader`` that waits (bounded) for an ended job's record to be stored.

    The collector stores a job shortly after its epilog; Slurm sends the END mail at about the
    same moment. ``collect`` (optional) asks the collector to ingest this job now instead.
    """

    def __init__(
        self,
        inner: TelemetryReader,
        *,
        deadline_s: float,
        poll_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        collect: Callable[[str], None] | None = None,
    ) -> None:
        self._inner = inner
        self._deadline_s = deadline_s
        self._poll = poll_interval_s
        self._clock, self._sleep = clock, sleep
        self._collect = collect

    def final(self, job: JobRecord) -> Telemetry | None:
        """The stored telemetry, waiting for it until the deadline."""
        tried_collect = False
        while True:
            tel = self._inner.final(job)
            if tel is not None:
                return tel
            if self._collect is not None and not tried_collect:
                tried_collect = True
                self._collect(job.job_id)
                continue
            if self._clock() + self._poll > self._deadline_s:
                return None
            self._sleep(self._poll)

    def live(self, job: JobRecord) -> Telemetry | None:
        """Live telemetry (no waiting)."""
        return self._inner.live(job)


@dataclass(slots=True)
class Progress:
    """How far one mail has got, across the drainer's passes (in memory; what must survive a
    dead drainer is in ``pending``, the row of the mail state)."""

    pending: PendingMail
    jobs: list[JobRecord] | None = None
    """What accounting said, once it was settled or the wait for it ended."""
    found: dict[str, Telemetry] = field(default_factory=dict)
    """Stored telemetry already read, by job id."""
    collected: bool = False

    @property
    def request(self) -> MailRequest:
        """The call as Slurm made it."""
        p = self.pending
        return MailRequest.from_env(p.subject, (p.recipient,), p.env)


class _LookingReader:
    """Reads stored telemetry once per pass (no waiting), keeping what it found."""

    def __init__(self, inner: TelemetryReader, found: dict[str, Telemetry]) -> None:
        self._inner = inner
        self._found = found
        self.missing: list[str] = []
        #: The store was not ready (not created yet, or behind this release's schema until the
        #: collector's next pass migrates it): waited for like a record not stored yet.
        self.store_missing: StoreNotReadyError | None = None

    def final(self, job: JobRecord) -> Telemetry | None:
        try:
            tel = self._found.get(job.job_id) or self._inner.final(job)
        except StoreNotReadyError as exc:
            self.store_missing = exc
            tel = None
        if tel is None:
            self.missing.append(job.job_id)
        else:
            self._found[job.job_id] = tel
        return tel

    def live(self, job: JobRecord) -> Telemetry | None:
        return self._inner.live(job)


class Notifier:
    """Decides and sends. One instance per drainer, admin call or ``--flush``."""

    def __init__(
        self,
        *,
        accounting: AccountingSource,
        reader: TelemetryReader,
        builder: MessageBuilder,
        mailer: Mailer,
        state: MailState,
        options: NotifyOptions,
        now: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        collect: Callable[[str], None] | None = None,
    ) -> None:
        self.accounting = accounting
        self.reader = reader
        self.builder = builder
        self.mailer = mailer
        self.state = state
        self.opts = options
        self._now, self._clock, self._sleep = now, clock, sleep
        self._collect = collect

    def _waiting(self) -> WaitingReader:
        return WaitingReader(
            self.reader,
            deadline_s=self._clock() + self.opts.wait_for_record_s,
            poll_interval_s=self.opts.poll_interval_s,
            clock=self._clock,
            sleep=self._sleep,
            collect=self._collect,
        )

    def _reports(self, jobs: Sequence[JobRecord]) -> list[JobReport]:
        reader = self._waiting()
        return [report_for(j, reader, min_elapsed_s=self.opts.min_elapsed_s) for j in jobs]

    def handle(self, req: MailRequest) -> Outcome:
        """Enrich, queue or hand back one mail, waiting here (bounded) for accounting and the
        record. Raises ``MailError``/``AccountingError``."""
        progress = Progress(
            PendingMail(req.key, req.subject, req.recipients[0] if req.recipients else "")
        )
        progress.pending = replace(progress.pending, enqueued_s=self._now())
        while True:
            outcome = self.advance(progress, req, persist=False)
            if outcome is not None:
                return outcome
            self._sleep(self.opts.poll_interval_s)

    def advance(
        self, progress: Progress, req: MailRequest | None = None, *, persist: bool = True
    ) -> Outcome | None:
        """One look at one mail: its outcome, or None to look again after ``poll_interval_s``.

        Accounting is asked until every job is settled, for at most ``wait_for_record_s`` from
        the call; then burst control decides (recording the decision in the waiting row when
        ``persist``); then the stored record is looked for, for at most ``wait_for_record_s``
        from that decision, and the message goes out with what there is. Raises
        ``MailError``/``AccountingError``.
        """
        req = req or progress.request
        if not req.enrichable:
            return Outcome.FALLBACK
        assert req.job_id is not None
        p = progress.pending
        if p.admitted_s is None:
            if progress.jobs is None:
                jobs, complete = self._accounted_once(req)
                late = (
                    self._now() + self.opts.poll_interval_s
                    > p.enqueued_s + self.opts.wait_for_record_s
                )
                if not complete and not late:
                    return None
                progress.jobs = jobs
            jobs = progress.jobs
            if not jobs or not any((j.alloc_tres.gpus or 0) > 0 for j in jobs):
                return Outcome.FALLBACK
            recipient = recipient_address(req.recipients[0], self.opts.recipient_domain)
            now = self._now()
            admitted = self.state.admit(
                jobs[0].user,
                recipient,
                req.key,
                now_s=now,
                window_s=self.opts.digest_window_s,
                max_per_window=self.opts.max_per_user_per_window,
                pending_key=p.key if persist else None,
            )
            if not admitted:
                queued = {q.job_id for q in self.state.queued()}
                return Outcome.QUEUED if req.key in queued else Outcome.DUPLICATE
            progress.pending = p = replace(p, admitted_s=now, address=recipient)
        elif progress.jobs is None:
            # A drainer that took over after the decision: accounting has settled by now.
            progress.jobs = self._accounted_once(req)[0]
            if not progress.jobs:
                return Outcome.FALLBACK
        assert p.admitted_s is not None and progress.jobs is not None
        recipient = p.address or recipient_address(req.recipients[0], self.opts.recipient_domain)
        reports = self._look(progress)
        if reports is None:
            return None
        msg = self.builder.build(reports, to=recipient, original_subject=req.subject)
        self.mailer.send(msg, [recipient])
        return Outcome.SENT

    def _look(self, progress: Progress) -> list[JobReport] | None:
        """The reports, or None while a record is missing and its wait has not ended."""
        assert progress.jobs is not None and progress.pending.admitted_s is not None
        while True:
            reader = _LookingReader(self.reader, progress.found)
            reports = [
                report_for(j, reader, min_elapsed_s=self.opts.min_elapsed_s) for j in progress.jobs
            ]
            if not reader.missing:
                return reports
            if self._collect is not None and not progress.collected:
                progress.collected = True
                for job_id in reader.missing:
                    self._collect(job_id)
                continue
            deadline = progress.pending.admitted_s + self.opts.wait_for_record_s
            if self._now() + self.opts.poll_interval_s > deadline:
                if reader.store_missing is not None:
                    raise type(reader.store_missing)(
                        f"{reader.store_missing.message} after waiting "
                        f"{self.opts.wait_for_record_s:g} s",
                        hint=reader.store_missing.hint,
                    )
                return reports
            return None

    def _accounted_once(self, req: MailRequest) -> tuple[list[JobRecord], bool]:
        """The jobs the mail is about as accounting has them now, and whether it is complete.

        Slurm sends the END mail the moment the job ends, while slurmdbd is still being told
        about it: on the test cluster the first query about a three-task array that had just
        ended returned one task with no name and no time limit. So the caller asks again
        until every job is settled and a whole-array mail has every task
        (``SLURM_ARRAY_TASK_COUNT``), or its wait ends.
        """
        from slurm_gpu.accounting.base import is_settled

        found = self.accounting.get_jobs([req.query])
        jobs = sorted(found.values(), key=lambda j: j.job_id)
        if not req.whole_array:
            jobs = [j for j in jobs if j.job_id == req.job_id] or jobs[:1]
        complete = bool(jobs) and all(is_settled(j) for j in jobs)
        if req.whole_array and req.array_task_count is not None:
            complete = complete and len(jobs) >= req.array_task_count
        return jobs, complete

    def flush(self) -> int:
        """Send every due digest; returns how many were sent."""
        due = self.state.take_due_digests(now_s=self._now(), window_s=self.opts.digest_window_s)
        sent = 0
        for queued in due.values():
            ids: list[str] = []
            for q in queued:
                ids.append(q.job_id.removeprefix("array:"))
            found = self.accounting.get_jobs(ids)  # one accounting query per digest
            jobs = sorted(found.values(), key=lambda j: j.job_id)
            if not jobs:
                continue
            reports = self._reports(jobs)
            recipient = queued[0].recipient
            msg = self.builder.build(reports, to=recipient)
            self.mailer.send(msg, [recipient])
            sent += 1
        return sent


def asked_for_end_mail(job: JobRecord) -> bool:
    """Whether the job's ``--mail-type`` already brings an END or FAIL mail."""
    types = {t.strip().upper() for t in (job.mail_type or "").split(",")}
    return bool(types & {"END", "FAIL", "ALL"})


def policy_mails(
    notifier: Notifier,
    jobs: Sequence[JobRecord],
    *,
    min_gpu_hours: float,
    period_s: float,
    opt_out: frozenset[str],
) -> list[str]:
    """Site policy: mail users whose ended job left at least ``min_gpu_hours`` of GPUs idle,
    even without ``--mail-type``; at most one per user per ``period_s``, never to users in
    ``opt_out``. Returns the job ids mailed about."""
    from slurm_gpu.accounting.base import FINAL_STATES

    mailed: list[str] = []
    reader = notifier._waiting()
    for job in jobs:
        if (
            job.state not in FINAL_STATES
            or not job.alloc_tres.gpus
            or job.user in opt_out
            or asked_for_end_mail(job)
        ):
            continue
        report = report_for(job, reader, min_elapsed_s=notifier.opts.min_elapsed_s)
        wasted = report.gpu_hours_wasted
        if wasted is None or wasted < min_gpu_hours:
            continue
        if not notifier.state.admit_policy(
            job.user, job.job_id, now_s=notifier._now(), period_s=period_s
        ):
            continue
        recipient = recipient_address(job.mail_user or job.user, notifier.opts.recipient_domain)
        msg = notifier.builder.build([report], to=recipient)
        notifier.mailer.send(msg, [recipient])
        mailed.append(job.job_id)
    return mailed
