"""Slurm's MailProg (``python -I -m slurm_gpu.cli.mail_cmd``) and ``slurm-gpu mail`` (admins).

slurmctld runs the rendered wrapper (``share/mailprog/slurm-gpu-mailprog``) as SlurmUser as
``MailProg -s SUBJECT USER``, where USER is the job owner's ``--mail-user``, verbatim. The
wrapper runs ``python -I -m slurm_gpu.cli.mail_cmd CONFIG -s SUBJECT USER`` from ``/`` with
only Slurm's job variables in the environment, and ``main`` reads that argv by position
(``slurm_gpu.notify.slurmcall``): no option is parsed from it, so ``--mail-user=--config=…``
is a recipient, and as it is not an address it is refused. The configuration file is the
wrapper's (root-owned, refused when another account could write it).

END and FAIL mails of GPU jobs become the enriched message (text + HTML + chart): the call
records the mail in the mail state and at most one detached drainer waits for the records and
sends (``slurm_gpu.notify.drain``). Every other mail, and any mail this program cannot enrich,
goes to the site's ordinary mail program with Slurm's three arguments, so users never lose
Slurm's own notice. See ``docs/mail.md``.

``slurm-gpu mail --flush`` (cron: waiting mails and due digests), ``--policy --since WHEN``
and ``--dry-run --mail-dir DIR`` are the admin command's, never the MailProg's.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import click

from slurm_gpu.cli.when import deprecated, parse_when
from slurm_gpu.config import Settings, load_settings  # noqa: TID251 (a composition root reads the config)
from slurm_gpu.errors import ConfigError, MailError, SlurmGpuError, UsageError
from slurm_gpu.notify.slurmcall import (
    SAFE_PATH,
    job_environment,
    parse_mailprog_argv,
    shown,
    valid_recipient,
)
from slurm_gpu.trust import untrusted_reason

#: Context-object key tests use to inject a ready ``Notifier`` factory.
NOTIFIER_KEY = "mail_notifier_factory"

#: The mail program used when the configuration cannot be trusted or read.
SYSTEM_MAIL = "/usr/bin/mail"

#: Name the mail state file has in ``mail.state_dir``.
STATE_FILE = "mail-state.db"

PROG = "slurm-gpu mail"
#: What a dry run says where the plain mail would have gone through the fallback program.
_NOT_SENT = "the plain mail would go through {prog}; nothing sent (--dry-run)"


def _log(line: str) -> None:
    """One line on stderr (the wrapper's log; slurmctld discards MailProg's stderr)."""
    click.echo(f"{PROG}: {line}", err=True)


def _fallback_argv(prog: str, subject: str | None, recipients: Sequence[str]) -> list[str]:
    argv = [prog]
    if subject is not None:
        argv += ["-s", subject]
    return argv + list(recipients)


def _exec_fallback(argv: list[str], env: Mapping[str, str] | None = None) -> NoReturn:
    """Become the site's mail program (stdin and arguments unchanged)."""
    try:
        if env is None:
            os.execv(argv[0], argv)
        os.execve(argv[0], argv, dict(env))
    except OSError as exc:
        _log(f"cannot run {argv[0]}: {exc.strerror}")
        click.echo("hint: set [mail] fallback_mailprog to the site's mail program", err=True)
        sys.exit(MailError.exit_code)


def _run_fallback(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run the site's mail program and wait (used after an enriched attempt failed)."""
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            check=False,
            timeout=120,
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return MailError.exit_code


def fallback_program(settings: Settings) -> str:
    """``[mail] fallback_mailprog`` if no other account can replace it, else ``/usr/bin/mail``
    (SlurmUser would run whatever that file holds)."""
    prog = settings.mail.fallback_mailprog
    reason = untrusted_reason(prog)
    if reason is None:
        return prog
    _log(f"[mail] fallback_mailprog refused: {reason}; using {SYSTEM_MAIL}")
    return SYSTEM_MAIL


def _state_path(settings: Settings) -> str:
    return os.path.join(settings.mail.state_dir, STATE_FILE)


def _scratch_state(settings: Settings) -> Any:
    """A dry run's mail state: a private copy of the real one, removed at exit. Its decisions
    (a job already mailed, a user's window, the policy's period) are the real state's; what it
    records (a policy mail "sent", a waiting mail dealt with) never reaches the real one, whose
    next real run would otherwise skip those users or lose those mails."""
    import atexit
    import shutil
    import tempfile

    from slurm_gpu.notify.state import MailState

    scratch = tempfile.mkdtemp(prefix="slurm-gpu-mail-dry-run-")
    atexit.register(shutil.rmtree, scratch, True)
    state = MailState(os.path.join(scratch, STATE_FILE))
    state.load_copy_of(_state_path(settings))
    return state


def build_notifier(settings: Settings, dry_run_dir: str | None) -> Any:
    """The real notifier: accounting as SlurmUser, the store, the configured transport; with
    ``dry_run_dir``, the mails written there and the state a scratch copy (``_scratch_state``)."""
    from slurm_gpu.jobreport.readers import StoreAndSpoolReader, make_accounting
    from slurm_gpu.notify.message import MailContext, MessageBuilder
    from slurm_gpu.notify.service import Notifier, NotifyOptions
    from slurm_gpu.notify.state import MailState
    from slurm_gpu.notify.transport import open_mailer

    m = settings.mail
    charts = None
    if m.charts:
        from slurm_gpu.jobreport.charts import charts_for

        charts = charts_for
    builder = MessageBuilder(
        from_address=m.from_address,
        context=MailContext(docs_url=m.docs_url),
        template_dir=m.template_dir,
        charts=charts,
    )
    return Notifier(
        # Mail is about ended jobs, which only accounting keeps: squeue is not asked.
        accounting=make_accounting(settings, controller=False),
        reader=StoreAndSpoolReader(settings, spark_points=120),
        builder=builder,
        mailer=open_mailer(m, dry_run_dir=dry_run_dir),
        state=MailState(_state_path(settings)) if dry_run_dir is None else _scratch_state(settings),
        options=NotifyOptions(
            recipient_domain=m.recipient_domain,
            wait_for_record_s=m.wait_for_record_s,
            poll_interval_s=m.poll_interval_s,
            digest_window_s=m.digest_window_s,
            max_per_user_per_window=m.max_per_user_per_window,
            min_elapsed_s=settings.gpueff.min_elapsed_s,
        ),
    )


NotifierFactory = Callable[[Settings, "str | None"], Any]


def drain_waiting(
    settings: Settings, lock: Any, factory: NotifierFactory, dry_run_dir: str | None
) -> tuple[int, int]:
    """Deal with the waiting mails while holding ``lock``, then send the due digests.
    Returns (mails dealt with, digests sent)."""
    from slurm_gpu.notify.drain import drain
    from slurm_gpu.notify.state import MailState, PendingMail

    prog = fallback_program(settings)

    def fallback(p: PendingMail) -> None:
        if not valid_recipient(p.recipient):  # checked on the way in; the file is not trusted
            _log(f"job {shown(p.key)}: refusing recipient {shown(p.recipient)!r}")
            return
        if dry_run_dir is not None:
            _log(f"job {shown(p.key)}: {_NOT_SENT.format(prog=prog)}")
            return
        rc = _run_fallback([prog, "-s", p.subject, p.recipient], {**p.env, "PATH": SAFE_PATH})
        if rc != 0:
            _log(f"job {shown(p.key)}: {prog} exited {rc}")

    try:
        notifier = factory(settings, dry_run_dir)
    except SlurmGpuError as err:
        if dry_run_dir is not None:
            lock.release()
            raise
        # Without a notifier nothing can be enriched: hand every waiting mail back now
        # rather than leave it to a next call that would fail the same way.
        _log(f"{err.message}; every waiting mail goes to the fallback")
        state = MailState(_state_path(settings))
        for p in state.pending():
            fallback(p)
            state.finish(p.key)
        state.close()
        lock.release()
        return 0, 0
    done = drain(notifier, lock, fallback=fallback, log=_log)
    return done, notifier.flush()


def _detach() -> bool:
    """Fork so slurmctld's mail thread returns at once; True in the child that goes on."""
    pid = os.fork()
    if pid:
        return False
    os.setsid()
    release_stdio()
    return True


def release_stdio() -> None:
    """Point stdin, stdout and a piped stderr at /dev/null.

    slurmctld reads MailProg's output through a pipe until every process holding it exits
    (measured on 22.05): a detached child keeping that pipe would hold one of slurmctld's
    threads for as long as it waits for the record. A stderr that the wrapper sent to a log
    file is kept, so the child's errors still reach the log.
    """
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    try:
        piped = not stat.S_ISREG(os.fstat(2).st_mode)
    except OSError:
        piped = True
    if piped:
        os.dup2(devnull, 2)
    os.close(devnull)


def mailprog(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    factory: NotifierFactory | None = None,
    detach: bool = True,
) -> int:
    """Slurm's MailProg: ``argv`` is ``CONFIG -s SUBJECT USER`` (by position). Returns the
    exit status: 0, 2 (not called as slurmctld calls it), 3 (configuration refused or bad;
    the mail went through ``/usr/bin/mail``), 9 (recipient refused, or no mail program ran)."""
    from slurm_gpu.notify.drain import DrainLock
    from slurm_gpu.notify.service import MailRequest
    from slurm_gpu.notify.state import Enqueued, MailState, PendingMail

    os.umask(0o077)
    env = job_environment(environ)
    # Libraries (matplotlib, sqlite3, the accounting command) see only Slurm's job variables.
    os.environ.clear()
    os.environ.update(env)
    try:
        call = parse_mailprog_argv(argv)
    except UsageError as err:
        _log(err.message)
        return err.exit_code
    job = shown(env.get("SLURM_JOB_ID", "?"))
    if not valid_recipient(call.recipient):
        _log(
            f"job {job}: refusing recipient {shown(call.recipient)!r}: not an address or user "
            "name; no mail sent"
        )
        return MailError.exit_code
    if call.legacy:
        _log("the MailProg wrapper is from an older release: render it again (docs/mail.md)")

    def plain(prog: str) -> list[str]:
        return [prog, "-s", call.subject, call.recipient]

    reason = untrusted_reason(call.config_path)
    settings: Settings | None = None
    if reason is None:
        try:
            # Read from the descriptor the trust walk checked (SlurmUser is not root, where
            # ``trusted=None`` would read the name again unchecked).
            settings = load_settings(call.config_path, trusted=True)
        except SlurmGpuError as err:
            reason = err.message
    if settings is None:
        # An untrusted or broken configuration must not cost users their Slurm mail.
        _log(f"configuration refused ({reason}); sent through {SYSTEM_MAIL}")
        rc = _run_fallback(plain(SYSTEM_MAIL), env)
        return ConfigError.exit_code if rc == 0 else rc
    fallback = plain(fallback_program(settings))
    req = MailRequest.from_env(call.subject, (call.recipient,), env)
    if not req.enrichable:
        _exec_fallback(fallback, env)
    try:
        state = MailState(_state_path(settings))
        mail = PendingMail(req.key, call.subject, call.recipient, env, time.time())
        added = state.enqueue(mail, max_pending=settings.mail.max_pending)
        state.close()
        if added is Enqueued.FULL:
            _log(f"job {job}: {settings.mail.max_pending} mails wait already; sent plain")
            _exec_fallback(fallback, env)
        lock = DrainLock(settings.mail.state_dir)
    except SlurmGpuError as err:
        _log(f"job {job}: {err.message}; using the fallback")
        _exec_fallback(fallback, env)
    if not lock.try_acquire():
        return 0  # the running drainer sends this one too
    if detach and not _detach():
        return 0
    drain_waiting(settings, lock, factory or build_notifier, None)
    return 0


# ----------------------------------------------------------------------------- admin command


def _settings(ctx: click.Context, config_path: str | None) -> Settings:
    root = ctx.find_root().ensure_object(dict)
    return load_settings(config_path or root.get("config_path"))


@click.command("mail")
@click.option("-s", "subject", default=None, help="Subject (as Slurm passes it).")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Configuration file.",
)
@click.option(
    "--dry-run",
    "dry_run",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="",
    help="Send nothing: write the mails into --mail-dir (as police --dry-run --mail-dir).",
)
@click.option(
    "--mail-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write the mails as .eml files in this directory instead of sending them.",
)
@click.option(
    "--foreground",
    is_flag=True,
    help="Accepted for compatibility: this command always works in the foreground.",
)
@click.option(
    "--flush",
    is_flag=True,
    help="Send the waiting mails (if no drainer runs) and the digests that are due, then exit.",
)
@click.option(
    "--policy",
    "policy",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="",
    help="Site policy run (cron): mail users whose jobs that ended since --since wasted "
    "[mail] waste_min_gpu_hours, then exit.",
)
@click.option(
    "--since",
    "since",
    default=None,
    metavar="WHEN",
    help="With --policy: 24h, 3d before now, or a date (UTC); default: 24h.",
)
@click.argument("recipients", nargs=-1)
@click.pass_context
def cli(
    ctx: click.Context,
    subject: str | None,
    config_path: str | None,
    dry_run: str | None,
    mail_dir: str | None,
    foreground: bool,
    flush: bool,
    policy: str | None,
    since: str | None,
    recipients: tuple[str, ...],
) -> None:
    """Admin side of the e-mail after jobs: flush, site policy, or one mail by hand (e.g.
    with --dry-run to test a configuration). Slurm's MailProg is the rendered wrapper."""
    from slurm_gpu.notify.service import MailRequest, Outcome

    obj = ctx.find_root().ensure_object(dict)
    factory = obj.get(NOTIFIER_KEY) or build_notifier
    dry_run_dir = _mail_dir(dry_run, mail_dir)
    policy_since = _policy_since(policy, since)
    settings = _settings(ctx, config_path)

    if flush:
        from slurm_gpu.notify.drain import DrainLock

        lock = DrainLock(settings.mail.state_dir)
        if lock.try_acquire():
            done, sent = drain_waiting(settings, lock, factory, dry_run_dir)
            click.echo(f"{done} waiting mail(s) handled")
        else:
            sent = factory(settings, dry_run_dir).flush()
            click.echo("a drainer is running: it sends the waiting mails")
        lock.close()
        click.echo(f"{sent} digest(s) sent")
        return
    if policy_since is not None:
        from slurm_gpu.notify.service import policy_mails
        from slurm_gpu.notify.state import read_opt_out

        if not settings.mail.waste_policy:
            click.echo("[mail] waste_policy is off: nothing to do")
            return
        notifier = factory(settings, dry_run_dir)
        now = time.time()
        jobs = notifier.accounting.jobs_between(policy_since, now)
        mailed = policy_mails(
            notifier,
            jobs,
            min_gpu_hours=settings.mail.waste_min_gpu_hours,
            period_s=settings.mail.waste_period_s,
            opt_out=read_opt_out(settings.mail.opt_out_file),
        )
        click.echo(f"{len(mailed)} policy mail(s) sent")
        return

    bad = [r for r in recipients if not valid_recipient(r)]
    if bad:
        raise UsageError(
            f"not an address or user name: {shown(bad[0])!r}",
            hint="give one recipient such as alice or alice@example.org",
        )
    cleaned = job_environment(os.environ)
    fallback = _fallback_argv(fallback_program(settings), subject, recipients)
    req = MailRequest.from_env(subject or "", recipients, cleaned)

    def hand_back(why: str) -> None:
        """The plain mail through the fallback program (never returns); in a dry run, a
        line saying so instead: a dry run sends nothing, the plain mail included."""
        if dry_run_dir is None:
            _exec_fallback(fallback)
        _log(f"{why}: {_NOT_SENT.format(prog=fallback[0])}")

    if not req.enrichable:
        hand_back(
            "not an END or FAIL mail about one job to one recipient (as slurmctld calls the "
            "mail program: SLURM_JOB_ID and SLURM_JOB_MAIL_TYPE=Ended in the environment; "
            "docs/mail.md, Testing a configuration)"
        )
        return
    try:
        notifier = factory(settings, dry_run_dir)
        outcome = notifier.handle(req)
        if outcome is Outcome.FALLBACK:
            hand_back(
                f"job {req.job_id}: the enriched mail does not cover it (no GPU, or no record)"
            )
            return
        notifier.flush()
    except SlurmGpuError as err:
        if dry_run_dir is not None:
            _log(f"job {req.job_id}: {err.message}; nothing sent (--dry-run)")
            sys.exit(err.exit_code)
        _log(f"job {req.job_id}: {err.message}; using the fallback")
        rc = _run_fallback(fallback)
        sys.exit(0 if rc == 0 else MailError.exit_code)


def _mail_dir(dry_run: str | None, mail_dir: str | None) -> str | None:
    """Where the mails go instead of being sent (``None``: sent). ``--dry-run DIR``, the old
    spelling, still works, with one deprecation line."""
    if dry_run:
        click.echo(deprecated("--dry-run DIR", "--dry-run --mail-dir DIR"), err=True)
        return dry_run
    if dry_run is not None and mail_dir is None:
        raise click.UsageError("--dry-run writes the mails into --mail-dir DIR: give it")
    return mail_dir


def _policy_since(policy: str | None, since: str | None) -> float | None:
    """The start of a ``--policy`` run's period, seconds since the epoch (``None``: no policy
    run). ``--policy HOURS``, the old spelling, still works, with one deprecation line."""
    if policy is None:
        if since is not None:
            raise click.UsageError("--since goes with --policy")
        return None
    now = time.time()
    if policy:
        try:
            hours = float(policy)
        except ValueError:
            raise click.BadParameter(
                f"{policy!r} is not a number of hours", param_hint="--policy"
            ) from None
        if hours < 0.01:
            raise click.BadParameter(f"{policy!r} is below 0.01 hours", param_hint="--policy")
        same = f"{hours:g}h" if hours == int(hours) else f"{round(hours * 60)}m"
        click.echo(deprecated(f"--policy {policy}", f"--policy --since {same}"), err=True)
        return now - hours * 3600
    return parse_when(since or "24h", now_s=now, utc=True)


def main() -> None:
    """The MailProg entry: ``python -I -m slurm_gpu.cli.mail_cmd CONFIG -s SUBJECT USER``."""
    try:
        rc = mailprog(sys.argv[1:], os.environ)
    except SlurmGpuError as err:
        _log(err.message)
        rc = err.exit_code
    except Exception as exc:  # one line in the log, never a traceback
        _log(f"unexpected error: {type(exc).__name__}: {exc}")
        rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
