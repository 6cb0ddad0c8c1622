"""The e-mail after the job, end to end on the test cluster: slurmctld runs the slurm-gpu
wrapper as its ``MailProg`` (as SlurmUser), the mail program waits for the collector (run here
as root, in a loop) to store the job, and the message reaches a real SMTP server on loopback.

Mails the program does not enrich (BEGIN) go to ``[mail] fallback_mailprog``, which on the
test cluster is ``hooks/fallback-mail``: it records each call as a file in
``$TC_ROOT/fallback-mail`` because there is no mail transport agent here.

The SMTP server listens where the cluster's ``slurm-gpu.toml`` sends mail (127.0.0.1:8025, the
port ``make demo`` uses too), so this file and a running demo cannot share the machine.
"""

from __future__ import annotations

import email
import email.policy
import os
import pwd
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import slurmtools

from slurm_gpu.config import load_settings

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "share" / "demo"
#: Longest wait for a mail after its job ended; the collector loop stores a job within seconds
#: and the mail program looks for the record every second ([mail] poll_interval_s).
MAIL_WAIT_S = 240.0


@dataclass(frozen=True)
class Received:
    """One message as the SMTP server got it."""

    rcpt_tos: tuple[str, ...]
    mail_from: str
    message: EmailMessage


class _Handler:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        with self._lock:
            self.received.append(Received(tuple(envelope.rcpt_tos), envelope.mail_from, msg))
        return "250 OK"

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)


class Sink:
    """The real SMTP server (aiosmtpd) the cluster's mail program sends to."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler

    def about(self, job_id: str) -> list[Received]:
        """Messages whose subject names ``job_id``: Slurm's subject (``Job_id=N ...``) on a
        single message, ``array N: ...`` on an array's digest."""
        pattern = re.compile(rf"(Job_id={job_id}(?!\d)|array {job_id}:)")
        return [r for r in self._handler.snapshot() if pattern.search(str(r.message["Subject"]))]


@pytest.fixture(scope="module")
def sink() -> Iterator[Sink]:
    from aiosmtpd.controller import Controller

    settings = load_settings(str(slurmtools.slurm_gpu_config_path()))
    m = settings.mail
    assert m.transport == "smtp" and m.smtp_host in ("127.0.0.1", "localhost"), (
        "the test cluster's [mail] must send to a loopback SMTP server"
    )
    handler = _Handler()
    controller = Controller(handler, hostname="127.0.0.1", port=m.smtp_port)
    # A demo run ("make demo") holds the same port while it runs; wait for it rather than fail.
    deadline = time.monotonic() + 120
    while True:
        try:
            controller.start()
            break
        except (OSError, RuntimeError) as exc:
            if time.monotonic() > deadline:
                pytest.fail(f"cannot listen on 127.0.0.1:{m.smtp_port} ({exc}); is a demo running?")
            time.sleep(2)
    try:
        yield Sink(handler)
    finally:
        controller.stop()


class CollectorLoop:
    """``slurm-gpu collect --once`` as root, again and again, in a thread (a timer's job)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.passes = 0

    def _run(self) -> None:
        argv = [
            str(slurmtools.venv_python().parent / "slurm-gpu"),
            "--config",
            str(slurmtools.slurm_gpu_config_path()),
            "collect",
            "--once",
            "--no-missing",
        ]
        while not self._stop.is_set():
            subprocess.run(argv, capture_output=True, timeout=300, check=False)
            self.passes += 1
            self._stop.wait(2.0)

    def __enter__(self) -> CollectorLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=320)


def _mail_programs_for(job_id: str) -> list[int]:
    """Pids of mail programs still running for ``job_id`` (waiting for the record, sending)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if b"slurm_gpu.cli.mail_cmd" in cmdline and (
            f"SLURM_JOB_ID={job_id}\0".encode() in environ
            or f"SLURM_ARRAY_JOB_ID={job_id}\0".encode() in environ
        ):
            pids.append(int(entry))
    return pids


def _wait_for_mail(sink: Sink, job_id: str) -> list[Received]:
    """Run the collector until a message about ``job_id`` arrived and no mail program for the
    job runs any more (so none can still be on its way); the messages about the job."""
    deadline = time.monotonic() + MAIL_WAIT_S
    with CollectorLoop():
        while time.monotonic() < deadline:
            if sink.about(job_id) and not _mail_programs_for(job_id):
                break
            time.sleep(0.5)
    got = sink.about(job_id)
    assert got, (
        f"no e-mail about job {job_id} after {MAIL_WAIT_S:g} s; "
        f"see {slurmtools.tc_root() / 'log' / 'mailprog.log'}"
    )
    return got


def _fallback_records(job_id: str) -> list[list[str]]:
    """What ``hooks/fallback-mail`` recorded for ``job_id``: one list of lines per call."""
    directory = slurmtools.tc_root() / "fallback-mail"
    return [p.read_text().splitlines() for p in sorted(directory.glob(f"{job_id}.*"))]


def _submit_demo(name: str, *extra: str) -> str:
    export = (
        f"--export=ALL,SLURM_GPU_PYTHON={slurmtools.venv_python()},"
        f"SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}"
    )
    out = slurmtools.user_dir("sgtest1")
    return slurmtools.submit(
        str(DEMO / f"{name}.sbatch"), "sgtest1", (export, f"--chdir={out}", *extra)
    )


def _parts(msg: EmailMessage) -> dict[str, list[EmailMessage]]:
    found: dict[str, list[EmailMessage]] = {}
    for part in msg.walk():
        assert isinstance(part, EmailMessage)
        found.setdefault(part.get_content_type(), []).append(part)
    return found


def test_mail_program_is_the_slurm_gpu_wrapper() -> None:
    conf = slurmtools.run_as(None, ["scontrol", "show", "config"]).stdout
    line = next(ln for ln in conf.splitlines() if ln.startswith("MailProg"))
    prog = line.split("=", 1)[1].strip()
    assert prog == str(slurmtools.tc_root() / "hooks" / "slurm-gpu-mailprog")
    # SlurmUser runs it: it must run the interpreter, read the store and write the mail state
    # ([mail] state_dir), and must not write the collector's state directory (root's alone).
    state = slurmtools.tc_root() / "state"
    for argv in (
        [str(slurmtools.venv_python()), "-c", "import slurm_gpu"],
        ["test", "-r", str(state / "slurm-gpu.db")],
        ["test", "-w", str(slurmtools.tc_root() / "mailstate")],
    ):
        probe = slurmtools.run_as("slurm", argv, cwd="/", check=False)
        assert probe.returncode == 0, (argv, probe.stderr)
    cannot = slurmtools.run_as("slurm", ["test", "-w", str(state)], cwd="/", check=False)
    assert cannot.returncode != 0


def test_end_mail_is_one_enriched_message(sink: Sink) -> None:
    job_id = _submit_demo("idle-gpu", "--mail-type=END", "--mail-user=sgtest1")
    assert slurmtools.wait_done(job_id, timeout_s=240) == "COMPLETED"
    got = _wait_for_mail(sink, job_id)

    assert len(got) == 1, [str(r.message["Subject"]) for r in got]
    rec = got[0]
    msg = rec.message
    # The bare --mail-user is completed by [mail] recipient_domain, in the envelope and To:.
    assert rec.rcpt_tos == ("sgtest1@localhost",)
    assert msg["To"] == "sgtest1@localhost"
    assert msg["From"] == "slurm-gpu@localhost"
    assert f"Job_id={job_id}" in str(msg["Subject"])
    assert "demo-idle-gpu" in str(msg["Subject"])

    assert msg.get_content_type() == "multipart/alternative"
    parts = _parts(msg)
    assert len(parts["text/plain"]) == 1 and len(parts["text/html"]) == 1
    assert len(parts["multipart/related"]) == 1
    pngs = parts.get("image/png", [])
    assert len(pngs) >= 1
    png = pngs[0].get_content()
    assert isinstance(png, bytes) and png.startswith(b"\x89PNG\r\n\x1a\n")
    cid = str(pngs[0]["Content-ID"]).strip("<>")
    html = parts["text/html"][0].get_content()
    assert f"cid:{cid}" in html

    text = parts["text/plain"][0].get_content()
    assert f"Job {job_id} (demo-idle-gpu) ended: COMPLETED" in text
    # The stored record made it in: per-GPU numbers, a finding and the request to use next time.
    assert "NO PROCESS EVER RAN" in text
    assert "An allocated GPU was never used (cause 6)" in text
    # The script asked --gres=gpu:2 (no type): the advice adds none (issue 26, point 5).
    assert "#SBATCH --gres=gpu:1" in text and "gpu:a100:1" not in text
    assert f"gpueff {job_id}" in text
    # The enriched path did not also hand the mail to the plain mail program.
    assert _fallback_records(job_id) == []


def test_begin_mail_goes_to_the_fallback_unchanged(sink: Sink) -> None:
    script = (
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --time=00:02:00\n#SBATCH --mem=100M\nsleep 1\n"
    )
    out = slurmtools.user_dir("sgtest1")
    job_id = slurmtools.submit(
        script, "sgtest1", (f"--chdir={out}", "--mail-type=BEGIN", "--mail-user=sgtest1")
    )
    slurmtools.wait_done(job_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _fallback_records(job_id):
        time.sleep(0.5)
    records = _fallback_records(job_id)
    assert len(records) == 1, records
    lines = records[0]
    args = [ln.removeprefix("arg=") for ln in lines if ln.startswith("arg=")]
    # Exactly Slurm's arguments, passed on: -s SUBJECT USER (the bare user name).
    assert len(args) == 3 and args[0] == "-s" and args[2] == "sgtest1", args
    assert f"Job_id={job_id}" in args[1] and "Began" in args[1]
    env = lines[lines.index("env:") + 1 :]
    assert f"SLURM_JOB_ID={job_id}" in env
    assert "SLURM_JOB_MAIL_TYPE=Began" in env
    # The wrapper keeps only Slurm's job variables and sets its own PATH.
    assert [ln for ln in env if ln.startswith("PATH=")] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    assert not [ln for ln in env if ln.startswith(("HOME=", "PYTHONPATH=", "LD_"))], env
    assert sink.about(job_id) == []


def test_mail_user_cannot_inject_config_option(sink: Sink) -> None:
    """``--mail-user=--config=FILE`` (FILE the user's own configuration, naming the user's own
    'mail program'): slurmctld passes it to the MailProg as USER, which must read it as a
    recipient, refuse it, and never run the user's program; the user's ordinary mail still
    works."""
    out = slurmtools.user_dir("sgtest1")
    out.chmod(0o777)  # so that the user's program, run as SlurmUser, could leave its marker
    marker = out / "pwned"
    evil = out / "x.sh"
    evil.write_text(f"#!/bin/sh\nid > {marker}\n")
    evil.chmod(0o755)
    cfg = out / "x.toml"
    cfg.write_text(f'[mail]\nfallback_mailprog = "{evil}"\n[paths]\nstate_dir = "{out}"\n')
    owner = pwd.getpwnam("sgtest1")
    for path in (evil, cfg):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    log = slurmtools.tc_root() / "log" / "mailprog.log"
    log_before = log.stat().st_size if log.exists() else 0
    script = (
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --time=00:02:00\n#SBATCH --mem=100M\nsleep 1\n"
    )
    job_id = slurmtools.submit(
        script,
        "sgtest1",
        (f"--chdir={out}", "--mail-type=BEGIN", f"--mail-user=--config={cfg}"),
    )
    slurmtools.wait_done(job_id)
    # The same user's ordinary mail, submitted after it, proves the MailProg ran meanwhile.
    plain_id = slurmtools.submit(
        script, "sgtest1", (f"--chdir={out}", "--mail-type=BEGIN", "--mail-user=sgtest1")
    )
    slurmtools.wait_done(plain_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _fallback_records(plain_id):
        time.sleep(0.5)
    assert len(_fallback_records(plain_id)) == 1
    refused = ""
    while time.monotonic() < deadline and "refusing recipient" not in refused:
        with open(log, encoding="utf-8", errors="replace") as fh:
            fh.seek(log_before)
            refused = fh.read()
        time.sleep(0.5)
    assert not marker.exists(), marker.read_text() if marker.exists() else ""
    assert f"job {job_id}: refusing recipient" in refused, refused
    # The refused mail reached no mail program at all: it was never passed on as an option.
    assert _fallback_records(job_id) == []
    assert sink.about(job_id) == []


def test_array_end_mail_is_one_digest(sink: Sink) -> None:
    script = (
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --time=00:02:00\n#SBATCH --mem=100M\n"
        "#SBATCH --job-name=mail-array\nsleep 2\n"
    )
    out = slurmtools.user_dir("sgtest1")
    array_id = slurmtools.submit(
        script,
        "sgtest1",
        (f"--chdir={out}", "--array=0-2", "--mail-type=END", "--mail-user=sgtest1"),
    )
    slurmtools.wait_done(array_id, timeout_s=180)
    got = _wait_for_mail(sink, array_id)

    assert len(got) == 1, [str(r.message["Subject"]) for r in got]
    msg = got[0].message
    assert got[0].rcpt_tos == ("sgtest1@localhost",)
    assert msg.get_content_type() == "multipart/alternative"
    text = _parts(msg)["text/plain"][0].get_content()
    assert "3 jobs ended" in text
    for task in range(3):
        assert f"{array_id}_{task}" in text
    assert _fallback_records(array_id) == []
