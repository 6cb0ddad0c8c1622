"""``slurm-gpu``: the admin command. Subcommands load lazily so that a hook or a quick command
never imports the report's heavy libraries."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import click

from slurm_gpu import __version__
from slurm_gpu.cli.common import config_option, debug_option
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.guard import run_guarded

#: subcommand -> module holding a click command or group named ``cli``. A module that does not
#: exist yet is simply not listed.
COMMANDS: dict[str, str] = {
    "config": "slurm_gpu.cli.config_cmd",
    "hooks": "slurm_gpu.cli.hooks_cmd",
    "sampler": "slurm_gpu.cli.sampler_cmd",
    "vgpu": "slurm_gpu.cli.vgpu_cmd",
    "demo": "slurm_gpu.cli.demo_cmd",
    "ship": "slurm_gpu.cli.ship_cmd",
    "collect": "slurm_gpu.cli.collect_cmd",
    "store": "slurm_gpu.cli.store_cmd",
    "admincomment": "slurm_gpu.cli.admincomment_cmd",
    "evaluate": "slurm_gpu.cli.evaluate_cmd",
    "mail": "slurm_gpu.cli.mail_cmd",
    "report": "slurm_gpu.cli.report_cmd",
    "doctor": "slurm_gpu.cli.doctor_cmd",
    "exporter": "slurm_gpu.cli.exporter_cmd",
    "live": "slurm_gpu.cli.live_cmd",
    "police": "slurm_gpu.cli.police_cmd",
    "web": "slurm_gpu.cli.web_cmd",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if importlib.util.find_spec(COMMANDS[name])]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMANDS.get(cmd_name)
        if module_name is None or importlib.util.find_spec(module_name) is None:
            return None
        command = importlib.import_module(module_name).cli
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.ensure_object(dict).get("debug"))
        return run_guarded("slurm-gpu", debug, lambda: super(LazyGroup, self).invoke(ctx))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@debug_option
@click.version_option(__version__, prog_name="slurm-gpu")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool) -> None:
    """Admin tools of slurm-gpu: hooks, sampler, collector, reports."""
    ctx.ensure_object(dict).update(config_path=config_path, debug=debug)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="slurm-gpu")


__all__ = ["SlurmGpuError", "cli", "main"]
