"""What every command shares: error-to-exit-code mapping, ``--debug``, settings loading.

The CLI is the only layer that prints or chooses exit codes. Library code raises
``SlurmGpuError`` subclasses; ``run_guarded`` turns them into one line plus a hint on stderr and
the class's documented exit code, with a traceback only under ``--debug``.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from slurm_gpu.config import Settings, load_settings, must_be_trusted  # noqa: TID251 (a composition root reads the config)
from slurm_gpu.errors import SlurmGpuError

T = TypeVar("T")


def fail(err: SlurmGpuError, prog: str, *, debug: bool = False) -> NoReturn:
    """Print ``prog: message`` and ``hint: …`` on stderr and exit with the error's code."""
    if debug:
        traceback.print_exc()
    click.echo(f"{prog}: {err.message}", err=True)
    if err.hint:
        click.echo(f"hint: {err.hint}", err=True)
    sys.exit(err.exit_code)


def run_guarded(prog: str, debug: bool, fn: Callable[[], T]) -> T:
    """Run ``fn``; map project errors to exit codes and anything else to exit 1 with a hint."""
    try:
        return fn()
    except SlurmGpuError as err:
        fail(err, prog, debug=debug)
    except (click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        raise  # click's own exits and usage errors carry their documented codes
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(130)
    except Exception as exc:  # the last line of defence: one line, no traceback
        if debug:
            traceback.print_exc()
        click.echo(f"{prog}: unexpected error: {type(exc).__name__}: {exc}", err=True)
        click.echo("hint: run again with --debug and report the traceback", err=True)
        sys.exit(1)


def settings_from(ctx: click.Context, *, trusted: bool | None = None) -> Settings:
    """The settings for this invocation, loaded once and cached on the root context.

    ``trusted=True`` for commands that are privileged by nature (``collect``, ``ship``): the
    file must be trusted whoever runs them. The default requires it when running as root,
    wherever ``--config`` or ``$SLURM_GPU_CONFIG`` points (``load_settings``); a file that is
    not trusted is a ``ConfigError`` (exit 3) with a hint.
    """
    root = ctx.find_root()
    obj = root.ensure_object(dict)
    if "settings" not in obj or (trusted and not obj.get("settings_trusted")):
        obj["settings"] = load_settings(obj.get("config_path"), trusted=trusted)
        obj["settings_trusted"] = must_be_trusted(trusted)
    settings: Settings = obj["settings"]
    return settings


def debug_enabled(ctx: click.Context) -> bool:
    """Whether ``--debug`` (or ``SLURM_GPU_DEBUG=1``) was given."""
    obj = ctx.find_root().ensure_object(dict)
    return bool(obj.get("debug")) or os.environ.get("SLURM_GPU_DEBUG") == "1"


#: ``--config``, as the two top-level commands (``gpueff`` and ``slurm-gpu``) take it.
config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Configuration file (default: $SLURM_GPU_CONFIG or /etc/slurm-gpu/config.toml).",
)

#: ``--debug``: tracebacks on errors (otherwise one line and a hint).
debug_option = click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
