"""``slurm-gpu hooks``: install the prolog and epilog wrapper scripts."""

from __future__ import annotations

import os
import sys

import click

from slurm_gpu.config import DEFAULT_PATH, ENV_VAR, load_settings  # noqa: TID251 (a composition root reads the config)
from slurm_gpu.errors import ConfigError, UsageError
from slurm_gpu.hooks.common import render_wrapper, wrapper_template

#: Seconds timeout(1) in the wrapper allows beyond hooks.hook_timeout_s before killing Python.
BACKSTOP_S = 5.0


@click.group("hooks")
def cli() -> None:
    """Install the Slurm prolog and epilog of slurm-gpu."""


@cli.command("install")
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for slurm-gpu-prolog and slurm-gpu-epilog (created if missing).",
)
@click.option(
    "--config",
    "config",
    default=None,
    type=click.Path(dir_okay=False),
    help="Configuration file the hooks read (default: --config of slurm-gpu, "
    f"${ENV_VAR}, or {DEFAULT_PATH}).",
)
@click.pass_context
def install(ctx: click.Context, dest: str, config: str | None) -> None:
    """Render the wrapper scripts with this interpreter and config, mode 0755.

    The wrappers run ``python -I`` from ``/`` with only Slurm's variables (docs/hooks.md). As
    root, a configuration file that is not trusted is refused (exit 3), and an interpreter or
    package that another account could change is warned about.

    Then point slurm.conf at them (the lines are printed): Prolog=DEST/slurm-gpu-prolog,
    Epilog=DEST/slurm-gpu-epilog, PrologFlags=Alloc (see docs/hooks.md).
    """
    root = ctx.find_root().ensure_object(dict)
    path = config or root.get("config_path") or os.environ.get(ENV_VAR) or DEFAULT_PATH
    path = os.path.abspath(path)
    timeout_s = 20.0
    try:
        timeout_s = load_settings(path).hooks.hook_timeout_s
    except ConfigError as err:
        if os.path.exists(path):
            raise
        click.echo(f"warning: {err.message}; hooks use defaults until it exists", err=True)
    python = os.path.abspath(sys.executable)
    if os.geteuid() == 0:
        from slurm_gpu.doctor import Status, check_code

        code = check_code(python)
        if code.status is not Status.OK:
            # The hooks run this interpreter and package as root.
            click.echo(f"warning: {code.detail}", err=True)
            click.echo(f"hint: {code.hint}", err=True)
    try:
        os.makedirs(dest, mode=0o755, exist_ok=True)
        for hook in ("prolog", "epilog"):
            text = render_wrapper(
                wrapper_template(hook), python=python, config=path, timeout_s=timeout_s + BACKSTOP_S
            )
            target = os.path.join(os.path.abspath(dest), f"slurm-gpu-{hook}")
            tmp = f"{target}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
            click.echo(f"installed {target}")
    except ValueError as exc:
        raise UsageError(str(exc), hint="use paths without quotes") from None
    except OSError as exc:
        raise UsageError(
            f"cannot write to {dest}: {exc.strerror}", hint="run as root or choose another --dest"
        ) from None
    where = os.path.abspath(dest)
    click.echo("")
    click.echo("Next: add these lines to slurm.conf on every node (docs/hooks.md):")
    click.echo("")
    for line in slurm_conf_lines(where):
        click.echo(line)
    click.echo("")
    click.echo("then run `scontrol reconfigure` and check with `slurm-gpu doctor`.")


def slurm_conf_lines(dest: str) -> tuple[str, ...]:
    """The slurm.conf lines that run the hooks installed in ``dest`` (``doctor`` checks
    them: ``doctor.SLURM_CONF_KEYS``)."""
    return (
        f"Prolog={dest}/slurm-gpu-prolog",
        f"Epilog={dest}/slurm-gpu-epilog",
        "PrologFlags=Alloc",
    )
