"""``slurm-gpu demo``: run the demo workloads on the local test cluster and show the capture.

A thin layer: the run itself is ``slurm_gpu.demo.run.run_demo``.
"""

from __future__ import annotations

import sys

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.demo.patterns import PATTERNS, describe


@click.group("demo")
def cli() -> None:
    """Demo jobs that reproduce each cause of low GPU utilization on virtual GPUs."""


@cli.command("list")
def list_patterns() -> None:
    """List the demo patterns."""
    click.echo(describe())


@cli.command("run")
@click.option(
    "--user",
    default="sgtest1",
    show_default=True,
    help="Submit as this user (through runuser when run as root).",
)
@click.option(
    "--patterns",
    default=",".join(PATTERNS),
    show_default=True,
    help="Comma-separated patterns to submit.",
)
@click.option(
    "--scripts",
    "scripts_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Directory of <pattern>.sbatch (default: share/demo).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="demo-output",
    show_default=True,
    help="Where the e-mails, the gpueff outputs and the weekly report go.",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for the jobs, collect them and show what users and admins get.",
)
@click.option(
    "--records",
    is_flag=True,
    help="Also print the sealed per-node records the hooks wrote.",
)
@click.option(
    "--record",
    "record_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Also save each job's accounting and sealed records as a labelled trace here "
    "(e.g. tests/data/traces).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=900.0,
    show_default=True,
    help="Seconds to wait for the jobs.",
)
@click.option(
    "--serve-web",
    "web_port",
    type=click.IntRange(0, 65535),
    default=0,
    help="After the run, print each job's web page at http://127.0.0.1:PORT/job/ID and "
    "serve the pages, as the demo user sees them, until interrupted (needs the web extra); "
    "0: no page.",
)
@click.pass_context
def run(
    ctx: click.Context,
    user: str,
    patterns: str,
    scripts_dir: str | None,
    out_dir: str,
    wait: bool,
    records: bool,
    record_dir: str | None,
    timeout_s: float,
    web_port: int,
) -> None:
    """Submit the demo jobs, wait for them, collect them, and show per job what its owner sees
    (gpueff), the e-mails after the jobs, and the weekly admin report."""
    from slurm_gpu.demo.run import DemoOptions, Echo, run_demo

    opts = DemoOptions(
        user=user,
        patterns=patterns,
        scripts_dir=scripts_dir,
        out_dir=out_dir,
        wait=wait,
        records=records,
        record_dir=record_dir,
        timeout_s=timeout_s,
        web_port=web_port,
    )
    echo = Echo(out=click.echo, err=lambda line: click.echo(line, err=True))
    status = run_demo(settings_from(ctx), opts, echo)
    if status:
        sys.exit(status)
