"""``slurm-gpu web``: the per-job web page (``docs/web.md``).

``serve`` runs it with werkzeug's server for a try-out, the demo and the tests (one process,
threads); sites serve ``wsgi_app()`` from their WSGI server (``share/ondemand/`` for Open
OnDemand, ``docs/web.md`` for a standalone service).
"""

from __future__ import annotations

from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.errors import UsageError


def _need_flask() -> None:
    try:
        import flask  # noqa: F401
    except ImportError:
        raise UsageError(
            "the web page needs Flask, which is not installed",
            hint="pip install 'slurm-gpu[web]'",
        ) from None


def wsgi_app(config_path: str | None = None) -> Any:
    """The page's WSGI application with the site's settings (``$SLURM_GPU_CONFIG`` or the
    default file): what a WSGI server or Passenger imports."""
    from slurm_gpu.config import load_settings  # noqa: TID251 - a composition root

    _need_flask()
    from slurm_gpu.web.app import create_app

    return create_app(load_settings(config_path))


@click.group("web")
def cli() -> None:
    """The per-job web page."""


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.pass_context
def serve(ctx: click.Context, host: str, port: int) -> None:
    """Serve the page (werkzeug's threaded server: a try-out, the demo, the tests).

    Behind a site's authentication, serve wsgi_app() from a production WSGI server instead."""
    settings = settings_from(ctx)
    _need_flask()
    from werkzeug.serving import run_simple

    from slurm_gpu.web.app import create_app

    click.echo(f"slurm-gpu web: http://{host}:{port}/ ({settings.web.identity})", err=True)
    run_simple(host, port, create_app(settings), threaded=True, use_reloader=False)
