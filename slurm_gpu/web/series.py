"""A stored job's timelines as chart series, and its idle phases: what the web page draws.

Pure: the store's node records in, frozen series out. Every chart of a job shares its time
axis per node (the sampler's downsampled timeline, ``records.TimelinePoint``), so a page can
draw the GPUs' duty cycle, memory and power and the job's CPU and memory of one node one
above the other with the same idle phases shaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from slurm_gpu.records import NodeRecord

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Line:
    """One series of a chart: a label and one value per time point (``None``: not read)."""

    label: str
    values: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart of one node: a title, a unit, time points and lines over them."""

    key: str
    """``duty``, ``memory``, ``power``, ``cpu`` or ``rss``."""
    title: str
    unit: str
    t_s: tuple[float, ...]
    """Bucket starts, seconds since the epoch."""
    lines: tuple[Line, ...]
    idle: tuple[tuple[float, float], ...]
    """Idle phases, ``(from_s, to_s)``: spans when every GPU of the node was idle."""
    max_value: float | None = None
    """The axis' top when it has a natural one (100 % duty cycle); else the data's."""

    @property
    def points(self) -> int:
        """Values held, all lines together (the browser tests count them)."""
        return sum(sum(v is not None for v in line.values) for line in self.lines)


@dataclass(frozen=True, slots=True)
class NodeCharts:
    """The charts of one node of the job."""

    host: str
    charts: tuple[Chart, ...]


def idle_spans(
    t_s: Sequence[float],
    width_s: Sequence[float],
    utils: Sequence[Sequence[float | None]],
    threshold_pct: float,
) -> tuple[tuple[float, float], ...]:
    """Spans of consecutive buckets where every GPU read was at or below ``threshold_pct``
    (a bucket no GPU was read in ends a span): the idle head, tail and phases."""
    spans: list[tuple[float, float]] = []
    start: float | None = None
    end = 0.0
    for t, w, per_gpu in zip(t_s, width_s, utils, strict=True):
        read = [u for u in per_gpu if u is not None]
        idle = bool(read) and all(u <= threshold_pct for u in read)
        if idle:
            if start is None:
                start = t
            end = t + w
        elif start is not None:
            spans.append((start, end))
            start = None
    if start is not None:
        spans.append((start, end))
    return tuple(spans)


def _gpu_label(rec: NodeRecord, i: int) -> str:
    info = rec.gpus[i].info if i < len(rec.gpus) else None
    if info is None:
        return f"GPU {i}"
    slot = info.minor_number if info.minor_number is not None else info.index
    return f"GPU {slot}"


def _per_gpu_lines(rec: NodeRecord) -> Callable[..., tuple[Line, ...]]:
    """``lines(attr, scale)``: one line per GPU of ``rec`` from a per-GPU timeline column."""

    def lines(attr: str, scale: float = 1.0) -> tuple[Line, ...]:
        out = []
        for i in range(len(rec.gpus)):
            values: list[float | None] = []
            for p in rec.timeline:
                col = getattr(p, attr)
                v = col[i] if i < len(col) else None
                values.append(None if v is None else float(v) / scale)
            out.append(Line(_gpu_label(rec, i), tuple(values)))
        return tuple(out)

    return lines


def node_charts(records: Iterable[NodeRecord], idle_threshold_pct: float) -> tuple[NodeCharts, ...]:
    """Per node (in name order) its five charts; nodes without a timeline are left out."""
    out: list[NodeCharts] = []
    for rec in sorted(records, key=lambda r: r.hostname):
        tl = rec.timeline
        if not tl:
            continue
        t = tuple(p.t_s for p in tl)
        widths = [p.width_s for p in tl]

        lines_of = _per_gpu_lines(rec)
        idle = idle_spans(t, widths, [p.gpu_utilization_pct for p in tl], idle_threshold_pct)
        cpu = Line("cores busy", tuple(p.host_cpu_cores for p in tl))
        rss = Line(
            "resident",
            tuple(None if p.host_rss_max_bytes is None else p.host_rss_max_bytes / GIB for p in tl),
        )
        charts = (
            Chart("duty", "GPU duty cycle", "%", t, lines_of("gpu_utilization_pct"), idle, 100.0),
            Chart(
                "memory",
                "GPU memory used",
                "GiB",
                t,
                lines_of("gpu_memory_used_max_bytes", GIB),
                idle,
            ),
            Chart("power", "GPU power", "W", t, lines_of("gpu_power_w"), idle),
            Chart("cpu", "Job CPU cores busy", "cores", t, (cpu,), idle),
            Chart("rss", "Job memory", "GiB", t, (rss,), idle),
        )
        out.append(NodeCharts(rec.hostname, charts))
    return tuple(out)


def chart_json(chart: Chart) -> dict[str, object]:
    """A chart as the page's script reads it (uPlot's column layout: times, then lines)."""
    return {
        "key": chart.key,
        "title": chart.title,
        "unit": chart.unit,
        "t": list(chart.t_s),
        "lines": [{"label": line.label, "values": list(line.values)} for line in chart.lines],
        "idle": [list(span) for span in chart.idle],
        "max": chart.max_value,
        "points": chart.points,
    }
