"""``slurm-gpu admincomment``: stored jobs' JS1 summaries into Slurm's AdminComment, printed,
or decoded back (to check what reportseff and jobstats read)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.config import Settings
from slurm_gpu.errors import JobNotFoundError, UsageError


def _summaries(settings: Settings, job_ids: tuple[str, ...]) -> list[tuple[Any, str]]:
    """(job record, encoded summary) of each stored job, in the order given."""
    from slurm_gpu.accounting.admincomment import build_summary, encode
    from slurm_gpu.collector.admincomment import has_gpu_telemetry
    from slurm_gpu.store import open_store

    out: list[tuple[Any, str]] = []
    with open_store(settings, readonly=True) as store:
        for job_id in job_ids:
            stored = store.get_job(job_id)
            if stored is None:
                raise JobNotFoundError(
                    f"job {job_id} is not in the store",
                    hint="collect it first ('slurm-gpu collect --job ID'), and give its raw id",
                )
            if not has_gpu_telemetry(stored.telemetry, stored.nodes):
                raise JobNotFoundError(
                    f"job {job_id} has no GPU telemetry in the store ({stored.telemetry})",
                    hint="only jobs whose GPUs were sampled have a summary",
                )
            out.append((stored.job, encode(build_summary(stored.job, stored.nodes))))
    return out


@click.command("admincomment")
@click.argument("job_ids", nargs=-1, metavar="[JOBID]...")
@click.option(
    "--print",
    "print_only",
    is_flag=True,
    help="Print 'JOBID BYTES JS1:…' for each job instead of writing it.",
)
@click.option(
    "--decode",
    "decode_text",
    metavar="STRING",
    help="Decode a JS1 string ('-': read it from stdin) and print its JSON.",
)
@click.pass_context
def cli(
    ctx: click.Context, job_ids: tuple[str, ...], print_only: bool, decode_text: str | None
) -> None:
    """Write stored jobs' GPU summaries into Slurm's AdminComment (JS1, as jobstats writes it).

    Writing uses sacctmgr and needs root or a Slurm operator; it stops at the first failure.
    Slurm 22.05's sacctmgr lower-cases AdminComment, which breaks the summary: the write is
    read back and reported as an error then. --print and --decode change nothing.
    """
    if decode_text is not None:
        if job_ids or print_only:
            raise UsageError("--decode takes no JOBID and no --print", hint="give one of them")
        from slurm_gpu.accounting.admincomment import decode

        text = sys.stdin.read() if decode_text == "-" else decode_text
        click.echo(json.dumps(decode(text.strip()), indent=2, sort_keys=True))
        return
    if not job_ids:
        raise UsageError("no job given", hint="slurm-gpu admincomment [--print] JOBID...")
    for job_id in job_ids:
        if not job_id.isdigit():
            raise UsageError(
                f"{job_id!r} is not a raw job id",
                hint="give the raw id (sacct -o JobIDRaw); array tasks have their own",
            )
    settings = settings_from(ctx)
    summaries = _summaries(settings, job_ids)
    if print_only:
        for job, comment in summaries:
            click.echo(f"{job.job_id} {len(comment)} {comment}")
        return
    from slurm_gpu.accounting.admincomment import AdminCommentWriter, sacctmgr_path_for

    acct = settings.accounting
    writer = AdminCommentWriter(
        sacctmgr_path=sacctmgr_path_for(settings.collector.sacctmgr_path, acct.sacct_path),
        sacct_path=acct.sacct_path,
        timeout_s=acct.timeout_s,
    )
    for job, comment in summaries:
        attempts = writer.write(job, comment)
        click.echo(
            f"job {job.job_id}: AdminComment written ({len(comment)} bytes, {attempts} attempt(s))"
        )
