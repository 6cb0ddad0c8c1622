"""``slurm-gpu config``: show and check the effective configuration."""

from __future__ import annotations

import json
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.config import Settings, describe, example_toml
from slurm_gpu.textsafe import without_password


@click.group("config")
def cli() -> None:
    """Show or check the configuration."""


@cli.command("show")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def show(ctx: click.Context, as_json: bool) -> None:
    """Print every setting, its effective value and where it came from (a URL's password
    as ``***``: this output is pasted into tickets)."""
    settings = settings_from(ctx)
    rows = [_shown(_effective(settings, row)) for row in describe(settings)]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "file": settings.path,
                    "settings": {k: {"value": v, "source": src} for k, v, src, _ in rows},
                },
                indent=2,
                default=list,
            )
        )
        return
    click.echo(f"# file: {settings.path or '(none: all defaults)'}")
    width = max(len(k) for k, *_ in rows)
    for key, value, source, _doc in rows:
        click.echo(f"{key:<{width}}  {json.dumps(value, default=list):<40}  # {source}")


def _shown(row: tuple[str, Any, str, str]) -> tuple[str, Any, str, str]:
    """The row with a URL's password hidden (``store.url``, ``live.prometheus_url``, ...)."""
    key, value, source, doc = row
    if key.endswith("url") and isinstance(value, str):
        return key, without_password(value), source, doc
    return row


def _effective(settings: Settings, row: tuple[str, Any, str, str]) -> tuple[str, Any, str, str]:
    """A row of ``describe`` with the value in effect where the setting's empty value means
    one derived from others: an empty ``store.url`` is the SQLite file in ``paths.state_dir``."""
    key, value, source, doc = row
    if key == "store.url" and not value:
        return key, settings.store_url, f"{source}: <paths.state_dir>/slurm-gpu.db", doc
    return row


@cli.command("check")
@click.pass_context
def check(ctx: click.Context) -> None:
    """Exit 0 if the configuration parses and validates, 3 with the bad key otherwise."""
    settings = settings_from(ctx)
    click.echo(f"ok: {settings.path or 'defaults only'}")


@cli.command("example")
def example() -> None:
    """Print a commented configuration file with every key at its default."""
    click.echo(example_toml(), nl=False)
