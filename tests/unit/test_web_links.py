"""``[web] base_url`` makes ``gpueff`` and the e-mail after the job link to the job's page
(issue 30, point 1); without it neither does."""

from __future__ import annotations

from pathlib import Path

import pytest
import web_fixtures as W
from click.testing import CliRunner

from slurm_gpu.cli.gpueff import BACKENDS_KEY, cli
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.jobreport.service import page_url, report_for
from slurm_gpu.notify.message import MailContext, MessageBuilder


@pytest.mark.parametrize("base", ["https://ood.example.org/pun/sys/slurm-gpu/", ""])
def test_gpueff_and_mail_link_to_the_page(tmp_path: Path, base: str) -> None:
    settings = W.settings_for(tmp_path, base_url=base)
    stored = W.store_jobs(settings)
    accounting = W.ServiceAccounting(stored)
    reader = StoreAndSpoolReader(settings)
    try:
        out = CliRunner().invoke(
            cli, ["2000_1"], obj={BACKENDS_KEY: (accounting, reader)}, catch_exceptions=False
        )
        report = report_for(stored[0], reader, min_elapsed_s=30)
    finally:
        reader.close()
    assert out.exit_code == 0, out.output
    msg = MessageBuilder(from_address="slurm-gpu@localhost", context=MailContext()).build(
        [report], to="sgtest1@localhost"
    )
    plain, html = msg.get_body(("plain",)), msg.get_body(("html",))
    assert plain is not None and html is not None
    if base:
        assert "Web page  https://ood.example.org/pun/sys/slurm-gpu/job/2000_1" in out.output
        link = "https://ood.example.org/pun/sys/slurm-gpu/job/1001"
        assert f"gpueff 1001 or {link}" in plain.get_content()
        assert f'<a href="{link}">' in html.get_content()
    else:
        assert "Web page" not in out.output and "/job/" not in plain.get_content()


def test_page_url_quotes_what_is_not_an_id() -> None:
    assert page_url("https://x/y/", "1234_7") == "https://x/y/job/1234_7"
    assert page_url("https://x", "12+0") == "https://x/job/12+0"
    assert page_url("https://x", "a/b") == "https://x/job/a%2Fb"
