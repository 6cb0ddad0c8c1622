"""Who can read or stall the node exporter (issue 25, item 7), with real sockets and a real
exporter: a local user who connects to the node's own (non-loopback) address is identified
and refused like one on loopback, before a byte of the request is read; a client sending a
byte a second neither holds a concurrent scrape nor its own connection past the deadline;
the textfile and the exporter's log are not readable by other users."""

from __future__ import annotations

import http.client
import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from test_live_exporter import run_sampler

from slurm_gpu.live.exporter import ExporterOptions, make_server

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


def own_address() -> str:
    """One of this host's addresses that is not loopback (the one its default route
    leaves from): what a user on the node reaches the scrape-network exporter at."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent: only a route is chosen
        except OSError:
            pytest.skip("this host has no route off loopback, so no address but loopback")
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("this host has no address but loopback")
    return address


@contextmanager
def serving(opts: ExporterOptions, address: str) -> Iterator[int]:
    srv = make_server(opts, address, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


def scrape(address: str, port: int, timeout: float = 15.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def not_me() -> frozenset[int]:
    """Allowed accounts that do not include the test's own: its connections are those of
    a local user the exporter must refuse."""
    return frozenset({os.geteuid() + 1})


def _dual_stack() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("bind", ["own", "0.0.0.0", "::"])
def test_a_local_user_on_the_nodes_own_address_is_refused(tmp_path: Path, bind: str) -> None:
    if bind == "::" and not _dual_stack():
        pytest.skip("no IPv6 on this host")
    run_sampler(tmp_path, [50.0] * 3, 3)
    address = own_address()
    opts = ExporterOptions(str(tmp_path / "spool"), 1e12, not_me())
    # "::": a dual-stack listener, the client's IPv4 address seen as ::ffff:a.b.c.d.
    with serving(opts, address if bind == "own" else bind) as port:
        status, body = scrape(address, port)
    assert status == 403
    assert b'job_id="42"' not in body and b"alice" not in body


def test_an_allowed_account_on_the_nodes_own_address_is_served(tmp_path: Path) -> None:
    run_sampler(tmp_path, [50.0] * 3, 3)
    address = own_address()
    opts = ExporterOptions(str(tmp_path / "spool"), 1e12, frozenset({os.geteuid()}))
    with serving(opts, address) as port:
        status, body = scrape(address, port)
    assert status == 200 and b'user="alice"' in body


FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=10)\n"
    "    print(r.status); print(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code); print(e.read().decode())\n"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as nobody")
def test_nobody_on_the_nodes_own_address_gets_403_and_root_is_served(tmp_path: Path) -> None:
    run_sampler(tmp_path, [50.0] * 3, 3)
    address = own_address()
    opts = ExporterOptions(str(tmp_path / "spool"), 1e12, frozenset({0}))
    with serving(opts, "0.0.0.0") as port:
        url = f"http://{address}:{port}/metrics"
        answers = []
        for uid in (NOBODY, None):
            proc = subprocess.run(
                [sys.executable, "-I", "-c", FETCH, url],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
                cwd="/",
                user=uid,
                group=uid,
                extra_groups=[] if uid is not None else None,
            )
            status, _, body = proc.stdout.partition("\n")
            answers.append((int(status), body))
    (nobody_status, nobody_body), (root_status, root_body) = answers
    assert nobody_status == 403 and 'job_id="42"' not in nobody_body
    assert root_status == 200 and 'user="alice"' in root_body


def test_a_refused_local_client_is_answered_before_it_sends_anything(tmp_path: Path) -> None:
    # The peer is checked before the request is read: a client that sends nothing at all
    # gets its 403 (the old server waited for the request line and headers first).
    opts = ExporterOptions(str(tmp_path / "spool"), 1e12, not_me())
    with serving(opts, "127.0.0.1") as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(4.0)  # below the request deadline: the answer must not wait for it
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.0 403")


class SlowClient(threading.Thread):
    """Sends a request's first line, then one byte of a header a second, never ending it;
    stops when the server answers or closes, or after ``limit`` bytes."""

    def __init__(self, port: int, limit: int = 30) -> None:
        super().__init__(daemon=True)
        self.port, self.limit = port, limit
        self.sent = 0
        self.answer = b""
        self.cut = False
        self.started_sending = threading.Event()

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\nX-Slow: ")
            while self.sent < self.limit:
                try:
                    s.send(b"a")
                except OSError:
                    self.cut = True
                    return
                self.sent += 1
                self.started_sending.set()
                ready, _, _ = select.select([s], [], [], 1.0)
                if ready:
                    with suppress(OSError):
                        self.answer = s.recv(4096)
                    self.cut = True
                    return


def test_a_slow_client_holds_neither_a_concurrent_scrape_nor_its_connection(
    tmp_path: Path,
) -> None:
    run_sampler(tmp_path, [50.0] * 3, 3)
    opts = ExporterOptions(str(tmp_path / "spool"), 1e12)
    with serving(opts, "127.0.0.1") as port:
        slow = SlowClient(port)
        slow.start()
        assert slow.started_sending.wait(30)
        status, body = scrape("127.0.0.1", port)
        sent_when_scraped, cut_when_scraped = slow.sent, slow.cut
        slow.join(60)
    # The scrape was answered while the slow client was still sending, a few bytes into
    # its request (it sends one a second; the old single thread served it only after).
    assert status == 200 and b'job_id="42"' in body
    assert not cut_when_scraped and sent_when_scraped < slow.limit
    # The slow client was cut at the request's deadline, long before it could finish, and
    # told why.
    assert slow.cut and slow.sent < slow.limit
    assert slow.answer.startswith(b"HTTP/1.0 408")


def test_connections_beyond_the_thread_bound_get_503_and_scrapes_resume(
    tmp_path: Path,
) -> None:
    run_sampler(tmp_path, [50.0] * 3, 3)
    opts = ExporterOptions(str(tmp_path / "spool"), 1e12, deadline_s=3.0, max_threads=2)
    with serving(opts, "127.0.0.1") as port:
        holders = [SlowClient(port) for _ in range(2)]
        for h in holders:
            h.start()
            assert h.started_sending.wait(30)
        busy, _ = scrape("127.0.0.1", port)
        for h in holders:
            h.join(60)
        after, body = scrape("127.0.0.1", port)
    assert busy == 503
    assert all(h.cut and h.answer.startswith(b"HTTP/1.0 408") for h in holders)
    assert after == 200 and b'job_id="42"' in body


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n[live]\nstale_after_s = 1e12\n')
    return cfg


def test_the_textfile_is_the_owners_alone(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurm_gpu.cli.admin import cli

    run_sampler(tmp_path, [50.0] * 3, 3)
    out = tmp_path / "slurm_gpu.prom"
    out.write_text("old\n")
    out.chmod(0o644)  # a file an older release left: replaced, not kept at its mode
    args = ["--config", str(_config(tmp_path)), "exporter", "--textfile", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert b'user="alice"' in out.read_bytes()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file another group")
def test_the_textfile_with_a_group_is_0640_of_that_group(tmp_path: Path) -> None:
    import grp

    from click.testing import CliRunner

    from slurm_gpu.cli.admin import cli

    run_sampler(tmp_path, [50.0] * 3, 3)
    group = grp.getgrgid(NOBODY if _has_gid(NOBODY) else 1)
    out = tmp_path / "slurm_gpu.prom"
    args = ["--config", str(_config(tmp_path)), "exporter", "--textfile", str(out)]
    result = CliRunner().invoke(cli, [*args, "--textfile-group", group.gr_name])
    assert result.exit_code == 0, result.output
    st = out.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == group.gr_gid
    missing = CliRunner().invoke(cli, [*args, "--textfile-group", "no-such-group-here"])
    assert missing.exit_code == 3 and "no group 'no-such-group-here'" in missing.output


def _has_gid(gid: int) -> bool:
    import grp

    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


def test_the_exporters_log_is_not_readable_by_others(tmp_path: Path) -> None:
    # The test cluster starts the exporter with its output appended to log/exporter.log,
    # a file its shell created 0644; the exporter makes it its owner's alone.
    run_sampler(tmp_path, [50.0] * 3, 3)
    log = tmp_path / "exporter.log"
    log.touch()
    log.chmod(0o644)
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "from slurm_gpu.cli.admin import main; main()"
    )
    argv = [sys.executable, "-I", "-c", code, "--config", str(_config(tmp_path)), "exporter"]
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [*argv, "--address", "127.0.0.1", "--port", "0"], stdout=fh, stderr=fh, cwd="/"
        )
    try:
        for _ in range(600):  # until it says it serves (or exits)
            if b"serving" in log.read_bytes() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert b"serving" in log.read_bytes(), log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
