"""``slurm-gpu ship``: move this node's sealed records to the collector's side."""

from __future__ import annotations

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.errors import ConfigError


@click.command("ship")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Move sealed records from paths.spool_dir to the collector (run from a node timer):
    into paths.inbox_dir (ship.transport = directory) or the store's PostgreSQL inbox
    (ship.transport = postgresql).

    Exit 0 when every record was shipped, 1 when some could not be (they stay in the spool and
    are tried again next time).
    """
    settings = settings_from(ctx, trusted=True)
    if settings.ship.transport == "postgresql":
        from slurm_gpu.capture.pgship import PgTarget, ship_postgresql

        s = settings.ship
        target = PgTarget(
            dsn=s.postgresql_dsn,
            password_file=s.password_file,
            connect_timeout_s=s.connect_timeout_s,
            statement_timeout_s=s.statement_timeout_s,
        )
        result = ship_postgresql(settings.paths.spool_dir, target)
        where = "the PostgreSQL inbox"
    else:
        from slurm_gpu.capture.ship import ship

        if not settings.paths.inbox_dir:
            raise ConfigError(
                "paths.inbox_dir is not set",
                key="paths.inbox_dir",
                path=settings.path,
                hint="set it to the shared directory the collector reads, or run the collector "
                'here, or set [ship] transport = "postgresql"',
            )
        result = ship(settings.paths.spool_dir, settings.paths.inbox_dir)
        where = settings.paths.inbox_dir
    click.echo(f"shipped {len(result.shipped)} record(s) to {where}")
    for name, reason in result.failed:
        click.echo(f"not shipped: {name}: {reason}", err=True)
    if result.failed:
        ctx.exit(1)
