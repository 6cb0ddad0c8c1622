"""The demo's e-mail summary: enriched messages counted at a real loopback SMTP sink, plain
fallback mails counted from what the test cluster's real fallback recorder
(``share/testcluster/fallback-mail.in``, run as a process) writes, and a loud failure when a
job that asked for mail got none (issue 14: a fresh machine sent no enriched e-mail and the demo
still ended with exit 0)."""

from __future__ import annotations

import os
import smtplib
import socket
import subprocess
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest

from slurm_gpu.demo.mailcheck import (
    MailTally,
    failure_line,
    fallback_dir_of,
    fallback_job_ids,
    summary_line,
    tally_mail,
)
from slurm_gpu.demo.mailsink import EmlSink
from slurm_gpu.resources import data_dir

PATTERNS = {"101": "idle-gpu", "102": "dataloader", "103": "near-oom"}


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[EmlSink]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = EmlSink(tmp_path / "mail", port=port)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def tc_root(tmp_path: Path) -> Path:
    """A test cluster root with the fallback recorder rendered as ``start`` renders it."""
    root = tmp_path / "tc"
    (root / "hooks").mkdir(parents=True)
    (root / "fallback-mail").mkdir()
    source = data_dir("share") / "testcluster" / "fallback-mail.in"
    prog = root / "hooks" / "fallback-mail"
    prog.write_text(source.read_text().replace("@TC_ROOT@", str(root)))
    prog.chmod(0o755)
    return root


def send_enriched(sink: EmlSink, job_ids: str) -> None:
    msg = EmailMessage()
    msg["From"] = "slurm-gpu@localhost"
    msg["To"] = "sgtest1@localhost"
    msg["Subject"] = f"Slurm Job_id={job_ids} Ended"
    msg["X-Slurm-Job-Id"] = job_ids
    msg.set_content("what the job used")
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=10) as smtp:
        smtp.send_message(msg, to_addrs=["sgtest1@localhost"])


def run_fallback(root: Path, job_id: str) -> None:
    """Run the fallback recorder as the mail program runs the plain path."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job_id, "SLURM_JOB_MAIL_TYPE": "Ended"}
    subprocess.run(
        [str(root / "hooks" / "fallback-mail"), "-s", f"Slurm Job_id={job_id} Ended", "sgtest1"],
        env=env,
        input="",
        text=True,
        check=True,
        timeout=30,
    )


def test_demo_counts_enriched_and_fallback_mail_separately(
    sink: EmlSink, tc_root: Path, tmp_path: Path
) -> None:
    send_enriched(sink, "101")
    run_fallback(tc_root, "102")
    fdir = fallback_dir_of(str(tc_root / "hooks" / "fallback-mail"))
    assert fdir == tc_root / "fallback-mail"
    tally = tally_mail(
        ["101", "102"], lambda: sink.saved, fdir, since_s=0, timeout_s=0, sleep=lambda s: None
    )
    assert (tally.enriched, tally.fallback) == ({"101"}, {"102"})
    line = summary_line(tally, tmp_path / "mail", fdir)
    assert "2 jobs asked for mail: 1 enriched" in line and "1 plain fallback" in line
    failed = failure_line(tally, PATTERNS)
    assert failed is not None and "\n" not in failed
    assert "only the plain fallback for job 102 (dataloader)" in failed


def test_demo_fails_loudly_when_a_mailed_job_got_no_mail(
    sink: EmlSink, tc_root: Path, tmp_path: Path
) -> None:
    send_enriched(sink, "101")
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    fdir = tc_root / "fallback-mail"
    tally = tally_mail(
        ["101", "103"],
        lambda: sink.saved,
        fdir,
        since_s=0,
        timeout_s=5,
        poll_s=1,
        sleep=sleep,
        clock=lambda: now[0],
    )
    assert now[0] >= 5, "it waited for the missing mail until the timeout"
    assert tally.missing == ("103",) and not tally.complete
    failed = failure_line(tally, PATTERNS)
    assert failed is not None and "no mail at all for job 103 (near-oom)" in failed


def test_demo_summary_passes_when_every_mailed_job_got_its_enriched_message(
    sink: EmlSink, tc_root: Path, tmp_path: Path
) -> None:
    # One digest names both jobs; the second job's message arrives while the demo waits.
    arrivals = iter([lambda: send_enriched(sink, "101,102")])

    def sleep(s: float) -> None:
        next(arrivals, lambda: None)()

    tally = tally_mail(
        ["101", "102"],
        lambda: sink.saved,
        tc_root / "fallback-mail",
        since_s=0,
        timeout_s=60,
        sleep=sleep,
    )
    assert tally.enriched == {"101", "102"} and tally.complete
    assert failure_line(tally, PATTERNS) is None
    assert "2 enriched" in summary_line(tally, tmp_path / "mail", tc_root / "fallback-mail")
    assert "0 plain fallback" in summary_line(tally, tmp_path / "mail", tc_root / "fallback-mail")


def test_demo_ignores_fallback_mail_of_an_earlier_demo(tc_root: Path) -> None:
    run_fallback(tc_root, "102")
    [old] = list((tc_root / "fallback-mail").iterdir())
    os.utime(old, (1000.0, 1000.0))
    run_fallback(tc_root, "103")
    assert fallback_job_ids(tc_root / "fallback-mail", since_s=2000.0) == {"103"}


def test_demo_fallback_of_a_site_mail_program_is_not_observable(tmp_path: Path) -> None:
    assert fallback_dir_of("/usr/bin/mail") is None
    tally = MailTally(("101",), frozenset(), frozenset(), fallback_known=False)
    assert "not observable" in summary_line(tally, tmp_path, None)
    failed = failure_line(tally, PATTERNS)
    assert failed is not None and "no enriched e-mail for job 101 (idle-gpu)" in failed
