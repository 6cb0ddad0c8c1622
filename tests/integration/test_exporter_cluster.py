"""The node exporter on the test cluster (issue 25, item 7): a user of the node (``sgtest2``)
who connects to an exporter on the node's own, non-loopback address gets 403 and no job,
root gets the running jobs; ``sgtest2`` sending a byte a second on many connections, and
root's own slow client, do not make the cluster's Prometheus miss a scrape of the node's
exporter, and root's slow client is cut at the request's deadline with 408."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import slurmtools

from slurm_gpu.config import Settings, load_settings
from slurm_gpu.prometheus.client import PrometheusClient

pytestmark = pytest.mark.cluster

#: Connects, sends the request line, then a header a byte a second for ``argv[3]`` seconds
#: on each of ``argv[4]`` connections at once; prints the first line of every answer.
SLOW = """import socket, sys, threading, time
host, port, seconds, n = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
answers = []
def one():
    s = socket.create_connection((host, port), timeout=30)
    end = time.monotonic() + seconds
    try:
        s.sendall(b"GET /metrics HTTP/1.0\\r\\nX-Slow: ")
        while time.monotonic() < end:
            s.send(b"a")
            time.sleep(1)
    except OSError:
        pass
    try:
        answers.append(s.recv(64).split(b"\\r\\n")[0].decode())
    except OSError:
        answers.append("reset")
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("\\n".join(answers))
"""

FETCH = """import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=20)
    print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"""


def settings() -> Settings:
    return load_settings(str(slurmtools.slurm_gpu_config_path()))


def own_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.254", 9))  # no packet sent: the route's source address
        address = str(s.getsockname()[0])
    assert not address.startswith("127."), "the test cluster's host needs a non-loopback address"
    return address


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node_exporter() -> Iterator[tuple[str, int]]:
    """A second real exporter, as root with the cluster's configuration, on the node's own
    scrape-network address (as docs/live.md deploys it for a remote Prometheus)."""
    address = own_address()
    port = free_port(address)
    argv = [
        str(slurmtools.venv_python()),
        "-I",
        "-c",
        "from slurm_gpu.cli.admin import main; main()",
        "--config",
        str(slurmtools.slurm_gpu_config_path()),
        "exporter",
        "--address",
        address,
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(argv, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        assert b"serving" in proc.stdout.readline()
        yield address, port
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_user_on_the_nodes_own_address_gets_403_and_root_the_jobs(
    node_exporter: tuple[str, int],
) -> None:
    job_dir = slurmtools.user_dir("sgtest1")
    job = slurmtools.submit(
        "#!/bin/sh\nsleep 120\n",
        user="sgtest1",
        args=[f"--chdir={job_dir}", f"--output={job_dir}/%j.out", "--gres=gpu:1", "--time=5"],
    )
    try:
        address, port = node_exporter
        url = f"http://{address}:{port}/metrics"
        deadline = time.monotonic() + 120
        while True:  # until the job's sampler has written its live summary
            out = slurmtools.run_as(None, [str(slurmtools.venv_python()), "-I", "-c", FETCH, url])
            if f'job_id="{job}"' in out.stdout:
                break
            assert time.monotonic() < deadline, "the job never appeared in the exposition"
            time.sleep(2)
        user = slurmtools.run_as(
            "sgtest2", [str(slurmtools.venv_python()), "-I", "-c", FETCH, url], cwd="/"
        )
        status, _, body = user.stdout.partition("\n")
        assert status == "403" and f'job_id="{job}"' not in body and "sgtest1" not in body
    finally:
        slurmtools.run_as(None, ["scancel", job], check=False)


def test_slow_clients_do_not_make_prometheus_miss_a_scrape() -> None:
    live = settings().live
    prometheus = PrometheusClient(live.prometheus_url, 5.0)
    port = live.exporter_port
    argv = [str(slurmtools.venv_python()), "-I", "-c", SLOW, "127.0.0.1", str(port)]
    root_answers: list[str] = []

    def root_slow() -> None:
        root_answers.append(
            slurmtools.run_as(None, [*argv, "20", "1"], timeout_s=90).stdout.strip()
        )

    root = threading.Thread(target=root_slow)
    root.start()
    user = slurmtools.run_as("sgtest2", [*argv, "20", "16"], cwd="/", timeout_s=90)
    root.join(90)
    # Every one of sgtest2's 16 connections was refused at once (403), none held a thread;
    # root's (allowed) was cut at the deadline.
    assert user.stdout.split().count("403") == 16, user.stdout
    assert root_answers and root_answers[0].startswith("HTTP/1.0 408"), root_answers
    # Prometheus (every 2 s) scraped the node's exporter without a miss meanwhile.
    scrapes = prometheus.query('count_over_time(up{job="slurm-gpu"}[16s])')
    worst = prometheus.query('min_over_time(up{job="slurm-gpu"}[16s])')
    assert scrapes and scrapes[0].value >= 5
    assert worst and worst[0].value == 1.0
