"""Render a ``WeeklyReport`` as one self-contained HTML page, or as a plain-text summary.

The page has no external assets (styles, charts and the tiny table-sorting script are inline),
so it opens offline, survives being mailed, and prints well (print CSS). Every string from
the store (user, account, partition, job and node names, finding codes) goes through jinja2's
autoescaping; only the SVG charts, produced here by matplotlib, are marked safe.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from slurm_gpu.analysis import energy as energy_fmt
from slurm_gpu.errors import ConfigError
from slurm_gpu.resources import data_dir
from slurm_gpu.weekly import charts
from slurm_gpu.weekly.model import CAUSES, REPORT_SCHEMA_VERSION, Headline, WeeklyReport

#: The project's built-in templates (``<repo>/templates/report``).
BUILTIN_DIR = data_dir("templates") / "report"


def _num(value: float | int | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def gh_digits(scale: float | None) -> int:
    """Decimals of every GPU-hour figure of a report whose allocated GPU-hours are ``scale``:
    enough to tell a test cluster's jobs of seconds apart, one on a site's weeks of thousands
    of hours. One precision for the whole report, so a column never mixes ``0.0`` with
    ``0.001`` and the headline agrees with the tables."""
    size = abs(scale or 0.0)
    return 1 if size >= 10 else 2 if size >= 1 else 3


def gh(value: float | None, digits: int | None = None) -> str:
    """GPU-hours with ``digits`` decimals (the report's, from ``gh_digits``); alone, as many as
    the value's own size needs."""
    if value is None or math.isnan(value):
        return "–"
    if digits is None:
        size = abs(value)
        digits = 1 if size >= 10 or size == 0 else 2 if size >= 0.1 else 3
    return f"{value:,.{digits}f}"


def _count(value: int | None, noun: str) -> str:
    """``1 job``, ``2 jobs``: a count and its noun, plural when the count is not one."""
    return f"{_num(value, 0)} {noun}{'' if value == 1 else 's'}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f} %"


def _date(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d")


def _datetime(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = round(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h:02d}h{m:02d}"
    if h:
        return f"{h}h{m:02d}"
    return f"{m}m{s:02d}s"


def _cause(cause: int | None) -> str:
    return "–" if cause is None else f"{cause}. {CAUSES.get(cause, '?')}"


def change(current: float | None, previous: float | None, *, points: bool = False) -> str:
    """The change from ``previous`` to ``current``: relative (%), or in points for percentages."""
    if current is None or previous is None:
        return "no previous data"
    if points:
        return f"{current - previous:+.1f} pts"
    if previous == 0:
        return "new" if current else "±0"
    return f"{100.0 * (current - previous) / previous:+.1f} %"


def headline_rows(cur: Headline, prev: Headline) -> list[dict[str, Any]]:
    """(label, value, unit, change, better-when) rows of the headline table. GPU-hours have
    the report's precision (``gh_digits``), as in its tables; energy its own unit (Wh below
    1 kWh), as in every report."""
    digits = gh_digits(cur.gpu_hours_allocated)
    energy_value, _, energy_unit = energy_fmt.kwh_text(cur.energy_kwh).partition(" ")

    def row(label: str, value: str, unit: str, delta: str, hint: str, key: str) -> dict[str, Any]:
        return {
            "label": label,
            "value": value,
            "unit": unit,
            "change": delta,
            "hint": hint,
            "key": key,
        }

    return [
        row(
            "GPU-hours allocated",
            gh(cur.gpu_hours_allocated, digits),
            "GPU·h",
            change(cur.gpu_hours_allocated, prev.gpu_hours_allocated),
            "",
            "allocated",
        ),
        row(
            "GPU-hours active",
            gh(cur.gpu_hours_active, digits),
            "GPU·h",
            change(cur.gpu_hours_active, prev.gpu_hours_active),
            "higher is better",
            "active",
        ),
        row(
            "GPU-hours wasted",
            gh(cur.gpu_hours_wasted, digits),
            "GPU·h",
            change(cur.gpu_hours_wasted, prev.gpu_hours_wasted),
            "lower is better",
            "wasted",
        ),
        row(
            "Median job duty cycle",
            _pct(cur.duty_cycle_median_pct),
            "",
            change(cur.duty_cycle_median_pct, prev.duty_cycle_median_pct, points=True),
            "higher is better",
            "median",
        ),
        row(
            "GPU-hour-weighted duty cycle",
            _pct(cur.duty_cycle_weighted_pct),
            "",
            change(cur.duty_cycle_weighted_pct, prev.duty_cycle_weighted_pct, points=True),
            "higher is better",
            "weighted",
        ),
        row(
            "GPU energy",
            energy_value if cur.energy_kwh is not None else "–",
            energy_unit or "kWh",
            change(cur.energy_kwh, prev.energy_kwh),
            "",
            "energy",
        ),
        row("GPU jobs", _num(cur.jobs, 0), "jobs", change(cur.jobs, prev.jobs), "", "jobs"),
        row(
            "Jobs with findings",
            _num(cur.jobs_with_findings, 0),
            "jobs",
            change(cur.jobs_with_findings, prev.jobs_with_findings),
            "lower is better",
            "findings",
        ),
    ]


def _filters() -> dict[str, Callable[..., Any]]:
    return {
        "num": _num,
        "count": _count,
        "gh": gh,
        "pct": _pct,
        "date": _date,
        "datetime": _datetime,
        "duration": _duration,
        "cause": _cause,
        "kwh": energy_fmt.kwh_text,
        "co2": energy_fmt.co2_text,
        "cost": energy_fmt.cost_text,
    }


def environment(override_dir: str = "") -> jinja2.Environment:
    """Templates from ``override_dir`` first (a site's own wording), then the built-in ones.

    Autoescaping is on for ``.html`` templates. Raises ``ConfigError`` for a missing override
    directory.
    """
    paths: list[str] = []
    if override_dir:
        if not Path(override_dir).is_dir():
            raise ConfigError(
                f"template override directory {override_dir} does not exist",
                key="report.template_dir",
                hint="create it or leave report.template_dir empty",
            )
        paths.append(override_dir)
    paths.append(str(BUILTIN_DIR))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(paths),
        autoescape=jinja2.select_autoescape(["html", "html.j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(_filters())
    return env


def _context(report: WeeklyReport) -> dict[str, Any]:
    return {
        "r": report,
        "headline": headline_rows(report.headline, report.previous_headline),
        "causes_named": CAUSES,
        "schema_version": REPORT_SCHEMA_VERSION,
    }


def _report_environment(report: WeeklyReport, template_dir: str) -> jinja2.Environment:
    """The templates with this report's one GPU-hour precision (``gh_digits``)."""
    env = environment(template_dir)
    digits = gh_digits(report.headline.gpu_hours_allocated)
    env.filters["gh"] = lambda value: gh(value, digits)
    return env


def render_html(report: WeeklyReport, *, template_dir: str = "") -> str:
    """The report as a self-contained HTML document."""
    env = _report_environment(report, template_dir)
    # The charts are our own markup, generated from numbers; the only strings in them are
    # GPU model and partition names, which matplotlib escapes when it writes the SVG text.
    svgs = {
        "histogram": Markup(charts.histogram_svg(report.histogram)),
        "by_model": Markup(charts.usage_svg(report.by_gpu_model, "by-model", "GPU model"))
        if report.by_gpu_model
        else None,
        "by_partition": Markup(charts.usage_svg(report.by_partition, "by-partition", "partition"))
        if report.by_partition
        else None,
        "causes": Markup(charts.causes_svg(report.causes)),
        "trend": Markup(charts.trend_svg(report.trend)),
    }
    return env.get_template("weekly.html.j2").render(**_context(report), charts=svgs)


def render_text(report: WeeklyReport, *, template_dir: str = "") -> str:
    """A plain-text summary of the report (the text part of the e-mail)."""
    env = _report_environment(report, template_dir)
    return env.get_template("weekly.txt.j2").render(**_context(report))
