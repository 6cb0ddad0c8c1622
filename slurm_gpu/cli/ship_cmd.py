"""``slurm-gpu ship``: move this node's sealed records to the collector's inbox."""

from __future__ import annotations

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.errors import ConfigError


@click.command("ship")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Copy sealed records from paths.spool_dir to paths.inbox_dir (run from a node timer).

    Exit 0 when every record was shipped, 1 when some could not be (they stay in the spool and
    are tried again next time).
    """
    from slurm_gpu.capture.ship import ship

    settings = settings_from(ctx, trusted=True)
    if not settings.paths.inbox_dir:
        raise ConfigError(
            "paths.inbox_dir is not set",
            key="paths.inbox_dir",
            path=settings.path,
            hint="set it to the shared directory the collector reads, or run the collector here",
        )
    result = ship(settings.paths.spool_dir, settings.paths.inbox_dir)
    click.echo(f"shipped {len(result.shipped)} record(s) to {settings.paths.inbox_dir}")
    for name, reason in result.failed:
        click.echo(f"not shipped: {name}: {reason}", err=True)
    if result.failed:
        ctx.exit(1)
