"""Static SVG line charts: the page's charts without JavaScript.

Each chart is a ``viewBox``-scaled SVG (it shrinks to a 375 px screen), with the idle phases
as grey bands behind the lines, one ``<polyline>`` per line (a gap where a value was not
read breaks it), the axis' top value and the time span written out, and a ``<title>`` for
screen readers. Every text is escaped; the numbers are ours.
"""

from __future__ import annotations

from markupsafe import Markup, escape

from slurm_gpu.web.series import Chart

WIDTH, HEIGHT = 640, 180
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 44, 8, 10, 22

#: Line colours that differ in lightness too, so that they read in greyscale; dashes repeat
#: them past eight lines.
COLOURS = ("#1f5fa8", "#d46a00", "#2a8a3e", "#8e3b9e", "#b8860b", "#0f8a8a", "#c0392b", "#555")


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def chart_svg(chart: Chart, element_id: str) -> Markup:
    """The chart as inline SVG markup."""
    t = chart.t_s
    values = [v for line in chart.lines for v in line.values if v is not None]
    top = chart.max_value or (max(values) if values else 1.0) or 1.0
    t0 = t[0] if t else 0.0
    t1 = t[-1] if t else 1.0
    span = (t1 - t0) or 1.0
    w = WIDTH - PAD_LEFT - PAD_RIGHT
    h = HEIGHT - PAD_TOP - PAD_BOTTOM

    def x(ts: float) -> float:
        return PAD_LEFT + w * (min(max(ts, t0), t1) - t0) / span

    def y(v: float) -> float:
        return PAD_TOP + h * (1.0 - min(max(v / top, 0.0), 1.0))

    parts = [
        f'<svg id="{escape(element_id)}" class="chart-svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-labelledby="{escape(element_id)}-title" '
        f'data-points="{chart.points}" preserveAspectRatio="none">',
        f'<title id="{escape(element_id)}-title">{escape(chart.title)} ({escape(chart.unit)})'
        f"</title>",
    ]
    for a, b in chart.idle:
        parts.append(
            f'<rect class="idle" x="{x(a):.1f}" y="{PAD_TOP}" width="{max(x(b) - x(a), 1.0):.1f}" '
            f'height="{h}" fill="#e3e3e3"><title>idle</title></rect>'
        )
    parts.append(
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + h}" x2="{WIDTH - PAD_RIGHT}" y2="{PAD_TOP + h}" '
        f'stroke="#999" stroke-width="1"/>'
    )
    parts.append(
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 8}" text-anchor="end" font-size="11">'
        f"{escape(_fmt(top))}</text>"
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + h}" text-anchor="end" font-size="11">0</text>'
        f'<text x="{PAD_LEFT}" y="{HEIGHT - 6}" font-size="11">0:00</text>'
        f'<text x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 6}" text-anchor="end" font-size="11">'
        f"{escape(_duration(span))}</text>"
    )
    for k, line in enumerate(chart.lines):
        colour = COLOURS[k % len(COLOURS)]
        dash = ' stroke-dasharray="6 3"' if k >= len(COLOURS) else ""
        runs: list[list[str]] = [[]]
        for ts, v in zip(t, line.values, strict=True):
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(ts):.1f},{y(v):.1f}")
        for run in runs:
            if not run:
                continue
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
                continue
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
                f'points="{" ".join(run)}"><title>{escape(line.label)}</title></polyline>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))
