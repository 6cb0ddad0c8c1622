"""One pass of the live policy (``slurm-gpu police``): read, decide, act, record.

The pass reads everything first (the live data, Slurm's running jobs, the policy's past
actions) and acts only when all three were read: Prometheus unreachable, ``squeue`` failing
or the store unreachable end the pass before any action, with the error's exit code. Then, job
by job, worst first: a warning is mailed to the job's user and recorded; a cancellation sets
the job's AdminComment to the reason (``sacct -o AdminComment`` shows it) and runs ``scancel``,
then is recorded. Each action is recorded at once, so a pass that dies midway loses at most
the one it was doing. A dry run records ``would_warn``/``would_cancel`` and acts on nothing.
An admin digest lists the pass's actions.

Seams: the command runner (``squeue``, ``scontrol``, ``scancel``), the mailer, the store's
engine and the live data's source are handed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.message import EmailMessage

from sqlalchemy import Engine

from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.accounting.runner import CommandRunner
from slurm_gpu.errors import AccountingError, MailError
from slurm_gpu.live.policy import Decision, PolicyConfig, SlurmJob, decide
from slurm_gpu.notify.message import clean_subject, recipient_address
from slurm_gpu.notify.transport import Mailer
from slurm_gpu.records import LiveJob
from slurm_gpu.store.liveactions import LiveAction, actions_for, record_actions
from slurm_gpu.textsafe import clean_user_text

log = logging.getLogger("slurm_gpu.live.police")

#: squeue's format: raw job id (unique per array element), user, account, partition, QOS,
#: node list. None of these may contain "|" (Slurm's names).
SQUEUE_FORMAT = "%A|%u|%a|%P|%q|%N"
#: Prefix of the AdminComment a cancellation writes.
COMMENT_PREFIX = "slurm-gpu police"


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


def _cmd(opts: PoliceOptions, name: str) -> str:
    return f"{opts.slurm_bin.rstrip('/')}/{name}" if opts.slurm_bin else name


def running_jobs(runner: CommandRunner, opts: PoliceOptions) -> dict[str, SlurmJob]:
    """Slurm's running jobs by raw id; ``AccountingError`` when squeue fails."""
    result = runner(
        [_cmd(opts, "squeue"), "-h", "-t", "R", "-o", SQUEUE_FORMAT],
        env={"SLURM_TIME_FORMAT": "standard"},
        timeout_s=opts.timeout_s,
    )
    if result.returncode != 0:
        raise AccountingError(
            f"squeue failed (exit {result.returncode}): {clean_user_text(result.stderr, 200)}",
            hint="slurmctld must answer for the policy to act",
        )
    jobs = {}
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6 or not fields[0].isdigit():
            continue
        job_id, user, account, partition, qos, nodes = fields
        try:
            hosts = expand_hostlist(nodes)
        except Exception:
            continue  # a node list we cannot read: the job is not judged (missing in Slurm)
        jobs[job_id] = SlurmJob(job_id, user, account, partition, qos, hosts)
    return jobs


def warning_message(d: Decision, opts: PoliceOptions, cfg: PolicyConfig) -> EmailMessage:
    """The warning to the job's owner: evidence, what to do, the gpueff command."""
    what = "never used" if d.rule == "never_used" else "idle"
    msg = EmailMessage()
    msg["Subject"] = clean_subject(f"Job {d.job_id}: {d.gpus} GPU(s) {what} on {opts.site_name}")
    msg["From"] = opts.from_address
    state = "were never used since it started" if d.rule == "never_used" else "are idle now"
    lines = [
        f"Your job {d.job_id} holds {d.gpus} GPU(s) that {state}:",
        "",
        *(f"  {e}" for e in d.evidence),
        "",
        f"Idle GPU time so far: {d.idle_gpu_s / 3600:.1f} GPU-hours, which other jobs wait for.",
        "",
        "What to do:",
        f"  - if the job is done or stuck: scancel {d.job_id}",
        "  - if the program should use these GPUs: check that it sees them "
        "(CUDA_VISIBLE_DEVICES, one rank per GPU) and is not waiting on data or a hung rank",
        "  - if it needs fewer GPUs: request fewer next time (--gres=gpu:N)",
        "",
        f"See the details so far: {opts.gpueff_command} {d.job_id}",
    ]
    if cfg.cancel:
        lines += [
            "",
            f"Jobs that stay idle are cancelled after {cfg.cancel_after_warnings} warning(s) "
            f"and {cfg.cancel_grace_s / 60:.0f} more minutes.",
        ]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def digest_message(done: Sequence[LiveAction], opts: PoliceOptions) -> EmailMessage:
    """The admin digest of one pass."""
    msg = EmailMessage()
    n_cancel = sum(a.action in ("cancelled", "would_cancel") for a in done)
    msg["Subject"] = clean_subject(
        f"slurm-gpu police on {opts.site_name}: {len(done) - n_cancel} warned, {n_cancel} cancelled"
    )
    msg["From"] = opts.from_address
    lines = [f"{'JOBID':>10} {'ACTION':<13} {'RULE':<11} {'USER':<12} {'GPUS':>4} IDLE GPU-H"]
    lines += [
        f"{a.job_id:>10} {a.action:<13} {a.rule:<11} {a.user[:12]:<12} {a.gpus:>4} "
        f"{a.idle_gpu_s / 3600:.1f}"
        for a in done
    ]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def run_pass(
    load_live: Callable[[], Sequence[LiveJob]],
    runner: CommandRunner,
    engine: Engine,
    mailer: Mailer,
    cfg: PolicyConfig,
    opts: PoliceOptions,
    now_s: float,
) -> PassResult:
    """Read everything, decide, act and record (see the module's docstring). Raises the
    source's, ``squeue``'s or the store's error before any action."""
    live = load_live()
    slurm = running_jobs(runner, opts)
    past = actions_for(
        engine,
        {j.job_id for j in live},
        {s.user for s in slurm.values()},
        now_s - max(cfg.user_interval_s, 0.0),
    )
    decisions = decide(live, slurm, past, cfg, now_s)
    done: list[LiveAction] = []
    failed: list[tuple[str, str]] = []
    for d in decisions:
        if d.action == "skip":
            continue
        action = {"warn": "warned", "cancel": "cancelled"}[d.action]
        if cfg.dry_run:
            action = f"would_{d.action}"
        else:
            try:
                if d.action == "warn":
                    _warn(d, mailer, cfg, opts)
                else:
                    _cancel(d, runner, opts)
            except (MailError, AccountingError) as exc:
                log.warning("job %s: %s not done: %s", d.job_id, d.action, exc.message)
                failed.append((d.job_id, exc.message))
                continue
        record = LiveAction(
            d.job_id, d.rule, action, d.user, d.account, now_s, d.gpus, d.idle_gpu_s, d.reason
        )
        record_actions(engine, [record])
        done.append(record)
    if done and opts.admin_emails:
        try:
            mailer.send(digest_message(done, opts), list(opts.admin_emails))
        except MailError as exc:
            failed.append(("digest", exc.message))
    return PassResult(tuple(decisions), tuple(done), tuple(failed))


def _warn(d: Decision, mailer: Mailer, cfg: PolicyConfig, opts: PoliceOptions) -> None:
    to = recipient_address(d.user, opts.recipient_domain)
    msg = warning_message(d, opts, cfg)
    msg["To"] = to
    mailer.send(msg, [to])


def _cancel(d: Decision, runner: CommandRunner, opts: PoliceOptions) -> None:
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
            raise AccountingError(
                f"{argv[0]} {argv[1]} failed (exit {result.returncode}): "
                f"{clean_user_text(result.stderr, 200)}",
                hint="the policy needs SlurmUser's or root's rights to cancel",
            )
