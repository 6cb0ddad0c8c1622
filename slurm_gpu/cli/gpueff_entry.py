"""The ``gpueff`` console script: a click-free fast path for the common case.

``gpueff 1234`` on the caller's own finished, collected job is answered from the store alone
(Slurm always shows users their own jobs; see docs/gpueff.md, "Who can see what"). That case
pays for nothing else, not even click's import; when the collector has rendered the job's
report into a SQLite store (``[gpueff] cache_reports``), it prints that text after one indexed
read, without importing the report code or jinja2 (``reportcache``). Anything else —
options, other users' jobs, running jobs, arrays, a job accounting must be asked about, any
error — goes to the full click command (``slurm_gpu.cli.gpueff``), which decides and reports
exactly as if this module did not exist.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurm_gpu.config import Settings

#: Plain job ids and array tasks only; anything else (options, ranges) takes the full path.
_SIMPLE_ID = re.compile(r"[0-9]+(_[0-9]+)?")


def _cached(settings: Settings, args: list[str], uid: int) -> str | None:
    """The output from the reports the collector rendered into a SQLite store, when every id
    has one rendered under this release, these templates and these settings; else ``None``.
    Imports the standard library only (``reportcache``)."""
    if not settings.gpueff.cache_reports:
        return None
    from slurm_gpu.store.urls import sqlite_path

    path = sqlite_path(settings.store_url)
    if path is None:
        return None
    from slurm_gpu.jobreport.reportcache import read_cached, render_key
    from slurm_gpu.jobreport.tty import use_colour

    texts = read_cached(path, args, uid, render_key(settings.gpueff), colour=use_colour(None))
    # As ``output.render_groups`` joins single-job reports.
    return None if texts is None else "\n".join(texts)


def fast_path(args: list[str]) -> str | None:
    """The full output for ``args`` when every id is the caller's own stored, settled single
    job; ``None`` when the full command must run instead. Never raises."""
    uid = os.getuid()
    config_path = None
    if len(args) >= 2 and args[0] == "--config":
        config_path, args = args[1], args[2:]
    if not args or not all(_SIMPLE_ID.fullmatch(a) for a in args):
        return None
    if os.environ.get("SLURM_GPU_DEBUG") == "1":
        return None
    try:
        from slurm_gpu.config import load_settings  # noqa: TID251 (a composition root reads the config)

        settings = load_settings(config_path)
        cached = _cached(settings, args, uid)
        if cached is not None:
            return cached

        from slurm_gpu.jobreport import output, service
        from slurm_gpu.jobreport.readers import make_reader
        from slurm_gpu.jobreport.terminal import TerminalRenderer

        reader = make_reader(settings)
        pending = service.start_lookup(args, service.NoAccounting(), reader, caller_uid=uid)
        if pending.asked_accounting:
            return None
        found = pending.finish(min_elapsed_s=settings.gpueff.min_elapsed_s)
        if found.missing or any(len(group) != 1 for _, group in found.groups):
            return None
        renderer = TerminalRenderer(
            colour=output.use_colour(None), template_dir=settings.gpueff.template_dir, cache=True
        )
        return output.render_groups(renderer, found.groups)
    except Exception:  # the full command reports every problem properly
        return None


def main() -> None:
    """Console-script entry point."""
    text = fast_path(sys.argv[1:])
    if text is None:
        from slurm_gpu.cli.gpueff import main as full

        full()
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        sys.exit(130)
