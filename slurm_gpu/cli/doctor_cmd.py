"""``slurm-gpu doctor``: check config, GPUs, spool, log, accounting and store."""

from __future__ import annotations

import functools

import click

from slurm_gpu import doctor
from slurm_gpu.cli.common import settings_from


def _store_info(settings: object) -> tuple[str, int, int]:
    from slurm_gpu.store import open_store

    with open_store(settings, readonly=True) as store:  # type: ignore[arg-type]
        info = store.info()
    return info.url, info.schema_version, info.latest_version


@click.command("doctor")
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(["telemetry", "spool", "log", "accounting", "store"]),
    help="Skip a check (repeatable), e.g. telemetry on a host without GPUs.",
)
@click.pass_context
def cli(ctx: click.Context, skip: tuple[str, ...]) -> None:
    """Check this installation. Exit 0 when nothing failed, 1 when a check failed."""
    from slurm_gpu.accounting import open_accounting
    from slurm_gpu.telemetry import open_source

    settings = settings_from(ctx)
    checks = {
        "telemetry": lambda: doctor.check_telemetry(functools.partial(open_source, settings)),
        "spool": lambda: doctor.check_spool(settings),
        "log": lambda: doctor.check_log(settings),
        "accounting": lambda: doctor.check_accounting(functools.partial(open_accounting, settings)),
        "store": lambda: doctor.check_store(functools.partial(_store_info, settings)),
    }
    click.echo(f"config: {settings.path or 'defaults only (no file)'}")
    results = doctor.run_checks([fn for name, fn in checks.items() if name not in skip])
    colours = {doctor.Status.OK: "green", doctor.Status.WARN: "yellow", doctor.Status.FAIL: "red"}
    for r in results:
        click.echo(
            f"{click.style(f'{r.status.value:>4}', fg=colours[r.status])}  {r.name:<11} {r.detail}"
        )
        if r.hint:
            click.echo(f"{'':17}hint: {r.hint}")
    if any(r.status is doctor.Status.FAIL for r in results):
        ctx.exit(1)
