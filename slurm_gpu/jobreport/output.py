"""What ``gpueff`` writes for a set of found jobs, shared by its click command and its fast
entry point (``slurm_gpu.cli.gpueff_entry``) so both print the same bytes."""

from __future__ import annotations

from collections.abc import Sequence

from slurm_gpu.jobreport.arrays import summarize, summary_lines
from slurm_gpu.jobreport.model import JobReport
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.jobreport.tty import use_colour as use_colour


def render_groups(
    renderer: TerminalRenderer, groups: Sequence[tuple[str, Sequence[JobReport]]]
) -> str:
    """One full report per single job, a table per array (or range of tasks) with the tasks'
    summary under it; a blank line between them."""
    parts = []
    for typed, group in groups:
        if len(group) == 1:
            parts.append(renderer.report(group[0]))
        else:
            parts.append(
                f"Array {typed}: {len(group)} tasks\n"
                + renderer.table(group)
                + "".join(f"{line}\n" for line in summary_lines(summarize(group)))
                + f"(gpueff {typed.split('_', 1)[0]}_N shows one task in full)\n"
            )
    return "\n".join(parts)
