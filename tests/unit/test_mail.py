"""The e-mail after a job, sent through a real SMTP server on loopback (aiosmtpd)."""

from __future__ import annotations

import email
import email.policy
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path

import gpueff_factory as F
import pytest
from aiosmtpd.controller import Controller
from click.testing import CliRunner

from slurm_gpu.cli.mail_cmd import NOTIFIER_KEY, cli
from slurm_gpu.config import parse_settings
from slurm_gpu.errors import MailError, StoreBehindError, StoreNotCreatedError
from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.charts import charts_for
from slurm_gpu.jobreport.model import FindingView, RecommendationView, Telemetry
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.notify.message import MailContext, MessageBuilder, clean_subject
from slurm_gpu.notify.service import MailRequest, Notifier, NotifyOptions, Outcome
from slurm_gpu.notify.state import MailState, read_opt_out
from slurm_gpu.notify.transport import DirMailer, SendmailMailer, SmtpMailer
from slurm_gpu.records import JobRecord, Tres

DOCS = "https://hpc.example.org/docs/gpu"


# --------------------------------------------------------------------------- real SMTP server


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    data: bytes

    @property
    def message(self) -> EmailMessage:
        msg = email.message_from_bytes(self.data, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        return msg


@dataclass
class Inbox:
    received: list[Received] = field(default_factory=list)

    async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
        self.received.append(
            Received(
                envelope.mail_from,  # type: ignore[attr-defined]
                list(envelope.rcpt_tos),  # type: ignore[attr-defined]
                envelope.original_content,  # type: ignore[attr-defined]
            )
        )
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    with socket.socket() as probe:  # a free port (aiosmtpd checks readiness by connecting)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


# --------------------------------------------------------------------------- fakes at seams


class FakeAccounting:
    name = "fake"

    def __init__(self, jobs: Sequence[JobRecord]) -> None:
        self.jobs = list(jobs)
        self.calls = 0

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        self.calls += 1
        return {
            j.job_id: j for j in self.jobs if any(q in (j.job_id, j.array_job_id) for q in job_ids)
        }

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        return []


class Reader:
    """Stored telemetry appears after ``after`` looks (the collector is a little late)."""

    def __init__(self, after: int = 0, tel: Telemetry | None = None) -> None:
        self.after = after
        self.looks = 0
        self.tel = tel or telemetry()

    def final(self, job: JobRecord) -> Telemetry | None:
        self.looks += 1
        return self.tel if self.looks > self.after else None

    def live(self, job: JobRecord) -> Telemetry | None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def telemetry() -> Telemetry:
    return Telemetry(
        gpus=adapter.gpu_lines_from_records([F.node_record()], spark_points=60),
        live=False,
        findings=(
            FindingView(
                code="GPU_UNUSED",
                severity="critical",
                cause=6,
                title="An allocated GPU was never used",
                text="GPU node1:1 ran no process during the whole job.",
                evidence=(("mean duty cycle", "0 %"),),
            ),
        ),
        recommendations=(RecommendationView(text="", sbatch_lines=("#SBATCH --gpus=1",)),),
    )


def notifier(
    port: int,
    jobs: Sequence[JobRecord],
    tmp_path: Path,
    *,
    reader: Reader | None = None,
    clock: Clock | None = None,
    opts: NotifyOptions | None = None,
) -> Notifier:
    clock = clock or Clock()
    return Notifier(
        accounting=FakeAccounting(jobs),
        reader=reader or Reader(),
        builder=MessageBuilder(
            from_address="slurm-gpu@cluster.example.org",
            context=MailContext(docs_url=DOCS),
            charts=charts_for,
        ),
        mailer=SmtpMailer("127.0.0.1", port, sender="slurm-gpu@cluster.example.org"),
        state=MailState(str(tmp_path / "state" / "mail-state.db")),
        options=opts or NotifyOptions(wait_for_record_s=30, poll_interval_s=3),
        now=clock,
        clock=clock,
        sleep=clock.sleep,
    )


def end_request(job_id: str = "1001", to: str = "sgtest1@example.org", **kw: str) -> MailRequest:
    subject = kw.pop("subject", f"Slurm Job_id={job_id} Name=train-resnet Ended, COMPLETED")
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_JOB_STATE": "COMPLETED"}
    env.update(kw)
    return MailRequest.from_env(subject, [to], env)


def html_of(msg: EmailMessage) -> str:
    part = msg.get_body(("html",))
    assert part is not None
    return str(part.get_content())


# --------------------------------------------------------------------------- the message


def test_end_mail_arrives_as_text_and_html_with_inline_chart(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    n = notifier(port, [F.job()], tmp_path)
    assert n.handle(end_request()) is Outcome.SENT
    assert len(inbox.received) == 1
    got = inbox.received[0]
    assert got.rcpt_tos == ["sgtest1@example.org"]
    msg = got.message
    assert msg.get_content_type() == "multipart/alternative"
    plain, related = msg.get_payload()  # type: ignore[misc]
    assert plain.get_content_type() == "text/plain"
    assert related.get_content_type() == "multipart/related"
    html = html_of(msg)
    images = {
        p["Content-ID"].strip("<>"): p for p in msg.walk() if p.get_content_type() == "image/png"
    }
    cids = re.findall(r'src="cid:([^"]+)"', html)
    assert cids and set(cids) == set(images)
    png = images[cids[0]].get_content()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000
    text = plain.get_content()
    assert "Job 1001 (train-resnet) ended: COMPLETED" in text
    assert "#SBATCH --gpus=1" in text and "#SBATCH --gpus=1" in html
    assert "2.00 allocated, 1.00 idle" in text
    assert "An allocated GPU was never used" in html
    assert "gpueff 1001" in text and "gpueff 1001" in html
    assert f'<a href="{DOCS}">' in html
    assert msg["Subject"] == "Slurm Job_id=1001 Name=train-resnet Ended, COMPLETED - GPUs 40% busy"
    assert msg["Auto-Submitted"] == "auto-generated"


def test_job_name_cannot_inject_headers_or_html(smtp: tuple[Inbox, int], tmp_path: Path) -> None:
    inbox, port = smtp
    evil = "x\r\nBcc: evil@attacker.example\r\n\r\n<script>alert(1)</script>"
    n = notifier(port, [F.job(job_name=evil)], tmp_path)
    subject = f"Slurm Job_id=1001 Name={evil} Ended"
    assert n.handle(end_request(subject=subject)) is Outcome.SENT
    got = inbox.received[0]
    assert got.rcpt_tos == ["sgtest1@example.org"]
    msg = got.message
    assert msg["Bcc"] is None
    assert "\n" not in msg["Subject"] and "\r" not in msg["Subject"]
    html = html_of(msg)
    assert "<script>" not in html and "&lt;script&gt;" in html
    header_block = got.data.split(b"\r\n\r\n", 1)[0]
    # "Bcc:" survives only as harmless text inside the one-line subject, never as a header.
    assert not any(line.lower().startswith(b"bcc:") for line in header_block.split(b"\r\n"))


def test_recipient_with_two_addresses_is_refused(tmp_path: Path, smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    n = notifier(port, [F.job()], tmp_path)
    with pytest.raises(MailError):
        n.handle(end_request(to="sgtest1@example.org,evil@attacker.example"))
    with pytest.raises(MailError):
        n.handle(end_request(to="sgtest1@example.org\r\nRCPT TO:<evil@attacker.example>"))
    assert inbox.received == []


def test_subject_is_cleaned_and_bounded() -> None:
    assert clean_subject("a\r\nb\tc\x1b[31m") == "a b c [31m"
    assert len(clean_subject("x" * 1000)) == 150


def test_bare_user_gets_the_site_domain(smtp: tuple[Inbox, int], tmp_path: Path) -> None:
    inbox, port = smtp
    n = notifier(port, [F.job()], tmp_path, opts=NotifyOptions(recipient_domain="example.org"))
    assert n.handle(end_request(to="sgtest1")) is Outcome.SENT
    assert inbox.received[0].rcpt_tos == ["sgtest1@example.org"]


# --------------------------------------------------------------------------- which mails


@pytest.mark.parametrize("mail_type", ["Began", "BEGIN", "Requeued", "Reached time limit"])
def test_other_mail_types_are_not_enriched(
    smtp: tuple[Inbox, int], tmp_path: Path, mail_type: str
) -> None:
    inbox, port = smtp
    n = notifier(port, [F.job()], tmp_path)
    assert n.handle(end_request(SLURM_JOB_MAIL_TYPE=mail_type)) is Outcome.FALLBACK
    assert inbox.received == []


def test_cpu_only_job_is_not_enriched(smtp: tuple[Inbox, int], tmp_path: Path) -> None:
    inbox, port = smtp
    cpu_job = F.job(alloc_tres=Tres(cpus=4, gpus=0, raw="cpu=4"))
    assert notifier(port, [cpu_job], tmp_path).handle(end_request()) is Outcome.FALLBACK
    assert inbox.received == []


def test_waits_for_the_stored_record(smtp: tuple[Inbox, int], tmp_path: Path) -> None:
    inbox, port = smtp
    clock = Clock()
    reader = Reader(after=3)
    n = notifier(port, [F.job()], tmp_path, reader=reader, clock=clock)
    assert n.handle(end_request()) is Outcome.SENT
    assert reader.looks == 4 and clock.t == pytest.approx(1009.0)
    assert "80 % busy" in inbox.received[0].message.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def test_gives_up_waiting_and_says_telemetry_is_pending(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    clock = Clock()
    n = notifier(port, [F.job()], tmp_path, reader=Reader(after=10**6), clock=clock)
    assert n.handle(end_request()) is Outcome.SENT
    assert clock.t - 1000.0 <= 30.0
    text = inbox.received[0].message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "has not been collected yet" in text and "% busy" not in text


# --------------------------------------------------------------------------- arrays and bursts


def _tasks(n: int) -> list[JobRecord]:
    return [
        F.job(
            job_id=str(3000 + i),
            job_id_display=f"2999_{i}",
            array_job_id="2999",
            array_task_id=str(i),
        )
        for i in range(n)
    ]


def test_whole_array_end_mail_is_one_digest(smtp: tuple[Inbox, int], tmp_path: Path) -> None:
    inbox, port = smtp
    tasks = _tasks(50)
    n = notifier(port, tasks, tmp_path)
    acc = n.accounting
    assert isinstance(acc, FakeAccounting)
    req = end_request(
        "3049",
        subject="Slurm Array Summary Job_id=2999_* (2999) Name=train-resnet Ended",
        SLURM_ARRAY_JOB_ID="2999",
        SLURM_ARRAY_TASK_ID="49",
    )
    assert n.handle(req) is Outcome.SENT
    assert len(inbox.received) == 1 and acc.calls == 1
    msg = inbox.received[0].message
    assert msg["Subject"].startswith("Slurm GPU digest, array 2999: 50 tasks")
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "50 jobs ended" in text and "2999_0" in text and "2999_49" in text
    # The same mail again (Slurm retried) is not sent twice.
    assert n.handle(req) is Outcome.DUPLICATE
    assert len(inbox.received) == 1


class LateAccounting(FakeAccounting):
    """Accounting that learns about the jobs late: call N sees ``snapshots[N]`` (the last one
    from then on), as slurmdbd does right after a job ended."""

    def __init__(self, snapshots: Sequence[Sequence[JobRecord]]) -> None:
        super().__init__(snapshots[0])
        self.snapshots = [list(s) for s in snapshots]

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        self.jobs = self.snapshots[min(self.calls, len(self.snapshots) - 1)]
        return super().get_jobs(job_ids)


def test_whole_array_mail_waits_until_accounting_has_every_task(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    tasks = _tasks(3)
    # Seen live: the first query after a 3-task array ended returned one unsettled task.
    early = F.job(
        job_id="3002",
        job_id_display="2999_2",
        array_job_id="2999",
        array_task_id="2",
        job_name="allocation",
        state="RUNNING",
        end_s=None,
        time_limit_s=None,
    )
    clock = Clock()
    n = notifier(port, [], tmp_path, clock=clock)
    n.accounting = acc = LateAccounting([[early], [tasks[2]], tasks])
    req = end_request(
        "3002",
        subject="Slurm Array Summary Job_id=2999_* (2999) Name=train-resnet Ended",
        SLURM_ARRAY_JOB_ID="2999",
        SLURM_ARRAY_TASK_ID="2",
        SLURM_ARRAY_TASK_COUNT="3",
    )
    assert n.handle(req) is Outcome.SENT
    assert acc.calls == 3 and clock.t == pytest.approx(1006.0)
    text = inbox.received[0].message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "3 jobs ended" in text and "2999_0" in text and "allocation" not in text


def test_single_mail_waits_for_settled_accounting_but_not_forever(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    unsettled = F.job(state="COMPLETED", end_s=None)
    clock = Clock()
    n = notifier(port, [], tmp_path, clock=clock)
    n.accounting = acc = LateAccounting([[unsettled], [unsettled], [F.job()]])
    assert n.handle(end_request()) is Outcome.SENT
    assert acc.calls == 3
    # Never settled: after wait_for_record_s the mail goes out with what accounting has.
    clock2 = Clock()
    n2 = notifier(port, [], tmp_path / "2", clock=clock2)
    n2.accounting = acc2 = LateAccounting([[unsettled]])
    assert n2.handle(end_request()) is Outcome.SENT
    assert acc2.calls == 11 and clock2.t == pytest.approx(1030.0)  # every 3 s for 30 s
    assert len(inbox.received) == 2


def test_burst_of_task_mails_is_throttled_into_one_digest(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    clock = Clock()
    tasks = _tasks(20)
    opts = NotifyOptions(digest_window_s=3600, max_per_user_per_window=3)
    n = notifier(port, tasks, tmp_path, clock=clock, opts=opts)
    outcomes = [
        n.handle(
            end_request(
                t.job_id, SLURM_ARRAY_JOB_ID="2999", SLURM_ARRAY_TASK_ID=t.array_task_id or ""
            )
        )
        for t in tasks
    ]
    assert outcomes.count(Outcome.SENT) == 3 and outcomes.count(Outcome.QUEUED) == 17
    assert len(inbox.received) == 3
    assert n.flush() == 0  # not due yet: the burst may go on
    clock.t += 3601
    assert n.flush() == 1
    assert len(inbox.received) == 4
    digest = inbox.received[3].message
    assert "17 jobs" in digest["Subject"] or "17 tasks" in digest["Subject"]
    assert n.flush() == 0


# --------------------------------------------------------------------------- state and policy


def test_policy_mail_at_most_once_per_period(tmp_path: Path) -> None:
    state = MailState(str(tmp_path / "s.db"))
    assert state.admit_policy("alice", "1", now_s=0, period_s=100)
    assert not state.admit_policy("alice", "2", now_s=50, period_s=100)
    assert state.admit_policy("bob", "3", now_s=50, period_s=100)
    assert state.admit_policy("alice", "4", now_s=101, period_s=100)


def test_opt_out_list(tmp_path: Path) -> None:
    path = tmp_path / "optout"
    path.write_text("# users who asked not to be mailed\nalice\n  bob  # since 2026\n\n")
    assert read_opt_out(str(path)) == {"alice", "bob"}
    assert read_opt_out(str(tmp_path / "missing")) == frozenset()


# --------------------------------------------------------------------------- transports


def test_dry_run_writes_eml(tmp_path: Path) -> None:
    builder = MessageBuilder(from_address="a@b.org", context=MailContext())
    report = adapter.accounting_report(F.job())
    mailer = DirMailer(str(tmp_path / "out"))
    mailer.send(builder.build([report], to="sgtest1@example.org"), ["sgtest1@example.org"])
    (eml,) = (tmp_path / "out").iterdir()
    assert eml.name == "0001-sgtest1@example.org.eml"
    parsed = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
    assert parsed["To"] == "sgtest1@example.org"


def test_sendmail_transport_gets_explicit_recipients(tmp_path: Path) -> None:
    log = tmp_path / "sendmail.log"
    script = tmp_path / "sendmail"
    script.write_text(f'#!/bin/sh\necho "$@" > {log}\ncat > {log}.msg\n')
    script.chmod(0o755)
    builder = MessageBuilder(from_address="a@b.org", context=MailContext())
    msg = builder.build([adapter.accounting_report(F.job())], to="sgtest1@example.org")
    SendmailMailer(str(script), sender="a@b.org").send(msg, ["sgtest1@example.org"])
    assert log.read_text().split() == ["-i", "-f", "a@b.org", "--", "sgtest1@example.org"]
    assert b"Subject: Slurm Job_id=1001" in (tmp_path / "sendmail.log.msg").read_bytes()


def test_smtp_refusal_is_a_mail_error(tmp_path: Path) -> None:
    builder = MessageBuilder(from_address="a@b.org", context=MailContext())
    msg = builder.build([adapter.accounting_report(F.job())], to="x@y.org")
    with pytest.raises(MailError):
        SmtpMailer("127.0.0.1", 1, timeout_s=2).send(msg, ["x@y.org"])


# --------------------------------------------------------------------------- the MailProg CLI


def _fallback_script(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "fallback.log"
    script = tmp_path / "mail"
    script.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done > {log}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def _config(tmp_path: Path, port: int, fallback: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[mail]\nfallback_mailprog = "{fallback}"\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\n'
    )
    return cfg


def test_cli_execs_the_fallback_with_the_same_arguments(tmp_path: Path) -> None:
    fallback, log = _fallback_script(tmp_path)
    cfg = _config(tmp_path, 1, fallback)
    env = {**os.environ, "SLURM_JOB_ID": "1001", "SLURM_JOB_MAIL_TYPE": "Began"}
    subject = "Slurm Job_id=1001 Name=a b Began, Queued time 00:00:01"
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_gpu.cli.mail_cmd", str(cfg), "-s", subject, "sgtest1"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == ["-s", subject, "sgtest1"]


def test_cli_sends_enriched_mail_in_the_foreground(
    smtp: tuple[Inbox, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox, port = smtp
    fallback, log = _fallback_script(tmp_path)
    cfg = _config(tmp_path, port, fallback)

    def factory(settings: object, dry_run_dir: str | None) -> Notifier:
        return notifier(port, [F.job()], tmp_path)

    for k, v in {"SLURM_JOB_ID": "1001", "SLURM_JOB_MAIL_TYPE": "Ended"}.items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(
        cli,
        [
            "--config",
            str(cfg),
            "--foreground",
            "-s",
            "Slurm Job_id=1001 Ended",
            "sgtest1@example.org",
        ],
        obj={NOTIFIER_KEY: factory},
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    assert len(inbox.received) == 1 and not log.exists()


def test_policy_mails_wasteful_jobs_once_per_period(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    from slurm_gpu.notify.service import policy_mails

    inbox, port = smtp
    quiet = dict(mail_type=None, mail_user=None)
    jobs = [
        F.job(job_id="1", job_id_display="1", **quiet),  # 1.0 GPU-h idle (GPU 1 unused): mailed
        F.job(job_id="2", job_id_display="2", **quiet),  # same user, same period: not again
        F.job(job_id="3", job_id_display="3", user="optout", **quiet),
        F.job(job_id="4", job_id_display="4", user="bob", mail_type="END"),  # gets Slurm's mail
        F.job(job_id="5", job_id_display="5", user="carol", elapsed_s=600, **quiet),  # 0.17 GPU-h
    ]
    n = notifier(port, jobs, tmp_path, opts=NotifyOptions(recipient_domain="example.org"))
    mailed = policy_mails(n, jobs, min_gpu_hours=1.0, period_s=86400, opt_out=frozenset({"optout"}))
    assert mailed == ["1"]
    assert [r.rcpt_tos for r in inbox.received] == [["sgtest1@example.org"]]
    assert policy_mails(n, jobs, min_gpu_hours=1.0, period_s=86400, opt_out=frozenset()) == ["3"]


# ----------------------------------------------------------------------- a store not created yet


class NoStoreYet(Reader):
    """The store file appears (the first collection ran) after ``after`` looks."""

    def final(self, job: JobRecord) -> Telemetry | None:
        self.looks += 1
        if self.looks <= self.after:
            raise StoreNotCreatedError("store /x/slurm-gpu.db does not exist yet")
        return self.tel


def test_fresh_install_waits_for_the_store_like_for_a_record(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    clock = Clock()
    reader = NoStoreYet(after=2)
    n = notifier(port, [F.job()], tmp_path, reader=reader, clock=clock)
    assert n.handle(end_request()) is Outcome.SENT
    assert reader.looks == 3
    assert "80 % busy" in inbox.received[0].message.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def test_store_never_created_ends_in_the_fallback_saying_so(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    clock = Clock()
    settings = parse_settings({"paths": {"state_dir": str(tmp_path / "never")}}, path=None)
    reader = StoreAndSpoolReader(settings)
    n = notifier(port, [F.job()], tmp_path, reader=reader, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(StoreNotCreatedError, match="does not exist yet after waiting 30 s"):
        n.handle(end_request())
    assert 27.0 <= clock.t - 1000.0 <= 30.0
    assert inbox.received == []


class StoreBehindYet(Reader):
    """The store is at an older schema until the collector's next pass migrates it."""

    def final(self, job: JobRecord) -> Telemetry | None:
        self.looks += 1
        if self.looks <= self.after:
            raise StoreBehindError("store /x/slurm-gpu.db is at schema version 3")
        return self.tel


def test_store_behind_this_release_is_waited_for_until_the_collector_migrates_it(
    smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    inbox, port = smtp
    reader = StoreBehindYet(after=2)
    n = notifier(port, [F.job()], tmp_path, reader=reader, clock=Clock())
    assert n.handle(end_request()) is Outcome.SENT
    assert reader.looks == 3
    assert "80 % busy" in inbox.received[0].message.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def test_the_mail_names_the_signal_that_ended_the_job() -> None:
    builder = MessageBuilder(from_address="a@b.org", context=MailContext())
    report = adapter.accounting_report(F.job(state="FAILED", exit_code=0, exit_signal=9))
    msg = builder.build([report], to="sgtest1@example.org")
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "ended: FAILED, signal 9, SIGKILL." in text, text
    assert "exit code 0" not in text and "exit code 0" not in html
    assert "FAILED, signal 9, SIGKILL" in html


def _admin_dry_run(
    tmp_path: Path, env: dict[str, str], factory: object | None = None
) -> tuple[object, Path, Path]:
    """``slurm-gpu mail --dry-run --mail-dir DIR -s SUBJECT sgtest1`` with a fallback mail
    program that logs its arguments when it runs."""
    fallback, log = _fallback_script(tmp_path)
    cfg = _config(tmp_path, 1, fallback)
    out = tmp_path / "mails"
    argv = ["--config", str(cfg), "--dry-run", "--mail-dir", str(out)]
    argv += ["-s", "Slurm Job_id=1001 Name=wrap Ended, TIMEOUT, ExitCode 0", "sgtest1"]
    obj = {NOTIFIER_KEY: factory} if factory is not None else {}
    res = CliRunner().invoke(cli, argv, env=env, obj=obj, catch_exceptions=False)
    return res, log, out


def test_a_dry_run_without_the_job_environment_sends_nothing_and_says_why(
    tmp_path: Path,
) -> None:
    """Seen on the test cluster: without ``SLURM_JOB_ID`` and ``SLURM_JOB_MAIL_TYPE`` the
    request is not an END mail about a job, and ``--dry-run`` ran the site's fallback mail
    program: a real mail, from a command that says it sends nothing."""
    unset = {"SLURM_JOB_ID": None, "SLURM_JOB_MAIL_TYPE": None}
    res, log, out = _admin_dry_run(tmp_path, unset)  # type: ignore[arg-type]
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert not log.exists(), "the fallback mail program ran in a dry run"
    assert not out.exists() or not any(out.iterdir())
    said = res.output  # type: ignore[attr-defined]
    assert "nothing sent" in said and "SLURM_JOB_ID" in said and "SLURM_JOB_MAIL_TYPE" in said


def test_a_dry_run_the_notifier_hands_back_sends_nothing(tmp_path: Path) -> None:
    """A job the enriched mail does not cover (no GPU, not settled): the plain mail would go
    through the fallback; a dry run says so and runs nothing."""

    class Back:
        def handle(self, req: object) -> Outcome:
            return Outcome.FALLBACK

        def flush(self) -> int:
            return 0

    env = {"SLURM_JOB_ID": "1001", "SLURM_JOB_MAIL_TYPE": "Ended"}
    res, log, _ = _admin_dry_run(tmp_path, env, lambda s, d: Back())
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert not log.exists(), "the fallback mail program ran in a dry run"
    assert "nothing sent" in res.output  # type: ignore[attr-defined]


def test_a_dry_run_whose_notifier_fails_sends_nothing(tmp_path: Path) -> None:
    class Failing:
        def handle(self, req: object) -> Outcome:
            raise MailError("smtp refused")

        def flush(self) -> int:
            return 0

    env = {"SLURM_JOB_ID": "1001", "SLURM_JOB_MAIL_TYPE": "Ended"}
    res, log, _ = _admin_dry_run(tmp_path, env, lambda s, d: Failing())
    assert not log.exists(), "the fallback mail program ran in a dry run"
    assert res.exit_code == MailError.exit_code, res.output  # type: ignore[attr-defined]
    assert "smtp refused" in res.output  # type: ignore[attr-defined]


def test_a_dry_runs_notifier_decides_from_the_real_state_and_records_nothing_in_it(
    tmp_path: Path,
) -> None:
    """``--policy --dry-run`` recorded its policy mails in the real state: the real run of the
    same period then skipped those users. A dry run works on a private copy."""
    from slurm_gpu.cli.mail_cmd import build_notifier

    settings = parse_settings(
        {
            "paths": {"state_dir": str(tmp_path / "state")},
            "mail": {"state_dir": str(tmp_path / "m")},
        },
        path=None,
    )
    real = MailState(str(tmp_path / "m" / "mail-state.db"))
    assert real.admit_policy("bob", "1", now_s=1000.0, period_s=86400)  # bob mailed earlier
    dry = build_notifier(settings, str(tmp_path / "out"))
    assert dry.state.path != real.path
    # The copy knows what the real state knows ...
    assert not dry.state.admit_policy("bob", "2", now_s=2000.0, period_s=86400)
    # ... and what it records stays in it.
    assert dry.state.admit_policy("carol", "3", now_s=2000.0, period_s=86400)
    assert real.admit_policy("carol", "3", now_s=2000.0, period_s=86400)
    real.close()


def test_a_recommendation_without_sbatch_lines_is_not_an_empty_heading() -> None:
    """Seen on the test cluster: "Next time, ask for" above nothing, for a job whose
    recommendation is to drop its one GPU (``--gres: gpu:1 -> 0``: text, no sbatch line),
    which ``gpueff`` and the web page showed."""
    import dataclasses

    rec = RecommendationView(text="--gres: gpu:1 -> 0", gpu_hours_saved=0.02)
    report = dataclasses.replace(adapter.accounting_report(F.job()), recommendations=(rec,))
    builder = MessageBuilder(from_address="a@b.org", context=MailContext())
    msg = builder.build([report], to="sgtest1@example.org")
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "--gres: gpu:1 -&gt; 0" in html and "0.02 GPU-hours" in html, html
    after = text.split("Next time, ask for", 1)[1]
    assert after.lstrip("\n").startswith("  --gres: gpu:1 -> 0 (saves about 0.02 GPU-hours)"), text
