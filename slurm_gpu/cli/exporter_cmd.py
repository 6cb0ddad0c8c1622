"""``slurm-gpu exporter``: this node's running GPU jobs for Prometheus (``docs/live.md``)."""

from __future__ import annotations

import contextlib

import click

from slurm_gpu.cli.common import settings_from


def _loopback_uids(names: tuple[str, ...]) -> frozenset[int]:
    """Root's uid and those of ``names`` that exist (a missing account is said once)."""
    import pwd

    uids = {0}
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            click.echo(f"slurm-gpu exporter: no account {name!r} (live.exporter_allowed_users)")
    return frozenset(uids)


@click.command("exporter")
@click.option("--address", default=None, help="Listen address (default: live.exporter_address).")
@click.option("--port", type=int, default=None, help="Listen port (default: live.exporter_port).")
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the exposition once to this file (node_exporter's textfile collector) "
    "instead of serving it.",
)
@click.pass_context
def cli(ctx: click.Context, address: str | None, port: int | None, textfile: str | None) -> None:
    """Serve GET /metrics (Prometheus text format) from the samplers' live summaries.

    Runs as a service (share/systemd/slurm-gpu-exporter.service), single-threaded. Clients
    on this host (loopback) are served only when their socket belongs to root or an account
    of live.exporter_allowed_users (the kernel's socket table says whose it is). With
    --textfile it writes the exposition once and exits (run it from a timer). Exit 0; 1 when
    the address cannot be bound or the file cannot be written; 3 when the configuration is
    unusable.
    """
    from slurm_gpu.live.exporter import ExporterOptions, make_server, write_textfile

    settings = settings_from(ctx, trusted=True)
    opts = ExporterOptions(
        settings.paths.spool_dir,
        settings.live.stale_after_s,
        loopback_uids=_loopback_uids(settings.live.exporter_allowed_users),
    )
    if textfile:
        try:
            write_textfile(opts, textfile)
        except OSError as exc:
            click.echo(f"slurm-gpu exporter: cannot write {textfile}: {exc.strerror}", err=True)
            click.echo("hint: the directory must exist and be writable by this user", err=True)
            ctx.exit(1)
        return
    host = address or settings.live.exporter_address
    bind_port = settings.live.exporter_port if port is None else port
    try:
        server = make_server(opts, host, bind_port)
    except OSError as exc:
        click.echo(f"slurm-gpu exporter: cannot listen on {host}:{bind_port}: {exc}", err=True)
        click.echo("hint: another exporter may run there; choose live.exporter_port", err=True)
        ctx.exit(1)
    click.echo(f"slurm-gpu exporter: serving http://{host}:{server.server_address[1]}/metrics")
    with server, contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
