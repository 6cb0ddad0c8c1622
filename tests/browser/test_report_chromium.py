"""The weekly report in a real browser (headless Chromium): no script error, every chart drawn
with a non-zero size, the table sorter works; the screenshot in the docs is made here.

Run with ``pytest -m browser tests/browser``. Needs Debian's ``chromium`` package.
Set ``SLURM_GPU_UPDATE_SCREENSHOT=1`` to refresh ``docs/img/report.png``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gen_week
from test_report_aggregate import hand_rows

from slurm_gpu.store import schema
from slurm_gpu.store.liveactions import LiveAction, record_actions
from slurm_gpu.store.store import Store
from slurm_gpu.weekly.aggregate import ReportOptions, build_report
from slurm_gpu.weekly.model import Period
from slurm_gpu.weekly.render import render_html

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]

WEEK_S = 7 * 86400.0
SINCE = gen_week.DEFAULT_SINCE_S

#: Appended to a copy of the page: records errors, measures every chart, sorts one table,
#: and writes the findings into the DOM for --dump-dom to return.
CHECKER = """
<script>
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
window.addEventListener("load", function () {
  var out = {errors: window.__errors, svgs: [], sorted: null};
  document.querySelectorAll("svg").forEach(function (s) {
    var r = s.getBoundingClientRect();
    out.svgs.push({w: r.width, h: r.height, shapes: s.querySelectorAll("path, rect").length});
  });
  try {
    var th = document.querySelector("#top-users th[data-sort='num']:nth-child(5)");
    th.click();
    var cells = Array.prototype.map.call(
      th.closest("table").tBodies[0].rows,
      function (row) { return parseFloat(row.cells[4].textContent.replace(/,/g, "")); });
    out.sorted = cells;
  } catch (e) { out.errors.push("checker: " + e); }
  var live = document.getElementById("live-policy");
  out.live = live ? {h: live.getBoundingClientRect().height,
                     rows: live.querySelectorAll("tbody tr").length,
                     text: live.textContent} : null;
  var pre = document.createElement("pre");
  pre.id = "__check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is missing: apt-get install -y chromium")


def _run(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report over three generated weeks plus the hand-made jobs (odd user names included)."""
    d = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{d}/store.db"
    with Store.open(url) as store:
        for i, n in enumerate((3000, 2600, 2200, 2500)):
            gen_week.insert(
                store.engine,
                *gen_week.frames(n, SINCE - i * WEEK_S, seed=10 + i, id_offset=10_000 + i * 10**6),
            )
        jobs, gpus, findings = hand_rows()
        gen_week.insert_dicts(store.engine, jobs, gpus, findings)
        _live_actions(store.engine, {j["job_id"]: j for j in jobs})
        report = build_report(
            store.engine,
            Period(SINCE, SINCE + WEEK_S),
            ReportOptions(site_name="Example cluster", trend_weeks=6),
            now_s=SINCE + WEEK_S + 3600,
        )
    path = d / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path


def _live_actions(engine: Any, jobs: dict[str, dict[str, Any]]) -> None:
    """The live policy warned job 101 and warned, then cancelled, job 106 (given a time
    limit, so that the cancellation is credited)."""
    with engine.begin() as conn:
        conn.execute(
            schema.jobs.update()
            .where(schema.jobs.c.job_id == "106")
            .values(time_limit_s=jobs["106"]["elapsed_s"] * 3)
        )

    def act(job_id: str, action: str, rule: str, after_s: float) -> LiveAction:
        j = jobs[job_id]
        return LiveAction(
            job_id, rule, action, j["user"], j["account"], j["start_s"] + after_s, 1, after_s, ""
        )

    record_actions(
        engine,
        [
            act("101", "warned", "never_used", 1800),
            act("106", "warned", "never_used", 1800),
            act("106", "cancelled", "never_used", jobs["106"]["elapsed_s"]),
        ],
    )


def test_report_renders_without_errors_and_every_chart_has_a_size(
    page: Path, tmp_path: Path
) -> None:
    checked = tmp_path / "checked.html"
    checked.write_text(page.read_text().replace("</body>", CHECKER + "</body>"))
    proc = _run(["--dump-dom", checked.as_uri()], tmp_path / "profile")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="__check">(.*?)</pre>', proc.stdout, re.S)
    assert m, "the checker did not run: " + proc.stderr[-2000:]
    result = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert result["errors"] == []
    # Console errors the page itself logged (Chromium prints them with --enable-logging).
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]
    assert not [ln for ln in console if "Uncaught" in ln or "Error" in ln], console
    assert len(result["svgs"]) == 5
    for svg in result["svgs"]:
        assert svg["w"] > 100 and svg["h"] > 50, svg
        assert svg["shapes"] > 5, svg
    # The live policy's section is drawn, one row per rule that acted.
    live = result["live"]
    assert live and live["h"] > 0 and live["rows"] == 1, live
    assert "GPU-hours stopped from being wasted by the live policy" in live["text"]
    # The sorter ordered the wasted GPU-hours column ascending.
    values = result["sorted"]
    assert values and values == sorted(values)


def test_screenshot(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    proc = _run(
        ["--hide-scrollbars", "--window-size=1100,2400", f"--screenshot={shot}", page.as_uri()],
        tmp_path / "profile",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    if os.environ.get("SLURM_GPU_UPDATE_SCREENSHOT") == "1":
        target = REPO / "docs" / "img" / "report.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


LAYOUT = """
<script>
window.addEventListener('load', function () {
  var vw = window.innerWidth, out = {overflow: [], clipped: [], overlaps: []};
  // Nothing wider than the window: the page scrolls down, never sideways.
  out.page = document.documentElement.scrollWidth;
  Array.prototype.forEach.call(document.querySelectorAll('body *'), function (el) {
    var r = el.getBoundingClientRect();
    if (r.width && r.right > vw + 1 && !el.closest('table')) {
      out.overflow.push(el.tagName + (el.id ? '#' + el.id : '') + ' ' + Math.round(r.right));
    }
  });
  // Every section link is whole on screen, and no two texts of the header overlap.
  var boxes = [];
  Array.prototype.forEach.call(
    document.querySelectorAll('nav a, .card .label, .card .value, .card .change, h1, h2'),
    function (el) {
      var r = el.getBoundingClientRect();
      if (r.right > vw + 1 || r.left < -1) out.clipped.push(el.textContent.trim());
      boxes.push([el.textContent.trim().slice(0, 30), r]);
    });
  for (var i = 0; i < boxes.length; i++) {
    for (var j = i + 1; j < boxes.length; j++) {
      var a = boxes[i][1], b = boxes[j][1];
      var apart = a.right - 1 <= b.left || b.right - 1 <= a.left ||
        a.bottom - 1 <= b.top || b.bottom - 1 <= a.top;
      if (!apart) {
        out.overlaps.push(boxes[i][0] + ' / ' + boxes[j][0]);
      }
    }
  }
  var pre = document.createElement('pre');
  pre.id = '__layout';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""

#: Where the browser tests keep their screenshots (CI keeps this folder as its artifacts).
ARTIFACTS = Path(os.environ.get("SLURM_GPU_TEST_OUTPUT", str(REPO / "test-output")))


@pytest.mark.parametrize("width", [600, 1200])
def test_report_fits_the_window_and_no_text_overlaps(
    page: Path, tmp_path: Path, width: int
) -> None:
    """At 600 and 1200 px: no element runs past the window (wide tables scroll inside their
    own box), every section link is whole on screen, no two header texts overlap (the
    browser's own layout, read by a script in the page); the screenshot is kept."""
    checked = tmp_path / "layout.html"
    checked.write_text(page.read_text().replace("</body>", LAYOUT + "</body>"))
    proc = _run([f"--window-size={width},2000", "--dump-dom", checked.as_uri()], tmp_path / "p")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="__layout">(.*?)</pre>', proc.stdout, re.S)
    assert m, "the layout check did not run: " + proc.stderr[-2000:]
    result = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert result["page"] <= width, result
    assert result["overflow"] == [], result["overflow"]
    assert result["clipped"] == [], result["clipped"]
    assert result["overlaps"] == [], result["overlaps"]
    shot = ARTIFACTS / "weekly" / f"report-{width}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    proc = _run(
        ["--hide-scrollbars", f"--window-size={width},2400", f"--screenshot={shot}", page.as_uri()],
        tmp_path / "shot",
    )
    assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
