"""Render the HTML e-mail in headless Chromium: the inline chart must load and show.

The message is built exactly as it is sent; for the render its ``cid:`` images are inlined as
``data:`` URIs (what a mail client does with multipart/related parts). Chromium dumps the DOM
after a script checked every image (``complete && naturalWidth > 0``), and takes a screenshot
whose pixels must not be blank.

Run with ``--update-screenshot`` semantics by setting ``SLURM_GPU_UPDATE_DOCS=1``: the
screenshot is then copied to ``docs/img/mail.png``.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))

import gpueff_factory as F

from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.charts import charts_for
from slurm_gpu.jobreport.model import FindingView, RecommendationView
from slurm_gpu.notify.message import MailContext, MessageBuilder

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

CHECK_SCRIPT = """
<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.length > 0 && imgs.every(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute('data-images', imgs.length + ':' + (ok ? 'loaded' : 'broken'));
});
</script>
"""


def _message_html(tmp_path: Path) -> str:
    report = adapter.accounting_report(F.job(job_name="train <resnet50> & friends"))
    report = adapter.with_telemetry(
        report,
        adapter.gpu_lines_from_records(
            [
                F.node_record(
                    utils=(
                        [min(95.0, 5.0 + 3 * k) for k in range(60)],
                        [0.0] * 60,
                    )
                )
            ],
            spark_points=60,
        ),
        live=False,
        findings=[
            FindingView(
                "GPU_UNUSED",
                "critical",
                6,
                "An allocated GPU was never used",
                "GPU node1:1 ran no kernel during the whole job: 1.00 GPU-hours nobody "
                "else could use. Request only the GPUs your program uses.",
                (("mean duty cycle", "0 %"), ("GPUs used", "1 of 2")),
            ),
            FindingView(
                "IDLE_HEAD",
                "warning",
                6,
                "The GPUs waited at the start",
                "For the first 10 minutes the GPUs were idle while the job prepared its data.",
                (("idle head", "00:10:00"),),
            ),
        ],
        recommendations=[
            RecommendationView("--gpus: 2 -> 1", ("#SBATCH --gpus=1", "#SBATCH --time=01:30:00"))
        ],
    )
    builder = MessageBuilder(
        from_address="slurm-gpu@cluster.example.org",
        context=MailContext(docs_url="https://hpc.example.org/docs/gpu"),
        charts=charts_for,
    )
    msg = builder.build([report], to="sgtest1@example.org")
    html_part = msg.get_body(("html",))
    assert html_part is not None
    html = str(html_part.get_content())
    for part in msg.walk():
        if part.get_content_type() == "image/png":
            cid = part["Content-ID"].strip("<>")
            data = base64.b64encode(part.get_content()).decode()
            html = html.replace(f"cid:{cid}", f"data:image/png;base64,{data}")
    assert "cid:" not in html
    return html.replace("</body>", CHECK_SCRIPT + "</body>")


def _png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, number of distinct RGB colours in a sample of rows) of an RGB(A) PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = 0
    bit_depth = colour_type = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, bit_depth, colour_type = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert bit_depth == 8 and colour_type in (2, 6)
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels + 1
    colours: set[bytes] = set()
    # Unfiltered sampling is enough to tell a page with content from a blank one: filtered rows
    # still differ from a uniform background's rows.
    for row in range(0, height, max(1, height // 50)):
        line = raw[row * stride + 1 : (row + 1) * stride]
        for x in range(0, width * channels, channels * 7):
            colours.add(line[x : x + 3])
    return width, height, len(colours)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_mail_html_renders_with_its_chart(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    page = tmp_path / "mail.html"
    page.write_text(_message_html(tmp_path), encoding="utf-8")
    profile = tmp_path / "profile"
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [*common, "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    match = re.search(r'data-images="([^"]+)"', dom.stdout)
    assert match, dom.stdout[:2000]
    assert match.group(1) == "1:loaded"
    assert "train &lt;resnet50&gt; &amp; friends" in dom.stdout  # escaped, rendered as text

    shot = tmp_path / "mail.png"
    run = subprocess.run(
        [
            *common,
            "--hide-scrollbars",
            "--window-size=760,1500",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    width, height, colours = _png_size_and_colours(shot)
    assert (width, height) == (760, 1500)
    assert colours > 20, "the screenshot looks blank"
    if os.environ.get("SLURM_GPU_UPDATE_DOCS") == "1":
        dest = Path(__file__).parents[2] / "docs" / "img" / "mail.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dest)


LAYOUT_SCRIPT = """
<script>
window.addEventListener('load', function () {
  // Values that must never break inside: "91 % busy", "3.87 Wh", "12 GiB / 40 GiB".
  var wrapped = [];
  var walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  var node;
  while ((node = walk.nextNode())) {
    var text = node.textContent.trim();
    if (text.length > 40 || !/(% busy|Wh$| J$|GiB)/.test(text)) continue;
    var range = document.createRange();
    range.selectNodeContents(node);
    var tops = {};
    Array.prototype.forEach.call(range.getClientRects(), function (r) {
      tops[Math.round(r.top)] = 1;
    });
    if (Object.keys(tops).length > 1) wrapped.push(text);
  }
  var over = document.documentElement.scrollWidth > window.innerWidth;
  document.body.setAttribute('data-wrapped', wrapped.join('|') || 'none');
  document.body.setAttribute('data-overflow', over ? 'yes' : 'no');
});
</script>
"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
@pytest.mark.parametrize("width", [600, 1200])
def test_mail_gpu_rows_never_break_inside_a_value(tmp_path: Path, width: int) -> None:
    """At 600 and 1200 px no value of a GPU's row breaks across lines ("91 % / busy") and
    nothing is wider than the window (the browser's layout, read by a script in the page)."""
    assert CHROMIUM is not None
    page = tmp_path / "mail.html"
    page.write_text(
        _message_html(tmp_path).replace("</body>", LAYOUT_SCRIPT + "</body>"), encoding="utf-8"
    )
    dom = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={width},1500",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    wrapped = re.search(r'data-wrapped="([^"]*)"', dom.stdout)
    over = re.search(r'data-overflow="([^"]*)"', dom.stdout)
    assert wrapped and over, dom.stdout[:2000]
    assert wrapped.group(1) == "none", (
        f"values broken across lines at {width} px: {wrapped.group(1)}"
    )
    assert over.group(1) == "no", f"the page is wider than {width} px"
    # Kept as a test artifact (CI keeps SLURM_GPU_TEST_OUTPUT, by default test-output/).
    out = Path(
        os.environ.get("SLURM_GPU_TEST_OUTPUT", str(Path(__file__).parents[2] / "test-output"))
    )
    shot = out / "mail" / f"mail-{width}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'shot-profile'}",
            "--hide-scrollbars",
            f"--window-size={width},1500",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", run.stderr[-2000:]
