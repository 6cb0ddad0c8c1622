"""The demo's orchestration helpers, with Slurm's commands faked at the runner seam and a real
loopback SMTP sink."""

from __future__ import annotations

import smtplib
import socket
import subprocess
from collections.abc import Sequence
from email.message import EmailMessage
from pathlib import Path

from slurm_gpu.demo.mailsink import EmlSink
from slurm_gpu.demo.showcase import (
    EndedJob,
    as_user,
    collect_until_stored,
    iso_utc,
    mail_command,
    mail_subject,
)
from slurm_gpu.demo.submit import DEMO_ORDER, demo_order, mail_program, submit_all


class FakeRunner:
    def __init__(self, stdout: str = "", returncode: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.stdout = stdout
        self.returncode = returncode

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        out = self.stdout or f"{100 + len(self.calls)};sgtest"
        return subprocess.CompletedProcess(list(argv), self.returncode, out, "")


def test_rounds_order_packs_four_gpus() -> None:
    assert demo_order(["idle-tail", "healthy", "dataloader"]) == [
        "healthy",
        "dataloader",
        "idle-tail",
    ]
    assert sorted(DEMO_ORDER) == sorted(set(DEMO_ORDER))


def test_mail_args_go_only_to_the_named_patterns(tmp_path: Path) -> None:
    runner = FakeRunner()
    scripts = [tmp_path / "healthy.sbatch", tmp_path / "near-oom.sbatch"]
    jobs = submit_all(
        scripts,
        user="sgtest1",
        python="/venv/bin/python",
        config_path="/tc/slurm-gpu.toml",
        extra_args={"near-oom": ["--mail-type=END", "--mail-user=sgtest1@localhost"]},
        runner=runner,
    )
    assert [j.job_id for j in jobs] == ["101", "102"]
    assert "--mail-type=END" not in runner.calls[0]
    assert runner.calls[1][:4] == ["runuser", "-u", "sgtest1", "--"]
    assert runner.calls[1][-3:] == [
        "--mail-type=END",
        "--mail-user=sgtest1@localhost",
        str(scripts[1]),
    ]


def test_mail_program_is_read_from_scontrol() -> None:
    runner = FakeRunner("JobCompType = jobcomp/none\nMailProg                = /usr/bin/mail\n")
    assert mail_program(runner) == "/usr/bin/mail"
    assert mail_program(FakeRunner("x", returncode=1)) is None


def test_collect_runs_until_every_job_is_stored() -> None:
    runner = FakeRunner()
    stored_after = [set(), {"1"}, {"1", "2"}]

    def stored(ids: Sequence[str]) -> set[str]:
        return stored_after[min(len(runner.calls), len(stored_after)) - 1]

    missing = collect_until_stored(
        ["collect"], ["1", "2"], stored, timeout_s=60, runner=runner, sleep=lambda s: None
    )
    assert missing == set() and len(runner.calls) == 3


def test_collect_gives_up_at_the_timeout() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    missing = collect_until_stored(
        ["collect"],
        ["1"],
        lambda ids: set(),
        timeout_s=10,
        poll_s=4,
        runner=FakeRunner(),
        sleep=sleep,
        clock=lambda: now[0],
    )
    assert missing == {"1"}


def test_mail_command_is_what_slurmctld_runs() -> None:
    job = EndedJob("12", "demo-near-oom", "COMPLETED", 41, 0)
    assert mail_subject(job) == (
        "Slurm Job_id=12 Name=demo-near-oom Ended, Run time 00:00:41, COMPLETED, ExitCode 0"
    )
    argv, env = mail_command(["slurm-gpu", "mail"], job, "sgtest1@localhost")
    assert argv[-1] == "sgtest1@localhost" and "--foreground" in argv
    assert env["SLURM_JOB_ID"] == "12" and env["SLURM_JOB_MAIL_TYPE"] == "Ended"
    failed = EndedJob("13", "x", "FAILED", 3600, 1)
    assert "Failed, Run time 01:00:00, FAILED, ExitCode 1" in mail_subject(failed)


def test_as_user_and_iso() -> None:
    assert as_user(["gpueff", "1"], "sgtest1", {"A": "b"}) == [
        "runuser",
        "-u",
        "sgtest1",
        "--",
        "env",
        "A=b",
        "gpueff",
        "1",
    ]
    assert as_user(["gpueff"], None, {}) == ["env", "gpueff"]
    assert iso_utc(0) == "1970-01-01T00:00:00"


def test_sink_saves_each_message_as_eml(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = EmlSink(tmp_path / "mail", port=port)
    sink.start()
    try:
        msg = EmailMessage()
        msg["From"] = "slurm-gpu@localhost"
        msg["To"] = "sgtest1@localhost"
        msg["Subject"] = "job 12"
        msg.set_content("hello")
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
            smtp.send_message(msg, to_addrs=["sgtest1@localhost"])
    finally:
        sink.stop()
    [path] = sink.saved
    assert path.name == "0001-sgtest1@localhost.eml"
    assert b"Subject: job 12" in path.read_bytes()
    assert path.stat().st_mode & 0o777 == 0o644
