"""``slurm-gpu store``: migrate the store and show what it holds."""

from __future__ import annotations

import json
import os

import click

from slurm_gpu.cli.common import settings_from


@click.group("store")
def cli() -> None:
    """Create, migrate and inspect the store (SQLite file or PostgreSQL)."""


@cli.command("migrate")
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create the store or bring it to this release's schema (a no-op when it is current)."""
    from slurm_gpu.store import mask_url, migrate_store
    from slurm_gpu.store.migrations import LATEST_VERSION
    from slurm_gpu.store.urls import sqlite_path

    settings = settings_from(ctx)
    path = sqlite_path(settings.store_url)
    if path is not None:
        # As every writer (``open_store``): the file is created 0600 in a 0700 directory,
        # never with the process's umask.
        from slurm_gpu.store.filemode import secure_sqlite_file

        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        secure_sqlite_file(path, settings.store.admin_group, state_dir=settings.paths.state_dir)
    applied = migrate_store(settings.store_url)
    url = mask_url(settings.store_url)
    if not applied:
        click.echo(f"{url}: already at schema version {LATEST_VERSION}")
    for m in applied:
        click.echo(f"{url}: applied migration {m.version}: {m.name}")


@cli.command("info")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def info(ctx: click.Context, as_json: bool) -> None:
    """Schema version, rows per table, jobs per telemetry status, size on disk."""
    from slurm_gpu.store import Store

    settings = settings_from(ctx)
    with Store.open(settings.store_url, migrate=False) as store:
        i = store.info()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "url": i.url,
                    "dialect": i.dialect,
                    "schema_version": i.schema_version,
                    "latest_version": i.latest_version,
                    "rows": dict(i.rows),
                    "telemetry": dict(i.telemetry),
                    "size_bytes": i.size_bytes,
                },
                indent=2,
            )
        )
        return
    click.echo(f"store:          {i.url} ({i.dialect})")
    click.echo(f"schema version: {i.schema_version} (this release: {i.latest_version})")
    for table, n in i.rows.items():
        click.echo(f"{table + ':':<15} {n} rows")
    if i.telemetry:
        status = ", ".join(f"{k} {v}" for k, v in sorted(i.telemetry.items()))
        click.echo(f"telemetry:      {status}")
    if i.size_bytes is not None:
        click.echo(f"size:           {i.size_bytes / 2**20:.1f} MiB")


@cli.command("reports")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="At most this many jobs, newest first.",
)
@click.pass_context
def reports(ctx: click.Context, limit: int) -> None:
    """Render gpueff's report of stored jobs that have none under the current templates.

    The collector renders each job it stores; run this after changing templates, the
    [gpueff] settings or the release, or for jobs stored before the cache existed, so that
    gpueff answers those from one read again. Needs [gpueff] cache_reports and a SQLite store.
    """
    from slurm_gpu.jobreport.prerender import ReportPrerenderer
    from slurm_gpu.store import Store

    settings = settings_from(ctx)
    with Store.open(settings.store_url, migrate=False) as store:
        prerenderer = ReportPrerenderer(settings, store)
        if not prerenderer.enabled:
            click.echo(
                "reports are not cached: [gpueff] cache_reports is off or the store is not a "
                "SQLite file (gpueff renders every report itself)"
            )
            return
        candidates, written = prerenderer.refresh(limit=limit)
    click.echo(f"{written} report(s) rendered ({candidates} job(s) had none under this key)")


@cli.command("sync-roles")
@click.pass_context
def sync_roles(ctx: click.Context) -> None:
    """Write who may read which rows of a PostgreSQL store, as Slurm says it.

    Reads PrivateData and SlurmUser (scontrol show config), Slurm operators and administrators
    (sacctmgr show user) and account coordinators (sacctmgr show account withcoord), and
    replaces the store's visibility tables in one transaction; the row-level security
    policies read them (docs/store.md). Run it from the collector's timer, as root. SQLite
    stores have nothing to sync: their file is closed to users.
    """
    import subprocess
    from collections.abc import Sequence

    from slurm_gpu.accounting.admincomment import sacctmgr_path_for
    from slurm_gpu.accounting.partitions import scontrol_path_for
    from slurm_gpu.store import Store
    from slurm_gpu.store.urls import sqlite_path
    from slurm_gpu.store.visibility import read_visibility, write_visibility

    settings = settings_from(ctx)
    if sqlite_path(settings.store_url) is not None:
        click.echo("SQLite store: no roles to sync (the file is root's; docs/gpueff.md)")
        return
    sacct = settings.accounting.sacct_path
    sacctmgr = sacctmgr_path_for(settings.collector.sacctmgr_path, sacct)
    scontrol = scontrol_path_for(sacct)

    def run(argv: Sequence[str]) -> str:
        try:
            return subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=settings.accounting.timeout_s,
                check=True,
                cwd="/",
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            from slurm_gpu.errors import AccountingError

            raise AccountingError(
                f"{argv[0]} {argv[1]} failed ({exc})",
                hint="check that slurmctld and slurmdbd answer; nothing was changed",
            ) from None

    vis = read_visibility(run, scontrol, sacctmgr)
    with Store.open(settings.store_url, migrate=False) as store:
        roles = write_visibility(store.engine, vis)
    click.echo(
        f"{roles} role(s) with more than their own jobs; "
        f"PrivateData=jobs {'on' if vis.private_jobs else 'off'}"
    )


def _when(ts: float | None) -> str:
    import time

    if ts is None:
        return "kept for ever"
    return "before " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


@cli.command("prune")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@click.pass_context
def prune(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Apply the [store] retention: delete old timelines and rendered reports (and whole old
    jobs when summary_retention_days is set), a batch per short transaction.

    Safe while the collector and gpueff run, and safe to repeat (the systemd timer
    slurm-gpu-prune.timer runs it daily). Exit 0 when done, 6 on a store error (the batches
    committed before it stay pruned)."""
    from slurm_gpu.store import Store
    from slurm_gpu.store.prune import RetentionPolicy
    from slurm_gpu.store.prune import prune as run_prune

    settings = settings_from(ctx)
    s = settings.store
    policy = RetentionPolicy(
        timeline_days=s.timeline_retention_days,
        summary_days=s.summary_retention_days,
        batch_jobs=s.prune_batch_jobs,
    )
    with Store.open(settings.store_url, migrate=not dry_run) as store:
        r = run_prune(store.engine, policy, dry_run=dry_run)
    if as_json:
        import dataclasses

        click.echo(json.dumps(dataclasses.asdict(r), indent=2))
        return
    verb = "would" if dry_run else "did"
    click.echo(f"timelines and reports: {_when(r.timeline_cutoff_s)}")
    click.echo(f"whole jobs:            {_when(r.summary_cutoff_s)}")
    if dry_run:
        click.echo(
            f"dry run: would remove the timelines of {r.timelines_pruned} job(s) and delete "
            f"{r.jobs_deleted} job(s)"
        )
        return
    click.echo(
        f"{verb} remove the timelines of {r.timelines_pruned} job(s) ({r.timeline_rows} "
        f"timeline and {r.report_rows} report rows) and delete {r.jobs_deleted} job(s), in "
        f"{r.batches} batch(es), {r.seconds:.1f} s (longest batch {r.longest_batch_s * 1e3:.0f} ms)"
    )


def _epoch(text: str, name: str) -> float:
    """``--since``/``--until``: a time before now (``7d``) or a date, UTC without an offset
    (``slurm_gpu.cli.when``), as seconds since the epoch."""
    import time

    from slurm_gpu.cli.when import parse_when

    return parse_when(text, now_s=time.time(), utc=True, option=name)


@cli.command("export")
@click.option(
    "--since",
    required=True,
    metavar="WHEN",
    help="Start, by job end: 7d, 2w before now, or a date (YYYY-MM-DD[THH:MM], UTC).",
)
@click.option(
    "--until", default=None, metavar="WHEN", help="End (excluded), same forms; default: now."
)
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "parquet"]), default="csv", show_default=True
)
@click.option(
    "--what",
    type=click.Choice(["jobs", "findings"]),
    default="jobs",
    show_default=True,
    help="One row per job (its summary) or one row per finding.",
)
@click.option("--out", "out_path", required=True, help="Output file; '-' writes CSV to stdout.")
@click.pass_context
def export(
    ctx: click.Context, since: str, until: str | None, fmt: str, what: str, out_path: str
) -> None:
    """Export job summaries or findings of jobs that ended in [--since, --until), streaming
    (memory stays flat). Columns: docs/store.md. Parquet needs pyarrow (slurm-gpu[export])."""
    from slurm_gpu.store import Store
    from slurm_gpu.store.export import export as run_export

    start, end = _epoch(since, "--since"), _epoch(until or "0m", "--until")
    settings = settings_from(ctx)
    with Store.open(settings.store_url, migrate=False) as store:
        r = run_export(store.engine, out_path, since_s=start, until_s=end, fmt=fmt, what=what)
    if out_path != "-":
        click.echo(f"{r.rows} {what} row(s) of {r.jobs} job(s) written to {r.path}", err=True)


@cli.command("grant-node")
@click.argument("role")
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A node whose records ROLE may push (repeat for more); default: the host named ROLE.",
)
@click.option("--revoke", is_flag=True, help="Take the inbox away from ROLE instead.")
@click.pass_context
def grant_node(ctx: click.Context, role: str, hosts: tuple[str, ...], revoke: bool) -> None:
    """Let ROLE push nodes' records into the PostgreSQL inbox ([ship] transport = postgresql).

    ROLE must exist (CREATE ROLE ... LOGIN, by the database's administrator); it gets INSERT
    on the node columns of record_inbox and nothing else, and row-level security hides every
    row of the store from it (docs/transport.md). Its rows count only for the hosts it is
    bound to (--host; default the host named like the role): others are quarantined. Run as
    the collector (the tables' owner).
    """
    from slurm_gpu.store import Store
    from slurm_gpu.store.inbox import grant_node_role, revoke_node_role

    settings = settings_from(ctx)
    with Store.open(settings.store_url, migrate=False) as store:
        if revoke:
            revoke_node_role(store.engine, role)
            click.echo(f"{role}: may no longer push records")
        else:
            grant_node_role(store.engine, role, hosts)
            bound = ", ".join(hosts or (role,))
            click.echo(f"{role}: may insert records of {bound} into record_inbox, and nothing else")
