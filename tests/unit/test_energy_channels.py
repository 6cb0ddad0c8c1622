"""One job's kWh and CO2 agree in ``gpueff`` (text and JSON), the e-mail and the weekly
report (issue 30, point 3); the web page is checked against the same numbers in
``tests/unit/test_web_app.py``.

The job of ``test_wasted_gpu_hours``: 1 hour on 2 GPUs of 210 W each (0.21 kWh each, 0.42 kWh
in all); GPU 0 idle for its first quarter (0.0525 kWh idle), GPU 1 never used (all its
0.21 kWh idle): 0.2625 kWh idle, 62.5 %. At 400 g/kWh, 168 g CO2; at 0.30 EUR, 0.126 EUR.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from click.testing import CliRunner

from slurm_gpu.analysis.energy import co2_text, kwh_text
from slurm_gpu.analysis.engine import analyze
from slurm_gpu.cli.gpueff import BACKENDS_KEY, cli
from slurm_gpu.config import parse_settings
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.jobreport.service import report_for
from slurm_gpu.notify.message import MailContext, MessageBuilder
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.weekly.energy import energy_summary

UTILS = ([0.0] * 15 + [90.0] * 45, [0.0] * 60)
KWH, IDLE_KWH, CO2_KG, COST = 0.42, 0.2625, 0.168, 0.126
ENERGY = {"price_per_kwh": 0.30, "co2_g_per_kwh": 400.0}


class OwnerAccounting:
    name = "fake"

    def __init__(self, job: JobRecord) -> None:
        self.job = job

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        return {self.job.job_id: self.job} if self.job.job_id in job_ids else {}

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        return [self.job]


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, JobRecord]:
    cfg = tmp_path / "config.toml"
    cfg.write_text("[gpueff]\nmin_elapsed_s = 30\n")
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    settings = parse_settings(
        {
            "paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")},
            "energy": ENERGY,
        },
        path=None,
    )
    job = F.job()
    record = F.node_record(utils=UTILS)
    analysis = analyze(job, [record], settings.analysis)
    with Store.open(settings.store_url) as store:
        store.write_batch(
            [JobBundle(job, (record,), TELEMETRY_COMPLETE, findings=analysis.findings)],
            collected_at_s=1.0,
        )
    return settings, job


def test_gpueff_mail_and_weekly_report_agree_on_kwh_and_co2(stored: tuple[Any, JobRecord]) -> None:
    settings, job = stored
    reader = StoreAndSpoolReader(settings)
    try:
        res = CliRunner().invoke(
            cli,
            ["--json", job.job_id],
            obj={BACKENDS_KEY: (OwnerAccounting(job), reader)},
            catch_exceptions=False,
        )
        assert res.exit_code == 0, res.output
        [shown] = json.loads(res.output)["jobs"]
        text = CliRunner().invoke(
            cli,
            [job.job_id],
            obj={BACKENDS_KEY: (OwnerAccounting(job), reader)},
            catch_exceptions=False,
        )
        assert text.exit_code == 0, text.output
        report = report_for(job, reader, min_elapsed_s=30)
    finally:
        reader.close()

    e = shown["energy"]
    assert e["kwh"] == pytest.approx(KWH)
    assert e["idle_kwh"] == pytest.approx(IDLE_KWH)
    assert e["co2_kg"] == pytest.approx(CO2_KG)
    assert e["cost"] == pytest.approx(COST) and e["currency"] == "EUR"
    line = "Energy  420 Wh (62 % while GPUs idled), 168 g CO2, 0.13 EUR"
    assert line in text.output

    msg = MessageBuilder(from_address="slurm-gpu@localhost", context=MailContext()).build(
        [report], to="sgtest1@localhost"
    )
    plain = msg.get_body(("plain",))
    html = msg.get_body(("html",))
    assert plain is not None and html is not None
    assert "Energy: 420 Wh (62 % while GPUs idled), 168 g CO2, 0.13 EUR." in plain.get_content()
    assert "420 Wh (62 % while GPUs idled), 168 g CO2, 0.13 EUR" in html.get_content()

    assert job.end_s is not None
    with Store.open(settings.store_url) as store, store.engine.connect() as conn:
        weekly = energy_summary(conn, job.end_s - 60, job.end_s + 60, settings.energy, 1.0)
    for groups in (weekly.by_user, weekly.by_account, weekly.by_partition):
        [g] = groups
        assert g.jobs == 1
        assert g.kwh == pytest.approx(e["kwh"])
        assert g.idle_kwh == pytest.approx(e["idle_kwh"])
        assert g.co2_kg == pytest.approx(e["co2_kg"])
        assert g.cost == pytest.approx(e["cost"])
        assert kwh_text(g.kwh) == "420 Wh" and co2_text(g.co2_kg) == "168 g CO2"
    assert weekly.by_user[0].key == job.user


def test_weekly_html_and_text_show_the_energy_section(stored: tuple[Any, JobRecord]) -> None:
    import dataclasses

    from slurm_gpu.weekly.aggregate import Period, build_report
    from slurm_gpu.weekly.jsonout import to_document
    from slurm_gpu.weekly.render import render_html, render_text

    settings, job = stored
    assert job.end_s is not None
    period = Period(job.end_s - 60, job.end_s + 60)
    with Store.open(settings.store_url) as store, store.engine.connect() as conn:
        weekly = build_report(store.engine, period)
        energy = energy_summary(conn, period.since_s, period.until_s, settings.energy, 1.0)
    weekly = dataclasses.replace(weekly, energy=energy)
    html = render_html(weekly)
    assert 'id="energy"' in html
    assert "420 Wh</td>" in html and 'href="#energy"' in html
    assert "168 g CO2" in html and "0.13 EUR" in html
    assert "420 Wh (262 Wh idle), 168 g CO2, 0.13 EUR" in render_text(weekly)
    doc = to_document(weekly)["report"]["energy"]
    assert doc["by_user"][0]["kwh"] == pytest.approx(KWH)


def test_weekly_report_command_carries_the_energy_section(
    stored: tuple[Any, JobRecord], tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from slurm_gpu.cli.admin import cli as admin

    settings, job = stored
    cfg = tmp_path / "weekly.toml"
    cfg.write_text(
        f'[store]\nurl = "{settings.store_url}"\n'
        "[energy]\nprice_per_kwh = 0.30\nco2_g_per_kwh = 400.0\n"
    )
    assert job.end_s is not None
    day = datetime.fromtimestamp(job.end_s, UTC).strftime("%Y-%m-%d")
    res = CliRunner().invoke(
        admin, ["--config", str(cfg), "report", "weekly", "--since", day, "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    energy = json.loads(res.stdout)["report"]["energy"]
    [user] = energy["by_user"]
    assert user["key"] == job.user and user["jobs"] == 1
    assert user["kwh"] == pytest.approx(KWH) and user["co2_kg"] == pytest.approx(CO2_KG)
    assert user["cost"] == pytest.approx(COST) and energy["currency"] == "EUR"
