"""The per-job web page (issue 30, point 1) through Flask's test client: what it shows, the
same energy figures as gpueff and the e-mail, Slurm's visibility enforced on the server
(another user's job is a 404, like a job that does not exist), and a page that works with
JavaScript off (its charts are SVG written by the server). The real browser:
``tests/browser/test_web_chromium.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import web_fixtures as W
from flask.testing import FlaskClient

from slurm_gpu.web.app import create_app


@pytest.fixture
def client(tmp_path: Path) -> FlaskClient:
    settings = W.settings_for(tmp_path)
    stored = W.store_jobs(settings)
    app = create_app(settings, W.backends(settings, stored, W.PRIVATE))
    return app.test_client()


def get(client: FlaskClient, path: str, user: str | None = "sgtest1", **env: Any) -> Any:
    environ = {"REMOTE_USER": user} if user else {}
    return client.get(path, environ_base={**environ, **env})


def test_job_page_shows_what_gpueff_shows(client: FlaskClient) -> None:
    resp = get(client, "/job/1001")
    assert resp.status_code == 200
    html = resp.get_data(as_text=True)
    for text in (
        "Job 1001",
        "train-resnet",
        "COMPLETED",
        "research",
        "gpu",
        "01:00:00 of 04:00:00",
        "node1:0",
        "node1:1",
        "no process ever ran on this GPU",
        "2.00 allocated",
        "Findings",
        "An allocated GPU was never used",
        "(cause 6)",
        "evidence:",
        "Much more time requested than used",
        "25 % efficiency",
        "4 GiB peak of 32 GiB",
    ):
        assert text in html, text
    # The energy line, to the digit as in gpueff and the e-mail (test_energy_channels).
    assert "420 Wh (62 % while GPUs idled), 168 g CO2, 0.13 EUR" in html
    assert resp.headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_charts_are_static_svg_holding_every_data_point(client: FlaskClient) -> None:
    html = get(client, "/job/1001").get_data(as_text=True)
    figures = re.findall(r'<figure class="chart" data-chart="([^"]+)" data-points="(\d+)"', html)
    assert [f.split("-")[3] for f, _ in figures] == ["duty", "memory", "power", "cpu", "rss"]
    points = {f.split("-")[3]: int(n) for f, n in figures}
    # 60 one-minute buckets: 2 GPUs for the GPU charts, one line for the job's CPU and memory.
    assert points == {"duty": 120, "memory": 120, "power": 120, "cpu": 60, "rss": 60}
    assert html.count('<svg id="') == 5 and html.count("<polyline") == 8
    # GPU 1 was idle all along but GPU 0 only for its first 15 minutes: one idle band.
    assert html.count('<rect class="idle"') == 5
    blocks = re.findall(r'<script type="application/json" class="chart-data">(.*?)</script>', html)
    duty = json.loads(blocks[0])
    assert duty["key"] == "duty" and len(duty["t"]) == 60
    assert duty["lines"][0]["values"][:16] == [0.0] * 15 + [90.0]
    assert duty["idle"] == [[1_700_000_100.0, 1_700_000_100.0 + 15 * 60]]


def test_another_users_job_is_not_found_not_forbidden(client: FlaskClient) -> None:
    mine = get(client, "/job/3001", user="sgtest2")
    assert mine.status_code == 200 and "secret-project" in mine.get_data(as_text=True)
    theirs = get(client, "/job/3001", user="sgtest1")
    missing = get(client, "/job/999999", user="sgtest1")
    assert theirs.status_code == missing.status_code == 404
    body = theirs.get_data(as_text=True)
    assert "secret-project" not in body and "sgtest2" not in body and "3001" not in body
    assert body == missing.get_data(as_text=True)


def test_coordinators_and_admins_see_their_accounts_jobs(client: FlaskClient) -> None:
    assert get(client, "/job/3001", user="prof").status_code == 200  # coordinates physics
    assert get(client, "/job/1001", user="prof").status_code == 404  # research: not theirs
    assert get(client, "/job/1001", user="slurm").status_code == 200


def test_no_identity_is_401_and_malformed_ids_are_404(client: FlaskClient) -> None:
    assert get(client, "/job/1001", user=None).status_code == 401
    assert get(client, "/job/1001", user="bad name;rm").status_code == 401
    assert get(client, "/job/not-a-job").status_code == 404


def test_header_identity_believes_only_trusted_proxies(tmp_path: Path) -> None:
    settings = W.settings_for(tmp_path, identity="header", trusted_proxies=["10.0.0.5"])
    stored = W.store_jobs(settings)
    c = create_app(settings, W.backends(settings, stored, W.PRIVATE)).test_client()
    ok = c.get(
        "/job/1001",
        headers={"X-Forwarded-User": "sgtest1"},
        environ_base={"REMOTE_ADDR": "10.0.0.5"},
    )
    assert ok.status_code == 200
    forged = c.get(
        "/job/1001",
        headers={"X-Forwarded-User": "sgtest1"},
        environ_base={"REMOTE_ADDR": "10.0.0.9"},
    )
    assert forged.status_code == 401


def test_array_tasks_stand_side_by_side(client: FlaskClient) -> None:
    html = get(client, "/job/2000").get_data(as_text=True)
    assert "Array 2000: 2 tasks" in html and 'class="tasks side-by-side"' in html
    assert html.index("Job 2000_0") < html.index("Job 2000_1")
    one = get(client, "/job/2000_1").get_data(as_text=True)
    assert "Job 2000_1" in one and "Job 2000_0" not in one


def test_recent_jobs_list_only_the_viewers(client: FlaskClient) -> None:
    html = get(client, "/").get_data(as_text=True)
    for link in ("/job/1001", "/job/2000_0", "/job/2000_1"):
        assert f'href="{link}"' in html
    assert "3001" not in html and "secret-project" not in html
    assert "420 Wh" in html


def test_page_needs_no_script_and_escapes_job_names(tmp_path: Path) -> None:
    settings = W.settings_for(tmp_path)
    stored = W.store_jobs(settings)
    from dataclasses import replace

    evil = [replace(stored[0], job_name="<script>alert(1)</script>"), *stored[1:]]
    c = create_app(settings, W.backends(settings, evil, W.PRIVATE)).test_client()
    html = get(c, "/job/1001").get_data(as_text=True)
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    # Without uPlot unpacked (or with JavaScript off) the page is whole: no script is needed
    # for any number or chart, and none is inline (the CSP forbids it).
    assert not re.search(r"<script(?![^>]*(type=\"application/json\"|src=))", html)


def test_recommendations_live_actions_and_live_jobs_are_shown(tmp_path: Path) -> None:
    """What the stored fixture has none of: a recommendation, live policy actions, and a
    running job's page (reloads itself, links to the Grafana job view)."""
    from dataclasses import replace

    from slurm_gpu.jobreport.model import LiveActionView, RecommendationView, TelemetryStatus
    from slurm_gpu.web.app import TaskView

    settings = W.settings_for(tmp_path, grafana_url="https://grafana.example.org")
    stored = W.store_jobs(settings)
    app = create_app(settings, W.backends(settings, stored, W.PRIVATE))
    client = app.test_client()
    base = client.get("/job/1001", environ_base={"REMOTE_USER": "sgtest1"})
    assert base.status_code == 200
    from slurm_gpu.jobreport.readers import StoreAndSpoolReader
    from slurm_gpu.jobreport.service import report_for

    reader = StoreAndSpoolReader(settings)
    try:
        report = report_for(stored[0], reader, min_elapsed_s=30)
    finally:
        reader.close()
    report = replace(
        report,
        state="RUNNING",
        telemetry=TelemetryStatus.LIVE,
        recommendations=(RecommendationView("--gpus: 2 -> 1", ("#SBATCH --gpus=1",), 1.0),),
        live_actions=(
            LiveActionView(1_700_001_900.0, 1800.0, "never_used", "warned", 1, 0.5, 0.0),
        ),
    )
    with app.test_request_context("/job/1001"):
        html = app.jinja_env.get_template("job.html").render(
            job_id="1001",
            tasks=[TaskView(report, ())],
            live=True,
            grafana="https://grafana.example.org/d/slurm-gpu-job?var-job_id=1001",
            interactive=False,
            viewer=None,
        )
    assert "Recommended request" in html and "#SBATCH --gpus=1" in html
    assert "(saves about 1.00 GPU-hours)" in html
    assert "Live policy" in html and "warned" in html
    assert '<meta http-equiv="refresh" content="60">' in html
    assert 'href="https://grafana.example.org/d/slurm-gpu-job?var-job_id=1001"' in html


def test_a_store_closed_to_the_viewer_is_not_the_pages_error(tmp_path: Path) -> None:
    # Seen as sgtest1 running the page (Open OnDemand's deployment: the page runs as the
    # user, the SQLite store is root's): their newest job, ended and not collected yet, was a
    # 503 "store …: Permission denied", and so was the list of their recent jobs, where
    # `gpueff` says "not collected yet" and lists every job.
    from dataclasses import replace

    from slurm_gpu.config import parse_settings
    from slurm_gpu.web.app import default_backends

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    settings = parse_settings(
        {
            "paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")},
            "store": {"url": f"sqlite:///{blocker}/slurm-gpu.db"},  # cannot be opened
            "gpueff": {"min_elapsed_s": 30, "cache_reports": False},
            "web": {"identity": "remote_user"},
        },
        path=None,
    )
    newest = W.jobs()[0][0]
    be = replace(
        default_backends(settings),
        accounting=lambda: W.ServiceAccounting([newest]),
        visibility=lambda: W.PRIVATE,
        now=lambda: 1_700_010_000.0,
    )
    client = create_app(settings, be).test_client()
    page = get(client, "/job/1001")
    assert page.status_code == 200, page.get_data(as_text=True)
    assert "not been collected yet" in page.get_data(as_text=True)
    listing = get(client, "/")
    assert listing.status_code == 200, listing.get_data(as_text=True)
    assert 'href="/job/1001"' in listing.get_data(as_text=True)


def test_the_page_names_the_signal_that_ended_the_job(tmp_path: Path) -> None:
    from dataclasses import replace

    settings = W.settings_for(tmp_path)
    stored = W.store_jobs(settings)
    killed = [replace(stored[0], state="FAILED", exit_code=0, exit_signal=9), *stored[1:]]
    c = create_app(settings, W.backends(settings, killed, W.PRIVATE)).test_client()
    html = get(c, "/job/1001").get_data(as_text=True)
    assert '<span class="exit">signal 9, SIGKILL</span>' in html, html


def test_a_page_that_cannot_read_the_timelines_says_so(tmp_path: Path) -> None:
    """Seen on the test cluster: the page run as the user (Open OnDemand) over the SQLite
    store, which is the collector's alone, showed a collected job's report with no charts and
    no word on why."""
    from dataclasses import replace

    from slurm_gpu.errors import StoreDeniedError

    settings = W.settings_for(tmp_path)
    stored = W.store_jobs(settings)

    def closed(job_id: str) -> Any:
        raise StoreDeniedError("store /x/slurm-gpu.db: Permission denied")

    be = replace(W.backends(settings, stored, W.PRIVATE), timelines=closed)
    html = get(create_app(settings, be).test_client(), "/job/1001").get_data(as_text=True)
    assert 'class="charts"' not in html
    assert "The timelines are not shown: this page cannot read the store that keeps them" in html
    # Readable: the charts, and no such note.
    html = get(
        create_app(settings, W.backends(settings, stored, W.PRIVATE)).test_client(), "/job/1001"
    ).get_data(as_text=True)
    assert 'class="charts"' in html and "The timelines are not shown" not in html
