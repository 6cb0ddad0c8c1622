"""What every command shares: ``--config``, ``--debug``, settings loading.

The CLI is the only layer that prints or chooses exit codes: library code raises
``SlurmGpuError`` subclasses and the entry points run under ``slurm_gpu.guard.run_guarded``.
"""

from __future__ import annotations

import os

import click

from slurm_gpu.config import Settings, load_settings, must_be_trusted  # noqa: TID251 (a composition root reads the config)


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
