"""The e-mail after the job on the version lab: slurmctld (in the lab's root) runs the project's
MailProg as SlurmUser, which waits for the collected job and sends one enriched message to a
real SMTP server (aiosmtpd, as tests/integration/test_mail_cluster.py) on the lab's port."""

from __future__ import annotations

import email
import email.policy
import threading
import time
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest
from labtools import PROJECT_BIN, Lab

MAIL_WAIT_S = 150.0


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[tuple[str, ...], EmailMessage]] = []
        self._lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        with self._lock:
            self.messages.append((tuple(envelope.rcpt_tos), msg))
        return "250 OK"

    def about(self, job_id: str) -> list[tuple[tuple[str, ...], EmailMessage]]:
        with self._lock:
            return [m for m in self.messages if f"Job_id={job_id} " in str(m[1]["Subject"])]


@pytest.fixture
def inbox(lab: Lab) -> Iterator[_Inbox]:
    from aiosmtpd.controller import Controller

    handler = _Inbox()
    controller = Controller(handler, hostname="127.0.0.1", port=lab.smtp_port)
    controller.start()
    try:
        yield handler
    finally:
        controller.stop()


def test_end_mail_is_one_enriched_message(lab: Lab, inbox: _Inbox) -> None:
    job_id = lab.submit(
        "#!/bin/bash\n#SBATCH --job-name=lab-mail --gres=gpu:2 --mem=300M --time=00:05:00\n"
        f"{PROJECT_BIN}/python -m slurm_gpu.demo idle-gpu --duration 12\n",
        args=("--mail-type=END", "--mail-user=labuser1"),
    )
    assert lab.wait_done(job_id) == "COMPLETED"
    node = lab.sacct_fields(job_id, ["NodeList"])["NodeList"]
    lab.wait_record(job_id, node)
    report = lab.ship_and_collect(job_id, [node])
    assert report["ingested"] == [job_id], report
    deadline = time.monotonic() + MAIL_WAIT_S
    while not inbox.about(job_id):
        assert time.monotonic() < deadline, (
            f"no mail about job {job_id}; see {lab.root}/var/log/slurm-gpu/mailprog.log"
        )
        time.sleep(0.5)
    time.sleep(2)  # a second message would come at once
    got = inbox.about(job_id)
    assert len(got) == 1
    rcpts, msg = got[0]
    assert rcpts == ("labuser1@localhost",)
    assert msg.get_content_type() == "multipart/alternative"
    text = next(p.get_content() for p in msg.walk() if p.get_content_type() == "text/plain")
    assert f"Job {job_id} (lab-mail) ended: COMPLETED" in text
    assert "An allocated GPU was never used (cause 6)" in text
    assert f"gpueff {job_id}" in text
