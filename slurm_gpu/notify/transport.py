"""How messages leave: SMTP, the local sendmail, or ``.eml`` files (``--dry-run DIR``).

The envelope recipients are always passed explicitly (never read from the headers), so even a
header that slipped through could not add a recipient.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import smtplib
import ssl
import stat
import subprocess
from collections.abc import Sequence
from email.message import EmailMessage
from typing import Protocol

from slurm_gpu.config import MailSettings
from slurm_gpu.errors import ConfigError, MailError
from slurm_gpu.privatefile import create_private, open_out_dir


class Mailer(Protocol):
    """Hands one message to its recipients."""

    def send(self, msg: EmailMessage, recipients: Sequence[str]) -> None:
        """Deliver ``msg`` to exactly ``recipients``; raises ``MailError``."""
        ...


class SmtpMailer:
    """SMTP with optional STARTTLS (certificate and host name verified) and login.

    ``ca_file`` names the PEM file of the CA(s) that sign the server's certificate; empty means
    the system's CAs. Every failure becomes a one-line ``MailError`` with a hint; the password
    never appears in it.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        starttls: bool = False,
        ca_file: str = "",
        user: str = "",
        password: str = "",
        timeout_s: float = 30.0,
        sender: str = "",
    ) -> None:
        self.host, self.port = host, port
        self.starttls, self.user, self._password = starttls, user, password
        self.timeout_s = timeout_s
        self.sender = sender
        # Built once, here, so that a bad CA file is a configuration error, not a failed send.
        self._tls = _tls_context(ca_file) if starttls else None

    def send(self, msg: EmailMessage, recipients: Sequence[str]) -> None:
        """Send over one SMTP session. Raises ``MailError`` on any refusal or network error."""
        offers_starttls = False
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
                smtp.ehlo()
                offers_starttls = smtp.has_extn("starttls")
                if self._tls is not None:
                    smtp.starttls(context=self._tls)
                if self.user:
                    smtp.login(self.user, self._password)
                refused = smtp.send_message(
                    msg, from_addr=self.sender or None, to_addrs=list(recipients)
                )
        except ssl.SSLCertVerificationError as exc:
            raise MailError(
                f"SMTP {self.host}:{self.port}: the server's certificate failed verification "
                f"({self._clean(exc.verify_message or exc.reason or 'unknown reason')})",
                hint="set [mail] smtp_ca_file to the CA that signed it, and smtp_host to a name "
                "the certificate holds",
            ) from None
        except smtplib.SMTPAuthenticationError as exc:
            raise MailError(
                f"SMTP {self.host}:{self.port} refused the login of {self.user!r}: "
                f"{self._describe(exc)}",
                hint="check [mail] smtp_user and the password in smtp_password_file",
            ) from None
        except (smtplib.SMTPException, OSError) as exc:
            if self.starttls and isinstance(exc, smtplib.SMTPNotSupportedError):
                hint = (
                    "the server does not offer STARTTLS: use a port that does (submission, "
                    "587), or set [mail] smtp_starttls = false"
                )
            elif not self.starttls and offers_starttls:
                hint = (
                    "the server offers STARTTLS and may require it before login or mail: "
                    "set [mail] smtp_starttls = true"
                )
            else:
                hint = "check [mail] smtp_host/smtp_port and that the server accepts mail from here"
            raise MailError(
                f"SMTP {self.host}:{self.port} did not take the message: {self._describe(exc)}",
                hint=hint,
            ) from None
        if refused:
            raise MailError(f"SMTP refused recipients: {', '.join(refused)}")

    def _describe(self, exc: BaseException) -> str:
        """One line: the server's code and reply, or the network error."""
        if isinstance(exc, smtplib.SMTPResponseException):
            reply = exc.smtp_error
            text = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
            return self._clean(f"{exc.smtp_code} {text}")
        if isinstance(exc, smtplib.SMTPRecipientsRefused):
            return self._clean(f"every recipient refused ({', '.join(exc.recipients)})")
        if isinstance(exc, OSError) and exc.strerror:
            return self._clean(exc.strerror)
        return self._clean(str(exc) or type(exc).__name__)

    def _clean(self, text: str) -> str:
        # Server replies may span lines; and no reply may ever echo the password into a log.
        line = " ".join(text.split())
        return line.replace(self._password, "***") if self._password else line


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
        """Write the message as a new 0600 file, created by descriptor inside the directory
        (made 0700 when missing; a link is never followed nor a file overwritten:
        ``slurm_gpu.privatefile``); raises ``MailError`` when that cannot be done."""
        safe = re.sub(r"[^A-Za-z0-9@._-]", "_", ",".join(recipients))[:80]
        try:
            dir_fd = open_out_dir(self.directory)
            try:
                n = len([f for f in os.listdir(dir_fd) if f.endswith(".eml")])
                fd = -1
                for k in range(n + 1, n + 1001):
                    with contextlib.suppress(FileExistsError):
                        fd = create_private(f"{k:04d}-{safe}.eml", dir_fd=dir_fd)
                        break
                if fd < 0:
                    raise OSError(errno.EEXIST, "no free message name")
            finally:
                os.close(dir_fd)
            with os.fdopen(fd, "wb") as fh:
                fh.write(msg.as_bytes())
        except OSError as exc:
            raise MailError(f"cannot write {self.directory}: {exc.strerror}") from None
        self.sent.append((msg, tuple(recipients)))


def _tls_context(ca_file: str) -> ssl.SSLContext:
    """A client context that verifies the certificate chain and the host name."""
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the CA file {ca_file} ({getattr(exc, 'strerror', None) or exc})",
            key="mail.smtp_ca_file",
            hint="give a readable PEM file of the CA certificate(s), or leave it empty",
        ) from None


def _read_password(path: str) -> str:
    """The first line of ``path``; refuses a world-readable file (it would leak the password)."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as fh:
            if os.fstat(fh.fileno()).st_mode & stat.S_IROTH:
                raise ConfigError(
                    f"the SMTP password file {path} is readable by every user",
                    key="mail.smtp_password_file",
                    hint=f"chmod o-r {path} (e.g. mode 0600, owned by SlurmUser)",
                )
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the SMTP password file ({exc.strerror})",
            key="mail.smtp_password_file",
            hint="make it readable by SlurmUser only (mode 0600)",
        ) from None
    return lines[0] if lines else ""


def open_mailer(settings: MailSettings, *, dry_run_dir: str | None = None) -> Mailer:
    """The configured transport, or a ``DirMailer`` for a dry run."""
    if dry_run_dir:
        return DirMailer(dry_run_dir)
    sender = settings.from_address
    if settings.transport == "sendmail":
        return SendmailMailer(settings.sendmail_path, sender=sender)
    if settings.smtp_ca_file and not settings.smtp_starttls:
        # Otherwise a site would believe its relay verified while nothing is encrypted.
        raise ConfigError(
            "smtp_ca_file is set but smtp_starttls is false: the CA would never be used",
            key="mail.smtp_ca_file",
            hint="set [mail] smtp_starttls = true",
        )
    return SmtpMailer(
        settings.smtp_host,
        settings.smtp_port,
        starttls=settings.smtp_starttls,
        ca_file=settings.smtp_ca_file,
        user=settings.smtp_user,
        password=_read_password(settings.smtp_password_file),
        timeout_s=settings.smtp_timeout_s,
        sender=sender,
    )
