"""``slurm-gpu exporter``: this node's running GPU jobs for Prometheus (``docs/live.md``)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.errors import ConfigError


def _local_uids(names: tuple[str, ...]) -> frozenset[int]:
    """Root's uid and those of ``names`` that exist (a missing account is said once)."""
    import pwd

    uids = {0}
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            click.echo(f"slurm-gpu exporter: no account {name!r} (live.exporter_allowed_users)")
    return frozenset(uids)


def _textfile_gid(name: str) -> int | None:
    """The gid of group ``name``; ``None`` for no group. ``ConfigError`` when it does not
    exist."""
    import grp

    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(
            f"no group {name!r} for the textfile",
            hint="give the group node_exporter runs as (Debian: prometheus), or none for 0600",
        ) from None


def private_output() -> None:
    """Everything this process writes stays its owner's: files it creates (umask 077), and
    its standard output and error where they are a regular file of its own (a log file a
    launcher opened under a looser umask): group and others lose their permissions. The
    log names local clients, addresses and job ids."""
    os.umask(0o077)
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
        except OSError:
            continue  # closed, or not ours to change


@click.command("exporter")
@click.option("--address", default=None, help="Listen address (default: live.exporter_address).")
@click.option("--port", type=int, default=None, help="Listen port (default: live.exporter_port).")
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the exposition once to this file (node_exporter's textfile collector) "
    "instead of serving it; mode 0600, or 0640 with --textfile-group.",
)
@click.option(
    "--textfile-group",
    default=None,
    help="Group that may read the textfile: the account node_exporter runs as (Debian: "
    "prometheus). Default: live.exporter_textfile_group, else none (0600).",
)
@click.pass_context
def cli(
    ctx: click.Context,
    address: str | None,
    port: int | None,
    textfile: str | None,
    textfile_group: str | None,
) -> None:
    """Serve GET /metrics (Prometheus text format) from the samplers' live summaries.

    Runs as a service (share/systemd/slurm-gpu-exporter.service), one thread per connection
    (at most 8), each request within 5 s from its accept. A client on this host (from any of
    its addresses, loopback or not) is served only when its socket belongs to root or an
    account of live.exporter_allowed_users (the kernel's socket table says whose it is),
    checked before its request is read. With --textfile it writes the exposition once and
    exits (run it from a timer). Exit 0; 1 when the address cannot be bound or the file
    cannot be written; 3 when the configuration (or --textfile-group) is unusable.
    """
    from slurm_gpu.live.exporter import ExporterOptions, exposition, make_server
    from slurm_gpu.live.textfile import write_private

    settings = settings_from(ctx, trusted=True)
    opts = ExporterOptions(
        settings.paths.spool_dir,
        settings.live.stale_after_s,
        local_uids=_local_uids(settings.live.exporter_allowed_users),
    )
    if textfile:
        group = (
            textfile_group if textfile_group is not None else settings.live.exporter_textfile_group
        )
        gid = _textfile_gid(group)
        try:
            write_private(exposition(opts).encode(), textfile, gid)
        except OSError as exc:
            click.echo(f"slurm-gpu exporter: cannot write {textfile}: {exc.strerror}", err=True)
            click.echo("hint: the directory must exist and be writable by this user", err=True)
            ctx.exit(1)
        return
    private_output()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
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
