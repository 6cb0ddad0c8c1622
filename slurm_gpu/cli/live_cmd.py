"""``slurm-gpu live``: every running GPU job, worst first (``docs/live.md``)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.errors import UsageError


def caller_is_admin(
    admin_group: str, euid: int | None = None, groups: tuple[int, ...] | None = None
) -> bool:
    """Root, or a member of ``admin_group`` (by gid; an unknown group admits no one).
    ``euid`` and ``groups`` default to the calling process's."""
    import grp
    import os

    if (os.geteuid() if euid is None else euid) == 0:
        return True
    if not admin_group:
        return False
    try:
        gid = grp.getgrnam(admin_group).gr_gid
    except KeyError:
        return False
    mine = (os.getegid(), *os.getgroups()) if groups is None else groups
    return gid in mine


def _slurm_jobs(settings: Any) -> dict[str, Any] | None:
    """Slurm's running GPU jobs (``squeue``, ``scontrol -d``); ``None``, with one line on
    stderr, when Slurm cannot be asked (the view then shows what the live data hold)."""
    import os

    from slurm_gpu.accounting.runner import SubprocessRunner
    from slurm_gpu.errors import SlurmGpuError
    from slurm_gpu.live.allocation import running_gpu_jobs

    sacct = settings.accounting.sacct_path
    slurm_bin = os.path.dirname(sacct) if os.path.isabs(sacct) else ""
    try:
        return dict(running_gpu_jobs(SubprocessRunner(), slurm_bin, settings.accounting.timeout_s))
    except SlurmGpuError as exc:
        click.echo(f"slurm-gpu live: Slurm's running jobs not read: {exc.message}", err=True)
        return None


@click.command("live")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, in a list.")
@click.option(
    "--local",
    is_flag=True,
    help="Read this node's live files even when live.prometheus_url is set.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show the worst N jobs.")
@click.pass_context
def cli(ctx: click.Context, as_json: bool, local: bool, limit: int | None) -> None:
    """List every running GPU job, worst first by GPU-hours being wasted now.

    For root and members of [store] admin_group only (it names every user's jobs; users
    see their own running job with gpueff). From Prometheus' HTTP API when
    live.prometheus_url is set, else from this node's live files (root: they are readable
    by each job's user alone). Exit 0; 2 for another caller; 3 on a bad configuration; 7
    when Prometheus is unreachable or answers no query result.
    """
    from slurm_gpu.live.snapshot import read_node
    from slurm_gpu.live.view import build_rows, render_table

    settings = settings_from(ctx)
    if not caller_is_admin(settings.store.admin_group):
        raise UsageError(
            "slurm-gpu live lists every user's running jobs: it is for root and the "
            "[store] admin_group only",
            hint="`gpueff JOBID` shows your own running job",
        )
    live = settings.live
    now = time.time()
    if live.prometheus_url and not local:
        from slurm_gpu.prometheus.client import PrometheusClient
        from slurm_gpu.prometheus.livejobs import live_jobs

        client = PrometheusClient(
            live.prometheus_url,
            live.prometheus_timeout_s,
            password_file=live.prometheus_password_file,
        )
        jobs = live_jobs(client)
        source = f"Prometheus {client.shown_url}"
    else:
        snapshot = read_node(settings.paths.spool_dir, now, float("inf"))
        jobs = list(snapshot.jobs)
        source = "this node's live files"
        if snapshot.unreadable:
            click.echo(
                f"slurm-gpu live: {snapshot.unreadable} live summaries could not be read",
                err=True,
            )
            click.echo("hint: they are readable by their job's user alone; run as root", err=True)
    slurm_jobs = _slurm_jobs(settings)
    if slurm_jobs is None:
        source += "; Slurm not asked: jobs without live data are not listed"
    else:
        source += f"; {len(slurm_jobs)} running GPU job(s) in Slurm"
    rows = build_rows(
        jobs,
        now,
        idle_min_s=live.idle_min_s,
        stale_after_s=live.stale_after_s,
        slurm_jobs=slurm_jobs,
    )[:limit]
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        click.echo(render_table(rows, now, source), nl=False)
