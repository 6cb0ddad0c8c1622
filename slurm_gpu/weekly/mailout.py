"""The weekly report as an e-mail: a text summary and the full HTML page.

Structure::

    multipart/alternative
      text/plain   (the summary, templates/report/weekly.txt.j2)
      text/html    (the self-contained page; its charts are inline SVG)

Headers go through the mail layer's strict policy (it refuses CR/LF in a header value) and the
subject is cleaned of control characters, so a site name cannot inject a header.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from slurm_gpu.notify.message import POLICY, clean_subject


def build_message(
    *, subject: str, sender: str, recipients: Sequence[str], text: str, html: str, now_s: float
) -> EmailMessage:
    """One message to every admin (``To:`` lists them; the envelope is set by the mailer)."""
    msg = EmailMessage(policy=POLICY)
    msg["Subject"] = clean_subject(subject)
    msg["From"] = sender
    msg["To"] = ", ".join(recipients)
    msg["Date"] = format_datetime(datetime.fromtimestamp(now_s, UTC))
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or None)
    msg["Auto-Submitted"] = "auto-generated"
    msg.set_content(text, charset="utf-8")
    msg.add_alternative(html, subtype="html", charset="utf-8")
    return msg
