"""The e-mail's chart: the legend never covers the plotted lines, and an idle GPU's line
(0 %) is drawn above the x axis, not hidden in it."""

from __future__ import annotations

import gpueff_factory as F

from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.charts import utilization_figure


def _figure():  # type: ignore[no-untyped-def]
    gpus = adapter.gpu_lines_from_records(
        [F.node_record(utils=([95.0] * 60, [0.0] * 60))], spark_points=60
    )
    report = adapter.with_telemetry(adapter.accounting_report(F.job()), gpus, live=False)
    fig = utilization_figure(report)
    fig.canvas.draw()
    return fig, fig.axes[0]


def test_the_legend_is_outside_the_plotting_area() -> None:
    _, ax = _figure()
    legend = ax.get_legend()
    assert legend is not None
    box = legend.get_window_extent()
    plot = ax.get_window_extent()
    assert box.y0 >= plot.y1 - 1, (box, plot)  # above the axes: over no line


def test_an_idle_gpus_line_is_above_the_x_axis() -> None:
    _, ax = _figure()
    low, _ = ax.get_ylim()
    assert low < 0  # the 0 % line is drawn inside the axes, not on its edge
