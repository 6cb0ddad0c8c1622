"""The live view end to end on the test cluster: the node's exporter, the cluster's real
Prometheus (``share/testcluster/start``), ``slurm-gpu live`` and ``slurm-gpu police`` with a
real SMTP server on loopback, real jobs, ``scancel`` and ``sacct``.

Jobs: an idle job (sgtest1, physics: one GPU held by ``sleep``, never used), an idle job of an
exempt account (sgtest2, biology) and a healthy job (sgtest1, the demo's ``healthy`` pattern).
The policy runs with test-sized windows from a configuration written next to the cluster's
(root's, so that it is trusted): grace 0, idle 60 s, cancellation on after one warning.
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import slurmtools

from slurm_gpu.config import load_settings
from slurm_gpu.prometheus.client import PrometheusClient

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def settings():  # type: ignore[no-untyped-def]
    return load_settings(str(slurmtools.slurm_gpu_config_path()))


def slurm_gpu(
    *args: str, config: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cfg = str(config or slurmtools.slurm_gpu_config_path())
    argv = [
        str(slurmtools.venv_python()),
        "-I",
        "-c",
        "from slurm_gpu.cli.admin import main; main()",
        "--config",
        cfg,
        *args,
    ]
    return slurmtools.run_as(None, argv, cwd="/", timeout_s=180, check=check)


class _Handler:
    def __init__(self) -> None:
        self.received: list[tuple[tuple[str, ...], EmailMessage]] = []
        self._lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        with self._lock:
            self.received.append((tuple(envelope.rcpt_tos), msg))
        return "250 OK"

    def about(self, job_id: str) -> list[tuple[tuple[str, ...], EmailMessage]]:
        with self._lock:
            return [r for r in self.received if f"Job {job_id}:" in str(r[1]["Subject"])]


@pytest.fixture(scope="module")
def sink() -> Iterator[_Handler]:
    from aiosmtpd.controller import Controller

    handler = _Handler()
    controller = Controller(handler, hostname="127.0.0.1", port=settings().mail.smtp_port)
    controller.start()
    try:
        yield handler
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def police_config() -> Iterator[Path]:
    """The cluster's configuration plus test-sized policy windows, root's 0644."""
    base = slurmtools.slurm_gpu_config_path().read_text()
    path = slurmtools.tc_root() / "police-test.toml"
    path.write_text(
        base.replace(
            "[live]\n",
            "[live]\n"
            "police_grace_s = 0\npolice_idle_s = 60\npolice_max_sample_age_s = 30\n"
            "police_coverage_min = 0.5\npolice_user_interval_s = 0\n"
            "police_cancel = true\npolice_cancel_after_warnings = 1\n"
            'police_cancel_grace_s = 30\npolice_exempt_accounts = ["biology"]\n'
            'police_admin_emails = ["admin@localhost"]\n',
            1,
        )
    )
    os.chmod(path, 0o644)
    slurm_gpu("store", "migrate", config=path)
    try:
        yield path
    finally:
        path.unlink()


def prometheus() -> PrometheusClient:
    live = settings().live
    assert live.prometheus_url, "the test cluster's [live] must name its Prometheus"
    return PrometheusClient(live.prometheus_url, 5.0)


def submit_sleep(job_dir: Path, user: str, account: str, seconds: int) -> str:
    return slurmtools.submit(
        f"#!/bin/sh\nsleep {seconds}\n",
        user=user,
        args=[
            f"--chdir={job_dir}",
            f"--output={job_dir}/%j.out",
            "--gres=gpu:1",
            f"--account={account}",
            "--time=10",
        ],
    )


def submit_healthy(job_dir: Path, seconds: int) -> str:
    script = (
        f"#!/bin/sh\nexec {slurmtools.venv_python()} -m slurm_gpu.demo healthy "
        f"--duration {seconds}\n"
    )
    return slurmtools.submit(
        script,
        args=[
            f"--chdir={job_dir}",
            f"--output={job_dir}/%j.out",
            "--gres=gpu:1",
            "--time=10",
            f"--export=ALL,SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}",
        ],
    )


def wait_until(what: str, fn: Any, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)


def live_rows() -> dict[str, dict[str, Any]]:
    out = slurm_gpu("live", "--json").stdout
    return {row["job_id"]: row for row in json.loads(out)}


def actions(job_id: str) -> list[tuple[str, str]]:
    import sqlalchemy as sa

    from slurm_gpu.store import schema
    from slurm_gpu.store.store import open_engine

    engine = open_engine(settings().store_url)
    t = schema.live_actions
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.action, t.c.rule).where(t.c.job_id == job_id)).all()
    engine.dispose()
    return [(r[0], r[1]) for r in rows]


def test_prometheus_scrapes_the_nodes_exporter() -> None:
    up = wait_until(
        "the exporter's target up",
        lambda: [s for s in prometheus().query('up{job="slurm-gpu"}') if s.value == 1.0],
        timeout_s=60,
    )
    assert len(up) == 1


def test_idle_job_is_listed_warned_once_and_cancelled_healthy_and_exempt_are_not(
    job_dir: Path, sink: _Handler, police_config: Path
) -> None:
    other_dir = slurmtools.user_dir("sgtest2")
    idle = submit_sleep(job_dir, "sgtest1", "physics", 600)
    exempt = submit_sleep(other_dir, "sgtest2", "biology", 600)
    healthy = submit_healthy(job_dir, 600)
    try:
        rows = wait_until(
            "slurm-gpu live to list the three jobs with an idle finding",
            lambda: (
                r
                if {idle, exempt, healthy} <= set(r := live_rows())
                and any(f["key"] == "never_used" for f in r[idle]["findings"])
                else None
            ),
        )
        assert rows[idle]["gpus_idle"] == 1 and rows[healthy]["findings"] == []
        order = list(rows)
        assert order.index(idle) < order.index(healthy)  # worst first

        # The never-used rule needs police_idle_s (60 s) of readings; pass after pass until
        # both idle jobs were warned (the idle one may already be cancelled by then).
        def both_warned() -> bool:
            slurm_gpu("police", config=police_config)
            return ("warned", "never_used") in actions(idle) and actions(exempt) == [
                ("warned", "never_used")
            ]

        wait_until("both idle jobs warned", both_warned, timeout_s=240)
        [(to, msg)] = wait_until("the warning mail", lambda: sink.about(idle), timeout_s=60)
        assert to == ("sgtest1@localhost",)
        body = msg.get_content()
        assert f"scancel {idle}" in body and f"gpueff {idle}" in body

        # After police_cancel_grace_s (30 s) the idle job is cancelled; the exempt one never.
        def cancelled() -> bool:
            out = json.loads(slurm_gpu("police", "--json", config=police_config).stdout)
            for d in out["decisions"]:
                if d["job_id"] == exempt and d["action"] != "skip":
                    raise AssertionError(f"the exempt job was acted on: {d}")
            return ("cancelled", "never_used") in actions(idle)

        wait_until("the idle job cancelled", cancelled, timeout_s=180)
        assert slurmtools.wait_done(idle, timeout_s=120) == "CANCELLED"
        comment = slurmtools.sacct_fields(idle, ["AdminComment"])["AdminComment"]
        assert comment.startswith("slurm-gpu police: cancelled")
        assert actions(idle) == [("warned", "never_used"), ("cancelled", "never_used")]
        assert [a for a, _r in actions(exempt)] == ["warned"]
        assert actions(healthy) == []
        # Exactly one warning each, nothing ever to the healthy job's owner about it.
        assert len(sink.about(idle)) == 1 and len(sink.about(exempt)) == 1
        assert sink.about(healthy) == []
        assert slurmtools.squeue_state(exempt) == "RUNNING"

        # After the job: collected, its owner's gpueff shows what the policy did while it ran.
        slurm_gpu("collect", "--job", idle, "--wait", "60")
        gpueff = slurmtools.venv_python().parent / "gpueff"
        cfg = str(slurmtools.slurm_gpu_config_path())
        shown = slurmtools.run_as("sgtest1", [str(gpueff), "--config", cfg, "--no-color", idle])
        assert "Live policy" in shown.stdout, shown.stdout
        policy_lines = [ln for ln in shown.stdout.splitlines() if ln.startswith("  - ")]
        assert any("warned" in ln for ln in policy_lines), shown.stdout
        assert any("cancelled" in ln for ln in policy_lines), shown.stdout
        as_json = slurmtools.run_as("sgtest1", [str(gpueff), "--config", cfg, "--json", idle])
        (job,) = json.loads(as_json.stdout)["jobs"]
        assert [a["action"] for a in job["live_actions"]] == ["warned", "cancelled"]
    finally:
        for job in (idle, exempt, healthy):
            slurmtools.run_as(None, ["scancel", job], check=False)


def _pid(name: str) -> int:
    return int((slurmtools.tc_root() / "run" / f"{name}.pid").read_text().strip())


def test_police_acts_on_nothing_while_prometheus_is_stopped(
    job_dir: Path, police_config: Path
) -> None:
    idle = submit_sleep(job_dir, "sgtest1", "physics", 600)
    pid = _pid("prometheus")
    try:
        wait_until("the job in the live view", lambda: idle in live_rows())
        os.kill(pid, signal.SIGSTOP)
        cfg = police_config.read_text().replace("[live]\n", "[live]\nprometheus_timeout_s = 2\n", 1)
        stopped = police_config.with_name("police-stopped.toml")
        stopped.write_text(cfg)
        os.chmod(stopped, 0o644)
        try:
            result = slurm_gpu("police", config=stopped, check=False)
        finally:
            stopped.unlink()
        assert result.returncode == 7, result.stdout + result.stderr
        assert "unreachable" in result.stderr
        assert actions(idle) == []
    finally:
        os.kill(pid, signal.SIGCONT)
        slurmtools.run_as(None, ["scancel", idle], check=False)


def test_police_cancels_nothing_while_the_nodes_exporter_is_stopped(
    job_dir: Path, police_config: Path
) -> None:
    idle = submit_sleep(job_dir, "sgtest1", "physics", 600)
    pid = _pid("exporter")
    try:
        wait_until("the job in the live view", lambda: idle in live_rows())
        time.sleep(65)  # past police_idle_s: with data, the job would be warned
        os.kill(pid, signal.SIGSTOP)
        # A failed scrape marks the target's series stale at once; give it a few scrapes.
        wait_until(
            "the job's series to go stale",
            lambda: (
                not [
                    s
                    for s in prometheus().query("slurm_gpu_job_gpus")
                    if s.labels.get("job_id") == idle
                ]
            ),
            timeout_s=60,
        )
        result = slurm_gpu("police", "--json", config=police_config, check=False)
        assert result.returncode == 0, result.stderr
        acted = [d for d in json.loads(result.stdout)["decisions"] if d["action"] != "skip"]
        assert [d for d in acted if d["job_id"] == idle] == []
        assert actions(idle) == []
    finally:
        os.kill(pid, signal.SIGCONT)
        slurmtools.run_as(None, ["scancel", idle], check=False)
