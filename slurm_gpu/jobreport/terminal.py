"""Render ``JobReport`` view models as terminal text (``gpueff``), with optional colour."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jinja2

from slurm_gpu.jobreport.model import (
    LIVE_SOURCE_PROMETHEUS,
    LIVE_SOURCE_SPOOL,
    JobReport,
    TelemetryStatus,
)
from slurm_gpu.jobreport.templating import environment

_ANSI = {
    "bold": "\x1b[1m",
    "dim": "\x1b[2m",
    "good": "\x1b[32m",
    "warn": "\x1b[33m",
    "bad": "\x1b[31m",
}
_RESET = "\x1b[0m"

_STATUS_LABEL = {
    TelemetryStatus.FINAL: "final, from the job's sealed record",
    TelemetryStatus.LIVE: "LIVE: the job is still running, numbers so far",
    TelemetryStatus.PENDING: "the job's record has not been collected yet: numbers from the "
    "node's last live summary",
}
_LIVE_SOURCE = {
    LIVE_SOURCE_SPOOL: "from the node's live summary",
    LIVE_SOURCE_PROMETHEUS: "from Prometheus",
}


def status_label(report: JobReport, now_s: float | None = None) -> str:
    """The words after "GPUs": final or live, and for live numbers where they came from and
    how old they are (``live, from Prometheus, 42 s old``)."""
    label = _STATUS_LABEL.get(report.telemetry, report.telemetry.value)
    if report.telemetry not in (TelemetryStatus.LIVE, TelemetryStatus.PENDING):
        return label
    parts = [label]
    if report.live_source in _LIVE_SOURCE and report.telemetry is TelemetryStatus.LIVE:
        parts.append(_LIVE_SOURCE[report.live_source])
    if report.live_updated_s is not None:
        now = time.time() if now_s is None else now_s
        parts.append(f"{max(0, round(now - report.live_updated_s))} s old")
    return "; ".join(parts[:1]) + ("; " + ", ".join(parts[1:]) if parts[1:] else "")


def colourer(enabled: bool) -> Callable[[object, str], str]:
    """``c(text, style)`` for templates: ANSI-wrapped when enabled, plain otherwise."""

    def c(text: object, style: str) -> str:
        if not enabled or style not in _ANSI:
            return str(text)
        return f"{_ANSI[style]}{text}{_RESET}"

    return c


def _duty_style(value: float | None) -> str:
    if value is None:
        return "dim"
    if value < 25:
        return "bad"
    if value < 60:
        return "warn"
    return "good"


def _state_style(state: str) -> str:
    if state == "COMPLETED":
        return "good"
    if state in ("RUNNING", "PENDING", "COMPLETING"):
        return "warn"
    return "bad"


def _severity_style(severity: str) -> str:
    return {"critical": "bad", "warning": "warn"}.get(severity, "dim")


class TerminalRenderer:
    """Renders reports through ``templates/gpueff`` (or a site's override directory)."""

    def __init__(
        self, *, colour: bool, template_dir: str = "", cache: bool = False, debug: bool = False
    ) -> None:
        """``cache``: keep compiled templates in ``templating.compiled_cache()``; ``debug``:
        also show each finding's evidence by the analysis's keys (``--debug``)."""
        self._debug = debug
        self._env = environment("gpueff", override_dir=template_dir, cache=cache)
        self._c = colourer(colour)
        # Looked up once: jinja2 checks the file on disk at every get_template, which the
        # collector (one report per stored job) would pay thousands of times.
        self._report_template: jinja2.Template | None = None

    def prepare(self) -> None:
        """Load and compile the templates now rather than at the first render (``gpueff``
        does it while accounting answers)."""
        for name in ("report.txt.j2", "table.txt.j2"):
            self._env.get_template(name)

    def report(self, report: JobReport) -> str:
        """One job's full report."""
        if self._report_template is None:
            self._report_template = self._env.get_template("report.txt.j2")
        return self._report_template.render(
            r=report,
            c=self._c,
            state_style=_state_style(report.state),
            status_label=status_label(report),
            duty_style=_duty_style,
            severity_style=_severity_style,
            severity_mark={"critical": "!!", "warning": "!", "info": "i"},
            debug=self._debug,
        )

    def table(self, reports: Sequence[JobReport]) -> str:
        """One line per job, for ``gpueff --user``."""
        return self._env.get_template("table.txt.j2").render(rows=reports, c=self._c)
