"""``slurm-gpu report weekly``: the admin report over the store (HTML, JSON, or mailed)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.config import Settings
from slurm_gpu.errors import ConfigError, MailError, UsageError


def _parse_date(value: str | None, option: str) -> float | None:
    """``--since``/``--until``: a time before now (``7d``) or a date, UTC without an offset
    (``slurm_gpu.cli.when``)."""
    if value is None:
        return None
    from slurm_gpu.cli.when import parse_when

    return parse_when(value, now_s=time.time(), utc=True, option=option)


def _write(path: str, text: str, group: str = "") -> None:
    """Write ``text`` atomically (a reader never sees half a report), mode 0600, or 0640 with
    group ``group``: the report names users and their waste, so it is never world-readable.

    The mode and group are set on the open descriptor, never through the name, which another
    account could replace in a directory it can write.
    """
    gid = _group_id(group) if group else -1
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".report-", dir=directory)  # mode 0600, O_EXCL
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if gid >= 0:
                os.fchown(fh.fileno(), -1, gid)
                os.fchmod(fh.fileno(), 0o640)
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _group_id(name: str) -> int:
    """The gid of ``report.output_group``; ``ConfigError`` when there is no such group."""
    import grp

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(
            f"no group {name!r}",
            key="report.output_group",
            hint="name an existing group, or leave it empty for owner-only reports (0600)",
        ) from None


def send_report_mail(settings: Settings, subject: str, text: str, html: str) -> None:
    """Mail the report to ``report.admin_emails`` (HTML part plus a text summary).

    The transport is the project's mailer (``slurm_gpu.notify.transport``: SMTP or sendmail,
    configured by ``[mail]``).
    Raises ``MailError`` when there is no recipient or the message cannot be handed over.
    """
    recipients = list(settings.report.admin_emails)
    if not recipients:
        raise MailError(
            "no recipient for the weekly report",
            hint="set report.admin_emails in the configuration",
        )
    from slurm_gpu.notify.transport import open_mailer
    from slurm_gpu.weekly.mailout import build_message

    msg = build_message(
        subject=subject,
        sender=settings.mail.from_address,
        recipients=recipients,
        text=text,
        html=html,
        now_s=time.time(),
    )
    # The envelope recipients are passed explicitly, never read from the headers.
    open_mailer(settings.mail).send(msg, recipients)


@click.group()
def cli() -> None:
    """Reports for admins."""


@cli.command("weekly")
@click.option(
    "--since",
    "since",
    metavar="WHEN",
    help="Start of the period: 7d, 2w before now, or a date (UTC); default: Monday 00:00 of "
    "the last full week.",
)
@click.option(
    "--until",
    "until",
    metavar="WHEN",
    help="End of the period (excluded), same forms; default: since + 7 days.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the report to this file instead of standard output.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["html", "json"]),
    default="html",
    show_default=True,
    help="HTML page or the JSON of the same aggregates.",
)
@click.option("--mail", is_flag=True, help="Also mail it to report.admin_emails.")
@click.pass_context
def weekly(
    ctx: click.Context,
    since: str | None,
    until: str | None,
    out: str | None,
    fmt: str,
    mail: bool,
) -> None:
    """Usage and waste of the cluster's GPUs over a week, for admins.

    Jobs count in the period in which they ended. Reads the store named by [store] url.
    """
    # Heavy imports (pandas, matplotlib) only when the report is actually made.
    from slurm_gpu.store.store import Store
    from slurm_gpu.weekly.aggregate import ReportOptions, build_report, last_full_week
    from slurm_gpu.weekly.energy import energy_summary
    from slurm_gpu.weekly.model import Period

    settings = settings_from(ctx)
    since_s = _parse_date(since, "--since")
    until_s = _parse_date(until, "--until")
    if since_s is None and until_s is None:
        period = last_full_week(time.time())
    elif since_s is None:
        assert until_s is not None
        period = Period(since_s=until_s - 7 * 86400.0, until_s=until_s)
    else:
        period = Period(since_s=since_s, until_s=until_s or since_s + 7 * 86400.0)
    if period.until_s <= period.since_s:
        raise UsageError("--until must come after --since", hint="e.g. --since 2026-11-16")
    rs = settings.report
    options = ReportOptions(
        site_name=rs.site_name,
        top_n=rs.top_n,
        worst_jobs_per_user=rs.worst_jobs_per_user,
        table_rows=rs.table_rows,
        trend_weeks=rs.trend_weeks,
        idle_edge_min_s=rs.idle_edge_min_s,
        unused_max_duty_pct=_unused_threshold(settings),
    )
    with Store.open(settings.store_url, migrate=False) as store:
        report = build_report(store.engine, period, options)
        with store.engine.connect() as conn:
            energy = energy_summary(
                conn,
                period.since_s,
                period.until_s,
                settings.energy,
                options.unused_max_duty_pct,
            )
        report = dataclasses.replace(report, energy=energy)

    from slurm_gpu.weekly.jsonout import render_json
    from slurm_gpu.weekly.render import render_html, render_text

    html = render_html(report, template_dir=rs.template_dir) if fmt == "html" or mail else ""
    body = html if fmt == "html" else render_json(report)
    if out:
        _write(out, body, rs.output_group)
    elif not mail or fmt == "json":
        sys.stdout.write(body)
    if mail:
        start = datetime.fromtimestamp(period.since_s, UTC).strftime("%Y-%m-%d")
        subject = f"[{rs.site_name}] GPU usage report, week of {start}"
        send_report_mail(settings, subject, render_text(report, template_dir=rs.template_dir), html)
        click.echo(f"report mailed to {len(rs.admin_emails)} recipient(s)", err=True)


def _unused_threshold(settings: Settings) -> float:
    analysis: Any = getattr(settings, "analysis", None)
    return float(getattr(analysis, "unused_max_duty_pct", 1.0))
