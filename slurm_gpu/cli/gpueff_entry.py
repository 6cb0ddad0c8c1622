"""The ``gpueff`` console script: a click-free fast path for the common case.

``gpueff 1234`` on the caller's own finished, collected job is answered without accounting
(Slurm always shows users their own jobs; see docs/gpueff.md, "Who can see what"). That case
pays for nothing else, not even click's import. When the collector has rendered the job's
report (``[gpueff] cache_reports``), it is printed without importing the report code or
jinja2: for an ordinary user from the file the collector wrote for that user alone
(``reportfiles``: the kernel checks who may open it, and the store itself need not be
readable by users), for root from the store (``reportcache``, one indexed read). The forms
taken here are ``gpueff [--config F] [--json] [--color|--no-color] JOBID...``. For an
ordinary user's ids that no rendered report answers, the question is asked at once
(``jobreport.early``: the controller first, then accounting) and, without ``--json``, its
answer is printed here too when it is single jobs or ids not returned (the full command's
refusal, exit 4). Anything else — other options, arrays, any error — goes to the full click
command (``slurm_gpu.cli.gpueff``), which decides and reports exactly as if this module did
not exist, reusing the answer already asked.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from slurm_gpu.config import Settings
    from slurm_gpu.errors import SlurmGpuError

#: Plain job ids and array tasks only; anything else (options, ranges) takes the full path.
_SIMPLE_ID = re.compile(r"[0-9]+(_[0-9]+)?")

#: The options this path takes, before the ids.
_FLAGS = ("--json", "--color", "--no-color")


def _from_files(
    settings: Settings, args: list[str], uid: int, *, as_json: bool, colour: bool
) -> str | None:
    """The output from the report files the collector wrote for this uid alone, when every id
    has one rendered under this release, these templates and these settings; else ``None``.
    Imports the standard library only."""
    if not settings.gpueff.cache_reports or uid == 0:
        return None
    from slurm_gpu.jobreport.reportcache import render_key
    from slurm_gpu.jobreport.reportfiles import read_reports, reports_root

    root = reports_root(settings.paths.state_dir, settings.gpueff.reports_dir)
    bodies = read_reports(root, uid, args, render_key(settings.gpueff))
    if bodies is None:
        return None
    if as_json:
        versions = {b.get("json_version") for b in bodies}
        if len(versions) != 1:
            return None
        import json

        # As the full command's ``jsonout.document`` and ``click.echo``.
        document = {
            "schema": "gpueff",
            "version": versions.pop(),
            "jobs": [b["job"] for b in bodies],
            "not_found": [],
        }
        return json.dumps(document, indent=2) + "\n"
    # As ``output.render_groups`` joins single-job reports.
    return "\n".join(b["colour" if colour else "plain"] for b in bodies)


def _cached(
    settings: Settings, args: list[str], uid: int, *, colour: bool | None = None
) -> str | None:
    """The output from the reports the collector rendered into the store (SQLite, or
    PostgreSQL read through libpq as the caller's own role), when every id has one rendered
    under this release, these templates and these settings; else ``None``. Imports the
    standard library only (``reportcache``, ``store.libpq``)."""
    if not settings.gpueff.cache_reports:
        return None
    from slurm_gpu.jobreport.reportcache import read_cached, read_cached_pg, render_key
    from slurm_gpu.jobreport.tty import use_colour
    from slurm_gpu.store.urls import libpq_conninfo, sqlite_path

    key, want_colour = render_key(settings.gpueff), use_colour(colour)
    path = sqlite_path(settings.store_url)
    if path is not None:
        texts = read_cached(path, args, uid, key, colour=want_colour)
    else:
        conninfo = libpq_conninfo(settings.store_url)
        if conninfo is None:
            return None
        texts = read_cached_pg(conninfo, args, uid, key, colour=want_colour)
    # As ``output.render_groups`` joins single-job reports.
    return None if texts is None else "\n".join(texts)


def fast_path(args: list[str], started: list[Any] | None = None) -> str | NotFound | None:
    """The full output for ``args`` when every id is the caller's own stored, settled single
    job; ``None`` when the full command must run instead. Never raises. With ``started``, an
    ordinary user's ids that no rendered report answers are asked of accounting at once
    (``jobreport.early``), the pending question is appended there for the full command, and
    its answer is rendered here when it needs nothing else (``NotFound`` for ids accounting
    did not return)."""
    uid = os.getuid()
    config_path = None
    if len(args) >= 2 and args[0] == "--config":
        config_path, args = args[1], args[2:]
    as_json = False
    flag: bool | None = None
    while args and args[0] in _FLAGS:
        if args[0] == "--json":
            as_json = True
        else:
            flag = args[0] == "--color"
        args = args[1:]
    if not args or not all(_SIMPLE_ID.fullmatch(a) for a in args):
        return None
    if os.environ.get("SLURM_GPU_DEBUG") == "1":
        return None
    try:
        from slurm_gpu.config import load_settings  # noqa: TID251 (a composition root reads the config)
        from slurm_gpu.jobreport.tty import use_colour

        settings = load_settings(config_path)
        colour = use_colour(flag)
        from_files = _from_files(settings, args, uid, as_json=as_json, colour=colour)
        if from_files is not None:
            return from_files
        if not as_json:
            cached = _cached(settings, args, uid, colour=colour)
            if cached is not None:
                return cached
        if uid != 0 and started is not None:
            # Nothing rendered for this user: accounting will be asked (a running job, one not
            # collected yet, another user's). Ask now, while the report code is imported.
            from slurm_gpu.jobreport import early

            started.append(early.start(settings, args))
        if as_json:
            return None  # rendered by the full command

        from slurm_gpu.jobreport import output, service
        from slurm_gpu.jobreport.readers import make_reader
        from slurm_gpu.jobreport.terminal import TerminalRenderer

        reader = make_reader(settings)
        # With the question asked early, its answer is rendered here too (a running job the
        # controller answered, a job accounting returned, an id it did not return): the full
        # command would print the same, after importing click. Any error or an array goes to
        # the full command, which takes the same early answer.
        accounting: Any = started[0] if started else service.NoAccounting()
        pending = service.start_lookup(args, accounting, reader, caller_uid=uid)
        if pending.asked_accounting and not started:
            return None
        found = pending.finish(min_elapsed_s=settings.gpueff.min_elapsed_s)
        if any(len(group) != 1 for _, group in found.groups):
            return None
        text = ""
        if found.groups:
            renderer = TerminalRenderer(
                colour=colour, template_dir=settings.gpueff.template_dir, cache=True
            )
            text = output.render_groups(renderer, found.groups)
        if found.missing:
            return NotFound(text, service.not_found_error(found.missing))
        return text
    except Exception:  # the full command reports every problem properly
        return None


@dataclass(frozen=True, slots=True)
class NotFound:
    """What the full command prints when accounting did not return some ids: the reports of
    the others on stdout, then the error's line and hint on stderr, and its exit code (4)."""

    stdout: str
    error: SlurmGpuError


def _leave(code: int) -> NoReturn:
    """End the process with ``code`` once what was written has reached its files (a flush
    that fails, such as to a reader gone, loses only that output; ``main`` chose the code).
    The interpreter's teardown is skipped: freeing every module the report imported is about
    an eighth of the fast path (``docs/performance.md``), and a finished command gains nothing
    from it. Nothing is left to do: the early question's thread has answered, and this path
    opens no file for writing."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):
            stream.flush()
    os._exit(code)


def main() -> None:
    """Console-script entry point."""
    # This path imports the report's modules, renders single jobs and ends the process
    # (``_leave``): what it allocates is bounded, so the cyclic collector's 38 young and 3
    # middle passes over the import-time objects (which freed 328 objects of a running job's
    # report, all freed by the process's end anyway) are not made: 8.8 ms less in the median
    # of 25 paired runs (docs/performance.md). The full command (a user's jobs over weeks)
    # runs with it.
    gc.disable()
    started: list[Any] = []
    text = fast_path(sys.argv[1:], started)
    if text is None:
        gc.enable()
        from slurm_gpu.cli.gpueff import main as full

        full(early=started[0] if started else None)
        return
    error = text.error if isinstance(text, NotFound) else None
    out = text.stdout if isinstance(text, NotFound) else text
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except BrokenPipeError:
        _leave(130)
    if error is not None:
        sys.stderr.write(error.lines("gpueff"))  # as ``guard.fail`` prints it
        _leave(error.exit_code)
    _leave(0)
