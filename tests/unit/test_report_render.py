"""The weekly report's HTML, text and JSON renderings, and the ``report weekly`` command."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gen_week
from test_report_aggregate import PERIOD, SINCE, hand_rows

from slurm_gpu.cli.admin import cli
from slurm_gpu.store.store import Store
from slurm_gpu.weekly.aggregate import ReportOptions, build_report
from slurm_gpu.weekly.jsonout import FORMAT, render_json
from slurm_gpu.weekly.model import REPORT_SCHEMA_VERSION, WeeklyReport
from slurm_gpu.weekly.render import change, gh, gh_digits, headline_rows, render_html, render_text

SECTIONS = (
    "headline",
    "distribution",
    "by-model",
    "by-partition",
    "top-users",
    "top-accounts",
    "causes",
    "never-used",
    "idle-edges",
    "hardware",
    "trend",
    "worst-jobs",
    "definitions",
)


@pytest.fixture(scope="module")
def hand_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('report')}/store.db"
    with Store.open(url) as store:
        gen_week.insert_dicts(store.engine, *hand_rows())
    return url


@pytest.fixture(scope="module")
def report(hand_store: str) -> WeeklyReport:
    with Store.open(hand_store, migrate=False) as store:
        return build_report(
            store.engine, PERIOD, ReportOptions(site_name="Lab <b>&</b>", top_n=5), now_s=SINCE
        )


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.tags: list[str] = []
        self.external: list[str] = []
        self.scripts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "a" and a.get("href"):
            self.hrefs.append(str(a["href"]))
        for key in ("src", "href"):
            value = a.get(key) or ""
            if tag != "a" and value and not value.startswith(("#", "data:")):
                self.external.append(value)
        if tag == "link":
            self.external.append(str(a))


def test_html_is_self_contained_with_every_section(report: WeeklyReport) -> None:
    html = render_html(report)
    p = _Collector()
    p.feed(html)
    assert set(SECTIONS) <= p.ids
    assert p.external == []  # no external style, script, image or font
    assert p.tags.count("svg") == 5  # histogram, by model, by partition, causes, trend
    assert p.tags.count("script") == 1  # the inline sorter
    # Every in-page link leads somewhere, including each top user's "worst jobs" anchor.
    for href in p.hrefs:
        assert href.startswith("#") and href[1:] in p.ids, href
    assert [w.anchor for w in report.worst_jobs] == [
        f"user-{n}" for n in range(1, len(report.worst_jobs) + 1)
    ]
    # SVG ids differ between charts (matplotlib's clip paths would clash otherwise).
    svg_ids = re.findall(r'<clipPath id="([^"]+)"', html)
    assert len(svg_ids) == len(set(svg_ids)) > 0


def test_user_controlled_strings_are_escaped(report: WeeklyReport) -> None:
    html = render_html(report)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Lab <b>" not in html and "Lab &lt;b&gt;&amp;&lt;/b&gt;" in html


def test_headline_numbers_are_on_the_page(report: WeeklyReport) -> None:
    html = render_html(report)
    h = report.headline
    digits = gh_digits(h.gpu_hours_allocated)
    assert gh(h.gpu_hours_allocated, digits) in html
    assert gh(h.gpu_hours_wasted, digits) in html
    assert f"{h.duty_cycle_weighted_pct:.1f} %" in html
    for c in report.causes:
        assert f">{gh(c.gpu_hours_wasted, digits)}<" in html


def test_one_gpu_hour_precision_for_the_whole_report(report: WeeklyReport) -> None:
    """A column never mixes 0.0 with 0.001, and the headline says what the tables say."""
    small = dataclasses.replace(
        report,
        headline=dataclasses.replace(
            report.headline, gpu_hours_allocated=0.5, gpu_hours_wasted=0.0667
        ),
    )
    html = render_html(small)
    assert gh_digits(0.5) == 3
    assert '<div class="value">0.067 <span class="unit">GPU·h' in html  # as a table prints it
    rows = [r for r in headline_rows(small.headline, small.previous_headline)]
    assert {r["value"] for r in rows if r["unit"] == "GPU·h"} >= {"0.500", "0.067"}
    assert gh(0.0, 3) == "0.000" and gh(0.001, 3) == "0.001" and gh(12.5, 3) == "12.500"


def test_gpu_hours_keep_small_numbers_apart() -> None:
    assert [gh(v) for v in (0.0, 0.0042, 0.25, 7.5, 1234.56)] == [
        "0.0",
        "0.004",
        "0.25",
        "7.50",
        "1,234.6",
    ]


def test_change_wording() -> None:
    assert change(120.0, 100.0) == "+20.0 %"
    assert change(50.0, 47.5, points=True) == "+2.5 pts"
    assert change(3.0, 0.0) == "new"
    assert change(None, 1.0) == "no previous data"


def test_text_summary(report: WeeklyReport) -> None:
    text = render_text(report)
    assert "Wasted GPU-hours by cause" in text
    for u in report.top_users:
        assert u.key in text
    assert f"Never-used GPUs: {report.never_used.gpus}" in text


def test_json_is_versioned_and_carries_the_same_numbers(report: WeeklyReport) -> None:
    doc = json.loads(render_json(report))
    assert doc["format"] == FORMAT and doc["version"] == REPORT_SCHEMA_VERSION
    r = doc["report"]
    assert r["headline"]["gpu_hours_wasted"] == report.headline.gpu_hours_wasted
    assert [c["gpu_hours_wasted"] for c in r["causes"]] == [
        c.gpu_hours_wasted for c in report.causes
    ]
    assert r["top_users"][0]["key"] == report.top_users[0].key
    assert len(r["trend"]) == len(report.trend)


def _config(tmp_path: Path, url: str, extra: str = "") -> str:
    path = tmp_path / "c.toml"
    path.write_text(f'[store]\nurl = "{url}"\n[report]\nsite_name = "T"\n{extra}')
    return str(path)


def test_cli_writes_html_and_json(hand_store: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, hand_store)
    out = tmp_path / "r.html"
    runner = CliRunner()
    res = runner.invoke(
        cli, ["--config", cfg, "report", "weekly", "--since", "2026-11-16", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("<!DOCTYPE html>")
    res = runner.invoke(
        cli,
        ["--config", cfg, "report", "weekly", "--since", "2026-11-16", "--format", "json"],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["report"]["period"] == {"since_s": SINCE, "until_s": SINCE + 7 * 86400}
    assert doc["report"]["headline"]["jobs"] == 8


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--since", "16/11/2026"], 2, "not a date"),
        (["--since", "2026-11-16", "--until", "2026-11-10"], 2, "--until must come after"),
        (["--since", "2026-11-16", "--mail"], 9, "no recipient"),
    ],
)
def test_cli_errors(
    hand_store: str, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    cfg = _config(tmp_path, hand_store)
    res = CliRunner().invoke(cli, ["--config", cfg, "report", "weekly", *args])
    assert res.exit_code == code, res.output
    assert message in res.output


def test_cli_unmigrated_store_is_a_store_error(tmp_path: Path) -> None:
    cfg = _config(tmp_path, f"sqlite:///{tmp_path}/empty.db")
    res = CliRunner().invoke(cli, ["--config", cfg, "report", "weekly"])
    assert res.exit_code == 6, res.output
    assert "slurm-gpu store migrate" in res.output


def test_cli_mails_text_and_html_to_the_admins(hand_store: str, tmp_path: Path) -> None:
    from email import message_from_bytes, policy

    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Sink

    class Keep(Sink):
        def __init__(self) -> None:
            self.envelopes: list[tuple[list[str], bytes]] = []

        async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
            self.envelopes.append((list(envelope.rcpt_tos), envelope.original_content))  # type: ignore[attr-defined]
            return "250 OK"

    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    handler = Keep()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        extra = (
            'admin_emails = ["a@example.org", "b@example.org"]\n'
            f'[mail]\ntransport = "smtp"\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\n'
            'from_address = "gpu-report@example.org"\n'
        )
        cfg = _config(tmp_path, hand_store, extra)
        res = CliRunner().invoke(
            cli, ["--config", cfg, "report", "weekly", "--since", "2026-11-16", "--mail"]
        )
        assert res.exit_code == 0, res.output
    finally:
        controller.stop()
    assert len(handler.envelopes) == 1
    rcpts, raw = handler.envelopes[0]
    assert rcpts == ["a@example.org", "b@example.org"]
    msg = message_from_bytes(raw, policy=policy.default)
    assert msg["Subject"] == "[T] GPU usage report, week of 2026-11-16"
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "Wasted GPU-hours by cause" in text
    assert html.startswith("<!DOCTYPE html>") and "&lt;script&gt;" in html
