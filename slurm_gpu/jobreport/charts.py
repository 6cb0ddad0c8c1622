"""The utilization chart of the e-mail after a job: one PNG, every GPU's duty cycle over time.

matplotlib is imported here and only here on the mail path, lazily (``gpueff`` never imports
this module). PNG, not SVG: mail clients drop SVG images.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

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


def utilization_png(report: JobReport, *, width_px: int = 640, height_px: int = 220) -> bytes:
    """PNG bytes of each GPU's duty cycle over the job (x: minutes since start)."""
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
        )
    ax.set_ylim(0, 105)
    ax.set_xlim(0, minutes)
    ax.set_ylabel("busy %")
    ax.set_xlabel("minutes since start")
    ax.grid(True, color="#dddddd", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if len(report.gpus) > 1:
        ax.legend(loc="upper right", fontsize=8, frameon=False, ncol=min(4, len(report.gpus)))
    fig.tight_layout()
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
