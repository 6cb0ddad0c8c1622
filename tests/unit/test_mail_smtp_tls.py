"""SMTP with STARTTLS and login, against a real SMTP server on loopback (aiosmtpd).

The server offers STARTTLS with a throwaway self-signed certificate made here by the
``openssl`` command, refuses AUTH and MAIL before STARTTLS, and requires a login. Nothing in
the client is faked: the messages go through ``smtplib`` and the ``ssl`` module.
"""

from __future__ import annotations

import email
import email.policy
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from slurm_gpu.config import load_settings
from slurm_gpu.errors import ConfigError, MailError
from slurm_gpu.notify.transport import SmtpMailer, open_mailer

USER = "slurm-mail"
PASSWORD = "s3cret-Pa55word"  # distinctive, so a leak into a message is found
RCPT = "sgtest1@example.org"
SENDER = "slurm-gpu@cluster.example.org"


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Cert:
    cert: Path
    key: Path


def _make_cert(directory: Path, name: str, san: str) -> Cert:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-subj", "/CN=" + san.split(",")[0].split(":")[1],
            "-addext", f"subjectAltName={san}",
            "-days", "1", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return Cert(cert, key)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Cert]:
    d = tmp_path_factory.mktemp("tls")
    return {
        # The server's own name on loopback, as a site's relay certificate would name it.
        "loopback": _make_cert(d, "loopback", "DNS:localhost,IP:127.0.0.1"),
        # Trusted once its CA is given, but for another host name.
        "other": _make_cert(d, "other", "DNS:mail.example.org"),
    }


# --------------------------------------------------------------------------- the server


@dataclass
class Inbox:
    received: list[tuple[str, list[str], bytes]] = field(default_factory=list)
    logins: list[tuple[bytes, bool]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.received.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 Message accepted for delivery"

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == USER.encode()
            and auth_data.password == PASSWORD.encode()
        )
        self.logins.append((auth_data.login, ok))
        return AuthResult(success=ok, handled=False)  # not handled: the server answers 535


Server = tuple[Inbox, int]


@pytest.fixture
def tls_server(certs: dict[str, Cert]) -> Iterator[Callable[[str], Server]]:
    """Starts, on demand, a server that requires STARTTLS (with the named cert) and AUTH."""
    controllers: list[Controller] = []

    def start(cert_name: str) -> Server:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certs[cert_name].cert, certs[cert_name].key)
        inbox = Inbox()
        with socket.socket() as probe:  # a free port (aiosmtpd checks readiness by connecting)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        controller = Controller(
            inbox,
            hostname="127.0.0.1",
            port=port,
            tls_context=ctx,
            require_starttls=True,
            auth_required=True,
            auth_require_tls=True,
            authenticator=inbox.authenticate,
        )
        controller.start()
        controllers.append(controller)
        return inbox, port

    try:
        yield start
    finally:
        for c in controllers:
            c.stop()


def _message() -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = SENDER
    msg["To"] = RCPT
    msg["Subject"] = "Slurm Job_id=1001 Ended"
    msg.set_content("GPU-hours left idle: 3.5\n")
    return msg


def _assert_clean(err: MailError) -> None:
    """One line, a hint, no chained traceback, no password."""
    assert "\n" not in str(err) and err.hint and "\n" not in err.hint
    assert err.__cause__ is None and err.__suppress_context__
    assert PASSWORD not in str(err) and PASSWORD not in err.hint


# --------------------------------------------------------------------------- (a) delivered


def test_starttls_and_login_deliver_the_message(
    tls_server: Callable[[str], Server], certs: dict[str, Cert]
) -> None:
    inbox, port = tls_server("loopback")
    mailer = SmtpMailer(
        "127.0.0.1",
        port,
        starttls=True,
        ca_file=str(certs["loopback"].cert),
        user=USER,
        password=PASSWORD,
        sender=SENDER,
        timeout_s=10,
    )
    mailer.send(_message(), [RCPT])
    assert inbox.logins == [(USER.encode(), True)]
    assert len(inbox.received) == 1
    mail_from, rcpts, data = inbox.received[0]
    assert (mail_from, rcpts) == (SENDER, [RCPT])
    got = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(got, EmailMessage)
    assert got["Subject"] == "Slurm Job_id=1001 Ended"
    body = got.get_body(("plain",))
    assert body is not None and "GPU-hours left idle: 3.5" in body.get_content()


def test_the_configuration_file_drives_tls_and_login(
    tls_server: Callable[[str], Server], certs: dict[str, Cert], tmp_path: Path
) -> None:
    """host, port, STARTTLS, CA file, user and password file, all read from the config."""
    inbox, port = tls_server("loopback")
    pw = tmp_path / "smtp-password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[mail]\nsmtp_host = "localhost"\nsmtp_port = {port}\nsmtp_starttls = true\n'
        f'smtp_ca_file = "{certs["loopback"].cert}"\nsmtp_user = "{USER}"\n'
        f'smtp_password_file = "{pw}"\nfrom_address = "{SENDER}"\n'
    )
    assert PASSWORD not in cfg.read_text()
    open_mailer(load_settings(str(cfg)).mail).send(_message(), [RCPT])
    assert inbox.logins == [(USER.encode(), True)]
    assert [r[:2] for r in inbox.received] == [(SENDER, [RCPT])]


# --------------------------------------------------------------------------- (b) wrong password


def test_a_wrong_password_is_a_clean_mail_error(
    tls_server: Callable[[str], Server], certs: dict[str, Cert]
) -> None:
    inbox, port = tls_server("loopback")
    wrong = PASSWORD + "-wrong"
    mailer = SmtpMailer(
        "127.0.0.1",
        port,
        starttls=True,
        ca_file=str(certs["loopback"].cert),
        user=USER,
        password=wrong,
        timeout_s=10,
    )
    with pytest.raises(MailError) as info:
        mailer.send(_message(), [RCPT])
    err = info.value
    _assert_clean(err)
    assert wrong not in str(err)
    assert "refused the login" in str(err) and "535" in str(err)
    assert err.hint is not None and "smtp_password_file" in err.hint
    # smtplib tries each mechanism the server offers (PLAIN, then LOGIN): all were refused.
    assert inbox.logins and set(inbox.logins) == {(USER.encode(), False)}
    assert inbox.received == []


# --------------------------------------------------------------------------- (c) no STARTTLS


@pytest.mark.parametrize("user", [USER, ""], ids=["login", "no-login"])
def test_starttls_off_against_a_server_that_requires_it(
    tls_server: Callable[[str], Server], user: str
) -> None:
    """With a login, AUTH is not even offered before TLS; without, MAIL is refused (530)."""
    inbox, port = tls_server("loopback")
    mailer = SmtpMailer("127.0.0.1", port, starttls=False, user=user, password=PASSWORD)
    with pytest.raises(MailError) as info:
        mailer.send(_message(), [RCPT])
    _assert_clean(info.value)
    assert info.value.hint is not None and "smtp_starttls = true" in info.value.hint
    # The password never went out over the plain connection.
    assert inbox.logins == [] and inbox.received == []


# --------------------------------------------------------------------------- (d) verification


def test_a_self_signed_server_is_refused_without_its_ca(
    tls_server: Callable[[str], Server],
) -> None:
    inbox, port = tls_server("loopback")
    mailer = SmtpMailer("127.0.0.1", port, starttls=True, user=USER, password=PASSWORD)
    with pytest.raises(MailError) as info:
        mailer.send(_message(), [RCPT])
    err = info.value
    _assert_clean(err)
    assert "certificate failed verification" in str(err) and "self-signed" in str(err)
    assert err.hint is not None and "smtp_ca_file" in err.hint
    assert inbox.logins == [] and inbox.received == []


def test_the_host_name_is_checked_even_with_the_ca_given(
    tls_server: Callable[[str], Server], certs: dict[str, Cert]
) -> None:
    """A certificate the CA file trusts, but for mail.example.org, not 127.0.0.1."""
    inbox, port = tls_server("other")
    mailer = SmtpMailer(
        "127.0.0.1",
        port,
        starttls=True,
        ca_file=str(certs["other"].cert),
        user=USER,
        password=PASSWORD,
    )
    with pytest.raises(MailError) as info:
        mailer.send(_message(), [RCPT])
    _assert_clean(info.value)
    assert "certificate failed verification" in str(info.value)
    assert "mismatch" in str(info.value)
    assert inbox.logins == [] and inbox.received == []


# --------------------------------------------------------------------------- configuration


def _settings(tmp_path: Path, mail: str) -> Any:
    cfg = tmp_path / "config.toml"
    cfg.write_text("[mail]\n" + mail)
    return load_settings(str(cfg)).mail


def test_a_world_readable_password_file_is_refused(tmp_path: Path) -> None:
    pw = tmp_path / "smtp-password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o644)
    m = _settings(
        tmp_path, f'smtp_starttls = true\nsmtp_user = "{USER}"\nsmtp_password_file = "{pw}"\n'
    )
    with pytest.raises(ConfigError) as info:
        open_mailer(m)
    assert "mail.smtp_password_file" in str(info.value) and "every user" in str(info.value)
    assert PASSWORD not in str(info.value)
    pw.chmod(0o640)  # group-readable (root:slurm) is fine
    assert isinstance(open_mailer(m), SmtpMailer)


def test_a_missing_password_file_is_a_config_error(tmp_path: Path) -> None:
    m = _settings(tmp_path, f'smtp_password_file = "{tmp_path / "nope"}"\n')
    with pytest.raises(ConfigError, match="smtp_password_file"):
        open_mailer(m)


def test_a_bad_ca_file_is_a_config_error(tmp_path: Path) -> None:
    missing = _settings(tmp_path, f'smtp_starttls = true\nsmtp_ca_file = "{tmp_path / "no"}"\n')
    with pytest.raises(ConfigError, match="smtp_ca_file"):
        open_mailer(missing)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    bad = _settings(tmp_path, f'smtp_starttls = true\nsmtp_ca_file = "{junk}"\n')
    with pytest.raises(ConfigError, match="smtp_ca_file"):
        open_mailer(bad)


def test_a_ca_file_without_starttls_is_refused(tmp_path: Path, certs: dict[str, Cert]) -> None:
    m = _settings(tmp_path, f'smtp_ca_file = "{certs["loopback"].cert}"\n')
    with pytest.raises(ConfigError) as info:
        open_mailer(m)
    assert info.value.hint == "set [mail] smtp_starttls = true"
