"""``gpueff`` on a RUNNING job from a "login" context, on the real test cluster with its real
Prometheus (``PrivateData=jobs``).

The login context is the cluster's configuration with ``spool_dir`` pointing to an empty
directory: on a real login node the spool (and its ``-live`` tree) sits on each compute
node's local disk and simply is not there, while the same configuration names the site's
Prometheus. That is what a login node's ``gpueff`` sees, whatever the user's permissions;
running as a user whose access to the live directory is denied would instead model a compute
node of someone else's job. sgtest1's job holds a GPU with ``sleep`` (never used).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurmtools

from slurm_gpu.config import load_settings
from slurm_gpu.prometheus.client import PrometheusClient

pytestmark = pytest.mark.cluster


def _settings() -> Any:
    return load_settings(str(slurmtools.slurm_gpu_config_path()))


def _login_config(name: str, prometheus_url: str | None) -> Path:
    """The cluster's configuration with an empty spool (and, if given, another Prometheus
    URL), root's 0644 like the real one."""
    root = slurmtools.tc_root()
    empty = root / f"{name}-spool"
    empty.mkdir(exist_ok=True)
    os.chmod(empty, 0o755)
    text = slurmtools.slurm_gpu_config_path().read_text()
    text, n = re.subn(r'(?m)^spool_dir = ".*"$', f'spool_dir = "{empty}"', text)
    assert n == 1
    if prometheus_url is not None:
        text, n = re.subn(
            r'(?m)^prometheus_url = ".*"$', f'prometheus_url = "{prometheus_url}"', text
        )
        assert n == 1
    path = root / f"{name}.toml"
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


@pytest.fixture(scope="module")
def login() -> Iterator[tuple[Path, Path]]:
    """(login configuration with Prometheus, login configuration without)."""
    with_prom = _login_config("login-prom", None)
    without = _login_config("login-noprom", "")
    try:
        yield with_prom, without
    finally:
        for p in (with_prom, without):
            p.unlink()


@pytest.fixture(scope="module")
def running_job() -> Iterator[str]:
    """sgtest1's running 1-GPU job, once Prometheus holds a fresh reading of it."""
    out = slurmtools.user_dir("sgtest1")
    job_id = slurmtools.submit(
        "#!/bin/sh\nsleep 600\n",
        "sgtest1",
        [f"--chdir={out}", f"--output={out}/%j.out", "--gres=gpu:1", "--time=10"],
    )
    try:
        client = PrometheusClient(_settings().live.prometheus_url, 5.0)
        query = f'slurm_gpu_gpu_sampled_seconds_total{{job_id="{job_id}"}}'
        deadline = time.monotonic() + 180
        while not [s for s in client.query(query) if s.value > 0]:
            assert time.monotonic() < deadline, "Prometheus never scraped the job's GPU"
            time.sleep(2)
        # slurmdbd learns of the start a moment after slurmctld: until then sacct (and so
        # gpueff) shows the job as pending.
        while slurmtools.sacct_state(job_id) != "RUNNING":
            assert time.monotonic() < deadline, "accounting never showed the job running"
            time.sleep(2)
        yield job_id
    finally:
        slurmtools.run_as(None, ["scancel", job_id], check=False)
        slurmtools.wait_done(job_id, timeout_s=120)


def _gpueff(user: str, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    gpueff = slurmtools.venv_python().parent / "gpueff"
    return slurmtools.run_as(
        user, [str(gpueff), "--config", str(config), "--no-color", *args], check=False
    )


def test_owner_gets_the_running_job_from_prometheus(
    running_job: str, login: tuple[Path, Path]
) -> None:
    res = _gpueff("sgtest1", login[0], running_job)
    assert res.returncode == 0, res.stdout + res.stderr
    label = next(ln for ln in res.stdout.splitlines() if ln.startswith("GPUs ("))
    assert "LIVE" in label and "from Prometheus" in label and " s old" in label
    doc = json.loads(_gpueff("sgtest1", login[0], "--json", running_job).stdout)
    [job] = doc["jobs"]
    assert job["telemetry"] == "live" and job["live_source"] == "prometheus"
    [gpu] = job["gpus"]
    # sleep never uses its GPU: a known 0 %, not unknown.
    assert gpu["duty_mean_pct"] == 0.0 and gpu["memory_total_bytes"]
    assert time.time() - job["live_updated_s"] < _settings().live.stale_after_s


def test_on_the_node_the_owner_gets_the_node_summary(running_job: str) -> None:
    res = _gpueff("sgtest1", slurmtools.slurm_gpu_config_path(), running_job)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "from the node's live summary" in res.stdout


def test_another_user_gets_not_found_as_for_an_ended_job(
    running_job: str, login: tuple[Path, Path]
) -> None:
    res = _gpueff("sgtest2", login[0], running_job)
    assert res.returncode == 4
    assert f"job {running_job} not found" in res.stderr
    assert "GPU-" not in res.stdout + res.stderr and "sgtest1" not in res.stdout


def test_without_prometheus_the_owner_is_told_live_numbers_are_not_here(
    running_job: str, login: tuple[Path, Path]
) -> None:
    res = _gpueff("sgtest1", login[1], running_job)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Live numbers are not available from this host" in res.stdout
    assert "busy" not in res.stdout


FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=10)\n"
    "    print(r.status); print(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code); print(e.read().decode())\n"
)


def _fetch_as(user: str | None, url: str) -> tuple[int, str]:
    argv = [str(slurmtools.venv_python()), "-I", "-c", FETCH, url]
    res = slurmtools.run_as(user, argv, cwd="/", check=False)
    if res.returncode != 0:
        return 0, res.stderr  # no HTTP answer (not listening yet)
    status, _, body = res.stdout.partition("\n")
    return int(status), body


@pytest.fixture
def exporter_url() -> Iterator[str]:
    """A node exporter of this checkout, as root with the cluster's configuration (its live
    files, its default exporter_allowed_users), on a free loopback port: the cluster's own
    exporter is whichever checkout last restarted the cluster."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    venv = slurmtools.venv_python()
    proc = subprocess.Popen(
        [
            str(venv),
            "-I",
            str(venv.parent / "slurm-gpu"),
            "--config",
            str(slurmtools.slurm_gpu_config_path()),
            "exporter",
            "--port",
            str(port),
        ],
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            if _fetch_as(None, url)[0] == 200:
                break
            assert proc.poll() is None and time.monotonic() < deadline, "exporter never answered"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_another_user_cannot_scrape_the_nodes_exporter(running_job: str, exporter_url: str) -> None:
    url = exporter_url
    status, body = _fetch_as("sgtest2", url)
    assert status == 403
    assert f'job_id="{running_job}"' not in body and "sgtest1" not in body
    # Root (and the prometheus account that scrapes it) are served: the job is there.
    status, body = _fetch_as(None, url)
    assert status == 200 and f'job_id="{running_job}"' in body


def test_doctor_warns_that_local_users_reach_the_loopback_prometheus() -> None:
    from slurm_gpu.cli.doctor_cmd import CHECKS

    skip = [a for c in CHECKS if c != "live" for a in ("--skip", c)]
    slurm_gpu = slurmtools.venv_python().parent / "slurm-gpu"
    cfg = str(slurmtools.slurm_gpu_config_path())
    res = slurmtools.run_as(None, [str(slurm_gpu), "--config", cfg, "doctor", *skip], check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(ln for ln in res.stdout.splitlines() if " live " in ln)
    assert "warn" in line and "PrivateData=jobs" in line
    assert "Prometheus listens on loopback (127.0.0.1:" in line
