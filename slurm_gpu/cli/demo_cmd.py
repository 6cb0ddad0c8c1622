"""``slurm-gpu demo``: run the demo workloads on the local test cluster and show the capture."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.demo.patterns import PATTERNS, describe
from slurm_gpu.demo.submit import (
    default_scripts_dir,
    describe_gpu,
    describe_host,
    find_records,
    job_states,
    submit_all,
    wait_for,
)
from slurm_gpu.errors import UsageError


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
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for the jobs and show what was captured.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=900.0,
    show_default=True,
    help="Seconds to wait for the jobs.",
)
@click.pass_context
def run(
    ctx: click.Context,
    user: str,
    patterns: str,
    scripts_dir: str | None,
    wait: bool,
    timeout_s: float,
) -> None:
    """Submit the demo jobs, wait for them, and print per job what the hooks captured."""
    settings = settings_from(ctx)
    base = Path(scripts_dir) if scripts_dir else default_scripts_dir()
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PATTERNS]
    if unknown:
        raise UsageError(
            f"unknown pattern(s): {', '.join(unknown)}", hint=f"one of: {', '.join(PATTERNS)}"
        )
    scripts = [base / f"{p}.sbatch" for p in wanted]
    missing = [str(s) for s in scripts if not s.is_file()]
    if missing:
        raise UsageError(f"no such script: {', '.join(missing)}", hint="pass --scripts DIR")
    as_user = user if os.geteuid() == 0 else None
    jobs = submit_all(scripts, user=as_user, python=sys.executable, config_path=settings.path)
    for job in jobs:
        click.echo(f"submitted {job.pattern:<12} job {job.job_id}")
    if not wait:
        return
    ids = [j.job_id for j in jobs]
    left = wait_for(ids, timeout_s=timeout_s)
    if left:
        click.echo(f"still running after {timeout_s:g}s: {', '.join(sorted(left))}", err=True)
    states = job_states(ids)
    records = find_records(settings.paths.spool_dir, [i for i in ids if i not in left], wait_s=15.0)
    for job in jobs:
        state = states.get(job.job_id, "RUNNING" if job.job_id in left else "?")
        click.echo(f"job {job.job_id} {job.pattern} {state}")
        got = records.get(job.job_id, "still running")
        if isinstance(got, str):
            click.echo(f"  {got}")
            continue
        for record in got:
            click.echo(
                f"  {record.hostname}: {len(record.gpus)} GPU(s), "
                f"{'complete' if record.complete else 'recovered'}"
            )
            for gpu in record.gpus:
                click.echo(f"    {describe_gpu(gpu)}")
            if record.host is not None:
                click.echo(f"    host: {describe_host(record.host)}")
    if left:
        sys.exit(1)
