"""``gpueff``: how well did my job use its GPUs, and what should I ask for next time.

Runs as the calling user. A job is shown only when Slurm accounting, asked *as that user*,
returns it, so Slurm's ``PrivateData`` decides what is visible; the one exception is the
caller's own settled job found in the store, which Slurm always shows its owner, so asking
adds nothing (``jobreport.service.answer_from_store``). Exit codes: ``docs/cli.md``.

Kept light on purpose: the store, the spool and the accounting adapter are imported only when
a job needs them, and nothing here imports pandas or matplotlib.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import click

from slurm_gpu import __version__
from slurm_gpu.cli.common import config_option, debug_option
from slurm_gpu.errors import UsageError
from slurm_gpu.guard import run_guarded

#: Context-settings key tests use to inject (accounting, reader) in place of the real ones.
BACKENDS_KEY = "gpueff_backends"
#: Context-settings key tests use to stand in for the caller's real uid (``os.getuid()``).
CALLER_UID_KEY = "gpueff_caller_uid"
#: Context-object key of the accounting question the console script asked early.
EARLY_KEY = "gpueff_early_accounting"


def _parse_since(text: str, now_s: float) -> float:
    """``--since``: a time before now (``3d``) or a local date (``slurm_gpu.cli.when``).
    Raises ``UsageError`` for a time after ``now_s``: the listing runs from it to now, and
    sacct refuses such a period with an error of its own."""
    from slurm_gpu.cli.when import FORMS, parse_when

    since_s = parse_when(text, now_s=now_s, utc=False)
    if since_s > now_s:
        raise UsageError(f"--since {text!r} is after now", hint=f"give a time before now: {FORMS}")
    return since_s


def _backends(ctx: click.Context, config_path: str | None) -> tuple[Any, Any, Any]:
    """(settings, accounting source, telemetry reader): injected by tests, else the real ones."""
    from slurm_gpu.config import load_settings  # noqa: TID251 (a composition root reads the config)

    injected = (ctx.obj or {}).get(BACKENDS_KEY)
    settings = load_settings(config_path)
    if injected is not None:
        accounting, reader = injected
        return settings, accounting, reader
    from slurm_gpu.jobreport.readers import make_accounting, make_reader

    # The console script may have asked accounting already (``jobreport.early``).
    accounting = (ctx.obj or {}).get(EARLY_KEY) or make_accounting(settings)
    return settings, accounting, make_reader(settings)


def _run(
    ctx: click.Context,
    job_ids: tuple[str, ...],
    user: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
    colour: bool | None,
    config_path: str | None,
    debug: bool = False,
) -> None:
    from slurm_gpu.jobreport import service

    if job_ids and (user or since):
        raise UsageError(
            "give job ids or --user/--since, not both",
            hint="gpueff 1234 5678, or gpueff --user alice --since 7d",
        )
    settings, accounting, reader = _backends(ctx, config_path)
    min_elapsed_s = settings.gpueff.min_elapsed_s
    # The caller's own settled jobs are answered from the store alone (Slurm shows users
    # their own jobs); for every other id accounting is asked in the background (the slowest
    # step) while the store is read and the renderer set up; nothing is shown before it
    # answered.
    if job_ids:
        # The real uid, not the effective one: the owner fast path must not widen what a
        # set-uid wrapper could see (none is needed or shipped; this keeps it so).
        caller_uid = (ctx.obj or {}).get(CALLER_UID_KEY, os.getuid())
        pending: Any = service.start_lookup(job_ids, accounting, reader, caller_uid=caller_uid)
    else:
        import getpass

        now_s = time.time()
        since_s = _parse_since(since, now_s) if since else now_s - 7 * 86400
        pending = service.start_recent(
            accounting,
            reader,
            user=user or getpass.getuser(),
            since_s=since_s,
            until_s=now_s,
            limit=limit,
        )
    renderer = None
    use_colour = False
    if not as_json:
        from slurm_gpu.jobreport import output
        from slurm_gpu.jobreport.terminal import TerminalRenderer

        use_colour = output.use_colour(colour)
        renderer = TerminalRenderer(
            colour=use_colour, template_dir=settings.gpueff.template_dir, cache=True, debug=debug
        )
        if getattr(pending, "asked_accounting", True):
            # Load the templates while accounting answers; without a wait, only the one
            # template the output needs is loaded, when it is needed.
            renderer.prepare()

    if not job_ids:
        reports = pending.finish(min_elapsed_s=min_elapsed_s)
        if as_json:
            from slurm_gpu.jobreport.jsonout import document

            click.echo(json.dumps(document(reports), indent=2))
        elif not reports:
            click.echo("no jobs in that period")
        else:
            assert renderer is not None
            click.echo(renderer.table(reports), nl=False, color=use_colour)
        return

    found = pending.finish(min_elapsed_s=min_elapsed_s)
    if as_json:
        from slurm_gpu.jobreport.jsonout import document

        flat = [r for _, group in found.groups for r in group]
        click.echo(json.dumps(document(flat, found.missing), indent=2))
    else:
        assert renderer is not None
        if found.groups:
            click.echo(output.render_groups(renderer, found.groups), nl=False, color=use_colour)
    if found.missing:
        raise service.not_found_error(found.missing)


@click.command("gpueff", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_ids", nargs=-1)
@click.option("-u", "--user", help="List this user's recent jobs (default: you, with --since).")
@click.option(
    "-S",
    "--since",
    help="Start of the listing: 3d, 12h, 30m, 2w before now, or YYYY-MM-DD[THH:MM] (local).",
)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="Most jobs listed with --user/--since.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (docs/gpueff.md).")
@click.option(
    "--color/--no-color",
    "colour",
    default=None,
    help="Force colour on or off (default: on a terminal, unless NO_COLOR is set).",
)
@config_option
@debug_option
@click.version_option(__version__, prog_name="gpueff")
@click.pass_context
def cli(
    ctx: click.Context,
    job_ids: tuple[str, ...],
    user: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
    colour: bool | None,
    config_path: str | None,
    debug: bool,
) -> None:
    """Show how a job used its GPUs and what to request next time.

    JOB_IDS: job ids (1234), array tasks (1234_7), whole arrays (1234). With no id, lists
    your jobs of the last week (or --user/--since).
    """
    debug = debug or os.environ.get("SLURM_GPU_DEBUG") == "1"
    run_guarded(
        "gpueff",
        debug,
        lambda: _run(ctx, job_ids, user, since, limit, as_json, colour, config_path, debug),
    )


def main(early: Any = None) -> None:
    """Console-script entry point; ``early``: accounting the console script already asked
    (``jobreport.early.EarlyAccounting``)."""
    cli(prog_name="gpueff", obj={EARLY_KEY: early} if early is not None else None)
