"""``slurm-gpu mail``: Slurm's MailProg, sending an enriched message after GPU jobs.

Slurm runs ``MailProg -s SUBJECT USER`` as SlurmUser with the job in the environment. END and
FAIL mails of GPU jobs become the enriched message (text + HTML + chart); every other mail, and
any mail this program cannot enrich, goes to the site's ordinary mail program with the same
arguments, so users never lose Slurm's own notice. See ``docs/mail.md``.

Also ``slurm-gpu mail --flush`` (from cron: send due digests) and ``--dry-run DIR``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from typing import Any, NoReturn

import click

from slurm_gpu.config import Settings, load_settings
from slurm_gpu.errors import MailError, SlurmGpuError

#: Context-object key tests use to inject a ready ``Notifier`` factory.
NOTIFIER_KEY = "mail_notifier_factory"


def _fallback_argv(prog: str, subject: str | None, recipients: tuple[str, ...]) -> list[str]:
    argv = [prog]
    if subject is not None:
        argv += ["-s", subject]
    return argv + list(recipients)


def _exec_fallback(argv: list[str]) -> NoReturn:
    """Become the site's mail program (stdin, environment and arguments unchanged)."""
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        click.echo(f"slurm-gpu mail: cannot run {argv[0]}: {exc.strerror}", err=True)
        click.echo("hint: set [mail] fallback_mailprog to the site's mail program", err=True)
        sys.exit(MailError.exit_code)


def _run_fallback(argv: list[str]) -> int:
    """Run the site's mail program and wait (used after an enriched attempt failed)."""
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, check=False, timeout=120).returncode
    except (OSError, subprocess.TimeoutExpired):
        return MailError.exit_code


def _settings(ctx: click.Context, config_path: str | None) -> Settings:
    root = ctx.find_root().ensure_object(dict)
    return load_settings(config_path or root.get("config_path"))


def build_notifier(settings: Settings, dry_run_dir: str | None) -> Any:
    """The real notifier: accounting as SlurmUser, the store, the configured transport."""
    from slurm_gpu.notify.message import MailContext, MessageBuilder
    from slurm_gpu.notify.service import Notifier, NotifyOptions
    from slurm_gpu.notify.state import MailState
    from slurm_gpu.notify.transport import open_mailer
    from slurm_gpu.userreport.readers import StoreAndSpoolReader, make_accounting

    m = settings.mail
    charts = None
    if m.charts:
        from slurm_gpu.charts.mail import charts_for

        charts = charts_for
    builder = MessageBuilder(
        from_address=m.from_address,
        context=MailContext(docs_url=m.docs_url),
        template_dir=m.template_dir,
        charts=charts,
    )
    return Notifier(
        accounting=make_accounting(settings),
        reader=StoreAndSpoolReader(settings, spark_points=120),
        builder=builder,
        mailer=open_mailer(m, dry_run_dir=dry_run_dir),
        state=MailState(os.path.join(settings.paths.state_dir, "mail-state.db")),
        options=NotifyOptions(
            recipient_domain=m.recipient_domain,
            wait_for_record_s=m.wait_for_record_s,
            poll_interval_s=m.poll_interval_s,
            digest_window_s=m.digest_window_s,
            max_per_user_per_window=m.max_per_user_per_window,
            min_elapsed_s=settings.gpueff.min_elapsed_s,
        ),
    )


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


@click.command("mail", context_settings={"ignore_unknown_options": False})
@click.option("-s", "subject", default=None, help="Subject (as Slurm passes it).")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Configuration file (when run directly as MailProg).",
)
@click.option(
    "--dry-run",
    "dry_run_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write .eml files into this directory instead of sending.",
)
@click.option(
    "--foreground",
    is_flag=True,
    help="Do not detach from Slurm while waiting for the job's record.",
)
@click.option("--flush", is_flag=True, help="Send the digests that are due, then exit.")
@click.option(
    "--policy",
    "policy_since",
    default=None,
    help="Site policy run (cron): mail users whose jobs that ended since this many hours "
    "ago wasted [mail] waste_min_gpu_hours, then exit.",
    type=click.FloatRange(min=0.01),
)
@click.argument("recipients", nargs=-1)
@click.pass_context
def cli(
    ctx: click.Context,
    subject: str | None,
    config_path: str | None,
    dry_run_dir: str | None,
    foreground: bool,
    flush: bool,
    policy_since: float | None,
    recipients: tuple[str, ...],
) -> None:
    """Slurm MailProg: enriched e-mail after GPU jobs, the site's mail program otherwise."""
    from slurm_gpu.notify.service import MailRequest, Outcome

    obj = ctx.find_root().ensure_object(dict)
    try:
        settings = _settings(ctx, config_path)
    except SlurmGpuError:
        if flush or policy_since is not None:
            raise
        # A broken config must not cost users their Slurm mail.
        rc = _run_fallback(_fallback_argv("/usr/bin/mail", subject, recipients))
        click.echo("slurm-gpu mail: bad configuration; sent through /usr/bin/mail", err=True)
        sys.exit(3 if rc == 0 else rc)
    fallback = _fallback_argv(settings.mail.fallback_mailprog, subject, recipients)
    factory = obj.get(NOTIFIER_KEY) or build_notifier

    if flush:
        notifier = factory(settings, dry_run_dir)
        click.echo(f"{notifier.flush()} digest(s) sent")
        return
    if policy_since is not None:
        import time

        from slurm_gpu.notify.service import policy_mails
        from slurm_gpu.notify.state import read_opt_out

        if not settings.mail.waste_policy:
            click.echo("[mail] waste_policy is off: nothing to do")
            return
        notifier = factory(settings, dry_run_dir)
        now = time.time()
        jobs = notifier.accounting.jobs_between(now - policy_since * 3600, now)
        mailed = policy_mails(
            notifier,
            jobs,
            min_gpu_hours=settings.mail.waste_min_gpu_hours,
            period_s=settings.mail.waste_period_s,
            opt_out=read_opt_out(settings.mail.opt_out_file),
        )
        click.echo(f"{len(mailed)} policy mail(s) sent")
        return

    req = MailRequest.from_env(subject or "", recipients, os.environ)
    if not req.enrichable:
        _exec_fallback(fallback)
    if not foreground and not dry_run_dir and not _detach():
        return
    try:
        notifier = factory(settings, dry_run_dir)
        outcome = notifier.handle(req)
        if outcome is Outcome.FALLBACK:
            _exec_fallback(fallback)
        notifier.flush()
    except SlurmGpuError as err:
        click.echo(f"slurm-gpu mail: job {req.job_id}: {err.message}; using the fallback", err=True)
        rc = _run_fallback(fallback)
        sys.exit(0 if rc == 0 else MailError.exit_code)


def main() -> None:
    """Entry point for ``python -m slurm_gpu.cli.mail_cmd`` (what the MailProg wrapper runs)."""
    from slurm_gpu.cli.common import run_guarded

    run_guarded(
        "slurm-gpu mail",
        os.environ.get("SLURM_GPU_DEBUG") == "1",
        lambda: cli(prog_name="slurm-gpu mail"),
    )


if __name__ == "__main__":
    main()
