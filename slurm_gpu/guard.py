"""How an entry point ends: project errors become one line, a hint and their exit code.

Library code raises ``SlurmGpuError`` subclasses; ``run_guarded`` turns them into one line plus
a hint on stderr and the class's documented exit code (``slurm_gpu.errors``), with a traceback
only under ``--debug``. Every entry point runs under it: the two CLIs (``cli``) and the demo
workload run inside jobs (``python -m slurm_gpu.demo``), which is why it sits below both.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from slurm_gpu.errors import SlurmGpuError

T = TypeVar("T")


def fail(err: SlurmGpuError, prog: str, *, debug: bool = False) -> NoReturn:
    """Print ``prog: message`` and ``hint: …`` on stderr and exit with the error's code."""
    if debug:
        traceback.print_exc()
    click.echo(err.lines(prog), err=True, nl=False)
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
