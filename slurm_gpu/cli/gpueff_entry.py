"""The ``gpueff`` console script: a click-free fast path for the common case.

``gpueff 1234`` on the caller's own finished, collected job is answered from the store alone
(Slurm always shows users their own jobs; see docs/gpueff.md, "Who can see what"). That case
pays for nothing else, not even click's import (~17 ms of a ~130 ms run). Anything else —
options, other users' jobs, running jobs, arrays, a job accounting must be asked about, any
error — goes to the full click command (``slurm_gpu.cli.gpueff``), which decides and reports
exactly as if this module did not exist.
"""

from __future__ import annotations

import os
import re
import sys

#: Plain job ids and array tasks only; anything else (options, ranges) takes the full path.
_SIMPLE_ID = re.compile(r"[0-9]+(_[0-9]+)?")


class _AccountingNeeded(Exception):
    """Raised by the stand-in accounting: this run must take the full path."""


class _NoAccounting:
    """Accounting for the fast path: being asked at all means the fast path does not apply."""

    name = "none"

    def get_jobs(self, job_ids: object) -> dict[str, object]:
        raise _AccountingNeeded

    def jobs_between(self, *args: object, **kwargs: object) -> list[object]:
        raise _AccountingNeeded


def fast_path(args: list[str]) -> str | None:
    """The full output for ``args`` when every id is the caller's own stored, settled single
    job; ``None`` when the full command must run instead. Never raises."""
    uid = os.getuid()
    config_path = None
    if len(args) >= 2 and args[0] == "--config":
        config_path, args = args[1], args[2:]
    if not args or uid == 0 or not all(_SIMPLE_ID.fullmatch(a) for a in args):
        return None
    if os.environ.get("SLURM_GPU_DEBUG") == "1":
        return None
    try:
        from slurm_gpu.config import load_settings
        from slurm_gpu.userreport import output, service
        from slurm_gpu.userreport.readers import make_reader
        from slurm_gpu.userreport.terminal import TerminalRenderer

        settings = load_settings(config_path)
        reader = make_reader(settings)
        pending = service.start_lookup(args, _NoAccounting(), reader, caller_uid=uid)  # type: ignore[arg-type]
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
