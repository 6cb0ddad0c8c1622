"""The per-job web page in a real browser (headless Chromium; issue 30, point 1): each job's
page renders without a script error, its interactive charts hold the job's data points, it
fits a 375 px screen, another user gets a 404 page, and screenshots at 375 and 1280 px are
kept in ``test-output/web/`` (``$SLURM_GPU_TEST_OUTPUT/web/`` when set).

The page is served by werkzeug on loopback, one server per viewer: a small WSGI layer in
front plays the site's authenticating web server (it sets ``REMOTE_USER``) and adds a
checker script, served from the page's own origin so that its Content-Security-Policy
(no inline script) lets it run. Run with ``pytest -m browser tests/browser``; needs Debian's
``chromium`` package, Flask (the ``web`` extra) and uPlot (``share/web/fetch-uplot``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

import web_fixtures as W
from werkzeug.serving import make_server

from slurm_gpu.web.app import UPLOT_JS, create_app

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
OUTPUT = Path(os.environ.get("SLURM_GPU_TEST_OUTPUT", str(REPO / "test-output"))) / "web"

CHECKER = b"""
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
window.addEventListener("load", function () {
  setTimeout(function () {
    var figs = Array.prototype.map.call(document.querySelectorAll("figure.chart"), function (f) {
      var plot = f.querySelector(".uplot canvas");
      var r = plot ? plot.getBoundingClientRect() : {width: 0, height: 0};
      return {id: f.getAttribute("data-chart"), points: +f.getAttribute("data-points"),
              drawn: +f.getAttribute("data-drawn-points"), error: f.getAttribute("data-error"),
              interactive: f.classList.contains("interactive"), w: r.width, h: r.height};
    });
    var out = {errors: window.__errors, figures: figs, title: document.title,
               scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
               energy: Array.prototype.map.call(document.querySelectorAll("dd.energy"),
                                                function (e) { return e.textContent; })};
    var pre = document.createElement("pre");
    pre.id = "__check";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }, 300);
});
"""


#: Headless Chromium's window is at least 500 px wide: a phone's 375 px is a frame of that
#: width in a page of the same origin, which copies the framed page's findings out.
FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="%s" style="border:0;width:%dpx;height:2400px;display:block"></iframe>
<script>
var f = document.getElementById("f");
var poll = setInterval(function () {
  var doc = f.contentDocument, pre = doc && doc.getElementById("__check");
  if (!pre) { return; }
  clearInterval(poll);
  var copy = document.createElement("pre");
  copy.id = "__check";
  copy.textContent = pre.textContent;
  document.body.appendChild(copy);
}, 100);
</script></body></html>"""


def as_user(app: Any, user: str) -> Callable[..., Iterable[bytes]]:
    """The site's front server: authenticates everyone as ``user``; adds the checker."""

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/__check.js":
            start_response("200 OK", [("Content-Type", "text/javascript")])
            return [CHECKER]
        if environ.get("PATH_INFO", "").startswith("/__frame/"):
            width, _, target = environ["PATH_INFO"][len("/__frame/") :].partition("/")
            start_response("200 OK", [("Content-Type", "text/html")])
            return [(FRAME % ("/" + target, int(width))).encode()]
        environ["REMOTE_USER"] = user
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return lambda data: None

        body = b"".join(app(environ, capture))
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        if body.rstrip().endswith(b"</html>"):
            body = body.replace(b"</body>", b'<script src="/__check.js"></script></body>')
        headers.append(("Content-Length", str(len(body))))
        start_response(captured["status"], headers)
        return [body]

    return wsgi


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Base URLs of the page as sgtest1 and as sgtest2."""
    if not os.path.isfile(UPLOT_JS):
        pytest.fail("uPlot is not unpacked: run share/web/fetch-uplot (make venv does)")
    d = tmp_path_factory.mktemp("web")
    settings = W.settings_for(d)
    stored = W.store_jobs(settings)
    app = create_app(settings, W.backends(settings, stored, W.PRIVATE))
    urls, running = {}, []
    for user in ("sgtest1", "sgtest2"):
        srv = make_server("127.0.0.1", 0, as_user(app, user), threaded=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        running.append(srv)
        urls[user] = f"http://127.0.0.1:{srv.server_port}"
    yield urls
    for srv in running:
        srv.shutdown()


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
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def check(url: str, width: int, profile: Path) -> dict[str, Any]:
    proc = _run([f"--window-size={width},1600", "--dump-dom", url], profile)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="__check">(.*?)</pre>', proc.stdout, re.S)
    assert m, "the checker did not run: " + proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]
    assert not [ln for ln in console if "Uncaught" in ln or "Error" in ln], console
    text = m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    result: dict[str, Any] = json.loads(text.replace("&amp;", "&"))
    return result


@pytest.mark.parametrize(("job", "charts"), [("1001", 5), ("2000", 10), ("2000_1", 5)])
def test_job_page_renders_and_its_charts_hold_the_jobs_points(
    servers: dict[str, str], tmp_path: Path, job: str, charts: int
) -> None:
    result = check(f"{servers['sgtest1']}/job/{job}", 1280, tmp_path / "profile")
    assert result["errors"] == []
    assert result["title"].startswith(f"Job {job}")
    figs = result["figures"]
    assert len(figs) == charts
    for f in figs:
        # The interactive chart replaced the static one and holds every point the server
        # wrote (60 one-minute buckets per GPU line, per CPU and memory line).
        assert f["interactive"] and f["error"] is None, f
        assert f["points"] > 0 and f["drawn"] == f["points"], f
        assert f["points"] % 60 == 0, f
        assert f["w"] > 200 and f["h"] > 100, f
    if job == "1001":
        assert result["energy"] == ["420 Wh (62 % while GPUs idled), 168 g CO2, 0.13 EUR"]


def test_page_fits_a_375_px_screen(servers: dict[str, str], tmp_path: Path) -> None:
    for path in ("/job/1001", "/job/2000", "/"):
        result = check(f"{servers['sgtest1']}/__frame/375{path}", 500, tmp_path / "profile")
        assert result["errors"] == []
        assert result["innerWidth"] == 375, result
        assert result["scrollWidth"] <= result["innerWidth"], (path, result)
        for f in result["figures"]:
            assert 200 <= f["w"] <= 375, (path, f)


def test_another_users_job_is_a_404_page(servers: dict[str, str], tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    result = check(f"{servers['sgtest1']}/job/3001", 1280, tmp_path / "profile")
    assert result["title"].startswith("Not found") and result["figures"] == []
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{servers['sgtest1']}/job/3001", timeout=10)
    assert info.value.code == 404
    # Its owner sees it.
    mine = check(f"{servers['sgtest2']}/job/3001", 1280, tmp_path / "profile2")
    assert mine["title"].startswith("Job 3001") and len(mine["figures"]) == 5


@pytest.mark.parametrize("width", [375, 1280])
def test_screenshots_are_kept(servers: dict[str, str], tmp_path: Path, width: int) -> None:
    from PIL import Image

    OUTPUT.mkdir(parents=True, exist_ok=True)
    for name, path in (("job-1001", "/job/1001"), ("array-2000", "/job/2000")):
        shot = OUTPUT / f"{name}-{width}.png"
        shot.unlink(missing_ok=True)
        # A phone's width through a frame (the window is at least 500 px), cut to it after.
        url = servers["sgtest1"] + (f"/__frame/{width}{path}" if width < 500 else path)
        proc = _run(
            [f"--window-size={max(width, 500)},2400", f"--screenshot={shot}", url],
            tmp_path / "profile",
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        with Image.open(shot) as img:
            if img.width > width:
                img.crop((0, 0, width, img.height)).save(shot)
        with Image.open(shot) as img:
            assert img.size == (width, 2400)
            # Not blank: the page drew text and charts.
            colours = img.convert("L").getcolors(maxcolors=1 << 16)
            assert colours is not None and len(colours) > 20
