"""The utilization chart of the e-mail after a job: one PNG, every GPU's duty cycle over time.

matplotlib is imported here and only here on the mail path, lazily (``gpueff`` never imports
this module). PNG, not SVG: mail clients drop SVG images.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.jobreport.model import JobReport


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart of a job as an inline image: its Content-ID (without angle brackets), PNG
    bytes and alt text. The report draws it; the e-mail (``notify.message``) attaches it."""

    cid: str
    png: bytes
    alt: str


#: Distinct in lightness as well as hue, so lines stay apart when printed in greyscale.
_COLOURS = ("#1f4e79", "#c55a11", "#548235", "#7030a0", "#000000", "#bf9000", "#2e75b6", "#843c0c")


#: The y axis starts below 0 % so that an idle GPU's line (at 0 %) is drawn above the x axis,
#: not hidden in it.
Y_MIN_PCT = -6.0


def utilization_figure(report: JobReport, *, width_px: int = 640, height_px: int = 220) -> Any:
    """The chart as a matplotlib ``Figure`` (laid out, not yet saved): each GPU's duty cycle
    over the job (x: minutes since start), the legend above the plot, never over a line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    ax = fig.add_subplot()
    minutes = max(report.elapsed_s, 1) / 60.0
    for i, g in enumerate(report.gpus):
        values = g.spark_pct
        if not values:
            continue
        step = minutes / len(values)
        xs = [step * (k + 0.5) for k in range(len(values))]
        ys = [float("nan") if v is None else v for v in values]
        ax.plot(
            xs,
            ys,
            color=_COLOURS[i % len(_COLOURS)],
            linewidth=1.6,
            label=f"{g.node}:{g.slot if g.slot is not None else i}",
            zorder=3,
        )
    ax.set_ylim(Y_MIN_PCT, 105)
    ax.set_yticks([0, 25, 50, 75, 100])
    ax.set_xlim(0, minutes)
    ax.set_ylabel("busy %")
    ax.set_xlabel("minutes since start")
    ax.grid(True, color="#dddddd", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if len(report.gpus) > 1:
        # Above the plotting area: over the lines it would hide a busy GPU's line.
        ax.legend(
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            fontsize=8,
            frameon=False,
            ncol=min(6, len(report.gpus)),
            borderaxespad=0.2,
        )
    fig.tight_layout()
    return fig


def utilization_png(report: JobReport, *, width_px: int = 640, height_px: int = 220) -> bytes:
    """PNG bytes of ``utilization_figure``."""
    fig = utilization_figure(report, width_px=width_px, height_px=height_px)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def charts_for(report: JobReport) -> Sequence[Chart]:
    """The charts of one job's message: none when there is nothing to draw."""
    if not report.has_gpu_numbers or not any(g.spark_pct for g in report.gpus):
        return ()
    cid = f"util-{report.job_id}@slurm-gpu"
    alt = f"GPU utilization of job {report.job_id_display} over time"
    return (Chart(cid=cid, png=utilization_png(report), alt=alt),)
