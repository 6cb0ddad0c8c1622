"""``slurm-gpu sampler``: run a job's sampler in the foreground (the prolog normally does)."""

from __future__ import annotations

import sys

import click


@click.group("sampler")
def cli() -> None:
    """The per-job GPU sampler."""


@cli.command("run")
@click.option("--job-id", required=True, help="Raw Slurm job id.")
@click.option("--gpus", required=True, help="Comma-separated GPU UUIDs to sample.")
@click.option("--uid", type=int, default=None, help="The job owner's uid.")
@click.option("--cores", type=int, default=None, help="Cores allocated to the job here.")
@click.pass_context
def run(ctx: click.Context, job_id: str, gpus: str, uid: int | None, cores: int | None) -> None:
    """Sample until SIGTERM, then seal the record (exit 1 if it could not be sealed)."""
    from slurm_gpu.hooks.sampler import main

    argv = ["--job-id", job_id, "--gpus", gpus]
    if uid is not None:
        argv += ["--uid", str(uid)]
    if cores is not None:
        argv += ["--cores", str(cores)]
    config = ctx.find_root().ensure_object(dict).get("config_path")
    if config:
        argv += ["--config", config]
    sys.exit(main(argv))
