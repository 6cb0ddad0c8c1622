"""A Prometheus behind HTTP basic authentication (its ``--web.config.file``), for real: the
credentials from ``live.prometheus_url`` or from ``live.prometheus_password_file``, a clear
refusal without them, and never sent to another host a redirect names."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.errors import ConfigError
from slurm_gpu.prometheus.client import PrometheusClient, PrometheusUnavailableError

PROMETHEUS = shutil.which("prometheus")
USER = "slurmgpu"
PASSWORD = "not-a-real-secret"
#: bcrypt (cost 4) of ``PASSWORD``, as Prometheus' web configuration takes it.
PASSWORD_HASH = "$2b$04$atJqhZ.VwZgPw0iWGkWgZu5WZZ1aAsVqNPlMe4VdmV4Ilyj4/Nc1m"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL (no credentials) of a real Prometheus that asks for a password."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (make deps)")
    tmp = tmp_path_factory.mktemp("promauth")
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    (tmp / "web.yml").write_text(f"basic_auth_users:\n  {USER}: '{PASSWORD_HASH}'\n")
    port = _free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp}/prometheus.yml",
            f"--storage.tsdb.path={tmp}/data",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={tmp}/web.yml",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # up, and asking for the password
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not start"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _with_credentials(url: str, userinfo: str) -> str:
    return url.replace("http://", f"http://{userinfo}@", 1)


def test_credentials_in_the_url_are_sent_as_basic_auth(prom: str) -> None:
    client = PrometheusClient(_with_credentials(prom, f"{USER}:{PASSWORD}"), 10.0)
    assert client.query("vector(42)")[0].value == 42.0
    assert PASSWORD not in client.shown_url and "***" in client.shown_url


def test_a_percent_encoded_password_is_decoded(prom: str, tmp_path: Path) -> None:
    # Not this server's password: the point is that "%3A" reaches it as ":" (401, not an
    # unreachable host named "slurmgpu:a").
    client = PrometheusClient(_with_credentials(prom, f"{USER}:a%3Ab"), 10.0)
    with pytest.raises(PrometheusUnavailableError, match="HTTP 401"):
        client.query("vector(1)")


def test_without_credentials_the_refusal_says_what_is_missing(prom: str) -> None:
    with pytest.raises(PrometheusUnavailableError) as err:
        PrometheusClient(prom, 10.0).query("vector(1)")
    assert "HTTP 401" in str(err.value)
    assert err.value.hint is not None and "prometheus_password_file" in err.value.hint


def test_a_wrong_password_is_refused_and_not_shown(prom: str) -> None:
    with pytest.raises(PrometheusUnavailableError) as err:
        PrometheusClient(_with_credentials(prom, f"{USER}:wrong-one"), 10.0).query("vector(1)")
    assert "HTTP 401" in str(err.value) and "wrong-one" not in str(err.value)
    assert "wrong-one" not in (err.value.hint or "")


def _password_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prometheus.password"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_the_password_file_gives_the_password_of_the_user_in_the_url(
    prom: str, tmp_path: Path
) -> None:
    secret = _password_file(tmp_path, PASSWORD + "\n")  # a trailing newline, as editors write
    client = PrometheusClient(_with_credentials(prom, USER), 10.0, password_file=str(secret))
    assert client.query("vector(7)")[0].value == 7.0


@pytest.mark.skipif(os.geteuid() != 0, reason="the file must be root's: run as root")
def test_a_password_file_another_account_can_write_is_refused(tmp_path: Path) -> None:
    secret = _password_file(tmp_path, PASSWORD)
    secret.chmod(0o622)
    with pytest.raises(ConfigError) as err:
        PrometheusClient(f"http://{USER}@127.0.0.1:1", 10.0, password_file=str(secret))
    assert "not a trusted file" in str(err.value)
    assert err.value.key == "live.prometheus_password_file"


def test_a_password_file_without_a_user_in_the_url_is_a_config_error(tmp_path: Path) -> None:
    secret = _password_file(tmp_path, PASSWORD)
    with pytest.raises(ConfigError) as err:
        PrometheusClient("http://127.0.0.1:1", 10.0, password_file=str(secret))
    assert err.value.key == "live.prometheus_password_file"
    assert err.value.hint is not None and "user@" in err.value.hint


def test_a_password_file_and_a_password_in_the_url_is_a_config_error(tmp_path: Path) -> None:
    secret = _password_file(tmp_path, PASSWORD)
    with pytest.raises(ConfigError) as err:
        PrometheusClient(f"http://{USER}:x@127.0.0.1:1", 10.0, password_file=str(secret))
    assert err.value.key == "live.prometheus_password_file"
    assert "x@" not in str(err.value)


class _Recorder:
    """A loopback server that records the Authorization header of every request, and
    answers with ``status`` (a redirect to ``location``) or an empty vector."""

    def __init__(self, status: int = 200, location: str = "") -> None:
        seen: list[str | None] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.headers.get("Authorization"))
                if status in (301, 302, 307):
                    self.send_response(status)
                    self.send_header("Location", location + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_redirect_elsewhere_does_not_carry_the_credentials() -> None:
    # "localhost" is loopback too, but another host than 127.0.0.1 to HTTP: as a proxy's
    # redirect to a login page, or an answer an attacker controls, would name one.
    elsewhere = _Recorder()
    try:
        front = _Recorder(302, f"http://localhost:{elsewhere.port}")
        try:
            client = PrometheusClient(f"http://{USER}:{PASSWORD}@127.0.0.1:{front.port}", 10.0)
            assert client.query("vector(1)") == []
            assert front.seen and front.seen[0] is not None and front.seen[0].startswith("Basic ")
            assert elsewhere.seen == [None]
        finally:
            front.close()
    finally:
        elsewhere.close()
