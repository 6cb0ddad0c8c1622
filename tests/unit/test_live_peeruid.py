"""The exporter serves loopback clients of root and the Prometheus account only: the client
socket's owner comes from the kernel's TCP tables (``live.peeruid``). Real sockets, a real
exporter, and a real client process under another uid (``nobody``) when run as root."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_live_exporter import run_sampler

from slurm_gpu.live.exporter import ExporterOptions, make_server
from slurm_gpu.live.peeruid import connection_uid, diag_uid, is_loopback, peer_uid

NOBODY = 65534


def _pair(family: int, host: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    """(listener, client, accepted) of one loopback connection."""
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname()[:2], timeout=5)
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_the_owner_of_a_loopback_client_socket_is_found() -> None:
    socks = _pair(socket.AF_INET, "127.0.0.1")
    try:
        assert connection_uid(socks[2]) == os.geteuid()
    finally:
        for s in socks:
            s.close()


def test_ipv6_loopback_and_a_v4_client_of_a_dual_stack_listener() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        socks = _pair(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    try:
        assert connection_uid(socks[2]) == os.geteuid()
    finally:
        for s in socks:
            s.close()
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind(("::", 0))
    listener.listen(1)
    client = socket.create_connection(("127.0.0.1", listener.getsockname()[1]), timeout=5)
    accepted, peer = listener.accept()
    try:
        assert peer[0] == "::ffff:127.0.0.1" and is_loopback(peer[0])
        assert connection_uid(accepted) == os.geteuid()
    finally:
        for s in (listener, client, accepted):
            s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as nobody")
@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_netlink_and_the_table_name_another_users_client_socket(family: int, host: str) -> None:
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host}")
    listener.listen(1)
    port = listener.getsockname()[1]
    hold = (
        "import socket, sys\n"
        f"s = socket.create_connection(({host!r}, {port}), timeout=10)\n"
        "s.recv(1)\n"
    )
    client = subprocess.Popen(
        [sys.executable, "-I", "-c", hold], cwd="/", user=NOBODY, group=NOBODY, extra_groups=[]
    )
    try:
        listener.settimeout(20)
        conn, _ = listener.accept()
        ends = (conn.getpeername()[:2], conn.getsockname()[:2])
        assert diag_uid(*ends) == NOBODY
        assert peer_uid(*ends) == NOBODY
        assert connection_uid(conn) == NOBODY
        conn.sendall(b"x")
        conn.close()
    finally:
        client.wait(timeout=20)
        listener.close()


def test_netlink_knows_no_socket_that_does_not_exist() -> None:
    assert diag_uid(("127.0.0.1", 1), ("127.0.0.1", 2)) is None


def test_a_connection_not_in_the_table_has_no_owner(tmp_path: Path) -> None:
    (tmp_path / "tcp").write_text("  sl  local_address rem_address   st tx rx tr rt uid\n")
    assert peer_uid(("127.0.0.1", 40000), ("127.0.0.1", 9817), proc_net=str(tmp_path)) is None
    assert not is_loopback("10.0.0.1") and is_loopback("127.0.0.2") and is_loopback("::1")


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """An exporter on loopback serving root's connections only; job 42 of alice runs."""
    run_sampler(tmp_path, [50.0] * 3, 3)
    opts = ExporterOptions(str(tmp_path / "spool"), 1e12, local_uids=frozenset({0}))
    srv = make_server(opts, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1], tmp_path
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=10)\n"
    "    print(r.status); print(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code); print(e.read().decode())\n"
)


def _fetch(port: int, uid: int | None) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-I", "-c", FETCH, f"http://127.0.0.1:{port}/metrics"],
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
    return int(status), body


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as nobody")
def test_another_local_user_gets_403_and_nothing_of_the_jobs(exporter: tuple[int, Path]) -> None:
    port, _ = exporter
    status, body = _fetch(port, NOBODY)
    assert status == 403
    assert 'job_id="42"' not in body and "alice" not in body
    status, body = _fetch(port, None)  # root, like Prometheus' account: served
    assert status == 200 and 'job_id="42"' in body and 'user="alice"' in body


def test_an_account_not_allowed_is_refused(tmp_path: Path) -> None:
    run_sampler(tmp_path, [50.0] * 3, 3)
    others = frozenset({os.geteuid() + 1})
    srv = make_server(ExporterOptions(str(tmp_path / "spool"), 1e12, others), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        status, body = _fetch(srv.server_address[1], None)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()
    assert status == 403 and 'job_id="42"' not in body


def test_slurm_gpu_live_is_for_root_and_the_admin_group() -> None:
    import grp

    from slurm_gpu.cli.live_cmd import caller_is_admin

    assert caller_is_admin("", euid=0, groups=())
    assert not caller_is_admin("", euid=NOBODY, groups=(NOBODY,))
    group = grp.getgrgid(os.getegid())
    assert caller_is_admin(group.gr_name, euid=NOBODY, groups=(group.gr_gid,))
    assert not caller_is_admin(group.gr_name, euid=NOBODY, groups=(group.gr_gid + 1,))
    assert not caller_is_admin("no-such-group-here", euid=NOBODY, groups=(0,))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the command as nobody")
def test_slurm_gpu_live_refuses_an_ordinary_user() -> None:
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="live-admin-"))  # pytest's tmp_path is root's alone
    base.chmod(0o755)
    cfg = base / "c.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{base}/spool"\n')
    cfg.chmod(0o644)
    repo = Path(__file__).resolve().parents[2]
    code = (
        f"import sys; sys.path.insert(0, {str(repo)!r}); "
        "from slurm_gpu.cli.admin import main; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, "--config", str(cfg), "live"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        check=False,
    )
    shutil.rmtree(base)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "for root and the [store] admin_group only" in proc.stderr
    assert "gpueff JOBID" in proc.stderr and "Traceback" not in proc.stderr
