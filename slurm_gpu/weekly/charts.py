"""Inline SVG charts for the weekly report, drawn with matplotlib (Agg, no display).

Each function takes report records and returns one ``<svg>`` element as text, ready to be
placed in the page. Text stays text (``svg.fonttype = 'none'``) so the page's fonts apply and
the labels are searchable and selectable. Colours differ in lightness as well as hue, and the
"wasted" series is hatched, so every chart still reads when printed in greyscale.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: never open a display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from slurm_gpu.weekly.model import (
    CauseShare,
    GroupUsage,
    HistogramBin,
    TrendWeek,
)

#: Dark for useful work, light and hatched for waste: distinct in greyscale.
ACTIVE_COLOUR = "#1f4e79"
WASTED_COLOUR = "#f4b183"
WASTED_HATCH = "///"
LINE_COLOUR = "#000000"

_STYLE: Any = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#d9d9d9",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "hatch.color": "#7f3f00",
    "hatch.linewidth": 0.8,
}


def _to_svg(fig: Figure, name: str) -> str:
    """Serialise ``fig`` as an inline ``<svg>`` whose ids cannot clash with other charts."""
    buf = io.StringIO()
    # The salt makes matplotlib's generated ids (clip paths, hatch patterns) unique per
    # chart, so several charts can share one HTML document; it also makes output repeatable.
    with plt.rc_context({"svg.hashsalt": name}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    # Keep the natural size (every chart then shows its text at the same size); the page's
    # CSS only shrinks a chart to fit a narrow window.
    return svg.replace(
        "<svg", f'<svg class="chart" role="img" aria-labelledby="{name}-title"', 1
    ).replace(">", f'><title id="{name}-title">{_TITLES.get(name, name)}</title>', 1)


_TITLES = {
    "histogram": "Job duty cycle, weighted by allocated GPU-hours",
    "by-model": "GPU-hours by GPU model",
    "by-partition": "GPU-hours by partition",
    "causes": "Wasted GPU-hours by cause",
    "trend": "Weekly GPU-hours and duty cycle",
}


def _figure(width_in: float, height_in: float) -> tuple[Figure, Axes]:
    fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=100)
    return fig, ax


def histogram_svg(bins: Sequence[HistogramBin]) -> str:
    """Bars of allocated GPU-hours per duty-cycle bin (x: duty cycle %, y: GPU-hours)."""
    with plt.rc_context(_STYLE):
        fig, ax = _figure(7.5, 3.0)
        lefts = [b.lo_pct for b in bins]
        widths = [b.hi_pct - b.lo_pct for b in bins]
        heights = [b.gpu_hours_allocated for b in bins]
        ax.bar(
            lefts,
            heights,
            width=widths,
            align="edge",
            color=ACTIVE_COLOUR,
            edgecolor="white",
            linewidth=0.8,
        )
        ax.set_xlim(0, 100)
        ax.set_xticks(range(0, 101, 10))
        ax.set_xlabel("Job duty cycle (% of time a kernel ran)")
        ax.set_ylabel("Allocated GPU-hours")
        ax.grid(axis="x", visible=False)
        return _to_svg(fig, "histogram")


def usage_svg(groups: Sequence[GroupUsage], name: str, what: str) -> str:
    """Horizontal stacked bars per group: active GPU-hours (dark) + wasted (hatched)."""
    shown = list(groups)[:12]
    with plt.rc_context(_STYLE):
        fig, ax = _figure(7.5, 0.8 + 0.38 * max(1, len(shown)))
        labels = [_short(g.key) for g in shown][::-1]
        active = [g.gpu_hours_active for g in shown][::-1]
        wasted = [g.gpu_hours_wasted for g in shown][::-1]
        rest = [
            max(0.0, g.gpu_hours_allocated - g.gpu_hours_active - g.gpu_hours_wasted) for g in shown
        ][::-1]
        ax.barh(labels, active, color=ACTIVE_COLOUR, label="active")
        ax.barh(
            labels,
            wasted,
            left=active,
            color=WASTED_COLOUR,
            hatch=WASTED_HATCH,
            edgecolor="#7f3f00",
            linewidth=0.5,
            label="wasted (idle)",
        )
        ax.barh(
            labels,
            rest,
            left=[a + w for a, w in zip(active, wasted, strict=True)],
            color="#d9d9d9",
            edgecolor="#7f7f7f",
            linewidth=0.5,
            label="partly busy or no telemetry",
        )
        ax.set_xlabel(f"Allocated GPU-hours by {what}")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False, fontsize=9)
        return _to_svg(fig, name)


def causes_svg(causes: Sequence[CauseShare]) -> str:
    """Horizontal bars of wasted GPU-hours per cause, in cause order."""
    with plt.rc_context(_STYLE):
        fig, ax = _figure(7.5, 0.8 + 0.38 * max(1, len(causes)))
        labels = [(f"{c.cause}. " if c.cause else "") + c.label for c in causes][::-1]
        values = [c.gpu_hours_wasted for c in causes][::-1]
        ax.barh(
            labels,
            values,
            color=WASTED_COLOUR,
            hatch=WASTED_HATCH,
            edgecolor="#7f3f00",
            linewidth=0.5,
        )
        ax.set_xlabel("Wasted GPU-hours")
        ax.grid(axis="y", visible=False)
        return _to_svg(fig, "causes")


def trend_svg(weeks: Sequence[TrendWeek]) -> str:
    """Weekly stacked bars (active + wasted GPU-hours) and the weighted duty cycle as a line."""
    with plt.rc_context(_STYLE):
        fig, ax = _figure(7.5, 3.0)
        labels = [datetime.fromtimestamp(w.since_s, UTC).strftime("%d %b") for w in weeks]
        x = list(range(len(weeks)))
        active = [w.gpu_hours_active for w in weeks]
        wasted = [w.gpu_hours_wasted for w in weeks]
        unmeasured = [
            max(0.0, w.gpu_hours_allocated - w.gpu_hours_active - w.gpu_hours_wasted) for w in weeks
        ]
        ax.bar(x, active, color=ACTIVE_COLOUR, label="active")
        ax.bar(
            x,
            wasted,
            bottom=active,
            color=WASTED_COLOUR,
            hatch=WASTED_HATCH,
            edgecolor="#7f3f00",
            linewidth=0.5,
            label="wasted",
        )
        if any(unmeasured):
            ax.bar(
                x,
                unmeasured,
                bottom=[a + w for a, w in zip(active, wasted, strict=True)],
                color="#d9d9d9",
                edgecolor="#7f7f7f",
                linewidth=0.5,
                label="partly busy or no telemetry",
            )
        ax.set_xticks(x, labels)
        ax.set_xlabel("Week starting (UTC)")
        ax.set_ylabel("GPU-hours")
        ax.grid(axis="x", visible=False)
        right = ax.twinx()
        duty = [w.duty_cycle_weighted_pct for w in weeks]
        right.plot(
            [i for i, d in zip(x, duty, strict=True) if d is not None],
            [d for d in duty if d is not None],
            color=LINE_COLOUR,
            marker="o",
            linestyle="--",
            linewidth=1.5,
            label="duty cycle (right axis)",
        )
        right.set_ylim(0, 100)
        right.set_ylabel("Weighted duty cycle (%)")
        right.grid(False)
        right.spines["right"].set_visible(True)
        handles, names = ax.get_legend_handles_labels()
        h2, n2 = right.get_legend_handles_labels()
        ax.legend(
            handles + h2,
            names + n2,
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            frameon=False,
            fontsize=8,
            ncol=4,
        )
        tops = [a + w + u for a, w, u in zip(active, wasted, unmeasured, strict=True)]
        ax.set_ylim(0, max([*tops, 1.0]) * 1.1)
        return _to_svg(fig, "trend")


def _short(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
