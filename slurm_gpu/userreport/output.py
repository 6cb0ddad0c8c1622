"""What ``gpueff`` writes for a set of found jobs, shared by its click command and its fast
entry point (``slurm_gpu.cli.gpueff_entry``) so both print the same bytes."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from slurm_gpu.userreport.model import JobReport
from slurm_gpu.userreport.terminal import TerminalRenderer


def use_colour(flag: bool | None) -> bool:
    """Colour when asked, else on a terminal unless ``NO_COLOR`` is set or ``TERM=dumb``."""
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def render_groups(
    renderer: TerminalRenderer, groups: Sequence[tuple[str, Sequence[JobReport]]]
) -> str:
    """One full report per single job, a table per array; a blank line between them."""
    parts = []
    for typed, group in groups:
        if len(group) == 1:
            parts.append(renderer.report(group[0]))
        else:
            parts.append(
                f"Array {typed}: {len(group)} tasks\n"
                + renderer.table(group)
                + f"(gpueff {typed}_N shows one task in full)\n"
            )
    return "\n".join(parts)
