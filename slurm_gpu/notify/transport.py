"""How messages leave: SMTP, the local sendmail, or ``.eml`` files (``--dry-run DIR``).

The envelope recipients are always passed explicitly (never read from the headers), so even a
header that slipped through could not add a recipient.
"""

from __future__ import annotations

import os
import re
import smtplib
import ssl
import subprocess
from collections.abc import Sequence
from email.message import EmailMessage
from typing import Protocol

from slurm_gpu.config import MailSettings
from slurm_gpu.errors import ConfigError, MailError


class Mailer(Protocol):
    """Hands one message to its recipients."""

    def send(self, msg: EmailMessage, recipients: Sequence[str]) -> None:
        """Deliver ``msg`` to exactly ``recipients``; raises ``MailError``."""
        ...


class SmtpMailer:
    """SMTP with optional STARTTLS and login."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        starttls: bool = False,
        user: str = "",
        password: str = "",
        timeout_s: float = 30.0,
        sender: str = "",
    ) -> None:
        self.host, self.port = host, port
        self.starttls, self.user, self._password = starttls, user, password
        self.timeout_s = timeout_s
        self.sender = sender

    def send(self, msg: EmailMessage, recipients: Sequence[str]) -> None:
        """Send over one SMTP session. Raises ``MailError`` on any refusal or network error."""
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
                if self.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if self.user:
                    smtp.login(self.user, self._password)
                refused = smtp.send_message(
                    msg, from_addr=self.sender or None, to_addrs=list(recipients)
                )
        except (smtplib.SMTPException, OSError) as exc:
            raise MailError(
                f"SMTP {self.host}:{self.port} did not take the message: {exc}",
                hint="check [mail] smtp_host/smtp_port and that the server accepts mail from here",
            ) from None
        if refused:
            raise MailError(f"SMTP refused recipients: {', '.join(refused)}")


class SendmailMailer:
    """The local ``sendmail -i -f FROM -- RCPT…`` (Postfix, Exim and msmtp all accept this)."""

    def __init__(self, path: str, *, sender: str = "", timeout_s: float = 60.0) -> None:
        self.path, self.sender, self.timeout_s = path, sender, timeout_s

    def send(self, msg: EmailMessage, recipients: Sequence[str]) -> None:
        """Pipe the message to sendmail. Raises ``MailError`` when it fails."""
        cmd = [self.path, "-i"]
        if self.sender:
            cmd += ["-f", self.sender]
        cmd += ["--", *recipients]
        try:
            proc = subprocess.run(
                cmd, input=msg.as_bytes(), capture_output=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MailError(
                f"cannot run {self.path}: {exc}", hint="set [mail] sendmail_path"
            ) from None
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise MailError(
                f"{self.path} exited {proc.returncode}: {err[-1] if err else 'no message'}"
            )


class DirMailer:
    """Writes each message as ``<dir>/<n>-<recipient>.eml`` instead of sending (dry run)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.sent: list[tuple[EmailMessage, tuple[str, ...]]] = []

    def send(self, msg: EmailMessage, recipients: Sequence[str]) -> None:
        """Write the message; raises ``MailError`` when the directory is not writable."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            n = len([f for f in os.listdir(self.directory) if f.endswith(".eml")])
            safe = re.sub(r"[^A-Za-z0-9@._-]", "_", ",".join(recipients))[:80]
            path = os.path.join(self.directory, f"{n + 1:04d}-{safe}.eml")
            with open(path, "wb") as fh:
                fh.write(msg.as_bytes())
        except OSError as exc:
            raise MailError(f"cannot write {self.directory}: {exc.strerror}") from None
        self.sent.append((msg, tuple(recipients)))


def _read_password(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the SMTP password file ({exc.strerror})",
            key="mail.smtp_password_file",
            hint="make it readable by SlurmUser only (mode 0600)",
        ) from None


def open_mailer(settings: MailSettings, *, dry_run_dir: str | None = None) -> Mailer:
    """The configured transport, or a ``DirMailer`` for a dry run."""
    if dry_run_dir:
        return DirMailer(dry_run_dir)
    sender = settings.from_address
    if settings.transport == "sendmail":
        return SendmailMailer(settings.sendmail_path, sender=sender)
    return SmtpMailer(
        settings.smtp_host,
        settings.smtp_port,
        starttls=settings.smtp_starttls,
        user=settings.smtp_user,
        password=_read_password(settings.smtp_password_file),
        timeout_s=settings.smtp_timeout_s,
        sender=sender,
    )
