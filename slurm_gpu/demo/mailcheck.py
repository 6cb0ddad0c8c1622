"""Which of the demo's jobs got which e-mail: the enriched message, Slurm's plain fallback, or
nothing.

The two paths leave different traces. An enriched message goes out by SMTP and lands in the
demo's sink as an ``.eml`` file whose ``X-Slurm-Job-Id`` header names its job(s)
(``notify.message``; a digest names several). A mail handed back to the plain path goes to
``[mail] fallback_mailprog``; on the test cluster that is ``share/testcluster/fallback-mail.in``,
which records each one as ``<TC_ROOT>/fallback-mail/<jobid>.XXXXXX``. The demo waits for every
job that asked for mail to show up in one of them, then says how many took each path and fails
when one took neither, or took only the fallback where the enriched message was expected.
"""

from __future__ import annotations

import email.parser
import email.policy
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Bytes read of one ``.eml`` file: the headers come first and are far below this.
HEAD_MAX_BYTES = 64 * 1024

#: The test cluster's fallback recorder writes into this directory, a sibling of the
#: ``hooks/`` directory that holds the recorder itself.
FALLBACK_DIR_NAME = "fallback-mail"


@dataclass(frozen=True, slots=True)
class MailTally:
    """What arrived for the jobs that asked for mail (job ids, as Slurm prints them)."""

    asked: tuple[str, ...]
    enriched: frozenset[str]
    """Jobs named by a message in the SMTP sink."""
    fallback: frozenset[str]
    """Jobs with a plain mail recorded by the fallback mail program (and no enriched one)."""
    fallback_known: bool = True
    """Whether the fallback's records could be looked at (else ``fallback`` is empty)."""

    @property
    def missing(self) -> tuple[str, ...]:
        """Jobs that asked for mail and got neither message, in the order asked."""
        return tuple(j for j in self.asked if j not in self.enriched and j not in self.fallback)

    @property
    def only_fallback(self) -> tuple[str, ...]:
        """Jobs that got the plain fallback instead of the enriched message."""
        return tuple(j for j in self.asked if j not in self.enriched and j in self.fallback)

    @property
    def complete(self) -> bool:
        """Every job that asked got some message (enriched or fallback)."""
        return not self.missing


def enriched_job_ids(paths: Iterable[Path]) -> frozenset[str]:
    """Job ids named in the ``X-Slurm-Job-Id`` header of the saved messages (bounded reads;
    a file that cannot be read or parsed names no job)."""
    parser = email.parser.BytesHeaderParser(policy=email.policy.default)
    found: set[str] = set()
    for path in paths:
        try:
            with path.open("rb") as fh:
                head = fh.read(HEAD_MAX_BYTES)
        except OSError:
            continue
        header = parser.parsebytes(head).get("X-Slurm-Job-Id")
        if header:
            found.update(p.strip() for p in str(header).split(",") if p.strip())
    return frozenset(found)


def fallback_job_ids(directory: Path, *, since_s: float = 0.0) -> frozenset[str]:
    """Job ids of the fallback recorder's files ``<jobid>.XXXXXX`` in ``directory`` modified at
    or after ``since_s`` (epoch seconds; older files are earlier demos' mails)."""
    found: set[str] = set()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return frozenset()
    for entry in entries:
        job_id, dot, _ = entry.name.partition(".")
        if not dot or not job_id:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime < since_s:
                continue
        except OSError:
            continue
        found.add(job_id)
    return frozenset(found)


def fallback_dir_of(fallback_mailprog: str) -> Path | None:
    """Where the test cluster's fallback recorder (``<TC_ROOT>/hooks/fallback-mail``) writes:
    ``<TC_ROOT>/fallback-mail``; ``None`` for any other mail program (a site's
    ``/usr/bin/mail`` leaves nothing the demo can count, and neither does a directory this
    account cannot list: it is SlurmUser's, mode 0750, and the demo runs as root)."""
    prog = Path(fallback_mailprog)
    if prog.name != FALLBACK_DIR_NAME or prog.parent.name != "hooks":
        return None
    directory = prog.parent.parent / FALLBACK_DIR_NAME
    readable = directory.is_dir() and os.access(directory, os.R_OK | os.X_OK)
    return directory if readable else None


def tally_mail(
    asked: Sequence[str],
    eml_paths: Callable[[], Iterable[Path]],
    fallback_dir: Path | None,
    *,
    since_s: float,
    timeout_s: float,
    poll_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> MailTally:
    """Look until every job of ``asked`` has an enriched or a fallback message, or until
    ``timeout_s`` (seconds) has passed; the last look's tally."""
    deadline = clock() + timeout_s
    while True:
        enriched = enriched_job_ids(eml_paths()) & frozenset(asked)
        fallback: frozenset[str] = frozenset()
        if fallback_dir is not None:
            fallback = (fallback_job_ids(fallback_dir, since_s=since_s) & frozenset(asked)) - (
                enriched
            )
        tally = MailTally(tuple(asked), enriched, fallback, fallback_dir is not None)
        if tally.complete or clock() >= deadline:
            return tally
        sleep(poll_s)


def summary_line(tally: MailTally, mail_dir: Path, fallback_dir: Path | None) -> str:
    """The summary's e-mail line: enriched and fallback counted separately."""
    n = len(tally.asked)
    asked = f"{n} job{'s' if n != 1 else ''} asked for mail"
    line = f"{asked}: {len(tally.enriched)} enriched (.eml in {mail_dir})"
    if fallback_dir is None:
        return line + ", plain fallback not observable here"
    return line + f", {len(tally.fallback)} plain fallback (recorded in {fallback_dir})"


def failure_line(tally: MailTally, patterns: dict[str, str]) -> str | None:
    """One line saying which jobs did not get their enriched message and what they got
    instead; ``None`` when every job that asked got it."""
    if not tally.missing and not tally.only_fallback:
        return None

    def name(job: str) -> str:
        return f"job {job} ({patterns[job]})" if job in patterns else f"job {job}"

    parts = []
    if tally.missing:
        got = "no mail at all" if tally.fallback_known else "no enriched e-mail"
        parts.append(f"{got} for {', '.join(name(j) for j in tally.missing)}")
    if tally.only_fallback:
        parts.append(
            f"only the plain fallback for {', '.join(name(j) for j in tally.only_fallback)}"
        )
    return (
        "e-mails: " + "; ".join(parts) + " (the mail program's log says why: "
        "wrapper log given to share/mailprog/render, on the test cluster log/mailprog.log)"
    )
