"""The per-job web page: a Flask application over ``gpueff``'s report (``docs/web.md``).

``/job/<id>`` shows everything ``gpueff <id>`` shows (header, per-GPU table, energy,
findings, live policy actions, recommended request) from the same lookup
(``jobreport.service``), then the job's timelines per node: static SVG charts rendered here,
which the page's script turns into interactive uPlot charts (zoom by dragging) when
JavaScript runs. An array's tasks stand side by side. ``/`` lists the viewer's recent jobs.

Visibility is the server's: a job is looked up through accounting as ``gpueff`` does, and,
when the page serves many viewers from one account, filtered by Slurm's rule
(``web.access``); a job the viewer may not see is a 404, the same page as a job that does
not exist.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, abort, g, render_template, request
from jinja2 import FileSystemLoader
from markupsafe import Markup

from slurm_gpu.config import Settings
from slurm_gpu.errors import SlurmGpuError, StoreError, UsageError
from slurm_gpu.jobreport import service
from slurm_gpu.jobreport.model import JobReport, TelemetryStatus
from slurm_gpu.jobreport.templating import BUILTIN_DIR, filters
from slurm_gpu.jobreport.terminal import status_label
from slurm_gpu.records import NodeRecord
from slurm_gpu.store.visibility import Visibility
from slurm_gpu.web import access, series, svg

#: The page's own files and the chart library unpacked at install time (``docs/web.md``).
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
#: uPlot, unpacked from its npm package by ``share/web/fetch-uplot``; without it the page
#: keeps its static charts.
UPLOT_JS = os.path.join(STATIC_DIR, "vendor", "uplot", "uPlot.iife.min.js")

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
)


@dataclass(frozen=True)
class Backends:
    """Where the page's answers come from; the tests plug in their own."""

    accounting: Callable[[], Any]
    """A new ``AccountingSource`` for one request."""
    reader: Callable[[], Any]
    """A new ``TelemetryReader`` (with ``close``) for one request."""
    timelines: Callable[[str], Sequence[NodeRecord]]
    """The full node records (every timeline column) of a stored job; ``()`` when none."""
    visibility: Callable[[], Visibility]
    """Slurm's visibility facts (service deployments)."""
    now: Callable[[], float] = field(default=time.time)


def default_backends(settings: Settings) -> Backends:
    """The real backends: accounting and the store as ``gpueff`` opens them, Slurm's
    visibility read at most every five minutes."""
    from slurm_gpu.jobreport.readers import (
        StoreAndSpoolReader,
        make_accounting,
        open_store_reader,
    )

    def timelines(job_id: str) -> Sequence[NodeRecord]:
        # A store this page cannot read raises (``StoreError``): the page says why it has no
        # timelines instead of showing none without a word.
        store = open_store_reader(settings.store_url)
        try:
            stored = store.get_job(job_id, timelines=True)
        finally:
            store.close()
        return tuple(stored.nodes) if stored is not None else ()

    cache: dict[str, tuple[float, Visibility]] = {}

    def visibility() -> Visibility:
        hit = cache.get("v")
        if hit is not None and time.monotonic() - hit[0] < 300:
            return hit[1]
        vis = slurm_visibility()
        cache["v"] = (time.monotonic(), vis)
        return vis

    return Backends(
        accounting=lambda: make_accounting(settings),
        # As gpueff's: an ended job the store does not hold, or a store closed to the viewer
        # (the page run as the user, under Open OnDemand), is "not collected yet", one job's
        # answer, never the page's error.
        reader=lambda: StoreAndSpoolReader(settings, spark_points=48, answer_uncollected=True),
        timelines=timelines,
        visibility=visibility,
    )


def slurm_visibility() -> Visibility:
    """Ask Slurm who sees what (``scontrol``, ``sacctmgr``); on failure the strictest rule:
    private jobs, nobody but root sees others' jobs."""
    import subprocess

    from slurm_gpu.store.visibility import read_visibility

    def run(argv: Sequence[str]) -> str:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=30, check=True
        ).stdout

    try:
        return read_visibility(run, "scontrol", "sacctmgr")
    except (OSError, subprocess.SubprocessError):
        return Visibility(private_jobs=True, admins=frozenset({"root"}))


@dataclass(frozen=True, slots=True)
class TaskView:
    """One job (or array task) on the page: its report and its charts."""

    report: JobReport
    nodes: tuple[series.NodeCharts, ...]
    timelines_unreadable: bool = False
    """The job has a final record, but the store that keeps its timelines is closed to this
    page (the page run as the user over the collector's SQLite store)."""

    @property
    def anchor(self) -> str:
        return "job-" + "".join(c if c.isalnum() else "-" for c in self.report.job_id_display)


def create_app(settings: Settings, backends: Backends | None = None) -> Flask:
    """The page's WSGI application."""
    app = Flask(__name__, static_folder=STATIC_DIR, static_url_path="/static")
    app.jinja_options = {**app.jinja_options, "autoescape": True}
    app.jinja_loader = FileSystemLoader(str(BUILTIN_DIR / "web"))
    app.jinja_env.filters.update(filters())
    app.jinja_env.globals["chart_svg"] = svg.chart_svg
    app.jinja_env.globals["chart_json"] = series.chart_json
    app.jinja_env.globals["status_label"] = status_label
    be = backends or default_backends(settings)
    web = settings.web
    proxies = frozenset(web.trusted_proxies)
    vendor = os.path.isfile(UPLOT_JS)

    def viewer() -> access.Viewer:
        v = access.viewer_of(
            request.environ, web.identity, user_header=web.user_header, trusted_proxies=proxies
        )
        if v is None:
            abort(401)
        return v

    def visible(v: access.Viewer, reports: Sequence[JobReport]) -> list[JobReport]:
        if v.trusted_by_slurm:
            return list(reports)
        vis = be.visibility()
        return [r for r in reports if access.may_see(vis, v.user, r.user, r.account)]

    @contextmanager
    def reader() -> Iterator[Any]:
        rd = be.reader()
        try:
            yield rd
        finally:
            close = getattr(rd, "close", None)
            if close is not None:
                close()

    @app.after_request
    def headers(resp: Response) -> Response:
        resp.headers["Content-Security-Policy"] = _CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["Cache-Control"] = "private, no-store"
        return resp

    def common() -> dict[str, Any]:
        return {"interactive": vendor, "viewer": getattr(g, "viewer", None)}

    @app.errorhandler(401)
    def unauthenticated(_: Any) -> tuple[str, int]:
        return render_template(
            "error.html",
            title="Not signed in",
            code=401,
            text="The page does not know who you are.",
            **common(),
        ), 401

    @app.errorhandler(404)
    def not_found(_: Any) -> tuple[str, int]:
        return render_template(
            "error.html",
            title="Not found",
            code=404,
            text="No such job, or not one you can see.",
            **common(),
        ), 404

    @app.errorhandler(SlurmGpuError)
    def unavailable(exc: SlurmGpuError) -> tuple[str, int]:
        return render_template(
            "error.html",
            title="Not available",
            code=503,
            text=str(exc),
            hint=getattr(exc, "hint", None),
            **common(),
        ), 503

    @app.get("/")
    def recent() -> str:
        v = g.viewer = viewer()
        now = be.now()
        with reader() as rd:
            reports = service.recent(
                be.accounting(),
                rd,
                user=v.user,
                since_s=now - web.recent_days * 86400.0,
                until_s=now,
                min_elapsed_s=settings.gpueff.min_elapsed_s,
                limit=web.recent_limit,
            )
        return render_template(
            "recent.html", reports=visible(v, reports), days=web.recent_days, **common()
        )

    def lookup(job_id: str) -> list[JobReport]:
        v = g.viewer = viewer()
        try:
            with reader() as rd:
                found = service.lookup(
                    [job_id], be.accounting(), rd, min_elapsed_s=settings.gpueff.min_elapsed_s
                )
        except UsageError:
            abort(404)
        reports = [r for _, group in found.groups for r in group]
        shown = visible(v, reports)
        if not shown:
            abort(404)
        return shown

    @app.get("/job/<job_id>")
    def job_page(job_id: str) -> str:
        reports = lookup(job_id)

        def task(r: JobReport) -> TaskView:
            if r.telemetry is not TelemetryStatus.FINAL:
                return TaskView(r, ())
            try:
                nodes = be.timelines(r.job_id)
            except StoreError:
                return TaskView(r, (), timelines_unreadable=True)
            return TaskView(r, series.node_charts(nodes, settings.telemetry.idle_threshold_pct))

        tasks = [task(r) for r in reports]
        live = any(r.telemetry is TelemetryStatus.LIVE or r.state == "RUNNING" for r in reports)
        grafana = ""
        if live and web.grafana_url:
            grafana = (
                f"{web.grafana_url.rstrip('/')}/d/slurm-gpu-job?var-job_id={reports[0].job_id}"
            )
        return render_template(
            "job.html",
            job_id=job_id,
            tasks=tasks,
            live=live,
            grafana=grafana,
            Markup=Markup,
            **common(),
        )

    return app
