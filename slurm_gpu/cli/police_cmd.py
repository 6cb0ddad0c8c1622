"""``slurm-gpu police``: one pass of the live policy (``docs/live.md``)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

import click

from slurm_gpu.cli.common import settings_from


@click.command("police")
@click.option("--dry-run", is_flag=True, help="Record what would be done; act on nothing.")
@click.option(
    "--mail-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write the mails as .eml files in this directory instead of sending them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print every decision as JSON.")
@click.option(
    "--config",
    "config_path",
    default=None,
    help="Configuration file (as slurm-gpu --config; an unusable one exits 3).",
)
@click.pass_context
def cli(
    ctx: click.Context, dry_run: bool, mail_dir: str | None, as_json: bool, config_path: str | None
) -> None:
    """Warn the owners of running jobs whose GPUs sit idle, and optionally cancel them.

    Run every few minutes from share/systemd/slurm-gpu-police.timer, as root. It never acts
    on missing, stale, partial, mismatched or contradictory data, and accounts for every
    running GPU job (--json: each one's status and reason). A dry run sends nothing. Exit 0
    after a pass (with or without actions; a job that ended before its action is not a
    failure); 3 on a bad or unreadable configuration; 5 when squeue or scontrol fails; 6 when
    the store is unreachable or not migrated; 7 when Prometheus is unreachable; 9 when some
    warning or cancellation could not be made (the others were, and are recorded).
    """
    if config_path is not None:
        root = ctx.find_root().ensure_object(dict)
        root["config_path"] = config_path
        root.pop("settings", None)
    from slurm_gpu.accounting.runner import SubprocessRunner
    from slurm_gpu.live.localwindows import local_windows
    from slurm_gpu.live.police import PoliceOptions, run_pass
    from slurm_gpu.live.policy import PolicyConfig
    from slurm_gpu.live.snapshot import read_node
    from slurm_gpu.notify.transport import Mailer, open_mailer
    from slurm_gpu.records import PartWindow
    from slurm_gpu.store import Store

    # Every job's decision goes to the log (stderr: the journal under systemd), --json or not.
    logging.basicConfig(
        level=logging.INFO, format="slurm-gpu police: %(message)s", stream=sys.stderr
    )
    settings = settings_from(ctx, trusted=True)
    live = settings.live
    cfg = PolicyConfig(
        grace_s=live.police_grace_s,
        idle_s=live.police_idle_s,
        max_sample_age_s=live.police_max_sample_age_s,
        coverage_min=live.police_coverage_min,
        idle_threshold_pct=settings.telemetry.idle_threshold_pct,
        scrape_job=live.police_scrape_job if live.prometheus_url else "",
        bind_gpus=live.police_bind_gpus,
        user_interval_s=live.police_user_interval_s,
        dry_run=dry_run or live.police_dry_run,
        cancel=live.police_cancel,
        cancel_after_warnings=live.police_cancel_after_warnings,
        cancel_grace_s=live.police_cancel_grace_s,
        max_cancels_per_pass=live.police_max_cancels_per_pass,
        exempt_users=frozenset(live.police_exempt_users),
        exempt_accounts=frozenset(live.police_exempt_accounts),
        exempt_partitions=frozenset(live.police_exempt_partitions),
        exempt_qos=frozenset(live.police_exempt_qos),
    )
    sacct = settings.accounting.sacct_path
    opts = PoliceOptions(
        slurm_bin=os.path.dirname(sacct) if os.path.isabs(sacct) else "",
        timeout_s=settings.accounting.timeout_s,
        recipient_domain=settings.mail.recipient_domain,
        from_address=settings.mail.from_address,
        admin_emails=tuple(live.police_admin_emails),
        site_name=settings.report.site_name,
    )

    now = time.time()

    def load_windows() -> Sequence[PartWindow]:
        if live.prometheus_url:
            from slurm_gpu.prometheus.client import PrometheusClient
            from slurm_gpu.prometheus.windows import read_windows

            client = PrometheusClient(
                live.prometheus_url,
                live.prometheus_timeout_s,
                password_file=live.prometheus_password_file,
            )
            return read_windows(
                client,
                cfg.idle_s,
                cfg.max_sample_age_s,
                now,
                live.police_target_label,
                cfg.idle_threshold_pct,
            )
        jobs = read_node(settings.paths.spool_dir, now, float("inf")).jobs
        return local_windows(jobs, now, cfg.idle_s, cfg.max_sample_age_s)

    # A dry run sends nothing; with --mail-dir it writes what it would send there.
    mailer: Mailer | None = (
        open_mailer(settings.mail, dry_run_dir=mail_dir) if mail_dir or not cfg.dry_run else None
    )
    with Store.open(settings.store_url, migrate=False) as store:
        result = run_pass(load_windows, SubprocessRunner(), store.engine, mailer, cfg, opts, now)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": cfg.dry_run,
                    "decisions": [asdict(d) for d in result.decisions],
                    "failed": [list(f) for f in result.failed],
                    "gone": list(result.gone),
                },
                indent=2,
            )
        )
    else:
        acted = [d for d in result.decisions if d.action != "skip"]
        prefix = "would " if cfg.dry_run else ""
        for d in acted:
            click.echo(f"job {d.job_id}: {prefix}{d.action} ({d.rule}: {d.reason})")
        for d in result.decisions:
            if d.action == "skip" and d.status != "judged":
                click.echo(f"job {d.job_id}: not judged [{d.status}]: {d.reason}")
        skipped = len(result.decisions) - len(acted)
        click.echo(f"{len(acted)} action(s), {skipped} job/rule(s) left alone")
        for job_id in result.gone:
            click.echo(f"job {job_id}: ended before its action")
        for job_id, why in result.failed:
            click.echo(f"not done: job {job_id}: {why}", err=True)
    if result.failed:
        ctx.exit(9)
