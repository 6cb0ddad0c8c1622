"""One pass of the live policy (``slurm-gpu police``): read, decide, act, record.

The pass reads everything first (the evidence over the window, Slurm's running GPU jobs with
their GPUs per node, the policy's past actions) and acts only when all three were read:
Prometheus unreachable, ``squeue``/``scontrol`` failing or the store unreachable end the pass
before any action, with the error's exit code. Every decision is logged (a skipped job with
its reason). Then, worst first: a user's warnings of this pass go out as **one** mail naming
every job (a 50-task array is one mail), each job's warning recorded; a cancellation sets the
job's AdminComment to the reason (``sacct -o AdminComment`` shows it) and runs ``scancel``,
then is recorded. A job that ended between the read and the action is not a failure. Each
action is recorded at once, so a pass that dies midway loses at most the one it was doing. A
dry run records ``would_warn``/``would_cancel`` and sends nothing: no user mail, no digest
(with ``--mail-dir`` the mails it would send are written there, worded "would"). An admin
digest lists a real pass's actions.

Seams: the command runner (``squeue``, ``scontrol``, ``scancel``), the mailer, the store's
engine and the evidence's source are handed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from sqlalchemy import Engine

from slurm_gpu.accounting.runner import CommandRunner
from slurm_gpu.errors import AccountingError, MailError
from slurm_gpu.gcpace import with_fewer_collections
from slurm_gpu.live.allocation import running_gpu_jobs
from slurm_gpu.live.policy import Decision, PolicyConfig, decide
from slurm_gpu.notify.message import clean_subject, recipient_address
from slurm_gpu.notify.transport import Mailer
from slurm_gpu.records import PartWindow
from slurm_gpu.store.liveactions import LiveAction, actions_for, record_actions
from slurm_gpu.textsafe import clean_command_message, clean_user_text

log = logging.getLogger("slurm_gpu.live.police")

#: Prefix of the AdminComment a cancellation writes.
COMMENT_PREFIX = "slurm-gpu police"
#: Most jobs named one by one in a warning mail; the rest are counted.
MAX_JOBS_NAMED = 100


@dataclass(frozen=True, slots=True)
class PoliceOptions:
    """What a pass needs besides the policy: commands, mail, wording."""

    slurm_bin: str
    """Directory of squeue, scontrol and scancel ("" for PATH)."""
    timeout_s: float
    recipient_domain: str
    from_address: str
    admin_emails: tuple[str, ...]
    site_name: str = "the cluster"
    gpueff_command: str = "gpueff"


@dataclass(frozen=True, slots=True)
class PassResult:
    """The pass's decisions and what came of each acted one."""

    decisions: tuple[Decision, ...]
    done: tuple[LiveAction, ...]
    failed: tuple[tuple[str, str], ...]
    """(job id, why) of actions that could not be carried out."""
    gone: tuple[str, ...] = ()
    """Jobs that ended between the read and their action (not failures)."""


def _cmd(opts: PoliceOptions, name: str) -> str:
    return f"{opts.slurm_bin.rstrip('/')}/{name}" if opts.slurm_bin else name


def _headers(msg: EmailMessage, opts: PoliceOptions) -> None:
    msg["From"] = opts.from_address
    msg["Date"] = formatdate(localtime=True)
    domain = opts.from_address.rpartition("@")[2] or None
    msg["Message-ID"] = make_msgid("slurm-gpu-police", domain=domain)


def warning_message(ds: Sequence[Decision], opts: PoliceOptions, cfg: PolicyConfig) -> EmailMessage:
    """One user's warning for this pass, naming every job it warns about (worst first):
    evidence, what to do, the gpueff command. A dry run's says it was not sent."""
    would = cfg.dry_run
    named = list(ds[:MAX_JOBS_NAMED])
    ids = [d.job_id for d in ds]
    gpus = sum(d.gpus for d in ds)
    if len(ds) == 1:
        d = ds[0]
        what = "never used" if d.rule == "never_used" else "idle"
        subject = f"Job {d.job_id}: {d.gpus} GPU(s) {what} on {opts.site_name}"
    else:
        more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
        subject = f"Jobs {', '.join(ids[:3])}{more}: {gpus} GPU(s) idle on {opts.site_name}"
    msg = EmailMessage()
    msg["Subject"] = clean_subject(("[dry run, not sent] Would warn: " if would else "") + subject)
    _headers(msg, opts)
    lines = []
    if would:
        lines += ["DRY RUN: slurm-gpu police would send this mail; it was not sent.", ""]
    lines += [
        f"Your job(s) {', '.join(ids[:MAX_JOBS_NAMED])}"
        + (f" and {len(ids) - MAX_JOBS_NAMED} more" if len(ids) > MAX_JOBS_NAMED else "")
        + " hold GPUs that sat idle over the whole last "
        + f"{cfg.idle_s / 60:.0f} minutes:",
    ]
    for d in named:
        state = "were never used since it started" if d.rule == "never_used" else "are idle"
        lines += [
            "",
            f"Job {d.job_id}: {d.gpus} GPU(s) that {state}; idle GPU time so far "
            f"{d.idle_gpu_s / 3600:.1f} GPU-hours, which other jobs wait for.",
            *(f"  {e}" for e in d.evidence),
            f"  See the details so far: {opts.gpueff_command} {d.job_id}",
        ]
    first = ids[0]
    lines += [
        "",
        "What to do:",
        f"  - if a job is done or stuck: scancel {first}"
        + (" (and likewise the others)" if len(ids) > 1 else ""),
        "  - if the program should use these GPUs: check that it sees them "
        "(CUDA_VISIBLE_DEVICES, one rank per GPU) and is not waiting on data or a hung rank",
        "  - if it needs fewer GPUs: request fewer next time (--gres=gpu:N)",
    ]
    if cfg.cancel:
        lines += [
            "",
            f"Jobs that stay idle {'would be' if would else 'are'} cancelled after "
            f"{cfg.cancel_after_warnings} warning(s) and {cfg.cancel_grace_s / 60:.0f} more "
            "minutes.",
        ]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def digest_message(
    done: Sequence[LiveAction], opts: PoliceOptions, dry_run: bool = False
) -> EmailMessage:
    """The admin digest of one pass (a dry run's says "would")."""
    msg = EmailMessage()
    n_cancel = sum(a.action in ("cancelled", "would_cancel") for a in done)
    n_warn = len(done) - n_cancel
    counts = (
        f"would warn {n_warn}, would cancel {n_cancel} (dry run, nothing done)"
        if dry_run
        else f"{n_warn} warned, {n_cancel} cancelled"
    )
    msg["Subject"] = clean_subject(f"slurm-gpu police on {opts.site_name}: {counts}")
    _headers(msg, opts)
    msg["To"] = ", ".join(opts.admin_emails)
    lines = [f"{'JOBID':>10} {'ACTION':<13} {'RULE':<11} {'USER':<12} {'GPUS':>4} IDLE GPU-H"]
    lines += [
        f"{a.job_id:>10} {a.action:<13} {a.rule:<11} {a.user[:12]:<12} {a.gpus:>4} "
        f"{a.idle_gpu_s / 3600:.1f}"
        for a in done
    ]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def _log_decisions(decisions: Sequence[Decision]) -> None:
    for d in decisions:
        skew = "" if d.skew_s is None else f", node clock skew {d.skew_s:+.0f} s"
        if d.action == "skip":
            # A mismatch or a disagreement between signals is worth an admin's look.
            level = logging.WARNING if d.status in ("mismatch", "not_judged") else logging.INFO
            log.log(level, "job %s: not acted on [%s]: %s%s", d.job_id, d.status, d.reason, skew)
        else:
            log.info("job %s: %s (%s: %s)%s", d.job_id, d.action, d.rule, d.reason, skew)


@with_fewer_collections
def run_pass(
    load_windows: Callable[[], Sequence[PartWindow]],
    runner: CommandRunner,
    engine: Engine,
    mailer: Mailer | None,
    cfg: PolicyConfig,
    opts: PoliceOptions,
    now_s: float,
) -> PassResult:
    """Read everything, decide, act and record (see the module's docstring). Raises the
    source's, Slurm's or the store's error before any action. ``mailer`` None: no mail at
    all (a dry run without a mail directory).

    The pass runs with fewer garbage collections (``gcpace``): it holds every job's answers
    from Prometheus (71,500 samples for 10,000 jobs of 2 GPUs) while it builds their
    windows, objects without reference cycles that collections at the default thresholds
    scanned again and again (a third or more of a pass's CPU, docs/performance.md)."""
    parts = load_windows()
    slurm = running_gpu_jobs(runner, opts.slurm_bin, opts.timeout_s)
    past = actions_for(
        engine,
        {p.job_id for p in parts} | set(slurm),
        {s.user for s in slurm.values()},
        now_s - max(cfg.user_interval_s, 0.0),
    )
    decisions = decide(parts, slurm, past, cfg, now_s)
    _log_decisions(decisions)
    done: list[LiveAction] = []
    failed: list[tuple[str, str]] = []
    gone: list[str] = []

    def record(d: Decision, action: str) -> None:
        rec = LiveAction(
            d.job_id, d.rule, action, d.user, d.account, now_s, d.gpus, d.idle_gpu_s, d.reason
        )
        record_actions(engine, [rec])
        done.append(rec)

    warns: dict[str, list[Decision]] = {}
    for d in decisions:
        if d.action == "warn":
            warns.setdefault(d.user, []).append(d)
        elif d.action == "cancel":
            if cfg.dry_run:
                record(d, "would_cancel")
                continue
            try:
                if _cancel(d, runner, opts):
                    record(d, "cancelled")
                else:
                    log.info("job %s ended before its cancellation: nothing to do", d.job_id)
                    gone.append(d.job_id)
            except AccountingError as exc:
                log.warning("job %s: cancel not done: %s", d.job_id, exc.message)
                failed.append((d.job_id, exc.message))
    for user, ds in warns.items():
        # One mail per user and pass, naming every job it warns about.
        action = "would_warn" if cfg.dry_run else "warned"
        try:
            if mailer is not None:
                _warn(user, ds, mailer, cfg, opts)
        except MailError as exc:
            log.warning("user %s: warning not sent: %s", user, exc.message)
            failed.extend((d.job_id, exc.message) for d in ds)
            continue
        # One transaction for the mail's jobs: a commit is most of a warning's cost.
        records = [
            LiveAction(
                d.job_id, d.rule, action, d.user, d.account, now_s, d.gpus, d.idle_gpu_s, d.reason
            )
            for d in ds
        ]
        record_actions(engine, records)
        done.extend(records)
    if done and opts.admin_emails and mailer is not None:
        try:
            mailer.send(digest_message(done, opts, cfg.dry_run), list(opts.admin_emails))
        except MailError as exc:
            failed.append(("digest", exc.message))
    return PassResult(tuple(decisions), tuple(done), tuple(failed), tuple(gone))


def _warn(
    user: str, ds: Sequence[Decision], mailer: Mailer, cfg: PolicyConfig, opts: PoliceOptions
) -> None:
    to = recipient_address(user, opts.recipient_domain)
    msg = warning_message(ds, opts, cfg)
    msg["To"] = to
    mailer.send(msg, [to])


def still_running(runner: CommandRunner, opts: PoliceOptions, job_id: str) -> bool:
    """Whether Slurm still lists ``job_id`` as running (``squeue -j``); when squeue cannot
    say, ``True`` (a failure is then reported as one)."""
    result = runner(
        [_cmd(opts, "squeue"), "-h", "-t", "R", "-j", job_id, "-o", "%A"],
        env={},
        timeout_s=opts.timeout_s,
    )
    if result.returncode != 0:
        return "Invalid job id" not in clean_user_text(result.stderr, 200)
    return job_id in result.stdout.decode("utf-8", "replace").split()


def _cancel(d: Decision, runner: CommandRunner, opts: PoliceOptions) -> bool:
    """Comment, then cancel; ``False`` when the job ended before (nothing to do)."""
    reason = (
        f"{COMMENT_PREFIX}: cancelled, {d.gpus} GPU(s) {d.rule.replace('_', ' ')}, "
        f"{d.idle_gpu_s / 3600:.1f} idle GPU-hours, {d.reason}"
    )
    for argv in (
        [_cmd(opts, "scontrol"), "update", f"JobId={d.job_id}", f"AdminComment={reason}"],
        [_cmd(opts, "scancel"), d.job_id],
    ):
        result = runner(argv, env={}, timeout_s=opts.timeout_s)
        if result.returncode != 0:
            if not still_running(runner, opts, d.job_id):
                return False
            raise AccountingError(
                f"{argv[0]} {argv[1]} failed (exit {result.returncode}): "
                f"{clean_command_message(result.stderr)}",
                hint="the policy needs SlurmUser's or root's rights to cancel",
            )
    return True
